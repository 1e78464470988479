"""``attnlab inspect RUN``: per-head diagnostics of a trained run.

    attnlab inspect runs/lm                      # table; runs/lm/inspect/heads.json and .png
    attnlab inspect runs/de --out report/ --no-ablation

The work is in :mod:`attnlab.inspect`; this module parses, prints and writes.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from attnlab.errors import UserError


def register(groups) -> None:
    """Add ``attnlab inspect``."""
    p = groups["top"].add_parser(
        "inspect",
        help="per-head diagnostics of a run: what each attention head does, degenerate heads",
        description="Score every attention head of a run on a probe batch (repeated random "
        "tokens for language models, fresh pairs of the synthetic task for translation, random "
        "inputs otherwise): causal check, entropy, previous-token, first-token (sink), diagonal, "
        "duplicate-token and induction scores, the loss change when the head is ablated, and "
        "for dates translation the agreement of cross-attention with the known alignment. "
        "Prints the table, flags degenerate heads with the reason, writes heads.json and "
        "heads.png.",
    )
    p.add_argument("run_dir", help="run directory written by 'attnlab train'")
    p.add_argument(
        "--out",
        metavar="DIR",
        help="where heads.json and heads.png go (default RUN/inspect)",
    )
    p.add_argument("--batch", type=int, default=4, help="rows of the probe batch (default 4)")
    p.add_argument(
        "--length",
        type=int,
        default=16,
        help="language models: length of the repeated half of each row (default 16)",
    )
    p.add_argument(
        "--no-ablation",
        action="store_true",
        help="skip the loss change of ablating each head (one forward per head)",
    )
    p.add_argument("--seed", type=int, default=1234, help="seed of the probe batch")
    p.add_argument(
        "--weights",
        choices=["best", "last"],
        default="best",
        help="best: the checkpoint with the lowest validation loss (default, as in every "
        "command); last: the final one",
    )
    p.set_defaults(func=_run_inspect)


def _run_inspect(args: argparse.Namespace) -> int:
    import attnlab
    from attnlab.inspect import diagnose
    from attnlab.inspect.diagnostics import summary_table
    from attnlab.inspect.probe import probe_for
    from attnlab.viz.heads import plot_head_scores

    if args.batch < 1 or args.length < 2:
        raise UserError("--batch must be at least 1 and --length at least 2")
    run = attnlab.load(args.run_dir, weights=args.weights)
    try:
        probe = probe_for(run, batch=args.batch, length=args.length, seed=args.seed)
    except ValueError as err:
        raise UserError(str(err)) from None
    heads = diagnose(
        run.model,
        probe.inputs,
        repeated=probe.repeated,
        loss_fn=None if args.no_ablation else probe.loss_fn,
        alignment=probe.alignment,
    )
    if not heads:
        raise UserError(f"{args.run_dir}: this {run.kind!r} model has no attention heads")
    out = Path(args.out) if args.out else Path(args.run_dir) / "inspect"
    out.mkdir(parents=True, exist_ok=True)
    print(f"{args.run_dir} ({run.kind}): {len(heads)} heads on {probe.description}")
    print(summary_table(heads))
    flagged = [h for h in heads if h.flags]
    print(f"{len(flagged)} of {len(heads)} heads flagged as degenerate")
    report = {
        "run": str(args.run_dir),
        "kind": run.kind,
        "probe": probe.description,
        "heads": [h.to_dict() for h in heads],
    }
    (out / "heads.json").write_text(json.dumps(report, indent=1) + "\n")
    plot_head_scores(heads, out / "heads.png")
    print(f"wrote {out / 'heads.json'} and {out / 'heads.png'}")
    return 0
