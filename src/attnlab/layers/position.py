"""Position information: sinusoidal, learned absolute, RoPE, ALiBi and 2-D sin-cos.

Self-attention is permutation-equivariant; these are the ways order gets back in.

- Sinusoidal (Vaswani et al.): PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(p / 10000^(2i/d)),
  added to the token embeddings. For every offset k there is one linear map M_k with
  PE[p + k] = M_k PE[p] (a rotation per frequency pair).
- Learned absolute: one trained vector per position (GPT-2, ViT).
- RoPE (Su et al.): rotate each (x_i, x_{i+D/2}) pair of q and k by angle p·θ_i, θ_i = θ^(−2i/D),
  so qᵀk depends only on the offset between the two positions. attnlab uses the "rotate-half"
  pairing of HF Llama / GPT-NeoX.
- ALiBi (Press et al.): no embedding; add −m_h·|i − j| to head h's scores, with geometric slopes m_h.
- 2-D sin-cos: half the channels encode the patch row, half the column (ViT/MAE patch grids).

Shapes: T positions, D model or head width, H heads.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

__all__ = [
    "sinusoidal_table",
    "SinusoidalPositionalEmbedding",
    "LearnedPositionalEmbedding",
    "RotaryEmbedding",
    "apply_rotary",
    "rotate_half",
    "alibi_slopes",
    "alibi_bias",
    "sincos_2d",
]


def sinusoidal_table(n_positions: int, dim: int, *, base: float = 10000.0) -> Tensor:
    """``(n_positions, dim)`` table, sin on even channels and cos on odd ones."""
    if dim % 2 != 0:
        raise ValueError(f"sinusoidal positions need an even width, got dim={dim}")
    pos = torch.arange(n_positions, dtype=torch.float64)[:, None]  # (T, 1)
    inv_freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)  # (D/2,)
    angles = pos * inv_freq  # (T, D/2)
    table = torch.empty(n_positions, dim, dtype=torch.float64)
    table[:, 0::2] = angles.sin()
    table[:, 1::2] = angles.cos()
    return table.float()


class SinusoidalPositionalEmbedding(nn.Module):
    """Fixed sinusoidal positions; ``forward(positions) -> (..., dim)``."""

    def __init__(self, max_seq_len: int, dim: int, *, base: float = 10000.0) -> None:
        super().__init__()
        self.max_seq_len = max_seq_len
        self.register_buffer(
            "table", sinusoidal_table(max_seq_len, dim, base=base), persistent=False
        )

    def forward(self, positions: Tensor) -> Tensor:
        _check_positions(positions, self.max_seq_len)
        return self.table[positions]


class LearnedPositionalEmbedding(nn.Module):
    """A trained vector per position (GPT-2 ``wpe``); ``forward(positions) -> (..., dim)``."""

    def __init__(self, max_seq_len: int, dim: int, *, device=None, dtype=None) -> None:
        super().__init__()
        self.max_seq_len = max_seq_len
        self.weight = nn.Parameter(torch.zeros(max_seq_len, dim, device=device, dtype=dtype))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, positions: Tensor) -> Tensor:
        _check_positions(positions, self.max_seq_len)
        return self.weight[positions]


def _check_positions(positions: Tensor, max_seq_len: int) -> None:
    if positions.numel() and int(positions.max()) >= max_seq_len:
        raise ValueError(f"position {int(positions.max())} is beyond max_seq_len={max_seq_len}")


def rotate_half(x: Tensor) -> Tensor:
    """(x₁, x₂) -> (−x₂, x₁) over the two halves of the last dimension."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate ``x (B, H, T, D)`` by angles whose cos/sin are ``(B or 1, 1, T, D)``."""
    return (x.float() * cos + rotate_half(x.float()) * sin).to(x.dtype)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (RoPE) for one head width.

    Args:
        head_dim: per-head width D (even).
        theta: base θ of the frequencies θ^(−2i/D) (10 000 in Llama 2, 500 000 in Llama 3).
    """

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


def alibi_slopes(n_heads: int) -> Tensor:
    """ALiBi's head slopes: 2^(−8/n), 2^(−16/n), … for n a power of two (8 heads: 1/2 … 1/256).

    For other head counts, the slopes of the closest smaller power of two are followed by every
    other slope of the next power of two, as in the paper's reference code.
    """
    if n_heads < 1:
        raise ValueError(f"n_heads must be positive, got {n_heads}")

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if math.log2(n_heads).is_integer():
        slopes = power_of_two(n_heads)
    else:
        closest = 2 ** math.floor(math.log2(n_heads))
        slopes = power_of_two(closest) + power_of_two(2 * closest)[0::2][: n_heads - closest]
    return torch.tensor(slopes, dtype=torch.float32)


def alibi_bias(slopes: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """Additive scores ``−m_h · |i − j|`` of shape ``(H, Tq, Tk)`` (or ``(B, H, Tq, Tk)``)."""
    dist = (q_pos[..., :, None] - k_pos[..., None, :]).abs().float()  # (B?, Tq, Tk)
    return -slopes.float()[:, None, None] * dist.unsqueeze(-3)


def sincos_2d(grid_h: int, grid_w: int, dim: int, *, base: float = 10000.0) -> Tensor:
    """Fixed 2-D positions for a ``grid_h × grid_w`` patch grid, ``(grid_h·grid_w, dim)``.

    Channels ``[:dim/2]`` encode the row, ``[dim/2:]`` the column, each as a 1-D sin-cos table;
    patches are numbered row by row.
    """
    if dim % 4 != 0:
        raise ValueError(f"2-D sin-cos positions need a width divisible by 4, got dim={dim}")
    rows = sinusoidal_table(grid_h, dim // 2, base=base)  # (Gh, D/2)
    cols = sinusoidal_table(grid_w, dim // 2, base=base)  # (Gw, D/2)
    return torch.cat(
        (rows[:, None, :].expand(grid_h, grid_w, -1), cols[None, :, :].expand(grid_h, grid_w, -1)),
        dim=-1,
    ).reshape(grid_h * grid_w, dim)
