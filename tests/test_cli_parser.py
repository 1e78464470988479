"""Every attnlab parser: no abbreviations, errors in the sub-command that failed, suggestions."""

from __future__ import annotations

import argparse

import pytest

from attnlab.cli import build_parser, main
from attnlab.commands.parser import Parser, suggest


def _error(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


def test_a_mistyped_flag_prints_the_subcommand_usage_and_a_suggestion(capsys):
    err = _error(capsys, ["train", "lm", "--stpes", "100"])
    assert err.startswith("usage: attnlab train lm ")
    assert "attnlab train lm: error: unrecognized arguments: --stpes 100" in err
    assert "did you mean --steps?" in err
    assert "<command>" not in err.splitlines()[0]  # not the top-level usage


def test_abbreviations_are_errors_everywhere(capsys):
    err = _error(capsys, ["train", "lm", "--step", "100"])
    assert "unrecognized arguments: --step 100 (did you mean --steps?)" in err
    err = _error(capsys, ["train", "translate", "--out", "x", "--max-tim", "5"])
    assert "attnlab train translate: error:" in err and "did you mean --max-time?" in err
    err = _error(capsys, ["generate", "runs/x", "--temp", "0"])
    assert "attnlab generate: error:" in err and "did you mean --temperature?" in err


def test_every_parser_is_built_from_the_one_class():
    """Sub-commands at every depth (train lm, bench attention, experiment ...) use Parser."""

    def walk(parser: argparse.ArgumentParser):
        yield parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    yield from walk(sub)

    parsers = list(walk(build_parser()))
    assert len(parsers) > 15
    for p in parsers:
        assert isinstance(p, Parser), p.prog
        assert p.allow_abbrev is False, p.prog


def test_a_mistyped_subcommand_gets_a_suggestion(capsys):
    err = _error(capsys, ["trian", "lm"])
    assert "invalid choice: 'trian'" in err and "did you mean train?" in err
    err = _error(capsys, ["bench", "atention"])
    assert err.startswith("usage: attnlab bench ") and "did you mean attention?" in err


def test_suggest():
    assert suggest("--stpes", ["--steps", "--seed", "--set"]) == "--steps"
    assert suggest("--stpes=100", ["--steps", "--seed"]) == "--steps"
    assert suggest("--zzz", ["--steps", "--seed"]) is None
