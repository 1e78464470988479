"""Muon for the hidden weight matrices, AdamW for everything else (``TrainConfig.optimizer="muon"``).

Muon (Jordan et al. 2024, the modded-nanogpt speedrun; ``torch.optim.Muon``) keeps a Nesterov
momentum ``B`` of the gradient of a matrix ``W`` and steps along its orthogonalisation::

    B ← μ B + G;   B̃ = G + μ B;   O = NS₅(B̃ / ‖B̃‖_F) ≈ U Vᵀ   (B̃ = U Σ Vᵀ)
    W ← W − γ λ W − γ √max(1, rows/cols) · O

``NS₅`` is five Newton–Schulz steps ``X ← a X + (b A + c A²) X`` with ``A = X Xᵀ`` and
``(a, b, c) = (3.4445, −4.775, 2.0315)``: every singular value of the update is pushed towards 1,
so no direction of the matrix gets a step much larger than another.

Which parameters: Muon is for the matrices *inside* the network. The split (:func:`muon_split`)
starts from AdamW's decayed group of :func:`attnlab.train.optim.param_groups` (so never norms,
biases, embeddings, positional tables or a head tied to the embedding) and keeps its 2-D tensors
whose module is not an output head: a module path piece containing ``head`` or ``classifier``
(``lm_head``, ``head``, ``cls_head``) or ``emb`` (``patch_embed.proj``, a linear input embedding)
stays with AdamW, as in modded-nanogpt (embedding, head and scalars on Adam). Convolution
kernels (4-D) stay with AdamW too.

The Newton–Schulz steps run in bfloat16 on a GPU, as in ``torch.optim.Muon`` and the speedrun,
and in float32 on a CPU (:class:`Muon`): a CPU without bfloat16 matrix instructions (AVX2
only) multiplies bfloat16 matrices far slower than float32 ones (five steps on a 128 × 512
gradient: 94 ms against 3.6 ms on one core), which made a 2 × 128 model's training step 0.6 s
instead of about 50 ms; float32 is the more exact of the two as well.

The learning rate: the Muon groups carry ``lr_scale = muon_lr / lr``, which
:meth:`attnlab.train.optim.LRSchedule.apply` multiplies in, so warm-up and decay act on both
optimizers alike.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnlab.train.config import TrainConfig

__all__ = ["Muon", "MuonAdamW", "muon_split", "make_muon_adamw", "newton_schulz"]

#: the quintic's coefficients ``(a, b, c)`` (those of torch.optim.Muon and modded-nanogpt)
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def newton_schulz(
    g: Tensor,
    steps: int = 5,
    coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
    eps: float = 1e-7,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """``NS(G) ≈ U Vᵀ`` of ``G = U Σ Vᵀ``: ``steps`` iterations ``X ← a X + (b A + c A²) X``,
    ``A = X Xᵀ``, from ``X = G / ‖G‖_F``, computed in ``dtype``; returned in ``dtype``.

    A tall matrix is transposed first, so that ``A`` is the smaller Gram matrix.
    """
    a, b, c = coefficients
    x = g.to(dtype)
    tall = g.size(0) > g.size(1)
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


def _ns_dtype(device: torch.device) -> torch.dtype:
    """bfloat16 on an accelerator (its matrix units), float32 on a CPU (see the module doc)."""
    return torch.float32 if device.type == "cpu" else torch.bfloat16


class Muon(torch.optim.Muon):
    """``torch.optim.Muon``, with its Newton–Schulz steps in float32 on a CPU.

    The same constructor, parameter groups and state (``momentum_buffer``), so a state saved by
    either loads into the other; the update is torch's (Nesterov momentum, decoupled decay,
    ``adjust_lr_fn``), with :func:`newton_schulz` in the dtype :func:`_ns_dtype` picks.
    """

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, mu, decay = group["lr"], group["momentum"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse or torch.is_complex(p):
                    raise RuntimeError("Muon takes real, dense gradients only")
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad)
                buf = state["momentum_buffer"]
                buf.lerp_(p.grad, 1 - mu)
                update = p.grad.lerp(buf, mu) if group["nesterov"] else buf
                o = newton_schulz(
                    update, group["ns_steps"], group["ns_coefficients"], group["eps"],
                    dtype=_ns_dtype(p.device),
                )  # fmt: skip
                p.mul_(1 - lr * decay)
                p.add_(o.to(p.dtype), alpha=-lr * _lr_ratio(group["adjust_lr_fn"], p.shape))
        return loss


def _lr_ratio(adjust_lr_fn: str | None, shape: torch.Size) -> float:
    """torch.optim.Muon's step-size factor for a ``rows × cols`` matrix."""
    rows, cols = shape[:2]
    if adjust_lr_fn in (None, "original"):
        return math.sqrt(max(1.0, rows / cols))
    if adjust_lr_fn == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, cols))
    return 1.0


