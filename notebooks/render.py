"""Execute the lecture notebooks and render them into the documentation site.

    python notebooks/render.py                        # every notebook, in full, into docs/notebooks/
    python notebooks/render.py --quick                # ATTNLAB_QUICK=1: budgets of seconds
    python notebooks/render.py --no-execute --out DIR # the pages without outputs (the site's test)
    python notebooks/render.py 04_gpt                 # only the notebooks whose names start so

Each ``notebooks/NN_name.py`` (a jupytext percent script, the reviewed source) becomes
``OUT/NN_name.ipynb`` (with its outputs) and ``OUT/NN_name.md``, the site's page: markdown cells as
they are, code cells as fenced blocks, text outputs as text blocks, pictures as PNG files beside
the page, HTML outputs (the inline explorer) as they are. ``notebooks/README.md`` becomes
``OUT/index.md``. The kernel runs in the repository's root with this process's environment.
"""

from __future__ import annotations

import argparse
import base64
import os
import re
import shutil
import sys
import time
from pathlib import Path

import jupytext
import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
QUICK_ENV = "ATTNLAB_QUICK"  # "1": every notebook shrinks its budgets to seconds
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def notebooks(prefixes: list[str] | None = None) -> list[Path]:
    """The notebooks' sources, in order (``NN_name.py``), optionally only those named by prefix."""
    found = sorted(p for p in HERE.glob("[0-9][0-9]_*.py"))
    if prefixes:
        found = [p for p in found if any(p.stem.startswith(x) for x in prefixes)]
    return found


def execute(path: Path, *, timeout: int = 600) -> nbformat.NotebookNode:
    """Read a percent script and run it in a fresh ``python3`` kernel; returns the notebook."""
    nb = jupytext.read(path)
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    # every cell has run and its outputs are in: the kernel is killed, not asked to shut down
    # (a graceful shutdown of a kernel holding torch took ~2.5 s of the notebook's ~10)
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        shutdown_kernel="immediate",
        resources={"metadata": {"path": str(ROOT)}},
    )
    client.execute()
    return nb


def _text(x: str | list[str]) -> str:
    return ANSI.sub("", "".join(x) if isinstance(x, list) else x)


def _fence(body: str, lang: str = "text") -> str:
    return f"```{lang}\n{body.rstrip()}\n```\n"


def to_markdown(nb: nbformat.NotebookNode, name: str, out: Path) -> str:
    """The page for one notebook; its pictures are written to ``out/name_files/``."""
    parts = [f"[Download the notebook]({name}.ipynb) · source: `notebooks/{name}.py`\n"]
    n_images = 0
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            parts.append(_text(cell.source) + "\n")
            continue
        if cell.cell_type != "code" or not cell.source.strip():
            continue
        parts.append(_fence(cell.source, "python"))
        for output in cell.get("outputs", []):
            kind = output.output_type
            if kind == "stream":
                parts.append(_fence(_text(output.text)))
            elif kind == "error":
                parts.append(_fence(_text("\n".join(output.traceback))))
            elif kind in ("display_data", "execute_result"):
                data = output.data
                if "image/png" in data:
                    n_images += 1
                    files = out / f"{name}_files"
                    files.mkdir(parents=True, exist_ok=True)
                    png = f"{name}_{n_images}.png"
                    (files / png).write_bytes(base64.b64decode(data["image/png"]))
                    parts.append(f"![output {n_images}]({name}_files/{png})\n")
                elif "text/html" in data:
                    # one line: a blank line inside would end Markdown's raw-HTML block
                    parts.append(
                        '<div markdown="0">'
                        + _text(data["text/html"]).replace("\n", "&#10;")
                        + "</div>\n"
                    )
                elif "text/plain" in data:
                    parts.append(_fence(_text(data["text/plain"])))
    return "\n".join(parts)


def render(nb: nbformat.NotebookNode, name: str, out: Path) -> None:
    """Write ``out/name.ipynb`` and ``out/name.md``."""
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out / f"{name}_files", ignore_errors=True)
    nbformat.write(nb, out / f"{name}.ipynb")
    (out / f"{name}.md").write_text(to_markdown(nb, name, out), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="only the notebooks whose names start so")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "notebooks")
    parser.add_argument("--quick", action="store_true", help=f"set {QUICK_ENV}=1")
    parser.add_argument("--no-execute", action="store_true", help="the pages without outputs")
    args = parser.parse_args(argv)
    if args.quick:
        os.environ[QUICK_ENV] = "1"
    args.out.mkdir(parents=True, exist_ok=True)
    # the README links the sources (NN_name.py), the site the pages (NN_name.md)
    index = re.sub(r"\]\((\d\d_\w+)\.py\)", r"](\1.md)", (HERE / "README.md").read_text())
    (args.out / "index.md").write_text(index, encoding="utf-8")
    for path in notebooks(args.names):
        start = time.perf_counter()
        nb = jupytext.read(path) if args.no_execute else execute(path)
        render(nb, path.stem, args.out)
        print(f"{path.name}: {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
