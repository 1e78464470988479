"""Validation during training: the task's loss over fixed validation batches, sharded over the
ranks, then the task's own ``evaluate`` (BLEU, accuracy...), with the training RNG untouched."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.config.train import TrainConfig
from attnlab.tasks.base import Task, to_device
from attnlab.train import distributed as dist_utils
from attnlab.train import fsdp
from attnlab.train.distributed import DistInfo
from attnlab.train.rng import capture_rng, restore_rng, rng_preserved

__all__ = ["validate"]


@torch.no_grad()
def validate(
    model: nn.Module,
    task: Task,
    cfg: TrainConfig,
    *,
    micro_bs: int,
    info: DistInfo,
    sharded: bool,
    autocast: Callable[[], AbstractContextManager[Any]],
) -> dict[str, float]:
    """Mean task loss (and metrics) over ``cfg.eval_batches`` fixed validation batches, sharded
    over the ranks, plus ``task.evaluate(model)`` when the task has one.

    Args:
        model: the model (left in train mode afterwards).
        task: the task (``eval_batches``, ``loss``, optionally ``evaluate``).
        cfg: the training settings (``eval_batches``).
        micro_bs: examples per validation batch.
        info: this process's rank, world and device.
        sharded: the model is FSDP-sharded: every rank runs every forward and ``evaluate``.
        autocast: the training loop's autocast context factory.

    Returns:
        ``{"val_loss": ..., "val_<metric>": ..., <evaluate's results>}`` (what rank 0 records).
    """
    rank, world, device = info.rank, info.world, info.device
    rec: dict[str, Any] = {}
    model.eval()
    with rng_preserved():
        if cfg.eval_batches > 0:
            batches = list(task.eval_batches(micro_bs, cfg.eval_batches))
            # shard the batches over ranks, unless there are too few to give each rank one
            shard = world > 1 and len(batches) >= world
            mine = batches[rank::world] if shard else batches
            # under FSDP each forward is a collective: a rank with fewer batches runs its
            # last one again (not counted), so that all run as many forwards
            runs_needed = -(-len(batches) // world) if shard and sharded else 0
            sums: dict[str, Tensor] = {}
            for i in range(max(len(mine), runs_needed)):
                batch = mine[min(i, len(mine) - 1)]
                with autocast():
                    loss, metrics = task.loss(model, to_device(batch, device), cfg)
                if i >= len(mine):
                    continue
                for k, v in {"loss": loss, **metrics}.items():
                    v = torch.as_tensor(v, device=device).detach().float().reshape(())
                    sums[k] = sums[k] + v if k in sums else v
            if mine:
                keys = sorted(sums)
                vec = torch.stack(
                    [sums[k] for k in keys] + [torch.tensor(float(len(mine)), device=device)]
                )  # (n_metrics + 1,)
                if shard:
                    dist_utils.all_reduce_sum(vec)
                vec = vec.cpu()
                rec.update({f"val_{k}": float(vec[j] / vec[-1]) for j, k in enumerate(keys)})
        if hasattr(task, "evaluate") and (info.is_main or sharded):
            if sharded:  # all ranks run it (collectives), with rank 0's random state
                restore_rng(dist_utils.broadcast_object(capture_rng()))
            with fsdp.whole_root(model):
                results = task.evaluate(model)
            if info.is_main:
                rec.update({k: float(v) for k, v in results.items()})
    model.train()
    return rec
