"""Data parallelism under ``torchrun``: process group, rank helpers, reductions.

``torchrun --nproc_per_node=K ...`` starts K processes and sets ``WORLD_SIZE``, ``RANK``,
``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``. Each process holds a full model replica, computes
gradients on its share of the global batch, and ``DistributedDataParallel`` averages the
gradients (all-reduce) so every replica takes the same optimizer step. Backend: NCCL for CUDA
tensors, gloo on the CPU.
"""

from __future__ import annotations

import atexit
import logging
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from attnlab.errors import UserError

__all__ = [
    "DistInfo",
    "setup",
    "is_distributed",
    "get_rank",
    "get_world_size",
    "is_main",
    "all_reduce_mean",
    "all_reduce_sum",
    "broadcast_float",
    "broadcast_ok",
    "broadcast_object",
    "share_of",
    "barrier",
    "wrap_ddp",
    "resolve_device",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistInfo:
    """Where this process stands: ``rank`` of ``world`` processes, and its device."""

    rank: int
    world: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """``"auto"`` -> this process's GPU if CUDA is available, else the CPU."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise UserError(f"unknown device {name!r}: {err}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"device {name!r} requested but CUDA is not available")
        if device.index is None:
            device = torch.device("cuda", local_rank)
        if device.index >= torch.cuda.device_count():
            raise UserError(
                f"device {device} does not exist: this machine has "
                f"{torch.cuda.device_count()} GPU(s) (LOCAL_RANK={local_rank}); start at most "
                "that many processes per node, or use --device cpu"
            )
    return device


def _env_world() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def setup(device: str = "auto", *, group: bool = False) -> DistInfo:
    """Join the process group when launched by torchrun (``WORLD_SIZE`` > 1); idempotent.

    The group stays open for the life of the process (several trainings may run in one
    process, e.g. a model and its baselines) and is destroyed at exit.

    Args:
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
        group: join even when torchrun started a single process (FSDP needs a group).
    """
    world = _env_world()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = resolve_device(device, local_rank)
    if world <= 1 and not (group and "MASTER_ADDR" in os.environ):
        return DistInfo(0, 1, 0, dev)
    if not dist.is_initialized():
        backend = "nccl" if dev.type == "cuda" else "gloo"
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        dist.init_process_group(backend=backend)
        atexit.register(_destroy)
        log.info(
            "joined process group: rank %d of %d, backend %s",
            dist.get_rank(),
            dist.get_world_size(),
            backend,
        )
    return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank, dev)


def _destroy() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def get_rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def get_world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def is_main() -> bool:
    return get_rank() == 0


def all_reduce_mean(t: torch.Tensor) -> torch.Tensor:
    """Mean of ``t`` over all ranks (``t`` itself when not distributed); in place."""
    if is_distributed():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        t /= dist.get_world_size()
    return t


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum of ``t`` over all ranks; in place."""
    if is_distributed():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def broadcast_float(x: float, device: torch.device) -> float:
    """Rank 0's value of ``x`` on every rank (so all ranks take the same decisions)."""
    if not is_distributed():
        return x
    t = torch.tensor([x], dtype=torch.float64, device=device)
    dist.broadcast(t, src=0)
    return float(t.item())


def broadcast_ok(ok: bool, device: torch.device) -> bool:
    """Rank 0's ``ok`` on every rank, so that all ranks stop together when rank 0 cannot go on
    (its run directory is locked by another job, say) instead of waiting for it forever."""
    return broadcast_float(1.0 if ok else 0.0, device) > 0.5


def share_of(n: float, device: torch.device) -> torch.Tensor | float:
    """This rank's share of a global batch's units (tokens, examples) against an equal split.

    ``n · world / Σ n``: a rank's mean loss weighted by it averages, over the ranks, to the mean
    over the whole global batch, however the units fall (padding makes the token counts of the
    ranks differ). 1.0 in one process; a collective under torchrun.
    """
    if not is_distributed():
        return 1.0
    total = torch.tensor(float(n), device=device)
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return float(n) * dist.get_world_size() / total.clamp(min=1.0)


def broadcast_object(obj):
    """Rank 0's ``obj`` (any picklable value) on every rank."""
    if not is_distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier() -> None:
    if is_distributed():
        dist.barrier()


class _DDP(DistributedDataParallel):
    """DDP that still answers attribute look-ups of the wrapped model (``model.config``,
    ``model.kind``), so task code works unchanged on a wrapped model."""

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.module, name)


def wrap_ddp(model: nn.Module, device: torch.device) -> nn.Module:
    """Wrap in DistributedDataParallel when running with several processes."""
    if not is_distributed():
        return model
    ids = [device.index] if device.type == "cuda" else None
    return _DDP(model, device_ids=ids)
