"""Run-directory helpers: atomic writes and clear errors for directories that are not runs."""

from __future__ import annotations

import inspect
import json
import os

import pytest

from attnlab.errors import RunDirError
from attnlab.runs import atomic_save, atomic_write_text, load, load_model, read_config


def test_atomic_files_get_the_same_permissions_as_a_plain_open(tmp_path):
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    atomic_write_text(tmp_path / "a.txt", "x")
    atomic_save(tmp_path / "b.bin", lambda tmp: open(tmp, "wb").write(b"x"))
    mode = plain.stat().st_mode & 0o777
    assert (tmp_path / "a.txt").stat().st_mode & 0o777 == mode
    assert (tmp_path / "b.bin").stat().st_mode & 0o777 == mode


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "model.bin"
    atomic_save(target, lambda tmp: open(tmp, "wb").write(b"old"))

    def broken(tmp):
        with open(tmp, "wb") as f:
            f.write(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_save(target, broken)
    assert target.read_bytes() == b"old"
    assert sorted(os.listdir(tmp_path)) == ["model.bin"]


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "no config.json"),
        ("{not json", "corrupted"),
        (json.dumps({"hello": 1}), "needs 'kind' and 'model'"),
        (json.dumps({"kind": "teapot", "model": {}}), "unknown model kind 'teapot'"),
    ],
)
def test_directories_that_are_not_runs_are_named_errors(tmp_path, content, message):
    if content is not None:
        (tmp_path / "config.json").write_text(content)
    with pytest.raises(RunDirError, match=message):
        load(tmp_path)


def test_missing_run_directory(tmp_path):
    with pytest.raises(RunDirError, match="does not exist"):
        read_config(tmp_path / "nope")


def test_load_names_a_misspelt_option_before_reading_anything(tmp_path):
    assert list(inspect.signature(load).parameters) == [
        *inspect.signature(load_model).parameters,
        "kinds",
    ]
    with pytest.raises(TypeError, match="wieghts"):
        load(tmp_path / "nope", wieghts="best")  # not the missing directory: the option
