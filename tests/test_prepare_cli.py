"""``attnlab prepare``: an interrupted preparation resumes to identical shards; ``train lm --data
DIR`` reads a prepared directory; data-parallel ranks read disjoint windows of one global batch."""

from pathlib import Path

import numpy as np
import pytest
import torch

from attnlab.cli import main
from attnlab.config import LMTaskConfig
from attnlab.data import shards
from attnlab.data.prepare import open_prepared, prepare_corpus
from attnlab.errors import UserError
from attnlab.tasks.lm import LMTask


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def corpus(tmp_path) -> Path:
    d = tmp_path / "corpus"
    d.mkdir()
    for i in range(6):
        lines = [f"def f{i}_{j}(x):\n    return x * {j}  # Größe {i}\n" for j in range(120)]
        (d / f"part{i}.py").write_text("".join(lines), encoding="utf-8")
    (d / "image.bin").write_bytes(b"\x89PNG\x00\x00")
    return d


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.name != "manifest.json"}


def _prepare_args(corpus: Path, out: Path) -> list[str]:
    return ["prepare", "--data", str(corpus), "--tokenizer", "bpe", "--vocab-size", "300",
            "--shard-tokens", "3000", "--no-progress", "--out", str(out)]  # fmt: skip


def test_interrupted_prepare_resumes_to_identical_shards(tmp_path, corpus, monkeypatch, capsys):
    """Stopped as its second shard is about to be complete (as a Ctrl-C there would), with the
    half-written shard left behind, ``attnlab prepare`` run again skips the files done and ends with the shards and
    manifest of an uninterrupted run."""
    assert main(_prepare_args(corpus, tmp_path / "whole")) == 0
    commit = shards.ShardWriter.commit
    calls = []

    def interrupted(self):
        calls.append(1)
        if len(calls) == 2:  # the first shard and the manifest are written; the second is half
            raise KeyboardInterrupt
        return commit(self)

    monkeypatch.setattr(shards.ShardWriter, "commit", interrupted)
    assert main(_prepare_args(corpus, tmp_path / "resumed")) != 0  # "attnlab: interrupted"
    monkeypatch.undo()
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    with pytest.raises(UserError, match="interrupted"):
        open_prepared(tmp_path / "resumed")
    capsys.readouterr()
    assert main(_prepare_args(corpus, tmp_path / "resumed")) == 0
    out = capsys.readouterr()
    assert (
        "resumed: 3 document(s)" in out.err
    )  # image.bin (skipped), part0, part1 and "skipped: 1 binary" in out.out
    whole, resumed = open_prepared(tmp_path / "whole"), open_prepared(tmp_path / "resumed")
    assert len(whole.manifest["shards"]) > 2
    assert _files(tmp_path / "whole") == _files(tmp_path / "resumed")
    assert whole.manifest == resumed.manifest
    assert main(_prepare_args(corpus, tmp_path / "resumed")) == 0  # done: nothing to do
    assert "already prepared" in capsys.readouterr().err


def _fails(args: list[str], capsys, message: str) -> None:
    capsys.readouterr()
    assert main(args) == 2
    assert message in capsys.readouterr().err


def test_prepare_refuses_other_settings_and_foreign_directories(tmp_path, corpus, capsys):
    assert main(_prepare_args(corpus, tmp_path / "p")) == 0
    args = _prepare_args(corpus, tmp_path / "p")
    args[args.index("300")] = "320"
    _fails(args, capsys, "holds a preparation with other settings (tokenizer)")
    assert main([*args, "--overwrite"]) == 0
    assert open_prepared(tmp_path / "p").tokenizer.vocab_size == 320
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "x.txt").write_text("mine")
    _fails(_prepare_args(corpus, tmp_path / "notes"), capsys, "not an empty directory")


def test_train_lm_reads_a_prepared_directory(tmp_path, corpus, capsys):
    assert main(_prepare_args(corpus, tmp_path / "p")) == 0
    run = ["train", "lm", "--data", str(tmp_path / "p"), "--steps", "2", "--seq-len", "16",
           "--batch-size", "4", "--eval-batches", "1", "--no-progress", "--device", "cpu"]  # fmt: skip
    assert main([*run, "--out", str(tmp_path / "run")]) == 0
    assert "files skipped: 1 binary" in capsys.readouterr().err
    _fails([*run, "--tokenizer", "char", "--out", str(tmp_path / "r2")], capsys, "prepared with")
    _fails([*run, "--max-chars", "9", "--out", str(tmp_path / "r3")], capsys, "--max-chars applies")
    assert main(["eval", str(tmp_path / "run")]) == 0


class _Recording:
    """Token ids that remember which positions were read."""

    def __init__(self, ids):
        self.ids, self.read = ids, set()

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, index):
        self.read |= set(np.asarray(index).ravel().tolist())
        return self.ids[index]


def test_two_ranks_read_disjoint_windows_of_the_global_batch(tmp_path, corpus):
    """Rank 0 and rank 1 of 2 get the two halves of global batch ``step`` (over several shards,
    held out by blocks), and each reads from disk only the ids of its own windows."""
    prepare_corpus(str(corpus), tmp_path / "p", kind="char", shard_tokens=5000)
    prepared = open_prepared(tmp_path / "p")
    assert len(prepared.manifest["shards"]) > 2
    cfg = LMTaskConfig(data=str(tmp_path / "p"), seq_len=16, seed=3, val_block=2048)
    T = 16
    for step in range(3):
        full = LMTask.build(cfg).get_batch("train", step, 8)[0]
        reads, parts = [], []
        for rank in range(2):
            task = LMTask.build(cfg)
            recorder = _Recording(task.ids)
            for split in task.splits.values():
                split.ids = recorder
            x, y = task.get_batch("train", step, 8, rank=rank, world=2)
            parts.append(x)
            reads.append(recorder.read)
            assert x.shape == (4, T) and torch.equal(x[:, 1:], y[:, :-1])
        assert torch.equal(torch.cat(parts), full)
        for rank in range(2):  # exactly its windows: T + 1 positions per window
            split = LMTask.build(cfg).splits["train"]
            rng = np.random.default_rng([3, 0, step])
            starts = rng.integers(0, len(split) - T, size=8)[rank * 4 : (rank + 1) * 4]
            want = split.positions(starts[:, None] + np.arange(T + 1)).ravel()
            assert reads[rank] == set(want.tolist())
