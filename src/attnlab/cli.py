"""``attnlab <verb>``: a thin command line over the library.

Each family of commands lives in ``attnlab.commands.<family>`` and adds its sub-commands through
``register(groups)``; this file only assembles the parser and turns user errors (and OS errors: a
missing file, a full disk) into one clear line and exit status 2 (``--debug`` shows the full
traceback instead). Ctrl-C exits with 130, SIGTERM during training with 143 (128 + the signal),
after the trainer has saved a checkpoint.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import time

from attnlab.commands import add_eval_parser
from attnlab.commands.parser import Parser
from attnlab.errors import UserError

COMMAND_MODULES = [
    "attnlab.commands.lm",
    "attnlab.commands.translate",
    "attnlab.commands.vision",
    "attnlab.commands.vision_experiments",
    "attnlab.commands.multimodal",
    "attnlab.commands.clip",
    "attnlab.commands.efficient",
    "attnlab.commands.interop",
    "attnlab.commands.experiments",
    "attnlab.commands.variant_experiments",
    "attnlab.commands.explore",
    "attnlab.commands.mlm",
    "attnlab.commands.t5",
    "attnlab.commands.inspect",
]


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="attnlab",
        description="Attention and Transformers end to end: train, generate, translate, classify, "
        "caption, ask, convert, benchmark and run the lecture's experiments.",
    )
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    top = parser.add_subparsers(
        dest="command", metavar="<command>", required=True, parser_class=Parser
    )
    train = top.add_parser("train", help="train a model; see 'attnlab train <task> --help'")
    experiment = top.add_parser(
        "experiment", help="run one of the lecture's claims as a measurement"
    )
    groups = {
        "top": top,
        "train": train.add_subparsers(
            dest="task", metavar="<task>", required=True, parser_class=Parser
        ),
        "experiment": experiment.add_subparsers(
            dest="experiment", metavar="<name>", required=True, parser_class=Parser
        ),
    }
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(groups)
    for name, sub in groups["train"].choices.items():  # (`train translate` has its own --task)
        sub.set_defaults(train_kind=name)

    add_eval_parser(top)
    return parser


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    from attnlab.train import clock  # after `started`: --max-time counts importing torch too

    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    clock.count_from(started)  # --max-time counts the start-up as well (train/clock.py)
    try:
        _check_paths(args)
        rc = args.func(args)
    except BrokenPipeError:  # `attnlab ... | head`: the reader left, which is not an error
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # no second error when Python flushes at exit
        return 0
    except (UserError, ValueError, OSError) as err:  # OSError: missing files, full disk, ...
        if args.debug:
            raise
        if os.environ.get("RANK", "0") == "0":  # under torchrun, say it once
            print(f"attnlab: error: {_message(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:  # Ctrl-C: 130; SIGTERM while training (Terminated): 143
        status = getattr(err, "exit_status", 130)
        if os.environ.get("RANK", "0") == "0":
            print(f"attnlab: {_interrupted(args, err, status)}", file=sys.stderr)
        return status
    finally:
        clock.count_from(None)
    return int(rc or 0)


def _interrupted(args: argparse.Namespace, err: KeyboardInterrupt, status: int) -> str:
    """``interrupted (Ctrl-C) at step 9 of 24; checkpoint saved in runs/x; resume with: ...``."""
    word = "terminated (SIGTERM)" if status == 143 else "interrupted (Ctrl-C)"
    stopped = getattr(err, "stopped", None)  # attached by the trainer (attnlab.train.stopping)
    training = args.command == "train"
    if stopped is not None:
        return f"{word} {stopped.describe(getattr(args, 'train_kind', None))}"
    if training:
        return f"{word} before training started; nothing new was saved"
    return word


# arguments that name a file or folder (dest -> how the message names it)
_PATH_ARGS = {
    "out": "--out",
    "data": "--data",
    "data_path": "--data-path",
    "config": "--config",
    "file": "--file",
    "run_dir": "the run directory",
    "image": "the image",
    "from_hf": "--from-hf",
    "to_hf": "--to-hf",
}


def _check_paths(args: argparse.Namespace) -> None:
    """An empty path would mean the working directory itself (``--data ""`` trained on whatever
    lay there, ``--out ""`` wrote into it): refuse it."""
    for dest, name in _PATH_ARGS.items():
        value = getattr(args, dest, None)
        values = value if isinstance(value, list) else [value]
        if any(v is not None and not str(v).strip() for v in values):
            raise UserError(f"{name} is empty: give a path")


def _message(err: Exception) -> str:
    """An OSError as ``PATH: cause`` (not ``[Errno 28] ...``); other errors as they are."""
    if isinstance(err, OSError) and err.strerror:
        return f"{err.filename}: {err.strerror}" if err.filename is not None else err.strerror
    return str(err)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
