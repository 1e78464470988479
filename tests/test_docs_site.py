"""Issue 32: the documentation site builds offline and strict.

``mkdocs build --strict`` fails on any warning: a broken link or anchor between pages, an image
that is not there, an API reference (mkdocstrings) that does not resolve, a docstring griffe
cannot read. Built here from a copy of ``docs/`` with the notebook pages rendered without
executing them (``tests/test_notebooks.py`` executes them; ``make docs`` does both in full).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("notebook_render", ROOT / "notebooks" / "render.py")
render = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(render)


@pytest.mark.slow  # about 10 s: mkdocstrings reads every documented module
def test_the_site_builds_strict_with_every_page_and_api_reference(tmp_path):
    pytest.importorskip(
        "mkdocs", reason="the docs extra is not installed (pip install -e '.[docs]')"
    )
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs, ignore=shutil.ignore_patterns("notebooks"))
    assert render.main(["--no-execute", "--out", str(docs / "notebooks")]) == 0
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    config["docs_dir"], config["site_dir"] = str(docs), str(tmp_path / "site")
    for plugin in config["plugins"]:
        if isinstance(plugin, dict) and "mkdocstrings" in plugin:
            plugin["mkdocstrings"]["handlers"]["python"]["paths"] = [str(ROOT / "src")]
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "-q",
            "-f",
            str(tmp_path / "mkdocs.yml"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    site = tmp_path / "site"
    for page in ["index.html", "lecture.html", "notebooks/index.html", "api/attention.html"]:
        assert (site / page).exists(), page
    api = (site / "api" / "attention.html").read_text(encoding="utf-8")
    assert 'id="attnlab.attention.scaled_dot_product_attention"' in api
    for path in render.notebooks():
        assert (site / "notebooks" / f"{path.stem}.html").exists(), path.stem
