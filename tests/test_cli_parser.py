"""Every attnlab parser: no abbreviations, errors in the sub-command that failed, suggestions."""

from __future__ import annotations

import argparse

import pytest

from attnlab.cli import Parser, build_parser, main, suggest


def _error(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnlab: error: "), err  # no usage block
    return lines[0]


def test_a_mistyped_flag_is_one_line_with_a_suggestion(capsys):
    line = _one_line(_error(capsys, ["train", "lm", "--stesp", "5"]))
    assert line == "attnlab: error: unknown flag --stesp (did you mean --steps?)"
    line = _one_line(_error(capsys, ["train", "lm", "--zzzz"]))
    assert "unknown flag --zzzz" in line and "'attnlab train lm --help'" in line


def test_abbreviations_are_errors_everywhere(capsys):
    line = _one_line(_error(capsys, ["train", "lm", "--step", "100"]))
    assert line.endswith("unknown flag --step (did you mean --steps?)")
    # the suggestion comes from the sub-command that did not understand the flag
    line = _one_line(_error(capsys, ["train", "translate", "--out", "x", "--max-tim", "5"]))
    assert "did you mean --max-time?" in line
    line = _one_line(_error(capsys, ["generate", "runs/x", "--temp", "0"]))
    assert "did you mean --temperature?" in line


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
    line = _one_line(_error(capsys, ["trian", "lm"]))
    assert line == "attnlab: error: unknown command 'trian' (did you mean train?)"
    line = _one_line(_error(capsys, ["bench", "atention"]))
    assert "did you mean attention?" in line
    line = _one_line(_error(capsys, ["generate", "x", "--beam", "two"]))
    assert "invalid int value: 'two'" in line and "'attnlab generate --help'" in line


def test_suggest():
    assert suggest("--stpes", ["--steps", "--seed", "--set"]) == "--steps"
    assert suggest("--stpes=100", ["--steps", "--seed"]) == "--steps"
    assert suggest("--zzz", ["--steps", "--seed"]) is None
