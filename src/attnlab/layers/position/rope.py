"""Rotary position embedding (RoPE, Su et al.).

Rotate each (x_i, x_{i+D/2}) pair of q and k by the angle p·θ_i, θ_i = θ^(−2i/D), so qᵀk depends
only on the offset between the two positions. attnlab uses the "rotate-half" pairing of HF Llama /
GPT-NeoX.

Shapes: B batch, H heads, T positions, D head width.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnlab.layers.position.base import Positions

__all__ = ["RotaryEmbedding", "apply_rotary", "rotate_half"]


def rotate_half(x: Tensor) -> Tensor:
    """(x₁, x₂) -> (−x₂, x₁) over the two halves of the last dimension."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate ``x (B, H, T, D)`` by angles whose cos/sin are ``(B or 1, 1, T, D)``."""
    return (x.float() * cos + rotate_half(x.float()) * sin).to(x.dtype)


class RotaryEmbedding(Positions):
    """Rotary position embedding (RoPE) for one head width.

    Args:
        head_dim: per-head width D (even).
        theta: base θ of the frequencies θ^(−2i/D) (10 000 in Llama 2, 500 000 in Llama 3).
    """

    relative = True

    def __init__(self, head_dim: int, *, theta: float = 10000.0) -> None:
        super().__init__()
        if head_dim % 2 != 0:
            raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
        self.head_dim = head_dim
        self.theta = theta
        self.register_buffer("inv_freq", self._frequencies(), persistent=False)

    def _frequencies(self, device=None) -> Tensor:
        exps = torch.arange(0, self.head_dim, 2, dtype=torch.float32, device=device) / self.head_dim
        return 1.0 / self.theta**exps  # θ^(−2i/D), always fp32

    def _apply(self, fn, recurse=True):
        # model.to(bfloat16) would round the frequencies and put long-range angles off by
        # radians: let the buffer follow the device, never the dtype
        super()._apply(fn, recurse)
        self.inv_freq = self._frequencies(device=self.inv_freq.device)
        return self

    def cos_sin(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """positions ``(T,)`` or ``(B, T)`` -> cos, sin ``(B or 1, 1, T, D)`` in fp32."""
        pos = positions.float()
        if pos.dim() == 1:
            pos = pos[None]
        freqs = pos[..., None] * self.inv_freq.float()  # (B, T, D/2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (B, T, D)
        return emb.cos()[:, None], emb.sin()[:, None]

    def forward(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        """Rotate q ``(B, H, Tq, D)`` at ``q_pos`` and k ``(B, Hkv, Tk, D)`` at ``k_pos``."""
        cq, sq = self.cos_sin(q_pos)
        ck, sk = (cq, sq) if k_pos is q_pos else self.cos_sin(k_pos)
        return apply_rotary(q, cq, sq), apply_rotary(k, ck, sk)

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        return self(q, k, q_pos, k_pos)
