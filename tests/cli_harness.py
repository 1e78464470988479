"""Run ``attnlab`` in this process and check what a hostile invocation may do.

Used by ``tests/test_cli_properties.py``. :func:`invoke` runs ``attnlab.cli.main(argv)`` the way a
shell would (own working directory, stdout, stderr, logging and warnings going to stderr, ``HOME``
and the cache in a sandbox), but without training: the first optimizer step raises
:class:`ReachedTraining` instead. A command whose settings were accepted therefore ends with
``status == "trained"`` after every check it makes before training (run directory, lock,
config.json written), and one that refuses them ends with exit status 2 before that.

:func:`check_refused` states what a refusal must look like: exit status 2, no traceback, and on
stderr exactly one ``attnlab: error: ...`` line (a usage error found by argparse too:
``attnlab: error: unknown flag --stesp (did you mean --steps?)``).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import logging
import os
import re
import sys
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import attnlab.cli as _cli
import attnlab.train.trainer as _trainer
from attnlab.cli import build_parser, main


class ReachedTraining(BaseException):
    """Raised instead of the first training step (a BaseException: the CLI must not catch it)."""


def _no_training(self) -> None:
    raise ReachedTraining(str(self.run_dir))


def _no_work(*args, **kwargs) -> None:
    raise ReachedTraining("work")


# long work that is not a training loop, stopped where it would start: (module, attribute)
_WORK = [
    ("attnlab.experiments.attention_bench", "run_benchmark"),
    ("attnlab.experiments.attention_bench", "block_memory"),
    ("attnlab.explore", "make_server"),
    ("attnlab.experiments.scene_runs", "pretrain_encoder"),  # (train caption --pretrain-steps)
    ("attnlab.experiments.caption_features", "pretrain_encoder"),
    ("attnlab.experiments.long_context", "train_xl"),  # (their own loops, not the trainer's)
    ("attnlab.experiments.adaptive_computation", "train_parity"),
    ("attnlab.experiments.induction", "train_induction"),
    ("attnlab.experiments.ablations", "train_variant"),
    ("attnlab.experiments.sequence_primitives", "train_recall"),
    ("attnlab.experiments.swin_cost", "measure_costs"),  # (builds and times, no training)
]


# One parser for every invocation: building it (some 900 flags) took ~80 ms, as long as many a
# refused invocation, and the property tests make hundreds. Parsing leaves it as it was (each
# call fills a new namespace; no attnlab action or command keeps state on it).
_PARSERS: list = []


def _parser():
    if not _PARSERS:
        _PARSERS.append(build_parser())
    return _PARSERS[0]


@dataclass
class Outcome:
    """What one invocation did: ``status`` is the exit status or ``"trained"``."""

    argv: list[str]
    status: int | str
    out: str
    err: str
    changes: dict[str, list[str]] = field(default_factory=dict)  # area -> changed paths

    def __str__(self) -> str:
        return (
            f"attnlab {' '.join(map(repr, self.argv))}\n-> status {self.status!r}\n"
            f"-- stderr --\n{self.err[-3000:]}\n-- stdout --\n{self.out[-1500:]}\n"
            f"-- changed files -- {self.changes}"
        )


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every file and directory under ``root`` with its size and modification time."""
    files = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            with contextlib.suppress(OSError):
                st = path.lstat()
                files[str(path.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return files


def changed(before: dict, after: dict) -> list[str]:
    """Paths created, deleted or modified between two snapshots."""
    return sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))


