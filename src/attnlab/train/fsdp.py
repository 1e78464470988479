"""Fully sharded data parallelism (FSDP2, ``torch.distributed.fsdp.fully_shard``) for every family.

DDP keeps a whole replica on each of the N ranks: the parameters, their gradients and AdamW's two
moments, ``4 + 4 + 8 = 16`` bytes per fp32 parameter on every rank. FSDP (ZeRO-3) shards all
three over the ranks, so each keeps ``16 / N`` bytes per parameter, plus, for the time a unit
computes, that unit's gathered parameters (and its full gradients until they are
reduce-scattered)::

    forward,  unit l:  all-gather W_l shards -> compute -> free the gathered W_l
    backward, unit l:  all-gather W_l again  -> grads   -> reduce-scatter (average) -> free
    optimizer:         AdamW on this rank's shard of every W, grad and moment

A *unit* is one repeated layer: every :class:`attnlab.layers.block.TransformerBlock`, and the
members of any ``nn.ModuleList`` of two or more modules of one type (RNN layers, Swin stages),
or what a model lists in ``model.fsdp_units()`` (a family's own choice). FSDP gathers a module's
parameters when its ``forward`` runs: a model whose task's ``loss`` calls other methods of the
model itself lists them in ``model.fsdp_forward_methods()`` (names); ``evaluate`` runs with the
model's own parameters gathered (:func:`whole_root`), so decoding works unchanged. Each unit is wrapped
with ``fully_shard`` (innermost first), then the model itself, which holds the rest (embeddings,
heads, final norms). A unit that shares a parameter with the outside (an LM's output head tied
to its embeddings is outside any unit; a table shared by every block would be) is not wrapped on
its own: its parameters stay with the enclosing unit, so a tied weight is one sharded tensor.

Mixed precision (``MixedPrecisionPolicy``): parameters are gathered and computed in
``fsdp_param_dtype`` (bf16 with ``amp="bf16"`` unless told otherwise), gradients are
reduce-scattered in ``fsdp_reduce_dtype`` (fp32 by default), and the sharded master weights and
optimizer state stay in fp32.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.device_mesh import init_device_mesh

from attnlab.errors import UserError
from attnlab.layers.block import TransformerBlock
from attnlab.train.config import TrainConfig

__all__ = [
    "under_torchrun",
    "check_strategy",
    "fsdp_units",
    "param_names",
    "mixed_precision",
    "shard_model",
    "is_sharded",
    "whole_root",
    "gradient_sync",
    "full_value",
    "full_state_dict",
    "memory_report",
    "format_memory",
    "log_memory",
]

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _fsdp():
    """``fully_shard``, ``FSDPModule``, ``MixedPrecisionPolicy`` (public since torch 2.6)."""
    # lazy: torch.distributed.fsdp takes ~1 s to import; only FSDP runs (torchrun) need it
    try:
        from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
    except ImportError:  # torch 2.5
        from torch.distributed._composable.fsdp import (  # type: ignore[no-redef]
            FSDPModule,
            MixedPrecisionPolicy,
            fully_shard,
        )
    return fully_shard, FSDPModule, MixedPrecisionPolicy


def under_torchrun() -> bool:
    """True in a process that torchrun (or a launcher setting the same variables) started."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def check_strategy(cfg: TrainConfig, resume: bool) -> bool:
    """Whether this run shards its model (``strategy="fsdp"`` in a torchrun process).

    A resumed FSDP run may continue in a single process (its checkpoint is read at any world
    size); it then trains unsharded, which is said in the log.

    Raises:
        UserError: ``strategy="fsdp"`` for a new run outside torchrun.
    """
    if cfg.strategy != "fsdp":
        return False
    if under_torchrun():
        return True
    if resume:
        log.warning(
            "--strategy fsdp outside torchrun: resuming in one process, unsharded (start it "
            "with torchrun to shard it again)"
        )
        return False
    raise UserError(
        "--strategy fsdp shards the model over the processes that torchrun starts; run "
        "'torchrun --nproc_per_node=N -m attnlab.cli train ...' (N=1 on one device), or drop "
        "--strategy fsdp to train in this one process"
    )


