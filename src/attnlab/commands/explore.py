"""``attnlab explore RUN``: the interactive attention explorer, as a file or a local server.

    attnlab explore runs/lm --input "The cat sat on the mat" --out lm.html
    attnlab explore runs/mlm --input "the return [MASK]alue of the function" --out mlm.html
    attnlab explore runs/vit --input digit.png --out vit.html
    attnlab explore runs/vqa --input scene.png --question "what colour is the circle?" --out vqa.html
    attnlab explore runs/lm --serve --port 8000

The work is in :mod:`attnlab.explore`; this module parses and prints.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnlab import explore
from attnlab.commands.flags import add_command, add_flags
from attnlab.commands.inspect import WEIGHTS_HELP
from attnlab.errors import UserError
from attnlab.explore import Explorer, write_page
from attnlab.explore.inputs import explore_input


def _run_explore(args: argparse.Namespace) -> int:
    if args.out and args.input is None:
        raise UserError("--out needs --input (the text or image file to explain)")
    if args.out and Path(args.out).is_dir():
        raise UserError(f"--out {args.out!r} is a directory; give a file name such as page.html")
    explorer = Explorer(args.run_dir, weights=args.weights)
    first = explore_input(explorer, args.input, args.question)
    if args.out:
        write_page(explorer.explain(first), args.out)
        size = Path(args.out).stat().st_size
        print(
            f"wrote {args.out} ({size / 1024:.0f} kB) from the {explorer.run.checkpoint}: "
            "open it in a browser"
        )
        return 0
    server = explore.make_server(explorer, port=args.port, first=first)
    print(
        f"explorer for {args.run_dir} ({explorer.run.checkpoint}) on {server.url} "
        "(Ctrl-C stops it)",
        flush=True,
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
    finally:
        server.server_close()
    return 0


# fmt: off
def register(groups) -> None:
    """Add ``attnlab explore``."""
    p = add_command(groups["top"], "explore", func=_run_explore,
        help="an interactive page of every attention layer and head for one input",
        description="Write one self-contained HTML page (no network, nothing loaded from "
        "anywhere) showing the attention of a run for one input: head view, model view, raw "
        "scores q·k/√d next to the weights, entropy and rollout; an MLM's guesses at each "
        "[MASK]; translation alignments; attention over images. With --serve, a local page "
        "(127.0.0.1 only) recomputes it for new input.", flags=[
        ("run_dir", None, None, "run directory written by 'attnlab train'"),
        ("--input", None, None,
         "the text (language models, translation; with [MASK] for an MLM encoder) or image "
         "file (vit, swin, captioning, VQA) to explain; required with --out; --serve without "
         "it opens with an example", {"metavar": "TEXT|IMAGE"}),
        ("--question", None, None, "VQA: the question about the image"),
    ])
    add_flags(p.add_mutually_exclusive_group(required=True), [
        ("--out", None, None, "write the page to this file", {"metavar": "PAGE.html"}),
        ("--serve", "store_true", None, "serve the page on 127.0.0.1 and recompute it live"),
    ])
    add_flags(p, [
        ("--port", int, 8000, "--serve: port (default 8000)"),
        ("--weights", ["best", "last"], "best", WEIGHTS_HELP),
    ])
# fmt: on
