"""The shared trainer on a toy classification task: run directory, resume, divergence, budget.

The toy task and model here (``ToyTask``, ``ToyModel``) are also used by the other
``test_train_*`` files and by the torchrun script of the distributed test.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections import namedtuple
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from torch import nn

from attnlab.errors import RunDirError, UserError
from attnlab.plotting import pyplot
from attnlab.runs import atomic_write_text
from attnlab.train import TrainConfig, TrainingDiverged, cross_entropy, to_device, train
from attnlab.train.checkpoint import save_weights

# ---------------------------------------------------------------------------------------------
# toy model and task


@dataclass
class ToyConfig:
    d_in: int = 8
    d_hidden: int = 16
    n_classes: int = 4
    dropout: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


class ToyModel(nn.Module):
    """Linear -> LayerNorm -> GELU -> Dropout -> Linear: weights, biases and a norm."""

    kind = "toy_mlp"

    def __init__(self, config: ToyConfig):
        super().__init__()
        self.config = config
        self.fc1 = nn.Linear(config.d_in, config.d_hidden)
        self.norm = nn.LayerNorm(config.d_hidden)
        self.drop = nn.Dropout(config.dropout)
        self.fc2 = nn.Linear(config.d_hidden, config.n_classes)

    def forward(self, x):
        return self.fc2(self.drop(torch.nn.functional.gelu(self.norm(self.fc1(x)))))


class ToyTask:
    """Classify x ~ N(0, I) by argmax of a fixed random linear teacher; batches from (seed, step).

    ``nan_at`` poisons the loss of the batch of that micro-step (``step * grad_accum + micro``);
    ``interrupt_at`` raises KeyboardInterrupt when that micro-step's batch is requested; ``delay``
    sleeps per batch. ``evaluate`` draws from every random generator (as a sampling evaluation
    would) and reports the accuracy on a fixed probe set.
    """

    def __init__(
        self,
        seed: int = 0,
        d_in: int = 8,
        n_classes: int = 4,
        nan_at: int | None = None,
        interrupt_at: int | None = None,
        delay: float = 0.0,
    ):
        self.seed, self.d_in, self.n_classes = seed, d_in, n_classes
        self.teacher = torch.randn(d_in, n_classes, generator=torch.Generator().manual_seed(seed))
        self.nan_at, self.interrupt_at, self.delay = nan_at, interrupt_at, delay
        self.saved_to: Path | None = None

    def _make(self, split: str, index: int, n: int):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + (split == "val") * 7919 + index)
        x = torch.randn(n, self.d_in, generator=g)
        y = (x @ self.teacher).argmax(-1)
        return x, y

    def get_batch(self, split, step, batch_size, rank=0, world=1):
        if self.interrupt_at is not None and step == self.interrupt_at:
            raise KeyboardInterrupt
        if self.delay:
            time.sleep(self.delay)
        x, y = self._make(split, step, batch_size)
        share = batch_size // world
        sl = slice(rank * share, (rank + 1) * share)
        poison = torch.tensor(float("nan") if step == self.nan_at else 1.0)
        return {"x": x[sl], "y": y[sl], "poison": poison}

    def loss(self, model, batch, cfg):
        logits = model(batch["x"])
        loss = cross_entropy(logits, batch["y"], label_smoothing=cfg.label_smoothing)
        acc = (logits.argmax(-1) == batch["y"]).float().mean()
        return loss * batch["poison"], {"acc": acc}

    def eval_batches(self, batch_size, n_batches):
        for i in range(n_batches):
            x, y = self._make("val", i, batch_size)
            yield {"x": x, "y": y, "poison": torch.tensor(1.0)}

    def evaluate(self, model):
        torch.rand(3), random.random(), np.random.rand()  # disturb every stream
        x, y = self._make("probe", 0, 64)
        return {"probe_acc": float((model(x).argmax(-1) == y).float().mean())}

    def count(self, batch):
        return len(batch["y"])

    def config_dict(self):
        return {"name": "toy", "seed": self.seed}

    def save_artifacts(self, run_dir):
        self.saved_to = Path(run_dir)
        atomic_write_text(Path(run_dir) / "labels.json", json.dumps(list(range(self.n_classes))))


def make_model(seed: int = 0, dropout: float = 0.0) -> ToyModel:
    torch.manual_seed(seed)
    return ToyModel(ToyConfig(dropout=dropout))


def base_cfg(**kw) -> TrainConfig:
    values = dict(
        steps=12,
        batch_size=16,
        lr=3e-2,
        warmup_steps=3,
        eval_every=6,
        eval_batches=2,
        log_every=1,
        progress=False,
        device="cpu",
    )
    values.update(kw)
    return TrainConfig(**values)


def train_losses(result) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in result.history if "loss" in r]


# ---------------------------------------------------------------------------------------------
# tests


def test_run_directory_contents_and_learning(tmp_path):
    """A run writes config, last/best weights, state, metrics, curve, artifacts; the loss drops."""
    task = ToyTask()
    res = train(make_model(), task, base_cfg(steps=30, eval_every=10), tmp_path / "run")
    d = res.run_dir
    names = sorted(p.name for p in d.iterdir())
    assert names == [
        "best.safetensors",
        "config.json",
        "labels.json",
        "loss.png",
        "metrics.jsonl",
        "model.safetensors",
        "state.pt",
    ]
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["kind"] == "toy_mlp" and cfg["model"] == ToyConfig().to_dict()
    assert cfg["train"]["steps"] == 30 and cfg["task"] == {"name": "toy", "seed": 0}
    records = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
    assert records == res.history
    train_recs = [r for r in records if "loss" in r]
    val_recs = [r for r in records if "val_loss" in r]
    assert [r["step"] for r in train_recs] == list(range(1, 31))
    assert [r["step"] for r in val_recs] == [10, 20, 30]
    assert {"lr", "grad_norm", "acc", "tokens_per_s", "tokens", "elapsed"} <= set(train_recs[0])
    assert {"val_loss", "val_acc", "probe_acc"} <= set(val_recs[0])  # task.evaluate() is logged
    assert train_recs[-1]["tokens"] == 30 * 16
    assert res.steps == 30 and res.val_loss == val_recs[-1]["val_loss"]
    assert res.best_val_loss == min(r["val_loss"] for r in val_recs)
    assert res.val_loss < val_recs[0]["val_loss"] < math.log(4)
    assert (d / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(d.glob(".*"))  # atomic writes leave no temporary files behind


def _interrupted_then_resumed(tmp_path, cfg, interrupt_at, dropout):
    run = tmp_path / "resumed"
    task = ToyTask(interrupt_at=interrupt_at[0] * cfg.grad_accum + interrupt_at[1])
    with pytest.raises(KeyboardInterrupt):
        train(make_model(dropout=dropout), task, cfg, run)
    state = torch.load(run / "state.pt", weights_only=True)
    assert state["progress"]["step"] == interrupt_at[0]  # Ctrl-C saved the completed steps
    model = make_model(seed=123, dropout=dropout)  # different init: the weights must be loaded
    return train(model, ToyTask(), cfg, run, resume=True), model


# (step, micro-batch): at a checkpoint; between checkpoints, mid-step after a forward+backward
@pytest.mark.parametrize("interrupt_at", [(4, 0), (7, 1)])
def test_resume_is_exact(tmp_path, interrupt_at):
    """A run stopped after k steps and resumed gives the same losses, lr and weights as one
    uninterrupted run (cosine schedule, dropout on: optimizer, schedule and RNG are restored)."""
    cfg = base_cfg(steps=12, eval_every=4, grad_accum=2)
    ref_model = make_model(dropout=0.2)
    ref = train(ref_model, ToyTask(), cfg, tmp_path / "ref")
    res, model = _interrupted_then_resumed(tmp_path, cfg, interrupt_at, dropout=0.2)
    got, want = train_losses(res), train_losses(ref)
    assert [s for s, _ in got] == [s for s, _ in want] == list(range(1, 13))
    assert max(abs(a - b) for (_, a), (_, b) in zip(got, want)) <= 1e-6
    lrs = lambda r: [h["lr"] for h in r.history if "loss" in h]  # noqa: E731
    assert lrs(res) == lrs(ref)
    vals = lambda r: [(h["step"], h["val_loss"]) for h in r.history if "val_loss" in h]  # noqa: E731
    assert [s for s, _ in vals(res)] == [4, 8, 12]
    assert max(abs(a[1] - b[1]) for a, b in zip(vals(res), vals(ref))) <= 1e-6
    probe = lambda r: [h["probe_acc"] for h in r.history if "probe_acc" in h]  # noqa: E731
    assert probe(res) == probe(ref)
    for p, q in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-6)
    assert res.steps == 12


def test_n_steps_then_resume_n_steps_equals_2n(tmp_path):
    """steps=N, then resume with steps=2N == steps=2N in one go (a schedule that does not
    depend on the run length: constant after warm-up)."""
    cfg = lambda n: base_cfg(steps=n, schedule="constant", eval_every=5)  # noqa: E731
    ref = train(make_model(dropout=0.2), ToyTask(), cfg(10), tmp_path / "ref")
    train(make_model(dropout=0.2), ToyTask(), cfg(5), tmp_path / "run")
    res = train(make_model(dropout=0.2), ToyTask(), cfg(10), tmp_path / "run", resume=True)
    got, want = train_losses(res), train_losses(ref)
    assert len(got) == 10
    assert max(abs(a - b) for (_, a), (_, b) in zip(got, want)) <= 1e-6
    # resuming a finished run is a no-op that reports it
    again = train(make_model(dropout=0.2), ToyTask(), cfg(10), tmp_path / "run", resume=True)
    assert again.steps == 10 and train_losses(again) == got


def test_stop_after_then_resume_equals_one_run_with_cosine(tmp_path):
    """stop_after=N of a 2N-step cosine run, then resume: the same as 2N steps in one go."""
    cfg = base_cfg(steps=10, eval_every=4)
    ref = train(make_model(dropout=0.2), ToyTask(), cfg, tmp_path / "ref")
    part = train(make_model(dropout=0.2), ToyTask(), cfg, tmp_path / "run", stop_after=5)
    assert part.steps == 5
    res = train(make_model(dropout=0.2), ToyTask(), cfg, tmp_path / "run", resume=True)
    got, want = train_losses(res), train_losses(ref)
    assert len(got) == 10
    assert max(abs(a - b) for (_, a), (_, b) in zip(got, want)) <= 1e-6


def test_not_a_task_is_rejected(tmp_path):
    with pytest.raises(TypeError, match="lacks \\['eval_batches'"):

        class Half:
            def get_batch(self, *a):
                return None

            def loss(self, *a):
                return None

        train(make_model(), Half(), base_cfg(), tmp_path / "run")


def test_non_finite_loss_stops_and_keeps_last_checkpoint(tmp_path):
    """NaN at the 5th step: TrainingDiverged names step 5; the step-3 checkpoint is intact."""
    run = tmp_path / "run"
    cfg = base_cfg(steps=12, eval_every=3, log_every=4)
    with pytest.raises(TrainingDiverged, match=r"at step 5\b.*loss is nan.*step 3") as info:
        train(make_model(), ToyTask(nan_at=4), cfg, run)
    assert isinstance(info.value, UserError)
    with safe_open(str(run / "model.safetensors"), "pt") as f:
        assert f.metadata()["step"] == "3"
        assert all(torch.isfinite(f.get_tensor(k)).all() for k in f.keys())
    assert torch.load(run / "state.pt", weights_only=True)["progress"]["step"] == 3
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in records) == 4  # nothing from the diverged steps
    assert not list(run.glob(".*"))  # no temporary files left behind
    # the kept checkpoint resumes
    res = train(make_model(), ToyTask(), cfg, run, resume=True)
    assert res.steps == 12 and math.isfinite(res.final_train_loss)


def test_existing_run_dir_is_protected(tmp_path):
    run = tmp_path / "run"
    cfg = base_cfg(steps=2, eval_every=2)
    train(make_model(), ToyTask(), cfg, run)
    before = (run / "model.safetensors").read_bytes()
    with pytest.raises(RunDirError, match="already exists.*--resume.*--overwrite"):
        train(make_model(seed=1), ToyTask(), cfg, run)
    assert (run / "model.safetensors").read_bytes() == before
    (run / "stale.txt").write_text("from an older run")
    train(make_model(seed=1), ToyTask(), cfg, run, overwrite=True)
    assert not (run / "stale.txt").exists()
    assert (run / "model.safetensors").read_bytes() != before

    foreign = tmp_path / "not_a_run"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("precious")
    with pytest.raises(RunDirError, match="not an attnlab run"):
        train(make_model(), ToyTask(), cfg, foreign, overwrite=True)
    assert (foreign / "thesis.tex").read_text() == "precious"

    empty = tmp_path / "empty"
    empty.mkdir()
    train(make_model(), ToyTask(), cfg, empty)  # an empty directory is fine

    with pytest.raises(RunDirError, match="cannot resume"):
        train(make_model(), ToyTask(), cfg, tmp_path / "missing", resume=True)
    with pytest.raises(UserError, match="resume.*overwrite"):
        train(make_model(), ToyTask(), cfg, run, resume=True, overwrite=True)

    save_weights(make_model(), run / "model.safetensors", step=99)  # as if killed mid-save
    with pytest.raises(RunDirError, match="model.safetensors is from step 99 but state.pt"):
        train(make_model(), ToyTask(), cfg, run, resume=True)
    (run / "state.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(RunDirError, match="cannot read .*state.pt: the file is damaged") as err:
        train(make_model(), ToyTask(), cfg, run, resume=True)
    assert "\n" not in str(err.value)  # one line, not torch's advice to unpickle anything
    other = ToyModel(ToyConfig(d_hidden=32))
    with pytest.raises(RunDirError, match="differs in \\['d_hidden'\\]"):
        train(other, ToyTask(), cfg, run, resume=True)


@pytest.fixture
def warm_imports():
    """Budgets under a second: the first optimizer (torch imports its compiler then) and the
    first plot (matplotlib) take a second or more once per process; pay it before the clock."""
    pyplot()
    torch.optim.AdamW([torch.zeros(1, requires_grad=True)])


class SlowEvalTask(ToyTask):
    """A ToyTask whose evaluation takes a second, as a real one (greedy decoding...) may."""

    def evaluate(self, model):
        time.sleep(1.0)
        return super().evaluate(model)


def test_time_budget_stops_on_time_and_fits_schedule(tmp_path, warm_imports):
    """max_time: the call takes the budget, its final (one-second) validation and checkpoint
    included: the loop stops early enough for them (attnlab.train.clock); cosine progress runs
    on the time left for training, so the last learning rate is near the floor."""
    budget = 4.0  # two 1 s validations and about 2 s of training steps
    cfg = base_cfg(steps=None, max_time=budget, warmup_steps=2, eval_every=10_000, min_lr_ratio=0.1)
    t0 = time.perf_counter()
    res = train(make_model(), SlowEvalTask(delay=0.01), cfg, tmp_path / "run")
    wall = time.perf_counter() - t0
    assert res.elapsed <= budget  # the clock when the final validation began: inside
    # the final validation (a 1 s sleep) fits: the whole call within the budget, up to what the
    # last writes take on a busy machine (the schedule arithmetic: tests/test_newcomer_budget.py)
    assert wall < budget + 2.0
    lrs = [r["lr"] for r in res.history if "loss" in r]
    assert lrs[0] < lrs[1] == pytest.approx(cfg.lr)  # end of the 2-step warm-up: peak
    assert all(a >= b for a, b in zip(lrs[1:], lrs[2:]))  # then decaying
    # validated at the start (which measures what a validation costs) and at the end
    assert [r["step"] for r in res.history if "val_loss" in r] == [0, res.steps]


def test_time_budget_resumes_with_elapsed_time(tmp_path, warm_imports):
    """A timed run stopped early and resumed keeps its clock: it ends once the total is spent."""
    cfg = base_cfg(steps=None, max_time=4.0, warmup_steps=2, eval_every=10_000)
    part = train(make_model(), ToyTask(delay=0.01), cfg, tmp_path / "run", stop_after=5)
    assert part.steps == 5 and part.elapsed < 4.0
    res = train(make_model(), ToyTask(delay=0.01), cfg, tmp_path / "run", resume=True)
    assert res.steps > 5 and part.elapsed < res.elapsed <= 4.0
    assert [r["step"] for r in res.history if "loss" in r] == list(range(1, res.steps + 1))


def test_log_records_average_the_steps_since_the_last_record(tmp_path):
    every = train(make_model(), ToyTask(), base_cfg(steps=7, log_every=1), tmp_path / "a")
    third = train(make_model(), ToyTask(), base_cfg(steps=7, log_every=3), tmp_path / "b")
    per_step = dict(train_losses(every))
    # records at 3 and 6, at 6 (validation: eval_every=6) and at the end (7)
    assert [s for s, _ in train_losses(third)] == [3, 6, 7]
    want = [np.mean([per_step[k] for k in ks]) for ks in ([1, 2, 3], [4, 5, 6], [7])]
    assert [v for _, v in train_losses(third)] == pytest.approx(want, abs=1e-6)
    assert third.final_train_loss == pytest.approx(per_step[7], abs=1e-6)


def test_bf16_autocast_runs_forward_in_bf16(tmp_path):
    seen = []

    class Spy(ToyTask):
        def loss(self, model, batch, cfg):
            seen.append(model(batch["x"]).dtype)
            return super().loss(model, batch, cfg)

    model = make_model()
    res = train(model, Spy(), base_cfg(steps=3, amp="bf16"), tmp_path / "run")
    assert set(seen) == {torch.bfloat16}
    assert all(p.dtype == torch.float32 for p in model.parameters())  # fp32 master weights
    assert math.isfinite(res.final_train_loss)


def test_gradient_accumulation_and_clipping_match_a_reference_loop(tmp_path):
    """The trainer's step == explicit loop: micro-batches averaged, clip_grad_norm_ on the
    accumulated gradient, then AdamW. Clipping is active (the unclipped loop ends elsewhere)."""
    clip = 0.05
    cfg = base_cfg(
        steps=5,
        grad_accum=2,
        grad_clip=clip,
        weight_decay=0.0,
        schedule="constant",
        warmup_steps=0,
        eval_every=100,
    )
    model = make_model()
    res = train(model, ToyTask(), cfg, tmp_path / "run")
    assert all(r["grad_norm"] > clip for r in res.history if "grad_norm" in r)

    def reference(clip_to):
        ref = make_model()
        opt = torch.optim.AdamW(ref.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=0.0)
        task = ToyTask()
        for step in range(cfg.steps):
            opt.zero_grad()
            for micro in range(cfg.grad_accum):
                batch = task.get_batch(
                    "train", step * cfg.grad_accum + micro, cfg.batch_size // cfg.grad_accum
                )
                loss, _ = task.loss(ref, batch, cfg)
                (loss / cfg.grad_accum).backward()
            if clip_to is not None:
                torch.nn.utils.clip_grad_norm_(ref.parameters(), clip_to)
            opt.step()
        return ref

    clipped, unclipped = reference(clip), reference(None)
    for p, q in zip(model.parameters(), clipped.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-6)
    assert (
        max((p - q).abs().max() for p, q in zip(model.parameters(), unclipped.parameters())) > 1e-4
    )


@pytest.mark.slow
def test_compile_trains_through_torch_compile(tmp_path, monkeypatch):
    """compile=True wraps the model with torch.compile (dynamo; the eager backend here so the
    test needs no C compiler) and follows the same trajectory as the uncompiled model."""
    compiled = []
    real_compile = torch.compile

    def spy(module, **kwargs):
        compiled.append(module)
        return real_compile(module, backend="eager")

    monkeypatch.setattr(torch, "compile", spy)
    model = make_model()
    res = train(model, ToyTask(), base_cfg(steps=3, compile=True), tmp_path / "c")
    ref = train(make_model(), ToyTask(), base_cfg(steps=3), tmp_path / "e")
    assert compiled == [model]
    assert [v for _, v in train_losses(res)] == pytest.approx(
        [v for _, v in train_losses(ref)], abs=1e-6
    )
    # the saved weights carry the plain module's names (no "_orig_mod." prefix)

    with safe_open(str(tmp_path / "c" / "model.safetensors"), "pt") as f:
        assert sorted(f.keys()) == sorted(k for k, _ in model.named_parameters())


def test_to_device_moves_nested_batches():
    Pair = namedtuple("Pair", "a b")

    @dataclass
    class Batch:
        x: torch.Tensor
        meta: dict

    batch = {"p": Pair(torch.ones(2), [torch.zeros(1), 3]), "d": Batch(torch.ones(1), {"k": "v"})}
    moved = to_device(batch, "meta")
    assert isinstance(moved["p"], Pair) and moved["p"].a.device.type == "meta"
    assert moved["p"].b[0].device.type == "meta" and moved["p"].b[1] == 3
    assert isinstance(moved["d"], Batch) and moved["d"].x.device.type == "meta"
    assert moved["d"].meta == {"k": "v"}


def test_warmup_longer_than_run_is_warned(tmp_path, caplog):
    with caplog.at_level("WARNING", logger="attnlab.train.trainer"):
        train(make_model(), ToyTask(), base_cfg(steps=2, warmup_steps=5), tmp_path / "r")
    assert "never reaches" in caplog.text


def test_resuming_a_cosine_run_with_a_new_length_is_warned(tmp_path, caplog):
    """Cosine fitted to N steps then resumed to 2N is not one 2N run: say so; a constant
    schedule (exact, see above) resumes silently."""
    for schedule in ("cosine", "constant"):
        run = tmp_path / schedule
        train(make_model(), ToyTask(), base_cfg(steps=4, schedule=schedule), run)
        caplog.clear()
        with caplog.at_level("WARNING", logger="attnlab.train.trainer"):
            cfg = base_cfg(steps=6, schedule=schedule)
            train(make_model(), ToyTask(), cfg, run, resume=True)
        assert ("fitted to steps=4" in caplog.text) == (schedule == "cosine"), caplog.text
