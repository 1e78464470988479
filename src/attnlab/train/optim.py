"""AdamW with weight-decay groups, and the learning-rate schedules.

Weight decay pulls weights towards zero; it makes sense for the matrices of linear maps, not for
gains and biases of norms, biases, embeddings or positional tables (shrinking those only hurts), so
they go into a second group with ``weight_decay=0`` (nanoGPT ``configure_optimizers``; timm
``param_groups_weight_decay``).

Schedules (``step`` = number of optimizer steps already taken, so the first step has ``step=0``;
``W`` = warm-up steps, ``S`` = total steps, ``lr`` = peak rate, ``lr_min = lr * min_lr_ratio``):

- ``cosine``: ``lr * (step+1)/W`` for ``step < W``, then
  ``lr_min + ½ (lr - lr_min) (1 + cos(π p))`` with ``p = (step - W) / (S - W)``.
- ``inverse_sqrt`` (Vaswani et al. 2017, §5.3, rescaled so the peak is ``lr``):
  ``lr * min(s/W, sqrt(W/s))`` with ``s = step + 1``: linear up to ``lr`` at ``s = W``, then ∝ 1/√s.
- ``constant``: the same linear warm-up, then ``lr``.
- ``wsd`` (warm-up, stable, decay; the speedrun's warm-up-free schedule with a long cool-down
  when ``W = 0``): the same warm-up, then ``lr`` until ``p = 1 − f``, then a straight line to
  ``lr_min`` at ``p = 1``: ``lr_min + (lr − lr_min) · min(1, (1 − p) / f)``, with ``p`` as for
  ``cosine`` and ``f = cooldown_frac``.

With a wall-clock budget (``max_time``) the progress ``p`` of ``cosine`` and ``wsd`` is measured
in time instead:
``p = (t - t_W) / (1 - t_W)`` with ``t = elapsed / max_time`` and ``t_W`` the value of ``t`` when
the warm-up ended; a warm-up given as ``warmup_frac`` is then also a fraction of the time.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from attnlab.train.config import TrainConfig
from attnlab.train.muon import MuonAdamW, make_muon_adamw

__all__ = ["param_groups", "make_optimizer", "LRSchedule", "no_decay", "MuonAdamW"]


def _marks_no_decay(piece: str) -> bool:
    """A name piece that marks an embedding, a positional table or a learned token."""
    piece = piece.lower()
    return (
        "emb" in piece
        or "position" in piece
        or piece.startswith("pos")
        or "_pos" in piece
        or piece.endswith("token")
    )


def no_decay(name: str, param: nn.Parameter, owner: nn.Module | None = None) -> bool:
    """True if the parameter ``name`` (held by module ``owner``) should not be weight-decayed.

    In order: tensors with fewer than 2 dimensions (biases, norm gains) are not decayed; weights
    of ``nn.Embedding`` and of normalisation layers (class name containing ``Norm``) are not;
    weights of ``nn.Linear`` and convolutions are (whatever their names: ``patch_embed.proj``
    is a linear map); otherwise the parameter's own name or its module's name decides:
    containing ``emb``, ``position`` or ``_pos``, starting with ``pos`` or ending in ``token``
    (``pos_emb.weight``, ``pos_embed``, ``rel_pos.table``, ``cls_token``) means no decay.
    """
    if param.ndim < 2:
        return True
    if owner is not None:
        if isinstance(owner, nn.Embedding) or "Norm" in type(owner).__name__:
            return True
        if isinstance(owner, (nn.Linear, nn.modules.conv._ConvNd)):
            return False
    return any(_marks_no_decay(piece) for piece in name.split(".")[-2:])


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Split the trainable parameters of ``model`` into a decayed and a non-decayed group.

    The rule is :func:`no_decay`; names (of parameters or modules) returned by an optional
    ``model.no_weight_decay()`` (the timm convention) are excluded as well. Shared (tied)
    parameters appear once, under their first name.

    Returns:
        ``[{"params": [...], "weight_decay": weight_decay, "names": [...]},
        {"params": [...], "weight_decay": 0.0, "names": [...]}]`` (empty groups dropped).
    """
    extra = set(model.no_weight_decay()) if hasattr(model, "no_weight_decay") else set()
    owner: dict[int, nn.Module] = {}
    exempt: set[int] = set()
    for mod_name, module in model.named_modules():
        for p in module.parameters(recurse=False):
            owner.setdefault(id(p), module)
            if isinstance(module, nn.Embedding):  # a tied output head stays undecayed too
                exempt.add(id(p))
        if mod_name in extra:
            exempt.update(id(p) for p in module.parameters())
    decay, keep = ([], []), ([], [])
    for name, p in model.named_parameters():  # named_parameters() yields a tied tensor once
        if not p.requires_grad:
            continue
        skip = id(p) in exempt or name in extra or no_decay(name, p, owner.get(id(p)))
        group = keep if skip else decay
        group[0].append(p)
        group[1].append(name)
    groups = [
        {"params": decay[0], "names": decay[1], "weight_decay": weight_decay},
        {"params": keep[0], "names": keep[1], "weight_decay": 0.0},
    ]
    return [g for g in groups if g["params"]]


