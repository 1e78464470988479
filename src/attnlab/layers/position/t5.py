"""T5's relative position bias (Raffel et al. 2020): a learned score per head and distance bucket.

Every (query i, key j) pair gets the learned scalar ``weight[bucket(j − i), h]`` added to head h's
score. Offsets are bucketed: the first ``max_exact`` distances get one bucket each, farther ones
share log-spaced buckets up to ``max_distance``, and everything beyond falls into the last bucket::

    bucket(n) = n                                                           n < max_exact
              = max_exact + ⌊log(n / max_exact) / log(max_distance / max_exact)
                             · (num_buckets − max_exact)⌋   (at most num_buckets − 1)   otherwise

- bidirectional (encoder): half the buckets for keys before the query, half for keys after it
  (``num_buckets //= 2``, and ``max_exact = num_buckets // 2`` of each half is exact);
- causal (decoder): only keys at or before the query; later offsets share bucket 0.

One table serves every layer of a stack, as in T5 (the model owns it and passes it to each layer's
attention). Unlike the scaled q·k, the bias is added unscaled.

Shapes: B batch, H heads, Tq/Tk query/key positions.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from attnlab.layers.position.base import Positions

__all__ = ["T5RelativeBias", "relative_position_bucket"]


def relative_position_bucket(
    relative_position: Tensor, *, bidirectional: bool, num_buckets: int, max_distance: int
) -> Tensor:
    """T5's bucket of each offset ``key_position − query_position`` (long tensor, same shape).

    Computed in the same order of operations as Mesh TensorFlow / Hugging Face, so the float
    rounding at the bucket edges agrees with theirs.
    """
    buckets = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative_position > 0).long() * num_buckets  # keys after the query
        distance = relative_position.abs()
    else:
        distance = -torch.clamp(relative_position, max=0)  # the future shares bucket 0
    max_exact = num_buckets // 2
    is_small = distance < max_exact
    # clamp only keeps log() finite where the exact bucket is used anyway
    far = distance.clamp(min=max_exact).float()
    log_bucket = (
        max_exact
        + (
            torch.log(far / max_exact)
            / math.log(max_distance / max_exact)
            * (num_buckets - max_exact)
        ).long()
    )
    log_bucket = log_bucket.clamp(max=num_buckets - 1)
    return buckets + torch.where(is_small, distance, log_bucket)


class T5RelativeBias(Positions):
    """T5's bucketed relative position bias, one table ``weight (num_buckets, n_heads)``.

    ``weight`` has Hugging Face's ``relative_attention_bias.weight`` layout, so
    ``bias.weight.copy_(hf.relative_attention_bias.weight)`` is the whole conversion.

    Args:
        n_heads: H, one score per head.
        num_buckets: distance buckets (32 in T5); at least 4 when bidirectional, 2 when causal.
        max_distance: offsets at or beyond this share the last bucket (128 in T5).
        bidirectional: buckets on both sides (encoder) or only for earlier keys (decoder).

    Raises:
        ValueError: a head count or bucket count that is not positive, too few buckets for an
            exact range, or a ``max_distance`` that is not positive or not beyond the exact range.
    """

    relative = True

    def __init__(
        self,
        n_heads: int,
        num_buckets: int = 32,
        max_distance: int = 128,
        bidirectional: bool = True,
        *,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        for name, value in (
            ("n_heads", n_heads),
            ("num_buckets", num_buckets),
            ("max_distance", max_distance),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"T5RelativeBias: {name} must be a positive integer, got {value!r}"
                )
        per_side = num_buckets // 2 if bidirectional else num_buckets
        max_exact = per_side // 2
        if max_exact < 1:
            raise ValueError(
                f"T5RelativeBias: num_buckets={num_buckets} is too few for "
                f"{'bidirectional' if bidirectional else 'causal'} buckets "
                f"(need at least {4 if bidirectional else 2})"
            )
        if max_distance <= max_exact:
            raise ValueError(
                f"T5RelativeBias: max_distance={max_distance} must exceed the exact range "
                f"({max_exact} offsets, from num_buckets={num_buckets})"
            )
        self.n_heads, self.num_buckets, self.max_distance = n_heads, num_buckets, max_distance
        self.bidirectional = bidirectional
        self.weight = nn.Parameter(torch.empty(num_buckets, n_heads, device=device, dtype=dtype))
        nn.init.normal_(self.weight, std=0.02)

    def extra_repr(self) -> str:
        return (
            f"n_heads={self.n_heads}, num_buckets={self.num_buckets}, "
            f"max_distance={self.max_distance}, bidirectional={self.bidirectional}"
        )

    def buckets(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """Bucket of every (query, key) pair: ``(Tq, Tk)`` or ``(B, Tq, Tk)``."""
        relative = k_pos[..., None, :] - q_pos[..., :, None]  # (B?, Tq, Tk) = j − i
        return relative_position_bucket(
            relative,
            bidirectional=self.bidirectional,
            num_buckets=self.num_buckets,
            max_distance=self.max_distance,
        )

    def bias(self, q_pos: Tensor | None, k_pos: Tensor | None) -> Tensor:
        """Additive scores ``(H, Tq, Tk)``, or ``(B, H, Tq, Tk)`` for per-row positions ``(B, T)``.

        With a KV cache the attention layer passes the new queries' positions
        (``cache length + arange(T)``) and all cached keys', so only the new rows are computed.
        """
        values = self.weight[self.buckets(q_pos.long(), k_pos.long())]  # (B?, Tq, Tk, H)
        return values.movedim(-1, -3)  # (B?, H, Tq, Tk)

    def forward(self, q_len: int, k_len: int, *, past: int = 0) -> Tensor:
        """The bias of ``q_len`` queries at ``past + arange(q_len)`` against keys ``arange(k_len)``.

        As Hugging Face's ``T5Attention.compute_bias(q_len, k_len, past_seen_tokens=past)``: with
        ``past = 0`` the queries are the *first* positions (top-left aligned).

        Returns:
            ``(1, H, q_len, k_len)``.
        """
        device = self.weight.device
        q_pos = torch.arange(past, past + q_len, device=device)
        k_pos = torch.arange(k_len, device=device)
        return self.bias(q_pos, k_pos).unsqueeze(0)
