"""The shared training loop: ``train(model, task, cfg, run_dir)``.

One optimizer step, written out (nanoGPT's loop is the model)::

    lr = schedule(step, elapsed / max_time)              # warm-up, then cosine / wsd / ...
    for micro in range(grad_accum):                      # gradient accumulation
        batch = task.get_batch("train", step * grad_accum + micro, batch_size // grad_accum,
                               rank, world)              # this rank's share, from (seed, step)
        with autocast(bf16?):
            loss, metrics = task.loss(model, batch, cfg)
        (loss * share / grad_accum).backward()           # DDP all-reduces grads on the last one
                                                         # (share: this rank's part of task.count)
    clip_grad_norm_(params, grad_clip)                   # global-norm clipping
    optimizer.step(); optimizer.zero_grad()              # AdamW, decoupled weight decay

Every ``log_every`` steps the losses are averaged over ranks, checked (a non-finite loss raises
:class:`TrainingDiverged`), written to ``metrics.jsonl`` and shown on the progress bar. Every
``eval_every`` steps, and at the end, the model is validated and a checkpoint written
(``model.safetensors``, ``best.safetensors``, ``state.pt``, ``metrics.jsonl``, ``loss.png``).
Only rank 0 writes, always atomically (temporary files + renames, a checkpoint's files as one
group: :mod:`attnlab.train.checkpoint`); under ``strategy="fsdp"`` (:mod:`attnlab.train.fsdp`)
every rank writes its shards of a sharded checkpoint (:mod:`attnlab.train.sharded`). A file that
cannot be written (full disk, read-only) stops the run with one :class:`RunWriteError` line, the
previous checkpoint kept. Rank 0 holds the run directory's lock while training, so a second start
there is refused.

Exact resume: a batch depends only on (task seed, split, step), and ``state.pt`` holds the
optimizer, the schedule, the step, the elapsed time and the torch / CUDA / Python / NumPy random
states, while validation runs with the random state saved and restored. So a run stopped at a
checkpoint (``stop_after``, or Ctrl-C or SIGTERM, which save one) and resumed reproduces the uninterrupted
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
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from attnlab import dcp_files
from attnlab.errors import UserError
from attnlab.tasks.base import Task, to_device
from attnlab.train import distributed as dist_utils
from attnlab.train import fsdp
from attnlab.train.checkpoint import (
    LAST_FILE,
    Progress,
    RunWriteError,
    check_run_dir,
    clear_run_dir,
    plot_loss,
    run_lock,
    start_run,
    write_checkpoint,
    write_metrics,
)
from attnlab.train.clock import Budget, after_step, schedule_point, session_start
from attnlab.train.config import TrainConfig
from attnlab.train.optim import LRSchedule, make_optimizer
from attnlab.train.progress import open_bar
from attnlab.train.resume import load_checkpoint, restore_task_state, warn_about_settings
from attnlab.train.rng import capture_rng, seed_all
from attnlab.train.sharded import remove_sharded, save_sharded, write_consolidated
from attnlab.train.signals import Interrupts, Terminated
from attnlab.train.state import PendingStep, Session, StepOutput, TrainState
from attnlab.train.stopping import StopInfo
from attnlab.train.validation import validate

__all__ = [
    "train",
    "TrainResult",
    "TrainingDiverged",
    "Terminated",
    "RunWriteError",
    "check_run_dir",
]

log = logging.getLogger(__name__)

_METRICS_FLUSH_SECONDS = 30.0  # also rewrite metrics.jsonl between checkpoints this often


class TrainingDiverged(UserError):
    """The training loss (or gradient norm) became NaN or infinite; the run was stopped."""


@dataclass
class TrainResult:
    """What :func:`train` returns.

    ``history`` holds every metrics.jsonl record of the run (resumed runs include the earlier
    ones): training records have ``loss``, validation records ``val_loss``. ``memory`` is this
    rank's :func:`attnlab.train.fsdp.memory_report` after the session's first step (bytes of
    parameters, gradients, optimizer state; RSS).
    """

    run_dir: Path
    steps: int
    final_train_loss: float | None
    best_val_loss: float | None
    val_loss: float | None
    history: list[dict] = field(default_factory=list)
    elapsed: float = 0.0
    memory: dict = field(default_factory=dict)


# ----------------------------------------------------------------------------------------------
# the run


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


def _finite_or_none(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


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
        RunDirError: ``run_dir`` holds a run and neither ``resume`` nor ``overwrite`` is set,
            another process is training in it, it cannot be written, or a resume finds no (or a
            mismatching) checkpoint.
        RunWriteError: a checkpoint, metrics or config file could not be written (full disk,
            read-only...); the previous checkpoint is kept, whole.
        Terminated: SIGTERM arrived (a checkpoint of the last completed step was saved first;
            Ctrl-C raises KeyboardInterrupt the same way).
        TrainingDiverged: the loss became non-finite; the last good checkpoint is kept.
        UserError: the batch does not split over ranks and micro-batches, bad device, ...
    """
    started = session_start()  # the clock of a timed run (clock.py)
    run_dir = Path(run_dir)
    _check_task(task)
    if stop_after is not None and stop_after < 0:
        raise ValueError(f"stop_after must be >= 0, got {stop_after}")
    sharded = fsdp.check_strategy(cfg, resume)  # fsdp outside torchrun: a clear refusal
    info = dist_utils.setup(cfg.device, group=sharded)
    device, rank, world, main = info.device, info.rank, info.world, info.is_main
    micro_bs = cfg.batch_size // cfg.grad_accum
    if micro_bs % world:
        raise UserError(
            f"batch_size {cfg.batch_size} does not split into grad_accum "
            f"{cfg.grad_accum} micro-batches over {world} processes "
            f"(need a multiple of {cfg.grad_accum * world})"
        )
    kind, model_cfg = _model_identity(model)

    # every rank gives the same answer here; only a single process also looks at the lock (under
    # torchrun rank 0 takes it next and tells the others)
    check_run_dir(run_dir, resume, overwrite, check_lock=world == 1)
    with Interrupts() as interrupts, run_lock(run_dir, main, device):
        check_run_dir(run_dir, resume, overwrite, check_lock=False)  # again, now that it is ours
        dist_utils.barrier()  # every rank has checked before rank 0 deletes anything
        if main and overwrite:
            clear_run_dir(run_dir)
        dist_utils.barrier()

        model.to(device)
        if sharded:  # before the optimizer: it must hold the sharded parameters
            fsdp.shard_model(model, cfg, device)
        optimizer = make_optimizer(model, cfg, device)
        schedule = LRSchedule(cfg)
        prog, history = Progress(), []
        if resume:
            prog, history = load_checkpoint(
                run_dir, model, optimizer, schedule, cfg, kind, model_cfg, device, rank
            )
            if world == 1:  # a task's carried state (Transformer-XL's memory), one process only
                restore_task_state(run_dir, task)
        else:
            seed_all(cfg.seed + rank)
        if main:  # messages and files once, from rank 0
            warn_about_settings(run_dir, task, cfg, resume)
            config = {"kind": kind, "model": model_cfg, "train": cfg.to_dict()}
            start_run(
                run_dir, task, {**config, "task": task.config_dict()}, resume, prog.last_ckpt_step
            )
        n_params = sum(p.numel() for p in model.parameters())
        log.info(
            "training %s (%.2fM parameters) on %s x%d%s, %s",
            kind,
            n_params / 1e6,
            device,
            world,
            " (FSDP)" if sharded else "",
            f"{cfg.max_time:.0f} s" if cfg.timed else f"{cfg.steps} steps",
        )
        session = Session(
            model, task, cfg, run_dir, info, micro_bs, started, interrupts, stop_after
        )
        loop = _Loop(session, TrainState(optimizer, schedule, prog, history))
        loop.run()
    return TrainResult(
        run_dir=run_dir,
        steps=prog.step,
        final_train_loss=prog.train_loss,
        best_val_loss=prog.best_val_loss,
        val_loss=prog.val_loss,
        history=history,
        elapsed=prog.elapsed,
        memory=loop.memory,
    )


