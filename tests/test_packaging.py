"""What the package promises about the Python it runs on: ``requires-python`` in pyproject.toml
admits the interpreter the suite runs on and refuses 3.10 (whose standard library has no
``tomllib``, which reads ``--config x.toml``), and the Makefile says so in one line before it
creates a virtual environment."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parents[1]


def test_requires_python_admits_this_interpreter_and_refuses_3_10():
    spec = SpecifierSet(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
                        ["requires-python"])  # fmt: skip
    assert spec.contains(f"{sys.version_info.major}.{sys.version_info.minor}")
    assert not spec.contains("3.10.13") and spec.contains("3.11.0")


def test_make_refuses_an_older_python_with_one_line(tmp_path):
    """The Makefile's set-up, given a ``python`` that reports 3.10, stops with one line naming
    the version needed, before any virtual environment is made."""
    fake = tmp_path / "python3.10"
    fake.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "-V" ]; then echo "Python 3.10.13"; exit 0; fi\n'
        f'exec {sys.executable} -c "import sys; sys.version_info = (3, 10, 13); '
        'exec(sys.argv[1])" "$2"\n'
    )
    fake.chmod(0o755)
    for name in ("Makefile", "pyproject.toml", "constraints.txt"):
        (tmp_path / name).write_bytes((ROOT / name).read_bytes())
    proc = subprocess.run(
        ["make", "-s", ".venv/.installed", f"PYTHON={fake}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert proc.returncode != 0
    assert "attnlab needs Python 3.11 or newer" in proc.stdout and "3.10.13" in proc.stdout
    assert not (tmp_path / ".venv").exists()


def test_the_repository_tracks_no_packages_or_large_binaries():
    """Data is generated or read from installed packages; fixtures stay small (the old release's
    runs, under 1 MB each); no wheel, archive or compiled object is committed."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    names = [n.decode() for n in tracked if n]
    packed = (".whl", ".tar.gz", ".zip", ".egg", ".so", ".pyd", ".dll", ".pt", ".bin", ".npy")
    assert [n for n in names if n.endswith(packed)] == []
    large = [n for n in names if (ROOT / n).is_file() and (ROOT / n).stat().st_size > 1 << 20]
    assert large == []
