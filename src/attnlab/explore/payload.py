"""The explorer's data: one JSON-able payload per input, the same shape for every family.

A payload is what one page shows: a title, a few summary lines (the model's prediction), an
optional image, and *views*. A view is one kind of attention (a decoder's self-attention, the
cross-attention of a translation, a ViT's patches...) across its layers::

    {"id", "title", "note", "queries": [str], "keys": [str], "layers": [module names],
     "heads": H, "weights": (L, H, Tq, Tk), "scores": (L, H, Tq, Tk) or None,
     "entropy": [[bits]] (L × H), "rollout": (Tq, Tk) or None, "grid": None or
     {"rows", "cols", "key_offset", "query_offset"}, "head_dim", "scores_have_bias",
     "score_label", "query"}

Tensors travel as base64 little-endian float32 (``{"shape", "data"}``), so the page holds exactly
the numbers the model returned (``-inf`` for masked scores included) at a third of JSON's size.

- Entropy of a head: the mean over its query rows of ``−Σ_j a_ij log₂ a_ij`` (bits). A head that
  looks at one key scores 0; one that spreads evenly over n keys scores log₂ n.
- Attention rollout (Abnar & Zuidema 2020): each layer mixes tokens, the residual stream carries
  them forward, so a layer is ``Â = ½(Ā + I)`` (heads averaged, rows renormalised) and the flow
  from the inputs to the last layer's outputs is ``R = Â_L ⋯ Â_1``.

Shape legend: L layers, H heads, Tq queries, Tk keys.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from attnlab.attention.capture import AttentionMaps
from attnlab.errors import UserError

__all__ = [
    "MAX_ENTRIES",
    "LayerAttention",
    "top_guesses",
    "encode_array",
    "entropy_bits",
    "rollout_matrix",
    "make_view",
    "group_layers",
    "layer_attention",
    "head_dim_of",
    "check_size",
]

#: most attention numbers (weights + scores of every view) one page may hold (16 MB of float32)
MAX_ENTRIES = 4_000_000

# a layer name ends with its stack, its index and its attention module: "decoder.3.cross_attn"
_LAYER_NAME = re.compile(r"^(?:(?P<stack>.*)\.)?(?P<index>\d+)\.(?P<attn>[A-Za-z_]+)$")


@dataclass
class LayerAttention:
    """One layer's attention for one input: ``weights (H, Tq, Tk)``, ``scores`` alike or None."""

    name: str
    weights: Tensor
    scores: Tensor | None


def encode_array(t: Tensor) -> dict:
    """``{"shape": [...], "data": base64 of the float32 values, little-endian, row-major}``."""
    a = np.ascontiguousarray(t.detach().to(torch.float32).cpu().numpy(), dtype="<f4")
    return {"shape": list(a.shape), "data": base64.b64encode(a.tobytes()).decode("ascii")}


def entropy_bits(weights: Tensor) -> Tensor:
    """Mean entropy (bits) of the attention rows of each head: ``(L, H, Tq, Tk) -> (L, H)``.

    Rows without any weight (fully masked queries) are left out of the mean.
    """
    w = weights.double()
    plogp = torch.where(w > 0, w * torch.log2(w.clamp_min(1e-300)), torch.zeros_like(w))
    h = -plogp.sum(-1)  # (L, H, Tq)
    real = (w.sum(-1) > 0).double()  # (L, H, Tq)
    return (h * real).sum(-1) / real.sum(-1).clamp_min(1.0)


def rollout_matrix(weights: Tensor, *, residual: float = 0.5) -> Tensor:
    """Attention rollout ``R = Â_L ⋯ Â_1`` with ``Â = (1−r)·mean_heads(A) + r·I``, rows renormalised.

    Args:
        weights: ``(L, H, T, T)`` self-attention, first layer first.
        residual: weight r of the identity (the skip connection).

    Returns:
        ``(T, T)``: row i is how much each input token flows into output token i.
    """
    L, _, T, T2 = weights.shape
    if T != T2:
        raise ValueError(f"rollout needs square self-attention maps, got {tuple(weights.shape)}")
    eye = torch.eye(T, dtype=torch.float64)
    r = eye.clone()
    for layer in weights.double():
        a = (1 - residual) * layer.mean(0) + residual * eye  # (T, T)
        a = a / a.sum(-1, keepdim=True).clamp_min(1e-12)
        r = a @ r
    return r.float()


