"""The shared training loop: ``train(model, task, cfg, run_dir)``.

One optimizer step, written out (nanoGPT's loop is the model)::

    lr = schedule(step, elapsed / max_time)              # warm-up, then cosine / inverse-sqrt
    for micro in range(grad_accum):                      # gradient accumulation
        batch = task.get_batch("train", step * grad_accum + micro, batch_size // grad_accum,
                               rank, world)              # this rank's share, from (seed, step)
        with autocast(bf16?):
            loss, metrics = task.loss(model, batch, cfg)
        (loss / grad_accum).backward()                   # DDP all-reduces grads on the last one
    clip_grad_norm_(params, grad_clip)                   # global-norm clipping
    optimizer.step(); optimizer.zero_grad()              # AdamW, decoupled weight decay

Every ``log_every`` steps the losses are averaged over ranks, checked (a non-finite loss raises
:class:`TrainingDiverged`), written to ``metrics.jsonl`` and shown on the progress bar. Every
``eval_every`` steps, and at the end, the model is validated and a checkpoint written
(``model.safetensors``, ``best.safetensors``, ``state.pt``, ``metrics.jsonl``, ``loss.png``).
Only rank 0 writes, always atomically (temporary file + rename).

Exact resume: a batch depends only on (task seed, split, step), and ``state.pt`` holds the
optimizer, the schedule, the step, the elapsed time and the torch / CUDA / Python / NumPy random
states, while validation runs with the random state saved and restored. So a run stopped at a
checkpoint (``stop_after``, or Ctrl-C, which saves one) and resumed reproduces the uninterrupted
run. ``steps=N`` followed by a resume with ``steps=2N`` equals ``steps=2N`` only for a schedule
that does not depend on the run length (``constant``, ``inverse_sqrt``): a cosine schedule of N
steps has already decayed to its floor at step N. To train a cosine run in pieces, give the full
length as ``steps`` and stop each piece with ``stop_after``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from attnlab import runs
from attnlab.errors import RunDirError, UserError
from attnlab.train import distributed as dist_utils
from attnlab.train.config import TrainConfig
from attnlab.train.optim import LRSchedule, make_optimizer
from attnlab.tasks.base import Task, to_device

__all__ = ["train", "TrainResult", "TrainingDiverged", "check_run_dir"]

log = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
LAST_FILE = "model.safetensors"
BEST_FILE = "best.safetensors"
STATE_FILE = "state.pt"
METRICS_FILE = "metrics.jsonl"
CURVE_FILE = "loss.png"
_METRICS_FLUSH_SECONDS = 30.0  # also rewrite metrics.jsonl between checkpoints this often


class TrainingDiverged(UserError):
    """The training loss (or gradient norm) became NaN or infinite; the run was stopped."""


@dataclass
class TrainResult:
    """What :func:`train` returns.

    ``history`` holds every metrics.jsonl record of the run (resumed runs include the earlier
    ones): training records have ``loss``, validation records ``val_loss``.
    """

    run_dir: Path
    steps: int
    final_train_loss: float | None
    best_val_loss: float | None
    val_loss: float | None
    history: list[dict] = field(default_factory=list)
    elapsed: float = 0.0


@dataclass
class _Progress:
    """The part of the loop's state that goes into state.pt besides optimizer and RNG."""

    step: int = 0  # optimizer steps completed
    elapsed: float = 0.0  # wall-clock seconds of training so far (all sessions)
    tokens: int = 0  # task.count summed over all steps and ranks
    best_val_loss: float | None = None
    val_loss: float | None = None
    train_loss: float | None = None
    last_eval_step: int = -1
    last_ckpt_step: int = -1


# ----------------------------------------------------------------------------------------------
# random state


