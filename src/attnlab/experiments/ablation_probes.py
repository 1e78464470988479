"""What the ``batchnorm``, ``residual`` and ``positions-concat`` rows of
:mod:`attnlab.experiments.ablations` measure with, and their tables.

- :func:`batch_dependence`: how much a window's logits change with the rest of its batch, with
  padding and with later positions (BatchNorm's batch statistics; LayerNorm's none);
- :func:`block_grad_norms`: the gradient norm of each block's parameters;
- :class:`ConcatPositions`: positions concatenated to the token embedding instead of added.

Shape legend: B batch, T window, V vocab, C d_model, P the position code's width.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.errors import UserError
from attnlab.experiments import common
from attnlab.layers.block import LearnedPositionalEmbedding
from attnlab.layers.position import Positions

__all__ = [
    "ConcatPositions",
    "batch_dependence",
    "block_grad_norms",
    "dependence_table",
    "grad_table",
]


class ConcatPositions(Positions):
    """Positions concatenated instead of added: the first C − P channels of the token embedding
    are kept and a learned P-wide position code fills the last P, ``[E[x_t]_{:C−P} ; p_t]``.

    The model width stays C; a tied output layer still reads all C columns of the embedding.

    Args:
        max_seq_len: positions in the table.
        d_model: C.
        width: P (1 ≤ P < C).
    """

    absolute = True

    def __init__(self, max_seq_len: int, d_model: int, width: int) -> None:
        super().__init__()
        if not 1 <= width < d_model:
            raise UserError(f"the position width must lie in [1, d_model), got {width}")
        self.keep = d_model - width
        self.code = LearnedPositionalEmbedding(max_seq_len, width)

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        code = self.code(positions).to(x.dtype)  # (T, P) or (B, T, P)
        code = code.expand(*x.shape[:-1], code.shape[-1])  # (B, T, P)
        return torch.cat([x[..., : self.keep], code], dim=-1)  # (B, T, C)


@torch.no_grad()
def batch_dependence(
    model: nn.Module, x: Tensor, *, training: bool = True, pad_id: int = 0
) -> dict:
    """How much one window's outputs depend on what else is in the batch.

    ``x (B, T)`` is split into halves ``a`` and ``b`` of ``B // 2`` rows. In training mode
    (``training``: a BatchNorm uses the batch's statistics; the model must have no dropout) or
    evaluation mode, the largest absolute change of the logits of

    - ``batch``: row 0 of ``a`` when rows 1… of ``a`` are replaced by those of ``b``;
    - ``padding``: the rows of ``a`` cut to their first R = T − T // 2 tokens, at those R
      positions, when T // 2 ``pad_id`` tokens are appended to every row (a causal model's real
      positions never read them);
    - ``future``: the first T // 2 positions of ``a`` when the last T − T // 2 of every row are
      replaced by ``b``'s (a causal model's earlier positions never read them).

    The model's mode and its buffers (BatchNorm's running statistics) are restored.
    """
    if x.shape[0] < 4 or x.shape[1] < 2:
        raise ValueError(
            f"batch_dependence needs at least 4 rows of 2 tokens, got {tuple(x.shape)}"
        )
    was, saved = model.training, {k: v.clone() for k, v in model.named_buffers()}
    model.train(training)
    half, T = x.shape[0] // 2, x.shape[1]
    a, b = x[:half], x[half : 2 * half]
    base = model(a)  # (B/2, T, V)
    swapped = model(torch.cat([a[:1], b[1:]]))[0]
    R = T - T // 2
    short = model(a[:, :R])  # (B/2, R, V)
    padded = model(torch.cat([a[:, :R], torch.full((half, T // 2), pad_id)], dim=1))
    future = model(torch.cat([a[:, : T // 2], b[:, T // 2 :]], dim=1))[:, : T // 2]
    out = {
        "batch": float((swapped - base[0]).abs().max()),
        "padding": float((padded[:, :R] - short).abs().max()),
        "future": float((future - base[:, : T // 2]).abs().max()),
    }
    model.train(was)
    buffers = dict(model.named_buffers())
    for k, v in saved.items():
        buffers[k].copy_(v)
    return out


def block_grad_norms(model: nn.Module, x: Tensor) -> list[float]:
    """The L2 norm of the next-token loss's gradient on ``x (B, T)`` with respect to each block's
    parameters, first block first (training mode; gradients cleared afterwards)."""
    was = model.training
    model.train()
    model.zero_grad(set_to_none=True)
    F.cross_entropy(model(x[:, :-1]).transpose(1, 2), x[:, 1:]).backward()
    norms = [
        math.sqrt(sum(float(p.grad.pow(2).sum()) for p in block.parameters() if p.grad is not None))
        for block in model.blocks
    ]
    model.zero_grad(set_to_none=True)
    model.train(was)
    return norms


def dependence_table(variants: list[dict]) -> common.Table:
    table = common.Table(
        ["variant", "mode", "Δ other windows", "Δ padding", "Δ later positions"],
        formats=["", "", ".2e", ".2e", ".2e"],
    )
    for r in variants:
        for mode, key in (("training (batch statistics)", "dependence"),
                          ("evaluation", "dependence_eval")):  # fmt: skip
            d = r[key]
            table.add(r["variant"], mode, d["batch"], d["padding"], d["future"])
    return table


def grad_table(variants: list[dict]) -> common.Table:
    table = common.Table(
        ["variant", "when", "‖g‖ layer 1", "‖g‖ middle layer", "‖g‖ last layer", "first / last",
         "by layer"],
        formats=["", "", ".2e", ".2e", ".2e", ".3g", ""],
    )  # fmt: skip
    for r in variants:
        for when, key in (("initialisation", "grads_init"), ("trained", "grads_trained")):
            v = r[key]
            table.add(r["variant"], when, v[0], v[len(v) // 2], v[-1], v[0] / v[-1],
                      ", ".join(f"{g:.2g}" for g in v))  # fmt: skip
    return table
