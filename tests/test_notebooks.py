"""Issue 32: the lecture notebooks (``notebooks/NN_name.py``, jupytext percent scripts) execute.

Each is converted with jupytext and run by nbclient in a fresh ``python3`` kernel in its quick
setting (``ATTNLAB_QUICK=1``: budgets of seconds), one thread like every test worker. A notebook
asserts what it teaches (a number it computes against the formula it shows), so a cell that
raises fails here; and each must end with a picture.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("notebook_render", ROOT / "notebooks" / "render.py")
render = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(render)

NOTEBOOKS = render.notebooks()


def test_there_are_eight_notebooks_and_the_index_lists_each():
    assert len(NOTEBOOKS) == 8, [p.name for p in NOTEBOOKS]
    index = (ROOT / "notebooks" / "README.md").read_text(encoding="utf-8")
    for path in NOTEBOOKS:
        assert f"]({path.name})" in index, path.name


@pytest.mark.slow  # a fresh kernel each, 5-20 s: make test runs them, make test-fast does not
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_quickly_and_ends_with_a_picture(path, monkeypatch, tmp_path):
    monkeypatch.setenv(render.QUICK_ENV, "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])
    )
    nb = render.execute(path, timeout=300)
    code = [c for c in nb.cells if c.cell_type == "code"]
    errors = [o for c in code for o in c.outputs if o.output_type == "error"]
    assert not errors
    last = code[-1].outputs
    assert any("image/png" in o.get("data", {}) for o in last), "the last cell draws no picture"
    render.render(nb, path.stem, tmp_path)  # the page the site shows
    page = (tmp_path / f"{path.stem}.md").read_text(encoding="utf-8")
    assert f"({path.stem}_files/" in page and (tmp_path / f"{path.stem}.ipynb").exists()
