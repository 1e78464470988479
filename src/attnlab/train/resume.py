"""``train(..., resume=True)``: restore a run from its newest checkpoint, whole or sharded.

A run directory holds a *whole* checkpoint (``model.safetensors`` + ``state.pt``, written by one
process or DDP) or a *sharded* one (``checkpoints/step-N/``, written by FSDP: see
:mod:`attnlab.train.sharded`); after a change of strategy both may be there, and the newer one
wins. Either loads into either kind of model, at any world size:

=================  ==========================================  ==================================
checkpoint         whole model (one process, DDP)              sharded model (FSDP)
=================  ==========================================  ==================================
whole              ``load_state_dict`` (as before)             each rank keeps its shards of it
sharded            DCP reassembles each tensor                 DCP reads the slices of each rank
=================  ==========================================  ==================================
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from safetensors.torch import load_file, load_model
from torch import nn

from attnlab import dcp_files, runs
from attnlab.errors import RunDirError
from attnlab.train.checkpoint import (
    LAST_FILE,
    METRICS_FILE,
    STATE_FILE,
    Progress,
    read_state,
)
from attnlab.train.config import TrainConfig
from attnlab.train.fsdp import is_sharded
from attnlab.train.optim import LRSchedule
from attnlab.train.rng import restore_rng, seed_all
from attnlab.train.sharded import load_full_into_sharded, load_sharded

__all__ = ["load_checkpoint", "restore_task_state", "warn_about_settings"]

log = logging.getLogger(__name__)


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


def _check_identity(run_dir: Path, model: nn.Module, kind: str, model_cfg: dict) -> None:
    saved = runs.read_config(run_dir)
    if saved["kind"] != kind:
        raise RunDirError(
            f"cannot resume {str(run_dir)!r}: it holds a {saved['kind']!r} model, not {kind!r}"
        )
    saved_model = saved["model"]
    config_cls = type(getattr(model, "config", None))
    if hasattr(config_cls, "from_dict") and isinstance(saved_model, dict):
        # a run of an earlier release lacks fields added since: compare the configs as built
        try:
            saved_model = json.loads(json.dumps(config_cls.from_dict(saved_model).to_dict()))
        except ValueError:
            pass  # reported below as a difference
    if saved_model != model_cfg:
        diff = sorted(
            k for k in set(saved_model) | set(model_cfg) if saved_model.get(k) != model_cfg.get(k)
        )
        raise RunDirError(f"cannot resume {str(run_dir)!r}: the model config differs in {diff}")


def _load_whole(
    run_dir: Path, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict, device
) -> None:
    """Weights from model.safetensors, optimizer from state.pt (checked to be of one step)."""
    what = f"cannot resume {str(run_dir)!r}"
    step = state["progress"]["step"]
    weights_step = dcp_files.weights_step(run_dir / LAST_FILE)
    if weights_step != step:
        raise RunDirError(
            f"{what}: {LAST_FILE} is from step {weights_step} but {STATE_FILE} from step "
            f"{step} (interrupted while saving?)"
        )
    if is_sharded(model):
        weights = load_file(run_dir / LAST_FILE)
        load_full_into_sharded(model, optimizer, weights, state["optimizer"], what)
        return
    missing, unexpected = load_model(model, run_dir / LAST_FILE, strict=False, device=str(device))
    if missing or unexpected:
        raise RunDirError(
            f"cannot resume: {LAST_FILE} does not match the model (missing "
            f"{sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]})"
        )
    try:
        optimizer.load_state_dict(state["optimizer"])
    except ValueError as err:
        raise RunDirError(f"cannot resume: optimizer state does not fit the model: {err}") from None


def restore_task_state(run_dir: Path, task) -> None:
    """Give a task with ``load_state_dict`` (:class:`~attnlab.tasks.lm_xl.XLTask`: the memory
    carried between steps) what its ``state_dict`` left in state.pt, when there is any."""
    path = run_dir / STATE_FILE
    if not hasattr(task, "load_state_dict") or not path.exists():
        return
    saved = read_state(path).get("task")
    if saved is not None:
        task.load_state_dict(saved)


def load_checkpoint(
    run_dir: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    schedule: LRSchedule,
    cfg: TrainConfig,
    kind: str,
    model_cfg: dict,
    device: torch.device,
    rank: int,
) -> tuple[Progress, list[dict]]:
    """Restore weights, optimizer, schedule, progress and (rank 0) random state from run_dir.

    Every rank calls it (a sharded checkpoint is read collectively).

    Returns:
        The progress and the metrics history up to the checkpoint's step.

    Raises:
        RunDirError: another kind of model or config, a damaged state.pt, weights from another
            step than the state, weights or optimizer state that do not fit the model, a
            sharded checkpoint of another model.
    """
    _check_identity(run_dir, model, kind, model_cfg)
    state = read_state(run_dir / STATE_FILE) if (run_dir / STATE_FILE).exists() else None
    sharded = dcp_files.last_sharded(run_dir)
    decay = [g["weight_decay"] for g in optimizer.param_groups]
    if sharded is not None and (state is None or sharded[0] > state["progress"]["step"]):
        what = f"cannot resume {str(run_dir)!r}"
        state = load_sharded(sharded[1], model, optimizer, kind, model_cfg, what)
        source = f"the sharded checkpoint {sharded[1].name}"
    elif state is not None:
        _load_whole(run_dir, model, optimizer, state, device)
        source = LAST_FILE
    else:
        raise RunDirError(f"cannot resume {str(run_dir)!r}: no checkpoint there")
    for g, wd in zip(optimizer.param_groups, decay):  # this run's settings win over the saved
        g["weight_decay"] = wd
        if "betas" in g:  # AdamW's groups (Muon's have none)
            g["betas"] = tuple(cfg.betas)
    step = state["progress"]["step"]
    schedule.load_state_dict(state["schedule"])
    prog = Progress(**state["progress"])
    if rank == 0:
        restore_rng(state["rng"])
    else:  # only rank 0's streams are saved; the others restart from a distinct, fixed seed
        seed_all(cfg.seed + rank + 7919 * step)
    history = _read_history(run_dir / METRICS_FILE, step)
    if rank == 0:
        log.info("resuming %s from step %d (%s)", run_dir, step, source)
    return prog, history


def warn_about_settings(run_dir: Path, task, cfg: TrainConfig, resume: bool) -> None:
    """Warn about settings that will surprise: a changed resume, a warm-up as long as the run."""
    if resume:
        saved = runs.read_config(run_dir)
        if saved.get("task") != json.loads(json.dumps(task.config_dict())):
            log.warning("resuming %s with a different task config: the data may differ", run_dir)
        saved_train = saved.get("train") or {}
        if saved_train != json.loads(json.dumps(cfg.to_dict())):
            log.info("resuming %s with changed training settings", run_dir)
        old = "max_time" if saved_train.get("max_time") is not None else "steps"
        new = "max_time" if cfg.timed else "steps"
        old_length = saved_train.get(old)
        changed = old_length is not None and (old, old_length) != (new, getattr(cfg, new))
        if cfg.schedule in ("cosine", "wsd") and changed:  # (a typed --steps may replace a budget)
            log.warning(
                "resuming a %s schedule fitted to %s=%s with %s=%s: the learning rate "
                "jumps back up from where the shorter schedule left it, so this is not the "
                "same as one run of the new length (constant and inverse_sqrt schedules are; "
                "or give the full length from the start and stop early with Ctrl-C)",
                cfg.schedule,
                old,
                old_length,
                new,
                getattr(cfg, new),
            )
    if not cfg.timed and cfg.schedule != "inverse_sqrt" and cfg.warmup >= cfg.steps:
        log.warning(
            "the warm-up (%d steps) is not shorter than the run (%d steps): the learning rate "
            "never reaches lr=%g; lower --warmup",
            cfg.warmup,
            cfg.steps,
            cfg.lr,
        )