def _capture_rng() -> dict:
    np_state = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": {
            "name": np_state[0],
            "keys": torch.from_numpy(np_state[1].astype(np.int64)),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
        },
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _restore_rng(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    n = state["numpy"]
    np.random.set_state(
        (
            n["name"],
            n["keys"].numpy().astype(np.uint32),
            n["pos"],
            n["has_gauss"],
            n["cached_gaussian"],
        )
    )
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


def _seed_all(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)


@contextlib.contextmanager
def _rng_preserved():
    """Run a block (validation, sampling) without disturbing the training random streams."""
    saved = _capture_rng()
    try:
        yield
    finally:
        _restore_rng(saved)


# ----------------------------------------------------------------------------------------------
# run directory


_TASK_METHODS = ("get_batch", "loss", "eval_batches", "count", "config_dict", "save_artifacts")


def _check_task(task: Any) -> None:
    missing = [m for m in _TASK_METHODS if not callable(getattr(task, m, None))]
    if missing:
        raise TypeError(f"{type(task).__name__} is not a training Task: it lacks {missing}")


def _model_identity(model: nn.Module) -> tuple[str, dict]:
    kind = getattr(model, "kind", type(model).__name__)
    config = getattr(model, "config", None)
    cfg_dict = config.to_dict() if hasattr(config, "to_dict") else {}
    return kind, json.loads(json.dumps(cfg_dict))  # JSON-normalised (tuples -> lists)


def check_run_dir(run_dir: str | Path, resume: bool = False, overwrite: bool = False) -> None:
    """Refuse to clobber an existing run; check that a resume has something to resume.

    :func:`train` calls it first; a command can call it earlier, before slow preparations.

    Raises:
        RunDirError: ``run_dir`` holds a run (and neither ``resume`` nor ``overwrite``), is not
            a directory, is not an attnlab run (``overwrite``), or has no checkpoint (``resume``).
        UserError: both ``resume`` and ``overwrite``.
    """
    run_dir = Path(run_dir)
    if resume and overwrite:
        raise UserError("choose one of resume (continue the run) and overwrite (start again)")
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"run directory {str(run_dir)!r} exists and is not a directory")
    if resume:
        missing = [f for f in (CONFIG_FILE, LAST_FILE, STATE_FILE) if not (run_dir / f).exists()]
        if missing:
            raise RunDirError(
                f"cannot resume {str(run_dir)!r}: no checkpoint there (missing "
                f"{', '.join(missing)})"
            )
        return
    if run_dir.exists() and any(run_dir.iterdir()):
        if not overwrite:
            raise RunDirError(
                f"run directory {str(run_dir)!r} already exists; resume it "
                "(--resume) or start again in its place (--overwrite)"
            )
        if not (run_dir / CONFIG_FILE).exists():
            raise RunDirError(
                f"refusing to overwrite {str(run_dir)!r}: it is not an attnlab run "
                "directory (no config.json)"
            )


def _save_weights(model: nn.Module, path: Path, step: int) -> None:
    from safetensors.torch import save_model

    runs.atomic_save(path, lambda tmp: save_model(model, tmp, metadata={"step": str(step)}))


def _weights_step(path: Path) -> int | None:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        meta = f.metadata() or {}
    return int(meta["step"]) if "step" in meta else None


def _read_history(path: Path, upto_step: int) -> list[dict]:
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            if rec.get("step", 0) <= upto_step:
                records.append(rec)
    return records


