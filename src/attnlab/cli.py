"""``attnlab <verb>``: a thin command line over the library.

Each family of commands lives in ``attnlab.commands.<family>`` and adds its sub-commands through
``register(groups)``; this file only assembles the parser and turns user errors (and OS errors: a
missing file, a full disk) into one clear line and exit status 2 (``--debug`` shows the full
traceback instead). Ctrl-C exits with 130, SIGTERM during training with 143 (128 + the signal),
after the trainer has saved a checkpoint.

Every parser, of the program and of each sub-command, is a :class:`Parser` (passed as
``add_subparsers(parser_class=Parser)``; nested sub-command groups inherit it), so three rules
hold everywhere, without code in the commands:

- a flag means exactly what is typed: abbreviations are off (``--step`` is not ``--steps``);
- a mistake is one line, ``attnlab: error: ...``, found by the sub-command that did not
  understand it (its flags are the ones suggested; the usage block is ``--help``'s job);
- an unknown flag or sub-command name that is close to a known one gets a suggestion:
  ``attnlab: error: unknown flag --stpes (did you mean --steps?)``.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import time
from collections.abc import Sequence

from attnlab.commands import add_eval_parser
from attnlab.errors import UserError, closest


def suggest(word: str, known: Sequence[str]) -> str | None:
    """The known word closest to ``word`` (a typo or an abbreviation), or None.

    Args:
        word: what was typed (``--stpes``; ``--stpes=100`` is compared without its value).
        known: the valid words (option strings or sub-command names).
    """
    return closest(word.split("=", 1)[0], known)


class Parser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` without abbreviations, erring in the sub-command that failed.

    Args:
        *args, **kwargs: as for ``argparse.ArgumentParser`` (``allow_abbrev`` defaults to False).
    """

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        """Parse, and reject leftovers here, so the error names this (sub-)command's usage.

        argparse hands a sub-command's unknown arguments back to the top-level parser, which
        would print the top-level usage; every ``attnlab`` parser rejects them itself instead.
        """
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            extras = self._more_positionals(namespace, extras)
        if extras:
            self.error(self._unrecognized(extras))
        return namespace, extras

    def _more_positionals(self, namespace: argparse.Namespace, extras: list[str]) -> list[str]:
        """Words typed after a flag that belong to a list positional (``attnlab translate RUN
        --beam 4 "twenty one"``): argparse reads a positional once, so it leaves them over."""
        many = [
            a
            for a in self._actions
            if not a.option_strings and a.nargs in ("*", "+") and a.dest != argparse.SUPPRESS
        ]
        if len(many) != 1 or any(w.startswith("-") for w in extras):
            return extras
        values = getattr(namespace, many[0].dest, None)
        setattr(namespace, many[0].dest, [*(values or []), *extras])
        return []

    def _unrecognized(self, extras: list[str]) -> str:
        """``unknown flag --stesp (did you mean --steps?)``; words that are not flags (the value
        after an unknown flag is not named) as ``unexpected argument(s)``."""
        flags = [w for w in extras if w.startswith("-") and len(w) > 1]
        if not flags:
            return f"unexpected argument(s): {' '.join(extras)}"
        options = [s for s in self._option_string_actions if s.startswith("--")]
        hints = []
        for word in flags:
            close = suggest(word, options) if word.startswith("--") else None
            if close is not None and close not in hints:
                hints.append(close)
        what = "unknown flag" if len(flags) == 1 else "unknown flags"
        message = f"{what} {' '.join(w.split('=', 1)[0] for w in flags)}"
        if hints:
            return message + f" (did you mean {' or '.join(hints)}?)"
        return message + f" (see '{self.prog} --help')"

    def error(self, message: str):
        """One line on stderr, ``attnlab: error: MESSAGE``, and exit status 2 (argparse would
        print the usage block first: 21 lines for one mistyped flag)."""
        if "did you mean" not in message and "--help" not in message:
            message += f" (see '{self.prog} --help')"
        self.exit(2, f"attnlab: error: {message}\n")

    def print_usage(self, file=None) -> None:  # (argparse calls it before error)
        if file is not sys.stderr:
            super().print_usage(file)

    def _check_value(self, action: argparse.Action, value) -> None:
        """An unknown sub-command or choice: the argparse message plus the closest valid one."""
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError as err:
            choices = [str(c) for c in action.choices or ()]
            close = suggest(str(value), choices) if isinstance(value, str) else None
            hint = f" (did you mean {close}?)" if close is not None else ""
            if isinstance(action, argparse._SubParsersAction):  # `attnlab trian`
                known = hint or f"; choose from {', '.join(choices)}"
                raise argparse.ArgumentError(None, f"unknown command {value!r}{known}") from None
            if close is None:
                raise
            raise argparse.ArgumentError(action, f"{err.message}{hint}") from None


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