def param_names(model: nn.Module) -> dict[int, list[str]]:
    """Every name of every parameter (a tied parameter has several)."""
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    return names


def fsdp_units(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The submodules that get their own ``fully_shard``, innermost first.

    ``model.fsdp_units()`` (an iterable of submodules) when the model defines it; otherwise
    every ``TransformerBlock`` and every member of an ``nn.ModuleList`` of two or more modules
    of one type. Units without parameters, and units sharing a parameter with a module outside
    them, are left out.

    Returns:
        ``(name, module)`` pairs, deeper modules before the ones that contain them.
    """
    named = {id(m): name for name, m in model.named_modules()}
    if callable(getattr(model, "fsdp_units", None)):
        chosen = list(model.fsdp_units())
        stray = [type(m).__name__ for m in chosen if id(m) not in named]
        if stray:
            raise ValueError(f"fsdp_units() returned modules that are not in the model: {stray}")
    else:
        chosen = [m for m in model.modules() if isinstance(m, TransformerBlock)]
        for m in model.modules():
            if isinstance(m, nn.ModuleList) and len(m) >= 2 and len({type(c) for c in m}) == 1:
                chosen.extend(m)
    all_names = param_names(model)
    units, seen = [], set()
    for m in chosen:
        name = named[id(m)]
        if id(m) in seen or m is model or not name:
            continue
        seen.add(id(m))
        inside = {id(p) for p in m.parameters()}
        if not inside:
            continue
        prefix = name + "."
        shared = [
            n for pid in inside for n in all_names[pid] if not n.startswith(prefix)
        ]  # names of this unit's parameters outside it
        if shared:
            log.info("FSDP: %s shares %s with the rest of the model; not a unit", name, shared[:3])
            continue
        units.append((name, m))
    units.sort(key=lambda u: -u[0].count("."))  # innermost first (stable: model order kept)
    return units


def mixed_precision(cfg: TrainConfig):
    """The ``MixedPrecisionPolicy`` of ``cfg``: compute dtype and gradient-reduction dtype."""
    _, _, MixedPrecisionPolicy = _fsdp()
    name = cfg.fsdp_param_dtype
    if name == "auto":
        name = "bfloat16" if cfg.amp == "bf16" else "float32"
    param_dtype = _DTYPES[name]
    return MixedPrecisionPolicy(
        param_dtype=None if param_dtype == torch.float32 else param_dtype,
        reduce_dtype=_DTYPES[cfg.fsdp_reduce_dtype],
    )


def shard_model(model: nn.Module, cfg: TrainConfig, device: torch.device) -> list[str]:
    """Apply ``fully_shard`` to every unit of ``model``, then to ``model`` (in place).

    The process group must be up (:func:`attnlab.train.distributed.setup`); ``model`` is on
    ``device``. Parameters become ``DTensor`` shards; names, attributes (``model.config``) and
    tied weights are kept.

    Returns:
        The names of the units.
    """
    from torch.distributed.fsdp import register_fsdp_forward_method  # lazy, as in _fsdp()

    fully_shard, _, _ = _fsdp()
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    options = dict(
        mesh=mesh,
        mp_policy=mixed_precision(cfg),
        reshard_after_forward=cfg.fsdp_reshard_after_forward,
    )
    units = fsdp_units(model)
    for _, unit in units:
        fully_shard(unit, **options)
    fully_shard(model, **options)
    for name in getattr(model, "fsdp_forward_methods", lambda: ())():
        register_fsdp_forward_method(model, name)  # gathers like forward when called
    log.info(
        "FSDP over %d ranks: %d units (%s) + the model",
        dist.get_world_size(),
        len(units),
        ", ".join(name for name, _ in units[:4]) + (", ..." if len(units) > 4 else ""),
    )
    return [name for name, _ in units]


@contextlib.contextmanager
def whole_root(model: nn.Module) -> Iterator[None]:
    """Gather the model's own parameters (embeddings, heads: those of no unit) for a block.

    FSDP gathers a module's parameters when its ``forward`` is called; a task's ``evaluate``
    may call other methods (``start_decoding``, ``decode_step``, ``encode``), which would meet
    sharded parameters. The units inside still gather themselves when called. A collective:
    every rank runs the block.
    """
    if not is_sharded(model):
        yield
        return
    model.unshard()
    try:
        yield
    finally:
        model.reshard()


def is_sharded(model: nn.Module) -> bool:
    """True for a model that :func:`shard_model` wrapped."""
    _, FSDPModule, _ = _fsdp()
    return isinstance(model, FSDPModule)


def gradient_sync(model: nn.Module, enabled: bool) -> None:
    """FSDP's ``no_sync``: skip (or do) the reduce-scatter in the next backward.

    With gradient accumulation only the last micro-batch of a step reduce-scatters; the
    earlier ones add up unsharded gradients on each rank.
    """
    model.set_requires_gradient_sync(enabled)


def full_value(t: Tensor) -> Tensor:
    """A ``DTensor`` (a clipped gradient norm under FSDP) as a plain tensor; others unchanged."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def full_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """Gather the whole model's weights on rank 0 (CPU), one name per tied tensor.

    A collective: every rank calls it; the others get ``{}``. Used for the consolidated
    ``model.safetensors`` / ``best.safetensors``.
    """
    # lazy: torch.distributed.checkpoint takes ~1.5 s to import; only sharded runs need it
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    # like safetensors' save_model, keep the alphabetically first name of a tied tensor
    drop = {n for names in param_names(model).values() for n in sorted(names)[1:]}
    return {k: v for k, v in full.items() if k not in drop}


# ----------------------------------------------------------------------------------------------
# memory


def _local(t: Tensor) -> Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _nbytes(tensors: Iterator[Tensor]) -> int:
    return sum(_local(t).numel() * _local(t).element_size() for t in tensors)


def _rss_bytes() -> tuple[int, int]:
    """(current, peak) resident set size of this process, from /proc (0, 0 elsewhere)."""
    try:
        with open("/proc/self/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return tuple(int(fields[k].split()[0]) * 1024 for k in ("VmRSS", "VmHWM"))  # type: ignore[return-value]
    except (OSError, KeyError, ValueError):
        return 0, 0


def memory_report(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes this rank holds: its parameter, gradient and optimizer-state shards, and more.

    Measured by summing the local tensors (a ``DTensor`` counts its local shard only), so under
    FSDP each number is about 1/N of DDP's. Call it after an optimizer step (gradients exist).

    Returns:
        ``{"params", "grads", "optimizer", "rss", "peak_rss"}`` and, on CUDA,
        ``"cuda_peak"`` (``torch.cuda.max_memory_allocated``).
    """
    params = list({id(p): p for p in model.parameters()}.values())
    state = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, Tensor)]
    rss, peak = _rss_bytes()
    report = {
        "params": _nbytes(iter(params)),
        "grads": _nbytes(p.grad for p in params if p.grad is not None),
        "optimizer": _nbytes(iter(state)),
        "rss": rss,
        "peak_rss": peak,
    }
    device = params[0].device if params else torch.device("cpu")
    if device.type == "cuda":
        report["cuda_peak"] = torch.cuda.max_memory_allocated(device)
    return report


def format_memory(report: dict[str, int]) -> str:
    """``parameters 1.2 MB, gradients 1.2 MB, optimizer 2.4 MB, RSS 310 MB (peak 320 MB)``."""

    def mb(n: int) -> str:
        return f"{n / 2**20:.1f} MiB"

    text = (
        f"parameters {mb(report['params'])}, gradients {mb(report['grads'])}, optimizer state "
        f"{mb(report['optimizer'])}, RSS {mb(report['rss'])} (peak {mb(report['peak_rss'])})"
    )
    if "cuda_peak" in report:
        text += f", CUDA peak {mb(report['cuda_peak'])}"
    return text


def log_memory(
    model: nn.Module, optimizer: torch.optim.Optimizer, rank: int, world: int
) -> dict[str, int]:
    """Log (INFO, ``attnlab -v``) and return this rank's :func:`memory_report`."""
    report = memory_report(model, optimizer)
    log.info("rank %d/%d memory: %s", rank, world, format_memory(report))
    return report
