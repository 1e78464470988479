"""``attnlab inspect RUN``: per-head diagnostics of a trained run.

    attnlab inspect runs/lm                      # table; runs/lm/inspect/heads.json and .png
    attnlab inspect runs/de --out report/ --no-ablation

The work is in :mod:`attnlab.inspect` (:mod:`attnlab.inspect.report`); this module parses,
prints and plots.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import attnlab
from attnlab.commands.flags import add_command
from attnlab.errors import UserError
from attnlab.inspect.diagnostics import summary_table
from attnlab.inspect.report import inspect_run, write_report
from attnlab.viz.heads import plot_head_scores

WEIGHTS_HELP = (
    "best: the checkpoint with the lowest validation loss (default, as in every command); last: "
    "the final one"
)


def _run_inspect(args: argparse.Namespace) -> int:
    if args.batch < 1 or args.length < 2:
        raise UserError("--batch must be at least 1 and --length at least 2")
    run = attnlab.load(args.run_dir, weights=args.weights)
    heads, probe = inspect_run(run, batch=args.batch, length=args.length, seed=args.seed,
                               ablation=not args.no_ablation)  # fmt: skip
    if not heads:
        raise UserError(f"{args.run_dir}: this {run.kind!r} model has no attention heads")
    out = Path(args.out) if args.out else Path(args.run_dir) / "inspect"
    out.mkdir(parents=True, exist_ok=True)
    print(f"{args.run_dir} ({run.kind}): {len(heads)} heads on {probe.description}")
    print(summary_table(heads))
    print(f"{sum(bool(h.flags) for h in heads)} of {len(heads)} heads flagged as degenerate")
    write_report(heads, probe, str(args.run_dir), run.kind, out / "heads.json")
    plot_head_scores(heads, out / "heads.png")
    print(f"wrote {out / 'heads.json'} and {out / 'heads.png'}")
    return 0


# fmt: off
def register(groups) -> None:
    """Add ``attnlab inspect``."""
    add_command(groups["top"], "inspect", func=_run_inspect,
        help="per-head diagnostics of a run: what each attention head does, degenerate heads",
        description="Score every attention head of a run on a probe batch (repeated random "
        "tokens for language models, fresh pairs of the synthetic task for translation, random "
        "inputs otherwise): causal check, entropy, previous-token, first-token (sink), diagonal, "
        "duplicate-token and induction scores, the loss change when the head is ablated, and "
        "for dates translation the agreement of cross-attention with the known alignment. "
        "Prints the table, flags degenerate heads with the reason, writes heads.json and "
        "heads.png.", flags=[
        ("run_dir", None, None, "run directory written by 'attnlab train'"),
        ("--out", None, None, "where heads.json and heads.png go (default RUN/inspect)",
         {"metavar": "DIR"}),
        ("--batch", int, 4, "rows of the probe batch (default 4)"),
        ("--length", int, 16,
         "language models: length of the repeated half of each row (default 16)"),
        ("--no-ablation", "store_true", None,
         "skip the loss change of ablating each head (one forward per head)"),
        ("--seed", int, 1234, "seed of the probe batch"),
        ("--weights", ["best", "last"], "best", WEIGHTS_HELP),
    ])
# fmt: on
