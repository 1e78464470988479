"""commands/flags.py and the shared argument helpers: a flag table means what the same
``add_argument`` calls mean; settings built from flags by field name; one "at least 1" check."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import pytest

from attnlab.commands.config_args import from_args
from attnlab.commands.flags import add_command, add_flags, at_least_one, pick
from attnlab.errors import UserError


def _by_hand() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="x")
    p.add_argument("run_dir", help="a run")
    p.add_argument("text", nargs="*", help="words")
    p.add_argument("--beam", type=int, default=1, help="beam width (default %(default)s)")
    p.add_argument("--weights", choices=["best", "last"], default="best")
    p.add_argument("--name", default=None, metavar="NAME", help="a name")
    p.add_argument("--overwrite", action="store_true", help="replace")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    p.add_argument("--keep-case", dest="lowercase", action="store_false", default=None)
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 2])
    return p


def _table() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="x")
    add_flags(
        p,
        [
            ("run_dir", None, None, "a run"),
            ("text", None, None, "words", {"nargs": "*"}),
            ("--beam", int, 1, "beam width (default %(default)s)"),
            ("--weights", ["best", "last"], "best", None),
            ("--name", None, None, "a name", {"metavar": "NAME"}),
            ("--overwrite", "store_true", None, "replace"),
            ("--no-progress", "store_false", None, None, {"dest": "progress"}),
            ("--keep-case", "store_false", None, None, {"dest": "lowercase", "default": None}),
            ("--sizes", int, [1, 2], None, {"nargs": "+"}),
        ],
    )
    return p


def _actions(p: argparse.ArgumentParser) -> list[tuple]:
    keys = ("option_strings", "dest", "default", "type", "choices", "required", "nargs", "help")
    return [(type(a).__name__, *(getattr(a, k) for k in keys)) for a in p._actions]


@pytest.mark.parametrize(
    "argv",
    [
        ["run"],
        ["run", "a", "b", "--beam", "4", "--weights", "last", "--name", "n"],
        ["run", "--overwrite", "--no-progress", "--keep-case", "--sizes", "3", "4"],
    ],
)
def test_a_flag_table_parses_like_the_add_argument_calls(argv):
    hand, table = _by_hand(), _table()
    assert _actions(table) == _actions(hand)
    assert table.format_help() == hand.format_help()
    assert vars(table.parse_args(argv)) == vars(hand.parse_args(argv))


def test_add_command_registers_flags_and_runner():
    top = argparse.ArgumentParser(prog="x")
    sub = top.add_subparsers(dest="cmd")
    add_command(sub, "go", func=len, flags=[("--n", int, 3, "how many")], help="go somewhere")
    args = top.parse_args(["go", "--n", "5"])
    assert (args.cmd, args.n, args.func) == ("go", 5, len)


@dataclass
class _Settings:
    steps: int = 10
    lr: float = 0.1
    norm_position: str = "post"


def test_from_args_takes_the_fields_named_like_flags_and_extra_wins():
    args = argparse.Namespace(steps=3, lr=0.5, norm="pre", out="runs/x")  # out, norm: no fields
    assert from_args(_Settings, args) == _Settings(steps=3, lr=0.5, norm_position="post")
    assert from_args(_Settings, args, norm_position=args.norm, lr=1.0) == _Settings(3, 1.0, "pre")
    assert from_args(_Settings, argparse.Namespace()) == _Settings()
    assert pick(args, "lr", "out") == {"lr": 0.5, "out": "runs/x"}


def test_at_least_one_names_the_first_flag_below_one():
    at_least_one(argparse.Namespace(beam=1, max_batches=None), "beam", "max_batches")
    with pytest.raises(UserError, match=r"^--batch-size must be at least 1, got 0$"):
        at_least_one(argparse.Namespace(beam=1, batch_size=0, top_k=-1), "beam", "batch_size")