@contextlib.contextmanager
def _sandbox(cwd: Path, home: Path, cache: Path, err: io.StringIO) -> Iterator[None]:
    """chdir, HOME, the cache, stderr for logging and warnings; training stubbed out."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    shown = logging.StreamHandler(err)  # what the CLI's logging.basicConfig would print
    shown.setLevel(logging.WARNING)
    shown.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root.addHandler(shown)
    env = {"HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"), "ATTNLAB_CACHE": str(cache)}
    saved_env = {k: os.environ.get(k) for k in env}
    run, parser = _trainer._Loop.run, _cli.build_parser
    work = [(importlib.import_module(m), name) for m, name in _WORK]
    saved_work = [getattr(m, name) for m, name in work]
    try:
        os.environ.update(env)
        _trainer._Loop.run = _no_training
        _cli.build_parser = _parser
        for m, name in work:
            setattr(m, name, _no_work)
        with contextlib.chdir(cwd), warnings.catch_warnings():
            warnings.simplefilter("default")
            warnings.filterwarnings("ignore", category=DeprecationWarning)
            warnings.showwarning = lambda msg, cat, fname, lineno, file=None, line=None: err.write(
                warnings.formatwarning(msg, cat, fname, lineno, line)
            )
            yield
    finally:
        _trainer._Loop.run, _cli.build_parser = run, parser
        for (m, name), saved in zip(work, saved_work, strict=True):
            setattr(m, name, saved)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        for h in list(root.handlers):
            if h not in handlers:
                root.removeHandler(h)
        root.setLevel(level)


def invoke(argv: Sequence[str], cwd: Path, *, stdin: str = "") -> Outcome:
    """Run ``attnlab *argv`` in ``cwd``; record exit status, output and changed files.

    ``cwd/../home`` and ``cwd/../cache`` serve as ``HOME`` and ``ATTNLAB_CACHE``; the changes in
    the three areas come back in ``Outcome.changes`` (``"cwd"``, ``"home"``, ``"cache"``).
    """
    argv = [str(a) for a in argv]
    home, cache = cwd.parent / "home", cwd.parent / "cache"
    for d in (home, cache):
        d.mkdir(exist_ok=True)
    areas = {"cwd": cwd, "home": home, "cache": cache}
    before = {name: snapshot(path) for name, path in areas.items()}
    out, err = io.StringIO(), io.StringIO()
    old_stdin = sys.stdin
    try:
        sys.stdin = io.StringIO(stdin)
        with _sandbox(cwd, home, cache, err):
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    status: int | str = main(argv)
                except SystemExit as exit_:  # argparse
                    status = exit_.code if isinstance(exit_.code, int) else 1
                except ReachedTraining:
                    status = "trained"
    finally:
        sys.stdin = old_stdin
    after = {name: snapshot(path) for name, path in areas.items()}
    changes = {name: changed(before[name], after[name]) for name in areas}
    return Outcome(argv, status, out.getvalue(), err.getvalue(), changes)


_CORPORA = ("prepared", "tokenizers")  # the cache's prepared corpora and their tokenizers
# a progress bar (tqdm: "reading characters: 0.00B [00:00, ?B/s]") is not a message
_PROGRESS = re.compile(r"\[\d+:\d\d(:\d\d)?[,<\]]")


def check_refused(outcome: Outcome, *, writes: Sequence[str] = ()) -> None:
    """Exit status 2 with one clear line, and nothing written outside ``writes``.

    ``writes`` are the paths the command was asked to write (``--out``), relative to the working
    directory: a refusal found while writing there may leave files in them. ``HOME`` must be as
    it was; the cache may only have gained corpora prepared before the refusal (a corpus too
    short for the settings is found once it is tokenized: it stays, ready for the next try).

    Raises:
        AssertionError: naming the invocation and what it did.
    """
    assert outcome.status == 2, f"expected exit status 2\n{outcome}"
    assert "Traceback" not in outcome.err, f"a traceback\n{outcome}"
    lines = [
        line for line in outcome.err.splitlines() if line.strip() and not _PROGRESS.search(line)
    ]
    # (argparse's usage errors too: every attnlab parser prints them as one line, issue 26)
    assert len(lines) == 1, f"expected exactly one line on stderr\n{outcome}"
    assert lines[0].startswith("attnlab: error: "), f"not an 'attnlab: error:' line\n{outcome}"
    _check_writes(outcome, writes, cache=False)


def _check_writes(outcome: Outcome, writes: Sequence[str], *, cache: bool) -> None:
    allowed = [Path(w) for w in writes]
    stray = [
        p
        for p in outcome.changes["cwd"]
        if not any(Path(p) == a or a in Path(p).parents for a in allowed)
    ]
    assert not stray, f"files written outside {list(writes)}: {stray}\n{outcome}"
    assert not outcome.changes["home"], f"files written in HOME\n{outcome}"
    if not cache:
        other = [p for p in outcome.changes["cache"] if Path(p).parts[0] not in _CORPORA]
        assert not other, f"a refused command changed the cache: {other}\n{outcome}"


def check_accepted(outcome: Outcome, *, writes: Sequence[str] = ()) -> None:
    """Exit status 0 (or training reached), no traceback, files changed only under ``writes``.

    ``writes`` are paths relative to the working directory (``--out`` and the like); the cache
    may change (prepared corpora), ``HOME`` may not.
    """
    assert outcome.status in (0, "trained"), f"expected success\n{outcome}"
    assert "Traceback" not in outcome.err, f"a traceback\n{outcome}"
    _check_writes(outcome, writes, cache=True)