class _Loop:
    """The training loop of one :func:`train` call (a class only to share its state)."""

    def __init__(self, session: Session, state: TrainState) -> None:
        self.session = session
        self.model, self.task, self.cfg = session.model, session.task, session.cfg
        self.run_dir, self.micro_bs = session.run_dir, session.micro_bs
        self.stop_after, self.interrupts = session.stop_after, session.interrupts
        info = session.info
        self.device: torch.device = info.device
        self.rank, self.world, self.main = info.rank, info.world, info.is_main
        self.optimizer, self.schedule = state.optimizer, state.schedule
        self.prog: Progress = state.prog
        self.history: list[dict] = state.history
        self.pending: list[PendingStep] = []
        self.metrics_written_at = time.perf_counter()
        self.window_start = time.perf_counter()
        self.start = session.started
        self.base_elapsed = self.prog.elapsed
        self.budget = Budget.of(self.cfg, self.device, warn=info.is_main)  # None: steps count
        self.bar = None

        model = self.model
        self.identity: tuple[str, dict] = _model_identity(model)
        self.sharded = fsdp.is_sharded(model)  # FSDP: every rank checkpoints, validates, evaluates
        self.memory: dict = {}  # this rank's bytes after the first step (TrainResult.memory)
        self.ddp = model if self.sharded else dist_utils.wrap_ddp(model, self.device)
        self.train_model = torch.compile(self.ddp) if self.cfg.compile else self.ddp
        self.autocast = (
            (lambda: torch.autocast(self.device.type, dtype=torch.bfloat16))
            if self.cfg.amp == "bf16"
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
            if self.budget is not None and prog.last_eval_step != prog.step:
                self._validate_and_checkpoint()  # measures what the final one will cost (clock.py)
            while True:
                rng_at_step_start = capture_rng()
                t, prog.finished = schedule_point(self.budget, cfg, prog.step, self.elapsed())
                if prog.finished:
                    break
                if self.stop_after is not None and prog.step >= self.stop_after:
                    break
                step_start = time.perf_counter()
                lr = self.schedule.apply(self.optimizer, prog.step, t)
                out = self._step(prog.step)
                with self.interrupts.deferred():  # a signal now is raised after the update
                    updating = True
                    self.optimizer.step()
                    prog.step += 1
                    updating = False
                    rng_at_step_start = None
                    self.pending.append(PendingStep(prog.step, lr, *out))
                prog.finished = after_step(self.budget, cfg, prog.step, step_start)
                if not self.memory:  # after a whole step: gradients and moments exist
                    self.memory = fsdp.log_memory(self.model, self.optimizer, self.rank, self.world)
                self._advance_bar()
                if prog.step % cfg.log_every == 0:
                    self._flush()
                if prog.step % cfg.eval_every == 0:
                    self._validate_and_checkpoint()
            if self.pending or prog.last_eval_step != prog.step:
                self._validate_and_checkpoint()
            elif prog.finished:  # say so in state.pt (stopping.py)
                self._checkpoint(capture_rng())
            self._consolidate()
        except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM (Terminated)
            if not updating:  # (a handler other than ours can interrupt the update itself)
                self._save_on_interrupt(rng_at_step_start, err)
            err.stopped = StopInfo.of(self)  # where it stopped, for the message (stopping.py)
            raise
        finally:
            if self.bar is not None:
                self.bar.close()
            self.model.eval()

    def _step(self, step: int) -> StepOutput:
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
            n = int(self.task.count(batch))
            count += n
            # under torchrun: weigh this rank's means by its share of the units (task.count) so
            # the step's loss is the mean over the global batch, as in one process
            share = dist_utils.share_of(n, self.device)
            batch = to_device(batch, self.device)
            last = micro == cfg.grad_accum - 1
            # DDP all-reduces gradients on every backward unless told not to: only the last
            # micro-batch of a step needs it
            accumulate = not last and self.ddp is not self.model
            sync = self.ddp.no_sync() if accumulate else contextlib.nullcontext()
            if self.sharded:  # FSDP's no_sync: reduce-scatter in the last backward only
                fsdp.gradient_sync(self.model, last)
            with sync:
                with self.autocast():
                    loss, metrics = self.task.loss(self.train_model, batch, cfg)
                (loss * share / cfg.grad_accum).backward()
            loss_sum += loss.detach().float() * share
            for k, v in metrics.items():
                v = v.detach().float() if isinstance(v, Tensor) else float(v)
                metric_sums[k] = metric_sums.get(k, 0.0) + v * share
        grad_norm = None
        if cfg.grad_clip is not None:
            # under FSDP the norm of the sharded gradients is computed across ranks (a DTensor)
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
            grad_norm = fsdp.full_value(grad_norm)
        metrics = {k: v / cfg.grad_accum for k, v in metric_sums.items()}
        return StepOutput(loss_sum / cfg.grad_accum, grad_norm, metrics, count)

    # -- logging --------------------------------------------------------------------------------

    def _flush(self, *, collective: bool = True) -> None:
        """Average the pending step losses over ranks, check them, record one metrics line."""
        if not self.pending:
            return
        steps = [p.step for p in self.pending]
        keys = sorted(self.pending[-1].metrics)
        has_norm = self.pending[-1].grad_norm is not None
        rows = []
        for p in self.pending:
            row = [p.loss, p.grad_norm if has_norm else 0.0, float(p.count)]
            row += [p.metrics.get(k, float("nan")) for k in keys]
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
        rec = {"step": steps[-1], "loss": float(table[:, 0].mean()), "lr": self.pending[-1].lr}
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
            write_metrics(self.run_dir, self.history, self.prog.last_ckpt_step)
        self.metrics_written_at = time.perf_counter()

    def _open_bar(self) -> None:
        if self.cfg.progress and self.main:
            self.bar = open_bar(self.cfg, self.prog)

    def _advance_bar(self) -> None:
        if self.bar is None:
            return
        if self.cfg.timed:
            self.bar.update(min(self.elapsed(), self.cfg.max_time) - self.bar.n)
        else:
            self.bar.update(1)

    # -- validation and checkpoints -------------------------------------------------------------

    def _validate(self) -> dict:
        """The validation record (see :func:`attnlab.train.validation.validate`)."""
        return validate(
            self.model,
            self.task,
            self.cfg,
            micro_bs=self.micro_bs,
            info=self.session.info,
            sharded=self.sharded,
            autocast=self.autocast,
        )

    def _validate_and_checkpoint(self) -> None:
        prog = self.prog
        self._flush()
        if prog.last_eval_step == prog.step:
            return
        if self.bar is not None:
            self.bar.set_description("validate", refresh=self.bar.mininterval < 1)
        started = time.perf_counter()
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
        self._checkpoint(capture_rng(), best=improved)
        self.window_start = time.perf_counter()  # validation time is not training throughput
        if self.budget is not None:
            self.budget.record_final(self.window_start - started)

    def _checkpoint(self, rng: dict, *, best: bool = False) -> None:
        """Write last (and best) weights, state.pt, metrics.jsonl and loss.png (rank 0); under
        FSDP every rank writes its shards of a sharded checkpoint instead."""
        prog, kept = self.prog, self.prog.last_ckpt_step
        prog.elapsed = self.elapsed()
        if not (self.main or self.sharded):
            prog.last_ckpt_step = prog.step
            return
        state = {
            "progress": {**vars(prog), "last_ckpt_step": prog.step},
            "schedule": self.schedule.state_dict(),
            "rng": rng,
        }
        if self.world == 1 and not self.sharded and hasattr(self.task, "state_dict"):
            state["task"] = self.task.state_dict()  # Transformer-XL's memory
        # all files written before any is renamed (a folder renamed last for a sharded one): a
        # full disk or a signal in the middle keeps the previous checkpoint whole
        if self.sharded:
            kind, model_cfg = self.identity
            meta = {"step": prog.step, "kind": kind, "model": model_cfg, "world": self.world}
            where = dict(best=best, kept=kept, main=self.main, device=self.device)
            save_sharded(
                self.run_dir, self.model, self.optimizer, state, meta, self.history, **where
            )
        else:
            state["optimizer"] = self.optimizer.state_dict()
            write_checkpoint(self.run_dir, self.model, state, self.history, best=best, kept=kept)
            if dcp_files.last_sharded(self.run_dir) is not None:  # an earlier FSDP phase's, older
                remove_sharded(self.run_dir)
        prog.last_ckpt_step = prog.step  # only now: Ctrl-C during the writes saves again
        self.metrics_written_at = time.perf_counter()
        if self.main and self.history:
            plot_loss(self.run_dir, prog.step)

    def _consolidate(self) -> None:
        """FSDP, at the end of a session: the last weights as one model.safetensors, so the run
        loads in one process like any other (every rank takes part)."""
        step = self.prog.step
        if self.sharded and self.prog.last_ckpt_step == step:
            where = dict(main=self.main, device=self.device, kept=step)
            write_consolidated(self.run_dir / LAST_FILE, self.model, step, **where)

    def _save_on_interrupt(self, rng: dict | None, err: KeyboardInterrupt) -> None:
        """Ctrl-C or SIGTERM between or inside steps: checkpoint the last completed step.

        Only in a single process: under torchrun the ranks stop at different points, and the
        collective a checkpoint needs would hang.
        """
        if self.world > 1 or self.prog.step == self.prog.last_ckpt_step:
            return
        try:
            self._flush(collective=False)
        except TrainingDiverged:
            return
        why = "terminated (SIGTERM)" if isinstance(err, Terminated) else "interrupted"
        log.warning("%s: saving a checkpoint at step %d", why, self.prog.step)
        self._checkpoint(rng if rng is not None else capture_rng())
        self._consolidate()
