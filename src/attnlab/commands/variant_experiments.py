"""``attnlab experiment long-context | adaptive-computation``: the lecture's "other variants"
(long inputs in chunks or with Transformer-XL's memory; adaptive computation time) as
measurements. A flag table each; the work is in :mod:`attnlab.experiments`.

    attnlab experiment long-context --max-time 240 --out runs/long-context
    attnlab experiment adaptive-computation --max-time 240 --out runs/adaptive-computation
"""

from __future__ import annotations

import argparse

from attnlab.commands.experiments import _experiment, add_experiment_args
from attnlab.commands.flags import add_flags

__all__ = ["register"]

_THREADS = (
    "--threads", int, None,
    "torch CPU threads (default: torch's, all cores; 1 is much faster on a busy machine)",
)  # fmt: skip

# fmt: off
_EXPERIMENTS = [
    {
        "name": "long-context",
        "help": "documents longer than the segment: disjoint chunks, sliding windows, "
        "Transformer-XL memory, full attention; loss and cost per token",
        "description": "Train one Transformer-XL on segments of --segment L characters (memory "
        "carried from segment to segment), then score the same held-out documents of "
        "--doc-len characters as disjoint chunks of L, sliding windows of L with --stride, "
        "windows of M+L recomputed per segment, windows of L per token (stride 1), segments "
        "with the memory, and one full-attention segment: loss, query rows and keys per token "
        "(counted) and evaluation time per token (measured, on the machine as it is).",
        "max_time": 240.0,
        "flags": [
            ("--segment", int, 32, "segment length L (default 32)"),
            ("--mem-len", int, None, "memory M (default: L)"),
            ("--doc-len", int, 256, "held-out document length N (default 256)"),
            ("--n-docs", int, 32, "held-out documents (default 32)"),
            ("--stride", int, None, "sliding-window stride (default L/4)"),
            ("--d-model", int, 64, None),
            ("--n-layers", int, 2, None),
            ("--batch-size", int, 16, "text streams per step (default 16)"),
            ("--lr", float, 2e-3, None),
            ("--data", None, "pydoc", "corpus, read by characters (default pydoc)"),
            ("--max-chars", int, None, "use only the first N characters"),
            _THREADS,
        ],
        "module": "long_context",
        "run": "run_long_context",
        "config": "LongContextConfig",
    },
    {
        "name": "adaptive-computation",
        "help": "a Universal Transformer with ACT on parity strings of varying length: steps "
        "by difficulty, accuracy against a fixed depth of equal average compute",
        "description": "Train a Universal Transformer (one shared block) with adaptive "
        "computation time on parity of 1 … --max-len bits, then a fixed-depth model with the "
        "same block, as many steps as the ACT model's mean, for as many optimizer steps. "
        "Report the ACT steps per length (over positions and at [CLS]), both models' "
        "held-out accuracy per length, and the rank correlation of length and steps.",
        "max_time": 240.0,
        "flags": [
            ("--max-len", int, 6, "longest bit string (default 6)"),
            ("--max-steps", int, 8, "the ACT ponder budget N_max (default 8)"),
            ("--ponder-cost", float, 0.001, "τ (default 0.001)"),
            ("--halting-bias", float, -1.0,
             "initial bias of the halting unit (default -1: about 4 steps at first)"),
            ("--d-model", int, 64, None),
            ("--batch-size", int, 64, None),
            ("--lr", float, 1e-3, None),
            ("--n-test", int, 200, "held-out strings per length (default 200)"),
            _THREADS,
        ],
        "module": "adaptive_computation",
        "run": "run_adaptive_computation",
        "config": "AdaptiveComputationConfig",
    },
]
# fmt: on


def register(groups) -> None:
    """Add the experiments of this module to ``groups["experiment"]``."""
    for spec in _EXPERIMENTS:
        e = groups["experiment"].add_parser(
            spec["name"], help=spec["help"], description=spec["description"]
        )
        add_experiment_args(e, name=spec["name"], max_time=spec["max_time"])
        add_flags(e, spec["flags"])
        e.set_defaults(func=lambda args, spec=spec: _run(spec, args))


def _run(spec: dict, args: argparse.Namespace) -> int:
    import importlib  # (the experiment's module loads only when it runs)

    module = importlib.import_module(f"attnlab.experiments.{spec['module']}")
    return _experiment(getattr(module, spec["run"]), getattr(module, spec["config"]), args)