#: devices with a fused AdamW kernel (one kernel for every parameter tensor)
FUSED_DEVICES = ("cpu", "cuda")


def make_optimizer(
    model: nn.Module, cfg: TrainConfig, device: torch.device | None = None
) -> torch.optim.AdamW | MuonAdamW:
    """AdamW over :func:`param_groups` with ``cfg.lr``, ``cfg.betas``, ``cfg.weight_decay``.

    The fused kernel is used on CPUs and GPUs: on a CPU torch otherwise updates one tensor at a
    time (its default) or in ``foreach`` batches, and for small models the optimizer step is then
    a large share of a training step. Measured on 2 CPU cores (1 thread, gpt2-mini, 0.8M
    parameters in 50 tensors; ``benchmarks/train_throughput.py --optimizers``): one tensor at a
    time 33 ms, foreach 15 ms, fused 2 ms per step.

    With ``cfg.optimizer == "muon"`` the hidden weight matrices go to ``torch.optim.Muon``
    instead (:mod:`attnlab.train.muon`).
    """
    muon = cfg.optimizer == "muon"
    groups = param_groups(model, 1.0 if muon else cfg.weight_decay)
    if not groups:
        raise ValueError("the model has no trainable parameters")
    dev = device if device is not None else next(p.device for g in groups for p in g["params"])
    fused = dev.type in FUSED_DEVICES and all(
        p.is_floating_point() for g in groups for p in g["params"]
    )
    if muon:
        return make_muon_adamw(groups, cfg, fused or None)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), fused=fused or None)


class LRSchedule:
    """The learning rate as a function of the step (and, for timed runs, the elapsed fraction).

    Explicit rather than a ``torch.optim.lr_scheduler`` so that a wall-clock budget can drive it;
    the trainer calls :meth:`apply` before every optimizer step. Its only state is ``t_W`` (the
    time fraction at which a step-counted warm-up ended in a timed run), saved for ``--resume``.
    """

    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.peak = cfg.lr
        self.floor = cfg.lr * cfg.min_lr_ratio
        self.warmup = cfg.warmup  # steps, or None for a time-fraction warm-up
        self.warmup_end_t: float | None = None

    def __call__(self, step: int, t: float | None = None) -> float:
        """Learning rate for the optimizer step with index ``step`` (0-based).

        Args:
            step: optimizer steps already taken.
            t: elapsed fraction of the time budget (timed runs only), in [0, 1].
        """
        cfg = self.cfg
        if cfg.schedule == "inverse_sqrt":
            s, w = step + 1, self.warmup
            return self.peak * min(s / w, math.sqrt(w / s))
        # linear warm-up (in steps, or in time for a time-fraction warm-up)
        if self.warmup is None:
            wf = cfg.warmup_frac
            if t is not None and t < wf:
                return self.peak * t / wf
            start = wf
        else:
            if step < self.warmup:
                return self.peak * (step + 1) / self.warmup
            start = None
        if cfg.schedule == "constant":
            return self.peak
        # progress p in [0, 1] after the warm-up: in steps, or in time for a timed run
        if cfg.timed:
            if start is None:
                if self.warmup_end_t is None:
                    self.warmup_end_t = t
                start = self.warmup_end_t
            p = (t - start) / max(1.0 - start, 1e-12)
        else:
            p = (step - self.warmup) / max(cfg.steps - self.warmup, 1)
        p = min(max(p, 0.0), 1.0)
        if cfg.schedule == "wsd":  # stable, then a linear cool-down over the last cooldown_frac
            return self.floor + (self.peak - self.floor) * min(1.0, (1.0 - p) / cfg.cooldown_frac)
        return self.floor + 0.5 * (self.peak - self.floor) * (1.0 + math.cos(math.pi * p))

    def apply(self, optimizer: torch.optim.Optimizer, step: int, t: float | None = None) -> float:
        """Set the learning rate of every parameter group (times its ``lr_scale``, 1 unless
        set: Muon's groups carry ``muon_lr / lr``); return the unscaled rate."""
        lr = self(step, t)
        for group in optimizer.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)
        return lr

    def state_dict(self) -> dict:
        return {"warmup_end_t": self.warmup_end_t}

    def load_state_dict(self, state: dict) -> None:
        self.warmup_end_t = state.get("warmup_end_t")
