"""``attnlab train lm --arch transformer-xl``: streamed batches, memory kept by the task, exact
resume, evaluation and generation with memory (:mod:`attnlab.tasks.lm_xl`)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import attnlab
from attnlab.cli import main
from attnlab.errors import UserError
from attnlab.runs import build_run, resolve
from attnlab.tasks.lm_xl import XLTask
from attnlab.tasks.losses import cross_entropy
from attnlab.train import train

_FLAGS = {
    "kind": "transformer_xl",
    "model.preset": "tiny",
    "task.seq_len": 8,
    "task.max_chars": 6000,
    "train.steps": 6,
    "train.batch_size": 4,
    "train.eval_every": 3,
    "train.eval_batches": 1,
    "train.warmup_steps": 1,
    "train.progress": False,
}


def _run(out, *, stop=None, resume=False, mem_len=24):
    spec = resolve(None, _FLAGS, [f"model.mem_len={mem_len}"], family="lm")
    model, task = build_run(spec)
    return train(model, task, spec.train, out, resume=resume, overwrite=not resume, stop_after=stop)


def test_train_lm_transformer_xl_cli_then_eval_load_generate(tmp_path, capsys):
    run = tmp_path / "xl"
    args = ["train", "lm", "--arch", "transformer-xl", "--preset", "tiny", "--seq-len", "16"]
    args += ["--max-chars", "6000", "--steps", "3", "--batch-size", "4", "--eval-batches", "1"]
    assert main([*args, "--set", "mem_len=16", "--no-progress", "--out", str(run)]) == 0
    model, tok = attnlab.load(run)
    assert model.kind == "transformer_xl"
    assert (model.config.mem_len, model.config.max_seq_len) == (16, 32)  # seq_len + mem_len
    capsys.readouterr()
    assert main(["eval", str(run), "--batch-size", "4"]) == 0
    assert "val loss" in capsys.readouterr().out
    assert main(["generate", str(run), "--prompt", "def ", "-n", "5", "--temperature", "0"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("def ") and len(text.rstrip("\n")) > len("def ")


def test_streamed_batches_continue_each_row():
    spec = resolve(None, _FLAGS, ["model.mem_len=8"], family="lm")
    _, task = build_run(spec)
    assert isinstance(task, XLTask)
    B, T = 4, task.seq_len
    n_seg = task.segments("train", B)
    batches = [task.get_batch("train", s, B) for s in range(n_seg + 1)]
    split = np.asarray(task.splits["train"][: len(task.splits["train"])], dtype=np.int64)
    n = len(split) // B
    for r in range(B):  # row r read in order is the r-th contiguous slice of the split
        read = torch.cat([b[0][r] for b in batches[:n_seg]]).numpy()
        np.testing.assert_array_equal(read, split[r * n : r * n + n_seg * T])
        for s in range(n_seg - 1):  # the next segment starts where this one's targets end
            assert batches[s + 1][0][r, 0] == batches[s][1][r, -1]
    assert [b[3] for b in batches] == [True] + [False] * (n_seg - 1) + [True]  # wraps at n_seg
    idx, targets, _, _ = task.get_batch("train", 1, B, rank=1, world=2)  # a rank's rows
    assert torch.equal(idx, batches[1][0][2:]) and torch.equal(targets, batches[1][1][2:])


@torch.no_grad()
def test_memory_reading_equals_one_pass_over_the_concatenated_context():
    """Eval (and the trainer's validation) read the held-out streams with memory: with a memory
    as long as what came before, that is one causal pass over the concatenation."""
    spec = resolve(None, _FLAGS, ["model.mem_len=24"], family="lm")
    model, task = build_run(spec)  # seq_len 8, mem_len 24, max_seq_len 32
    model.eval()
    rows = task.stream_rows("val", 2)[:, :25]
    whole = cross_entropy(model(rows[:, :24]).out, rows[:, 1:25])
    res = task.val_loss(model, batch_size=2, n_batches=3)
    assert res["tokens"] == 2 * 24
    assert res["loss"] == pytest.approx(float(whole), abs=1e-5)
    losses = [float(task.loss(model, b)[0]) for b in task.eval_batches(2, 3)]
    assert np.mean(losses) == pytest.approx(float(whole), abs=1e-5)
    first = float(task.loss(model, next(iter(task.eval_batches(2, 3))))[0])  # memory reset
    assert first == pytest.approx(losses[0], abs=1e-6)


def test_resume_continues_exactly_with_the_saved_memory(tmp_path, monkeypatch):
    _run(tmp_path / "a")
    _run(tmp_path / "b", stop=2)  # mid-stream: the next step needs step 2's memory
    _run(tmp_path / "b", resume=True)
    a, b = (
        load_file(tmp_path / "a" / "model.safetensors"),
        load_file(tmp_path / "b" / "model.safetensors"),
    )
    assert all(torch.equal(a[k], b[k]) for k in a)
    monkeypatch.setattr(
        "attnlab.train.trainer.restore_task_state", lambda run_dir, task: None
    )  # no memory
    _run(tmp_path / "c", stop=2)
    _run(tmp_path / "c", resume=True)
    c = load_file(tmp_path / "c" / "model.safetensors")
    assert any(not torch.equal(a[k], c[k]) for k in a)  # so the memory carried over matters


@torch.no_grad()
def test_decoding_with_memory_equals_the_concatenated_forward():
    """generate's path: the prompt fills the memory, then one token per step after it."""
    spec = resolve(None, _FLAGS, ["model.mem_len=24"], family="lm")
    model, _ = build_run(spec)
    model.eval()
    ids = torch.randint(0, model.config.vocab_size, (2, 20))
    state = model.start_decoding(2)
    logits, state = model.decode_step(ids[:, :18], state)  # segments of 8, 8, 2
    torch.testing.assert_close(logits, model(ids[:, :18]).out[:, -1], atol=1e-5, rtol=1e-5)
    for t in (18, 19):
        logits, state = model.decode_step(ids[:, t : t + 1], state)
        torch.testing.assert_close(logits, model(ids[:, : t + 1]).out[:, -1], atol=1e-5, rtol=1e-5)


def test_memory_too_long_for_max_seq_len_is_refused():
    with pytest.raises(UserError, match=r"mem_len=48 is too long.*max_seq_len=40"):
        resolve(None, {**_FLAGS, "task.seq_len": 32}, ["model.mem_len=48", "max_seq_len=40"])


def test_a_runs_config_with_a_longer_memory_derives_max_seq_len_again(tmp_path):
    run = tmp_path / "xl"
    _run(run, stop=1, mem_len=8)  # seq_len 8 + mem_len 8: max_seq_len 16
    spec = resolve(run / "config.json", {}, ["mem_len=24"], family="lm")
    assert (spec.task.seq_len, spec.model["mem_len"], spec.model["max_seq_len"]) == (8, 24, 32)