def layer_attention(maps: AttentionMaps, name: str, *, batch_index: int = 0) -> LayerAttention:
    """The last call of layer ``name`` for one row of the batch, as ``(H, Tq, Tk)``.

    Additive attention reports ``(B, S)`` per decoding step (or ``(B, T, S)`` at once): every
    call is stacked into the queries of one head.
    """
    calls = maps.calls(name)
    score_calls = maps.score_calls(name)
    first = calls[0]
    if first.dim() == 4:  # multi-head: (B, H, Tq, Tk)
        w, s = calls[-1][batch_index], maps.scores(name)
        return LayerAttention(name, w.float(), None if s is None else s[batch_index].float())

    def stack(ts: list[Tensor]) -> Tensor:
        rows = [t[batch_index] for t in ts]  # (S,) or (T, S) each
        rows = [r[None] if r.dim() == 1 else r for r in rows]
        return torch.cat(rows, 0)[None].float()  # (1, T, S)

    scores = stack(score_calls) if len(score_calls) == len(calls) else None
    return LayerAttention(name, stack(calls), scores)


def group_layers(
    maps: AttentionMaps, classify: Callable[[str, str, str], str | None]
) -> dict[str, list[LayerAttention]]:
    """Layers grouped into views, in the order they ran.

    Args:
        maps: a capture of one forward (batch of one).
        classify: ``(stack, attention module, full name) -> view id`` (None leaves it out); for
            ``decoder.3.cross_attn`` the stack is ``decoder`` and the module ``cross_attn``.
    """
    groups: dict[str, list[LayerAttention]] = {}
    for name in maps:
        m = _LAYER_NAME.match(name)
        stack, attn = (m["stack"] or "", m["attn"]) if m else ("", name.rsplit(".", 1)[-1])
        view = classify(stack, attn, name)
        if view is not None:
            groups.setdefault(view, []).append(layer_attention(maps, name))
    return groups


def head_dim_of(model: nn.Module, name: str) -> int | None:
    """The head width d of attention layer ``name`` (for the page's √d), when it has one."""
    try:
        return getattr(model.get_submodule(name), "head_dim", None)
    except AttributeError:
        return None


def top_guesses(logits: Tensor, k: int, label: Callable[[int], str]) -> str:
    """The ``k`` most probable outputs of ``logits (V,)`` as ``"label p, label p, ..."``."""
    probs = logits.float().softmax(-1)
    top = probs.topk(min(k, probs.numel()))
    return ", ".join(
        f"{label(int(i))} {float(p):.2f}" for p, i in zip(top.values, top.indices, strict=True)
    )


def make_view(
    view_id: str,
    title: str,
    layers: Sequence[LayerAttention],
    *,
    queries: Sequence[str],
    keys: Sequence[str],
    note: str = "",
    rollout: bool = False,
    grid: dict | None = None,
    head_dim: int | None = None,
    scores_have_bias: bool = False,
    score_label: str = "q·k/√d",
    query: int = 0,
) -> dict:
    """One view of the payload (see the module docstring).

    Raises:
        UserError: the layers' shapes disagree with each other or with the token labels.
    """
    if not layers:
        raise UserError(f"no attention recorded for the {title}")
    weights = torch.stack([la.weights for la in layers])  # (L, H, Tq, Tk)
    L, H, Tq, Tk = weights.shape
    if (Tq, Tk) != (len(queries), len(keys)):
        raise UserError(
            f"{title}: attention is {Tq}×{Tk} but there are {len(queries)} queries and "
            f"{len(keys)} keys"
        )
    have_scores = all(la.scores is not None for la in layers)
    scores = torch.stack([la.scores for la in layers]) if have_scores else None
    return {
        "id": view_id,
        "title": title,
        "note": note,
        "queries": [str(q) for q in queries],
        "keys": [str(k) for k in keys],
        "layers": [la.name for la in layers],
        "heads": H,
        "weights": encode_array(weights),
        "scores": None if scores is None else encode_array(scores),
        "entropy": [[round(float(e), 4) for e in row] for row in entropy_bits(weights)],
        "rollout": encode_array(rollout_matrix(weights)) if rollout and Tq == Tk else None,
        "grid": grid,
        "head_dim": head_dim,
        "scores_have_bias": scores_have_bias,
        "score_label": score_label,
        "query": min(max(query, 0), Tq - 1),
    }


def check_size(views: Sequence[dict]) -> None:
    """Refuse a page too large to open comfortably (:data:`MAX_ENTRIES` numbers).

    Raises:
        UserError: the message gives the count and what to shorten.
    """
    n = 0
    for v in views:
        for key in ("weights", "scores", "rollout"):
            if v.get(key):
                n += int(np.prod(v[key]["shape"]))
    if n > MAX_ENTRIES:
        raise UserError(
            f"this input gives {n:,} attention numbers, more than a page holds ({MAX_ENTRIES:,}); "
            "use a shorter input"
        )
