"""``attnlab experiment NAME``: the lecture's claims as measurements (issue 14's experiments).

    attnlab experiment exposure-bias --max-time 300 --out runs/exposure-bias
    attnlab experiment label-smoothing --max-time 300 --out runs/label-smoothing
    attnlab experiment extrapolation --max-time 240 --out runs/extrapolation
    attnlab experiment norm-placement --max-time 240 --out runs/norm-placement
    attnlab experiment warmup --max-time 240 --out runs/warmup
    attnlab experiment grokking --max-time 150 --out runs/grokking
    attnlab experiment induction-heads --max-time 300 --out runs/induction-heads
    attnlab experiment ablations --max-time 300 --out runs/ablations
    attnlab experiment long-context --max-time 240 --out runs/long-context
    attnlab experiment adaptive-computation --max-time 240 --out runs/adaptive-computation
    attnlab experiment sequence-primitives --max-time 240 --out runs/sequence-primitives

Every experiment here takes ``--max-time SECONDS`` for the whole experiment (it splits the budget
over its runs) or ``--steps N`` per run (repeatable), writes ``table.md``, ``results.json`` and a
plot into ``--out`` (refusing a directory that holds files unless ``--overwrite``), and prints the
table.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from attnlab.commands.config_args import from_args
from attnlab.commands.flags import add_flags, at_least_one
from attnlab.experiments.common import TABLE_FILE
from attnlab.experiments.lecture_table import experiments, lm_model_rows

__all__ = ["register", "add_experiment_args"]


# fmt: off
def add_experiment_args(p: argparse.ArgumentParser, *, name: str, max_time: float) -> None:
    """The flags every experiment shares: budget, output directory, device, seed, progress."""
    add_flags(
        p.add_argument_group("budget and output"),
        [
            ("--max-time", float, max_time, "wall-clock seconds for the whole experiment, split "
             "over its runs (default %(default)s)", {"metavar": "SECONDS"}),
            ("--steps", int, None,
             "train every run for exactly N steps instead of fitting --max-time (repeatable)"),
            ("--out", None, f"runs/{name}", "output directory (default %(default)s)"),
            ("--overwrite", "store_true", None, "replace what --out already holds"),
            ("--device", None, "auto", "cpu, cuda, cuda:1 ... (default auto)"),
            ("--seed", int, 0, None),
            ("--no-progress", "store_false", None, None, {"dest": "progress"}),
        ],
    )


def register(groups) -> None:
    """Add the experiments of this module to ``groups["experiment"]`` (see attnlab.commands)."""
    for spec in experiments():
        e = groups["experiment"].add_parser(
            spec["name"], help=spec["help"], description=spec["description"]
        )
        add_experiment_args(e, name=spec["name"], max_time=spec["max_time"])
        add_flags(e, spec["flags"])
        if "lm" in spec:
            add_flags(e.add_argument_group("model and data"), lm_model_rows(**spec["lm"]))
        add_flags(e, spec.get("flags after lm", ()))
        e.set_defaults(func=_experiment(spec))


# fmt: on


def _experiment(spec: dict):
    """The runner of one experiment: check the shared flags, build its config from the flags,
    run it and print its table."""
    run, config_cls = spec["run"]
    renamed = spec.get("renamed", {})  # config field -> flag dest

    def func(args: argparse.Namespace) -> int:
        at_least_one(args, *[n for n in ("threads", "steps") if hasattr(args, n)])
        if getattr(args, "threads", None) is not None:  # (the language-model experiments)
            torch.set_num_threads(args.threads)
        extra = {name: getattr(args, dest) for name, dest in renamed.items()}
        run(from_args(config_cls, args, **extra), args.out, overwrite=args.overwrite)
        print((Path(args.out) / TABLE_FILE).read_text(encoding="utf-8").rstrip())
        print(f"\ntable.md, results.json and the plot are in {args.out}")
        return 0

    return func