#: module-path pieces that mark an input embedding or an output head (kept on AdamW)
_EDGE_MARKS = ("head", "classifier", "emb")


def _is_edge(name: str) -> bool:
    """True if the parameter ``name`` belongs to an input embedding or an output head."""
    module_path = name.split(".")[:-1]
    return any(mark in piece.lower() for piece in module_path for mark in _EDGE_MARKS)


def muon_split(marked: list[dict], weight_decay: float) -> tuple[dict | None, list[dict]]:
    """Split parameter groups into Muon's group and AdamW's groups.

    Args:
        marked: :func:`~attnlab.train.optim.param_groups` ``(model, 1.0)``: a weight decay
            of 1.0 marks the decayed group, whatever this run's setting.
        weight_decay: this run's AdamW decay for the decayed group.

    Returns:
        ``(muon_group or None, adamw_groups)``: ``muon_group`` holds the 2-D tensors of
        :func:`~attnlab.train.optim.param_groups`' decayed group that are not an embedding or a
        head; the AdamW groups are that function's groups without them (``weight_decay`` for the
        decayed one, 0 for the other; empty groups dropped).
    """
    muon = {"params": [], "names": []}
    rest = []
    for g in marked:
        decayed = g["weight_decay"] > 0
        keep = {"params": [], "names": [], "weight_decay": weight_decay if decayed else 0.0}
        for p, name in zip(g["params"], g["names"]):
            target = muon if decayed and p.ndim == 2 and not _is_edge(name) else keep
            target["params"].append(p)
            target["names"].append(name)
        if keep["params"]:
            rest.append(keep)
    return (muon if muon["params"] else None), rest


class MuonAdamW:
    """Two optimizers stepped as one: :class:`Muon` and ``torch.optim.AdamW``.

    It offers what the trainer, the checkpoint and ``--resume`` use: ``param_groups`` (Muon's
    first), ``state``, ``step``, ``zero_grad``, ``state_dict`` and ``load_state_dict`` (one dict
    ``{"muon": ..., "adamw": ...}``).
    """

    def __init__(self, muon: Muon, adamw: torch.optim.AdamW | None):
        self.muon, self.adamw = muon, adamw
        self._parts = [o for o in (muon, adamw) if o is not None]

    @property
    def param_groups(self) -> list[dict]:
        return [g for o in self._parts for g in o.param_groups]

    @property
    def state(self) -> dict:
        """Both optimizers' per-parameter state, as one read-only dict (a ``ChainMap`` would
        let a lookup insert into Muon's ``defaultdict``)."""
        return {p: s for o in self._parts for p, s in o.state.items()}

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for o in self._parts:
            o.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self._parts:
            o.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {
            "muon": self.muon.state_dict(),
            "adamw": None if self.adamw is None else self.adamw.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        if not isinstance(state, dict) or set(state) != {"muon", "adamw"}:
            raise ValueError("the saved optimizer state is not a Muon + AdamW state")
        if (state["adamw"] is None) != (self.adamw is None):
            raise ValueError("the saved optimizer state has another Muon / AdamW split")
        self.muon.load_state_dict(state["muon"])
        if self.adamw is not None:
            self.adamw.load_state_dict(state["adamw"])


def make_muon_adamw(
    marked: list[dict], cfg: TrainConfig, fused: bool | None
) -> MuonAdamW | torch.optim.AdamW:
    """Muon over :func:`muon_split`'s matrices (``cfg.muon_lr``, ``cfg.muon_momentum``,
    ``cfg.muon_weight_decay``), AdamW as usual over the rest; plain AdamW if no matrix fits."""
    muon_group, rest = muon_split(marked, cfg.weight_decay)
    adamw = (
        torch.optim.AdamW(rest, lr=cfg.lr, betas=tuple(cfg.betas), fused=fused) if rest else None
    )
    if muon_group is None:
        return adamw
    muon_group["lr_scale"] = cfg.muon_lr / cfg.lr
    muon = Muon(
        [muon_group],
        lr=cfg.muon_lr,
        momentum=cfg.muon_momentum,
        weight_decay=cfg.muon_weight_decay,
        nesterov=True,
    )
    return MuonAdamW(muon, adamw)
