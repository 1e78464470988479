"""The shape of the codebase: layers that point one way, no import cycles, files of one job."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "attnlab"


def test_import_layer_contract_holds():
    """`lint-imports` (import-linter, configured in pyproject.toml) finds no upward import,
    counting imports inside functions."""
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "from importlinter.cli import lint_imports_command; lint_imports_command()",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    modules = sorted(graph.modules)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.find_modules_directly_imported_by(v)):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for m in modules:
        if m not in index:
            visit(m)
    return out


def test_no_import_cycle_between_modules():
    graph = grimp.build_graph("attnlab")
    assert _cycles(graph) == []


def test_cycle_finder_finds_a_cycle():
    g = grimp.ImportGraph()
    for m in ("p", "p.a", "p.b", "p.c"):
        g.add_module(m)
    g.add_import(importer="p.a", imported="p.b")
    g.add_import(importer="p.b", imported="p.a")
    g.add_import(importer="p.c", imported="p.a")
    assert _cycles(g) == [["p.a", "p.b"]]


def test_no_source_file_over_600_lines():
    long = {
        str(p.relative_to(SRC)): n
        for p in SRC.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 600
    }
    assert long == {}


def _imports_in_functions(path: Path) -> list[tuple[int, int]]:
    """``(first line, last line)`` of each import inside a function or method of ``path``."""
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append((child.lineno, child.end_lineno or child.lineno))
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            visit(child, inner)

    visit(ast.parse(path.read_text()), False)
    return found


def test_imports_inside_functions_are_few_and_say_why():
    """Imports sit at the top (ruff's PLC0415); the few inside a function (heavy or optional:
    matplotlib, sacrebleu, torch.distributed.checkpoint, the kernel build...) carry a comment
    on their line or the line above (commands/ included: it has none)."""
    unexplained, count = [], 0
    for path in sorted(SRC.rglob("*.py")):
        lines = path.read_text().splitlines()
        found = _imports_in_functions(path)
        starts = {last: first for first, last in found}  # a group of imports shares one comment
        for first, last in found:
            count += 1
            said = any("#" in lines[i - 1] for i in range(first, last + 1))
            above = first - 1
            while above in starts or lines[above - 1].strip() in ("try:", "except ImportError:"):
                above = starts.get(above, above) - 1
            if not (said or lines[above - 1].strip().startswith("#")):
                unexplained.append(f"{path.relative_to(SRC)}:{first}")
    assert unexplained == []
    assert count <= 40


def test_the_in_function_import_finder_sees_nested_imports(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("import os\n\ndef f():\n    def g():\n        import json\n    import re\n")
    assert _imports_in_functions(src) == [(5, 5), (6, 6)]


def _gpt_path_module():
    spec = importlib.util.spec_from_file_location("gpt_path", ROOT / "benchmarks" / "gpt_path.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_gpt_reads_in_a_handful_of_files():
    """``benchmarks/gpt_path.py`` traces the gpt2-mini preset's config, build and forward with
    sys.settrace: the files a reader follows stay at most 8 (13 before the hook points and the
    captures shared a module, 12 before the norms, FFNs and absolute positions joined the block
    and ``BlockConfig`` the config base), and the trace sees the files the GPT is known to run through."""
    files = _gpt_path_module().gpt_path()
    for known in ("models/lm.py", "attention/core.py", "layers/block.py", "config/base.py"):
        lines = len((SRC / known).read_text().splitlines())
        assert files["attnlab/" + known] == lines  # each file counted whole
    assert "attnlab/attention/capture.py" not in files  # a re-export: nothing of it runs
    assert len(files) <= 8, files