def _finite_or_none(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


# ----------------------------------------------------------------------------------------------
# the loop


def train(
    model: nn.Module,
    task: Task,
    cfg: TrainConfig,
    run_dir: str | Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    stop_after: int | None = None,
) -> TrainResult:
    """Train ``model`` on ``task`` and write the run directory.

    Args:
        model: the model (moved to ``cfg.device``; left there, in eval mode, afterwards).
            ``model.kind`` and ``model.config.to_dict()`` go into config.json.
        task: provides batches, the loss and validation data (see :class:`attnlab.train.Task`).
        cfg: the training settings.
        run_dir: where config.json, weights, state and metrics go.
        resume: continue the run saved in ``run_dir`` from its last checkpoint.
        overwrite: delete an existing run in ``run_dir`` and start again.
        stop_after: end this session (validating and checkpointing) once this many steps are
            done in total, as if interrupted; the schedule still runs to ``cfg.steps`` /
            ``cfg.max_time``, and ``resume=True`` later continues exactly.

    Returns:
        A :class:`TrainResult`.

    Raises:
        RunDirError: ``run_dir`` holds a run and neither ``resume`` nor ``overwrite`` is set, or
            a resume finds no (or a mismatching) checkpoint.
        TrainingDiverged: the loss became non-finite; the last good checkpoint is kept.
        UserError: the batch does not split over ranks and micro-batches, bad device, ...
    """
    run_dir = Path(run_dir)
    _check_task(task)
    if stop_after is not None and stop_after < 0:
        raise ValueError(f"stop_after must be >= 0, got {stop_after}")
    info = dist_utils.setup(cfg.device)
    device, rank, world, main = info.device, info.rank, info.world, info.is_main
    micro_bs = cfg.batch_size // cfg.grad_accum
    if micro_bs % world:
        raise UserError(
            f"batch_size {cfg.batch_size} does not split into grad_accum "
            f"{cfg.grad_accum} micro-batches over {world} processes "
            f"(need a multiple of {cfg.grad_accum * world})"
        )
    kind, model_cfg = _model_identity(model)

    check_run_dir(run_dir, resume, overwrite)
    dist_utils.barrier()  # every rank has checked before rank 0 deletes anything
    if main and overwrite and run_dir.exists():
        shutil.rmtree(run_dir)
    dist_utils.barrier()

    model.to(device)
    optimizer = make_optimizer(model, cfg, device)
    schedule = LRSchedule(cfg)
    prog = _Progress()
    history: list[dict] = []
    if resume:
        prog, history = _load_checkpoint(
            run_dir, model, optimizer, schedule, cfg, kind, model_cfg, device, rank
        )
    else:
        _seed_all(cfg.seed + rank)
    if resume and main:  # messages once, from rank 0
        saved = runs.read_config(run_dir)
        if saved.get("task") != json.loads(json.dumps(task.config_dict())):
            log.warning("resuming %s with a different task config: the data may differ", run_dir)
        saved_train = saved.get("train") or {}
        if saved_train != json.loads(json.dumps(cfg.to_dict())):
            log.info("resuming %s with changed training settings", run_dir)
        length = "max_time" if cfg.timed else "steps"
        old_length = saved_train.get(length)
        if cfg.schedule == "cosine" and old_length not in (None, getattr(cfg, length)):
            log.warning(
                "resuming a cosine schedule fitted to %s=%s with %s=%s: the learning rate "
                "jumps back up from where the shorter schedule left it, so this is not the "
                "same as one run of the new length (constant and inverse_sqrt schedules are; "
                "or give the full length from the start and stop early with Ctrl-C)",
                length,
                old_length,
                length,
                getattr(cfg, length),
            )
    if main:
        run_dir.mkdir(parents=True, exist_ok=True)
        config = {
            "kind": kind,
            "model": model_cfg,
            "train": cfg.to_dict(),
            "task": task.config_dict(),
        }
        runs.atomic_write_text(run_dir / CONFIG_FILE, json.dumps(config, indent=2) + "\n")
        if not resume:
            task.save_artifacts(run_dir)
    if main and not cfg.timed and cfg.schedule != "inverse_sqrt" and cfg.warmup >= cfg.steps:
        log.warning(
            "the warm-up (%d steps) is not shorter than the run (%d steps): the learning rate "
            "never reaches lr=%g; lower --warmup",
            cfg.warmup,
            cfg.steps,
            cfg.lr,
        )
    n_params = sum(p.numel() for p in model.parameters())
    log.info(
        "training %s (%.2fM parameters) on %s x%d, %s",
        kind,
        n_params / 1e6,
        device,
        world,
        f"{cfg.max_time:.0f} s" if cfg.timed else f"{cfg.steps} steps",
    )

    loop = _Loop(model, task, cfg, run_dir, optimizer, schedule, prog, history, info, micro_bs)
    loop.stop_after = stop_after
    loop.run()
    return TrainResult(
        run_dir=run_dir,
        steps=prog.step,
        final_train_loss=prog.train_loss,
        best_val_loss=prog.best_val_loss,
        val_loss=prog.val_loss,
        history=history,
        elapsed=prog.elapsed,
    )


def _load_checkpoint(
    run_dir: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    schedule: LRSchedule,
    cfg: TrainConfig,
    kind: str,
    model_cfg: dict,
    device: torch.device,
    rank: int,
) -> tuple[_Progress, list[dict]]:
    """Restore weights, optimizer, schedule, progress and (rank 0) random state from run_dir."""
    from safetensors.torch import load_model

    saved = runs.read_config(run_dir)
    if saved["kind"] != kind:
        raise RunDirError(
            f"cannot resume {str(run_dir)!r}: it holds a {saved['kind']!r} model, not {kind!r}"
        )
    if saved["model"] != model_cfg:
        diff = sorted(
            k
            for k in set(saved["model"]) | set(model_cfg)
            if saved["model"].get(k) != model_cfg.get(k)
        )
        raise RunDirError(f"cannot resume {str(run_dir)!r}: the model config differs in {diff}")
    try:
        state = torch.load(run_dir / STATE_FILE, map_location="cpu", weights_only=True)
    except Exception as err:  # pickle / zip errors of a damaged file
        # torch's own message is pages long and suggests weights_only=False: do not pass it on
        raise RunDirError(
            f"cannot read {run_dir / STATE_FILE}: the file is damaged or not an attnlab "
            f"training state ({type(err).__name__})"
        ) from None
    step = state["progress"]["step"]
    weights_step = _weights_step(run_dir / LAST_FILE)
    if weights_step != step:
        raise RunDirError(
            f"cannot resume {str(run_dir)!r}: {LAST_FILE} is from step "
            f"{weights_step} but {STATE_FILE} from step {step} (interrupted while "
            "saving?)"
        )
    missing, unexpected = load_model(model, run_dir / LAST_FILE, strict=False, device=str(device))
    if missing or unexpected:
        raise RunDirError(
            f"cannot resume: {LAST_FILE} does not match the model (missing "
            f"{sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]})"
        )
    decay = [g["weight_decay"] for g in optimizer.param_groups]
    try:
        optimizer.load_state_dict(state["optimizer"])
    except ValueError as err:
        raise RunDirError(f"cannot resume: optimizer state does not fit the model: {err}") from None
    for g, wd in zip(optimizer.param_groups, decay):  # this run's settings win over the saved
        g["weight_decay"], g["betas"] = wd, tuple(cfg.betas)
    schedule.load_state_dict(state["schedule"])
    prog = _Progress(**state["progress"])
    if rank == 0:
        _restore_rng(state["rng"])
    else:  # only rank 0's streams are saved; the others restart from a distinct, fixed seed
        _seed_all(cfg.seed + rank + 7919 * step)
    history = _read_history(run_dir / METRICS_FILE, step)
    if rank == 0:
        log.info("resuming %s from step %d", run_dir, step)
    return prog, history


class _Loop:
    """The training loop of one :func:`train` call (a class only to share its state)."""

    def __init__(
        self, model, task, cfg, run_dir, optimizer, schedule, prog, history, info, micro_bs
    ):
        self.model: nn.Module = model
        self.task: Task = task
        self.cfg: TrainConfig = cfg
        self.run_dir: Path = run_dir
        self.optimizer = optimizer
        self.schedule: LRSchedule = schedule
        self.prog: _Progress = prog
        self.history: list[dict] = history
        self.device: torch.device = info.device
        self.rank, self.world, self.main = info.rank, info.world, info.is_main
        self.micro_bs = micro_bs
        self.pending: list[tuple[int, Tensor, Tensor | None, float, dict, int]] = []
        self.metrics_written_at = time.perf_counter()
        self.window_start = time.perf_counter()
        self.start = time.perf_counter()
        self.base_elapsed = prog.elapsed
        self.bar = None
        self.stop_after: int | None = None

        self.ddp = dist_utils.wrap_ddp(model, self.device)
        self.train_model = torch.compile(self.ddp) if cfg.compile else self.ddp
        self.autocast = (
            (lambda: torch.autocast(self.device.type, dtype=torch.bfloat16))
            if cfg.amp == "bf16"
            else contextlib.nullcontext
        )

    def elapsed(self) -> float:
        return self.base_elapsed + time.perf_counter() - self.start

    # -- the loop -------------------------------------------------------------------------------

    def run(self) -> None:
        cfg, prog = self.cfg, self.prog
        self._open_bar()
        rng_at_step_start: dict | None = None
        updating = False
        try:
            self.model.train()
            while True:
                rng_at_step_start = _capture_rng()
                if cfg.timed:
                    t = dist_utils.broadcast_float(self.elapsed(), self.device) / cfg.max_time
                    if t >= 1.0:
                        break
                else:
                    t = None
                    if prog.step >= cfg.steps:
                        break
                if self.stop_after is not None and prog.step >= self.stop_after:
                    break
                lr = self.schedule.apply(self.optimizer, prog.step, t)
                loss, grad_norm, metrics, count = self._step(prog.step)
                updating = True
                self.optimizer.step()
                prog.step += 1
                updating = False
                rng_at_step_start = None
                self.pending.append((prog.step, loss, grad_norm, lr, metrics, count))
                self._advance_bar()
                if prog.step % cfg.log_every == 0:
                    self._flush()
                if prog.step % cfg.eval_every == 0:
                    self._validate_and_checkpoint()
            if self.pending or prog.last_eval_step != prog.step:
                self._validate_and_checkpoint()
        except KeyboardInterrupt:
            if not updating:
                self._save_on_interrupt(rng_at_step_start)
            raise
        finally:
            if self.bar is not None:
                self.bar.close()
            self.model.eval()

    def _step(self, step: int) -> tuple[Tensor, Tensor | None, dict, int]:
        """Forward and backward over the micro-batches of one optimizer step; clip."""
        cfg = self.cfg
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum = torch.zeros((), device=self.device)
        metric_sums: dict[str, Any] = {}
        count = 0
        for micro in range(cfg.grad_accum):
            batch = self.task.get_batch(
                "train", step * cfg.grad_accum + micro, self.micro_bs, self.rank, self.world
            )
            count += int(self.task.count(batch))
            batch = to_device(batch, self.device)
            last = micro == cfg.grad_accum - 1
            # DDP all-reduces gradients on every backward unless told not to: only the last
            # micro-batch of a step needs it
            accumulate = not last and self.ddp is not self.model
            sync = self.ddp.no_sync() if accumulate else contextlib.nullcontext()
            with sync:
                with self.autocast():
                    loss, metrics = self.task.loss(self.train_model, batch, cfg)
                (loss / cfg.grad_accum).backward()
            loss_sum += loss.detach().float()
            for k, v in metrics.items():
                v = v.detach().float() if isinstance(v, Tensor) else float(v)
                metric_sums[k] = metric_sums.get(k, 0.0) + v
        grad_norm = None
        if cfg.grad_clip is not None:
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        metrics = {k: v / cfg.grad_accum for k, v in metric_sums.items()}
        return loss_sum / cfg.grad_accum, grad_norm, metrics, count

    # -- logging --------------------------------------------------------------------------------

    def _flush(self, *, collective: bool = True) -> None:
        """Average the pending step losses over ranks, check them, record one metrics line."""
        if not self.pending:
            return
        steps = [p[0] for p in self.pending]
        keys = sorted(self.pending[-1][4])
        has_norm = self.pending[-1][2] is not None
        rows = []
        for _, loss, grad_norm, _, metrics, count in self.pending:
            row = [loss, grad_norm if has_norm else 0.0, float(count)]
            row += [metrics.get(k, float("nan")) for k in keys]
            rows.append(
                torch.stack(
                    [torch.as_tensor(v, device=self.device).float().reshape(()) for v in row]
                )
            )
        # one (n_steps, 3 + n_metrics) table: columns loss | grad norm | count | metrics
        table = torch.stack(rows)
        if collective:
            dist_utils.all_reduce_mean(table)  # grad norms are equal on all ranks already
        table = table.cpu()  # the only device -> host copy of the window
        grad_norms = [float(v) for v in table[:, 1]] if has_norm else [None] * len(steps)
        for i, s in enumerate(steps):
            loss_i, norm_i = float(table[i, 0]), grad_norms[i]
            if math.isfinite(loss_i) and (norm_i is None or math.isfinite(norm_i)):
                continue
            self.pending.clear()
            self._write_metrics()
            what = (
                f"loss is {loss_i}" if not math.isfinite(loss_i) else f"gradient norm is {norm_i}"
            )
            kept = (
                f"the last good checkpoint (step {self.prog.last_ckpt_step}) is kept in "
                f"{str(self.run_dir)!r}"
                if self.prog.last_ckpt_step >= 0
                else "no checkpoint had been written yet"
            )
            raise TrainingDiverged(
                f"training diverged at step {s}: the {what}; {kept}. Try a lower learning rate "
                f"(lr={self.cfg.lr}), a longer warm-up or gradient clipping."
            )
        now = time.perf_counter()
        tokens = round(float(table[:, 2].sum()) * self.world)
        self.prog.tokens += tokens
        self.prog.train_loss = float(table[-1, 0])
        rec = {"step": steps[-1], "loss": float(table[:, 0].mean()), "lr": self.pending[-1][3]}
        if grad_norms[-1] is not None:
            rec["grad_norm"] = grad_norms[-1]
        for j, k in enumerate(keys):
            rec[k] = float(table[:, 3 + j].mean())
        rec["tokens_per_s"] = tokens / max(now - self.window_start, 1e-9)
        rec["tokens"] = self.prog.tokens
        rec["elapsed"] = round(self.elapsed(), 3)
        self.history.append(rec)
        self.pending.clear()
        self.window_start = now
        if self.bar is not None:
            self.bar.set_postfix_str(
                f"loss {rec['loss']:.4f}, {rec['tokens_per_s']:,.0f} tok/s, lr {rec['lr']:.2e}",
                refresh=False,
            )
        if now - self.metrics_written_at > _METRICS_FLUSH_SECONDS:
            self._write_metrics()

    def _write_metrics(self) -> None:
        if self.main:
            text = "".join(json.dumps(r) + "\n" for r in self.history)
            runs.atomic_write_text(self.run_dir / METRICS_FILE, text)
        self.metrics_written_at = time.perf_counter()

    def _open_bar(self) -> None:
        if not (self.cfg.progress and self.main):
            return
        import sys

        from tqdm.auto import tqdm

        # redirected to a file or CI log: a line every 30 s instead of a redraw per step
        quiet = {} if sys.stderr.isatty() else {"mininterval": 30.0}
        if self.cfg.timed:
            self.bar = tqdm(
                **quiet,
                total=round(self.cfg.max_time),
                initial=min(round(self.prog.elapsed), round(self.cfg.max_time)),
                unit="s",
                desc="train",
                dynamic_ncols=True,
                bar_format="{l_bar}{bar}| {n:.0f}/{total_fmt}s [{elapsed}<{remaining}{postfix}]",
            )
        else:
            self.bar = tqdm(
                **quiet,
                total=self.cfg.steps,
                initial=self.prog.step,
                unit="step",
                desc="train",
                dynamic_ncols=True,
            )

    def _advance_bar(self) -> None:
        if self.bar is None:
            return
        if self.cfg.timed:
            self.bar.update(min(self.elapsed(), self.cfg.max_time) - self.bar.n)
        else:
            self.bar.update(1)

    # -- validation and checkpoints -------------------------------------------------------------

    @torch.no_grad()
    def _validate(self) -> dict:
        """Mean task loss over the fixed validation batches (sharded over ranks) + evaluate()."""
        cfg, task, model = self.cfg, self.task, self.model
        rec: dict[str, Any] = {}
        model.eval()
        with _rng_preserved():
            if cfg.eval_batches > 0:
                batches = list(task.eval_batches(self.micro_bs, cfg.eval_batches))
                # shard the batches over ranks, unless there are too few to give each rank one
                shard = self.world > 1 and len(batches) >= self.world
                mine = batches[self.rank :: self.world] if shard else batches
                sums: dict[str, Tensor] = {}
                for batch in mine:
                    with self.autocast():
                        loss, metrics = task.loss(model, to_device(batch, self.device), cfg)
                    for k, v in {"loss": loss, **metrics}.items():
                        v = torch.as_tensor(v, device=self.device).detach().float().reshape(())
                        sums[k] = sums[k] + v if k in sums else v
                if mine:
                    keys = sorted(sums)
                    vec = torch.stack(
                        [sums[k] for k in keys]
                        + [torch.tensor(float(len(mine)), device=self.device)]
                    )  # (n_metrics + 1,)
                    if shard:
                        dist_utils.all_reduce_sum(vec)
                    vec = vec.cpu()
                    rec.update({f"val_{k}": float(vec[j] / vec[-1]) for j, k in enumerate(keys)})
            if self.main and hasattr(task, "evaluate"):
                rec.update({k: float(v) for k, v in task.evaluate(model).items()})
        model.train()
        return rec

    def _validate_and_checkpoint(self) -> None:
        prog = self.prog
        self._flush()
        if prog.last_eval_step == prog.step:
            return
        if self.bar is not None:
            self.bar.set_description("validate", refresh=self.bar.mininterval < 1)
        val = self._validate()
        if self.bar is not None:
            self.bar.set_description("train", refresh=False)
        prog.last_eval_step = prog.step
        improved = False
        if "val_loss" in val:
            prog.val_loss = _finite_or_none(val["val_loss"])
            if prog.val_loss is None:
                if self.main:
                    log.warning("validation loss is %s at step %d", val["val_loss"], prog.step)
            elif prog.best_val_loss is None or prog.val_loss < prog.best_val_loss:
                prog.best_val_loss = prog.val_loss
                improved = True
        if val:
            rec = {
                "step": prog.step,
                **{k: _finite_or_none(v) for k, v in val.items()},
                "elapsed": round(self.elapsed(), 3),
            }
            self.history.append(rec)
        self._checkpoint(_capture_rng(), best=improved)
        self.window_start = time.perf_counter()  # validation time is not training throughput

    def _checkpoint(self, rng: dict, *, best: bool = False) -> None:
        """Write last (and best) weights, state.pt, metrics.jsonl and loss.png (rank 0)."""
        prog = self.prog
        prog.elapsed = self.elapsed()
        if not self.main:
            prog.last_ckpt_step = prog.step
            return
        d = self.run_dir
        # weights before state: a crash in between leaves state.pt one checkpoint behind the
        # weights, which a resume detects through the step stored in both
        _save_weights(self.model, d / LAST_FILE, prog.step)
        if best:
            _save_weights(self.model, d / BEST_FILE, prog.step)
        state = {
            "progress": {**vars(prog), "last_ckpt_step": prog.step},
            "optimizer": self.optimizer.state_dict(),
            "schedule": self.schedule.state_dict(),
            "rng": rng,
        }
        runs.atomic_save(d / STATE_FILE, lambda tmp: torch.save(state, tmp))
        prog.last_ckpt_step = prog.step  # only now: Ctrl-C during the writes saves again
        self._write_metrics()
        if self.history:
            from attnlab.train.curves import plot_curves

            plot_curves(d / METRICS_FILE, d / CURVE_FILE)

    def _save_on_interrupt(self, rng: dict | None) -> None:
        """Ctrl-C between or inside steps: checkpoint the last completed step (1 process)."""
        if self.world > 1 or self.prog.step == self.prog.last_ckpt_step:
            return
        try:
            self._flush(collective=False)
        except TrainingDiverged:
            return
        log.warning("interrupted: saving a checkpoint at step %d", self.prog.step)
        self._checkpoint(rng if rng is not None else _capture_rng())
