"""Issue 18, docs: the ``attnlab`` commands in the fenced blocks of README.md and docs/*.md.

- every command that names no placeholder parses with today's parser (a renamed or mistyped flag
  in the docs fails here);
- within one page, a run directory is written by one kind of command only (``runs/llama`` for an
  LM run and then for ``convert --from-hf`` broke following the README in order);
- the README's cheap commands run in order, as a newcomer types them, with short budgets
  (``--steps 2``), in a fresh directory, globs expanded as a shell would: the explorer for every
  family, the Hugging Face export and its round trip, captions of the whole folder ``attnlab
  scene`` wrote (issue 26). Which ones are cheap: see :func:`_cheap`.
"""

from __future__ import annotations

import glob
import re
import shlex
import time
from pathlib import Path

import pytest

from attnlab.cli import build_parser, main

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: words that stand for something the reader fills in
PLACEHOLDER = re.compile(r"^[A-Z][A-Z_]{1,}$|[|<>]|\.\.\.|…|^\./|path/to|hf-dir|llama-dir")


def commands(page: Path) -> list[str]:
    """The ``attnlab ...`` command lines of the fenced blocks of ``page``, in order (continued
    lines joined, comments dropped, ``a && b`` split)."""
    out, fenced, pending = [], False, ""
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fenced, pending = not fenced, ""
            continue
        if not fenced:
            continue
        line = pending + line.strip()
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        if not words or words[0] != "attnlab":  # (output lines, other programs)
            continue
        parts, current = [], []
        for w in words:  # `a && b`, and two commands side by side in a summary block
            if w in ("&&", ";", "attnlab"):
                parts.append(current)
                current = ["attnlab"] if w == "attnlab" else []
            else:
                current.append(w)
        parts.append(current)
        out += [shlex.join(p) for p in parts if len(p) > 1 and p[0] == "attnlab"]
    return out


def _concrete(line: str) -> bool:
    return not any(PLACEHOLDER.search(w) for w in shlex.split(line)[1:])


def test_the_pages_have_commands():
    assert len(commands(ROOT / "README.md")) >= 20


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_documented_command_parses(page):
    parser = build_parser()
    bad = []
    for line in filter(_concrete, commands(page)):
        try:
            parser.parse_args(shlex.split(line)[1:])
        except SystemExit:
            bad.append(line)
    assert not bad, f"{page.name}: commands today's parser rejects: {bad}"


def _writer(words: list[str]) -> str | None:
    """What kind of command writes the ``--out`` of ``words``: ``train lm``, ``convert`` ..."""
    if "--out" not in words[:-1] or len(words) < 3:
        return None
    return " ".join(words[1:3]) if words[1] == "train" else words[1]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_a_run_directory_is_written_by_one_kind_of_command(page):
    writers: dict[str, set[str]] = {}
    for line in commands(page):
        words = shlex.split(line)
        who = _writer(words)
        if who is not None and who != "experiment":
            writers.setdefault(words[words.index("--out") + 1].rstrip("/"), set()).add(who)
    clashes = {out: sorted(w) for out, w in writers.items() if len(w) > 1}
    assert not clashes, f"{page.name}: one directory, different runs: {clashes}"


# ---- running the README -----------------------------------------------------------------------

#: commands that take minutes or are the benchmark/experiment/demo suites, each tested on its
#: own (a Hugging Face folder from outside is a placeholder, ``./llama-dir``)
_EXPENSIVE = ("bench", "experiment", "demo")


def _cheap(words: list[str]) -> bool:
    """Whether a README command runs here: no placeholder, not expensive, not a long context,
    not the consolidation of a run that ``torchrun`` would have written."""
    return words[1] not in _EXPENSIVE and "4096" not in words and "--consolidate" not in words


def _expand(words: list[str]) -> list[str]:
    """Globs expanded as a shell expands them (``scenes/scene_*.png``), in sorted order."""
    out: list[str] = []
    for w in words:
        out += sorted(glob.glob(w)) or [w] if "*" in w else [w]
    return out


def _short(words: list[str]) -> list[str]:
    """A training command with a short budget: ``--steps 2`` instead of its length, one
    validation batch, a small slice of the LM corpora; other commands as written."""
    if words[1] != "train":
        return words
    if "--resume" in words:  # as typed: the run's own length
        return [*words, "--no-progress"]
    out, skip = [], False
    for w in words:
        if skip:
            skip = False
        elif w in ("--steps", "--max-time"):
            skip = True
        else:
            out.append(w)
    out += ["--steps", "2", "--eval-batches", "1", "--no-progress"]
    prepared = "--data" in words and Path(words[words.index("--data") + 1]).is_dir()
    if words[2] in ("lm", "mlm") and not prepared:  # (a prepared corpus is already cut)
        out += ["--max-chars", "30000"]
    if words[2] in ("caption", "vqa"):
        out += ["--n-train", "40", "--n-val", "16"]
    if words[2] == "clip":  # (a batch holds distinct scenes: at least its 64)
        out += ["--n-train", "80", "--n-val", "16"]
    if words[2] == "translate":
        out += ["--n-examples", "500"]
    return out


@pytest.mark.slow
def test_the_readme_runs_in_order(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    ran, skipped = [], set()
    for line in commands(ROOT / "README.md"):
        words = shlex.split(line)
        if not (_concrete(line) and _cheap(words)) or skipped & set(words):  # (or reads its run)
            if "--out" in words:
                skipped.add(words[words.index("--out") + 1])
            continue
        t0 = time.perf_counter()
        rc = main(_expand(_short(words))[1:])
        print(f"{time.perf_counter() - t0:6.1f} s  {shlex.join(_short(words))}")
        assert rc == 0, f"README command failed: {line}"
        ran.append(words[1:])
    firsts = [w[0] for w in ran]
    assert ["train", "lm"] in [w[:2] for w in ran] and ["train", "image"] in [w[:2] for w in ran]
    assert "classify" in firsts
    # issue 26: the explorer for every family, the export round trip, a folder of captions
    explored = {w[1] for w in ran if w[0] == "explore"}
    assert {"runs/explore-lm", "runs/de", "runs/vit", "runs/cap", "runs/vqa"} <= explored
    assert ["convert", "--to-hf", "runs/tiny", "--out", "exported"] in ran
    assert any(w[:2] == ["generate", "--from-hf"] for w in ran)
    assert ["eval", "runs/tiny-back"] in ran
    assert ["caption", "runs/cap", "scenes/scene_*.png"] in ran
    assert any(p.endswith("_x8.png") for p in glob.glob("scenes/scene_*.png"))
