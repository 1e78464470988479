"""Positions: RoPE scores depend on the offset only, the sinusoidal shift map, ALiBi slopes."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.layers import (
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SinusoidalPositionalEmbedding,
    alibi_bias,
    alibi_slopes,
    sincos_2d,
    sinusoidal_table,
)

# ----------------------------------------------------------------------------------------------
# RoPE


def _rope_score(rope: RotaryEmbedding, q: torch.Tensor, k: torch.Tensor, m: int, n: int) -> float:
    """qᵀk after rotating q to position m and k to position n."""
    rq, rk = rope(q, k, torch.tensor([m]), torch.tensor([n]))
    return (rq * rk).sum().item()


@settings(max_examples=30, deadline=None)
@given(
    m=st.integers(0, 200),
    n=st.integers(0, 200),
    shift=st.integers(-150, 300),
    theta=st.sampled_from([10000.0, 500000.0]),
    seed=st.integers(0, 1000),
)
def test_rope_score_depends_only_on_the_offset(m, n, shift, theta, seed):
    shift = max(shift, -min(m, n))  # keep positions non-negative
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(1, 1, 1, 32, generator=gen), torch.randn(1, 1, 1, 32, generator=gen)
    rope = RotaryEmbedding(32, theta=theta)
    before = _rope_score(rope, q, k, m, n)
    after = _rope_score(rope, q, k, m + shift, n + shift)
    # fp32 angles up to ~500 rad: allow a few ulps of the angle times |q||k|
    assert abs(after - before) < 1e-3 * (q.norm() * k.norm()).item()


def test_rope_score_changes_with_the_offset():
    q, k = torch.randn(1, 1, 1, 32), torch.randn(1, 1, 1, 32)
    rope = RotaryEmbedding(32)
    scores = [_rope_score(rope, q, k, 10 + d, 10) for d in range(5)]
    assert min(abs(a - b) for i, a in enumerate(scores) for b in scores[i + 1 :]) > 1e-3


def test_rope_equals_rotate_half_pairs_by_hand():
    """Pair (x_i, x_{i+D/2}) is rotated by angle p·θ^(−2i/D) (HF Llama / GPT-NeoX layout)."""
    D, theta = 8, 10000.0
    x = torch.randn(1, 2, 5, D, dtype=torch.float64)
    pos = torch.tensor([0, 1, 2, 7, 40])
    rope = RotaryEmbedding(D, theta=theta)
    rotated, _ = rope(x.float(), x.float(), pos, pos)
    expected = x.clone()
    for t, p in enumerate(pos.tolist()):
        for i in range(D // 2):
            a = p * theta ** (-2 * i / D)
            x1, x2 = x[..., t, i], x[..., t, i + D // 2]
            expected[..., t, i] = x1 * math.cos(a) - x2 * math.sin(a)
            expected[..., t, i + D // 2] = x1 * math.sin(a) + x2 * math.cos(a)
    torch.testing.assert_close(rotated.double(), expected, rtol=0, atol=1e-5)
    # a rotation keeps the norm
    torch.testing.assert_close(rotated.norm(dim=-1), x.float().norm(dim=-1), rtol=1e-5, atol=0)


def test_rope_per_row_positions():
    rope = RotaryEmbedding(16)
    q, k = torch.randn(2, 3, 4, 16), torch.randn(2, 1, 4, 16)
    pos = torch.tensor([[0, 1, 2, 3], [5, 6, 7, 8]])
    rq, rk = rope(q, k, pos, pos)
    rq1, rk1 = rope(q[1:], k[1:], pos[1], pos[1])
    torch.testing.assert_close(rq[1:], rq1)
    torch.testing.assert_close(rk[1:], rk1)
    with pytest.raises(ValueError, match="even head_dim, got 7"):
        RotaryEmbedding(7)


# ----------------------------------------------------------------------------------------------
# sinusoidal


def test_sinusoidal_table_is_the_formula():
    d = 12
    table = sinusoidal_table(50, d)
    pos = torch.arange(50, dtype=torch.float64)[:, None]
    i = torch.arange(d // 2, dtype=torch.float64)[None, :]
    angle = pos / 10000 ** (2 * i / d)
    torch.testing.assert_close(table[:, 0::2].double(), angle.sin(), rtol=0, atol=1e-6)
    torch.testing.assert_close(table[:, 1::2].double(), angle.cos(), rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="dim=5"):
        sinusoidal_table(4, 5)


@pytest.mark.parametrize("k", [1, 7, 30])
def test_sinusoidal_shift_is_one_linear_map_for_all_positions(k):
    d, n = 16, 20000
    pe = sinusoidal_table(n + k, d).double()
    # the slowest frequency 10000^(-14/16) needs positions over ~1/3 of its 2e4 period to be
    # pinned down, so draw fitting and checking positions from the whole range
    order = torch.randperm(n, generator=torch.Generator().manual_seed(k))
    fit, held_out = order[:200], order[200:1200]
    # solve PE(pos + k) = M_k PE(pos) by least squares on some positions ...
    M_t = torch.linalg.lstsq(pe[fit], pe[fit + k]).solution  # (d, d): PE(pos)ᵀ M_kᵀ
    # ... and check it on positions it never saw
    torch.testing.assert_close(pe[held_out] @ M_t, pe[held_out + k], rtol=0, atol=1e-5)
    # the map is a rotation (orthogonal), one 2×2 block per frequency pair
    torch.testing.assert_close(M_t.T @ M_t, torch.eye(d, dtype=torch.float64), rtol=0, atol=1e-4)
    off_block = M_t.clone()
    for i in range(0, d, 2):
        off_block[i : i + 2, i : i + 2] = 0
    assert off_block.abs().max() < 1e-4


def test_embedding_modules_look_up_positions_and_reject_out_of_range():
    sin = SinusoidalPositionalEmbedding(10, 8)
    torch.testing.assert_close(sin(torch.tensor([[3, 4]])), sinusoidal_table(10, 8)[[3, 4]][None])
    learned = LearnedPositionalEmbedding(10, 8)
    torch.testing.assert_close(learned(torch.tensor([2, 9])), learned.weight[[2, 9]])
    assert learned.weight.requires_grad
    for module in (sin, learned):
        with pytest.raises(ValueError, match="position 10.*max_seq_len=10"):
            module(torch.tensor([0, 10]))


def test_sincos_2d_encodes_row_then_column():
    table = sincos_2d(3, 4, 16)
    assert table.shape == (12, 16)
    rows, cols = sinusoidal_table(3, 8), sinusoidal_table(4, 8)
    for r in range(3):
        for c in range(4):
            torch.testing.assert_close(table[r * 4 + c], torch.cat([rows[r], cols[c]]))
    with pytest.raises(ValueError, match="dim=6"):
        sincos_2d(2, 2, 6)


# ----------------------------------------------------------------------------------------------
# ALiBi


def test_alibi_slopes_for_8_heads_are_half_to_1_over_256():
    expected = torch.tensor([1 / 2 ** (h + 1) for h in range(8)])
    torch.testing.assert_close(alibi_slopes(8), expected, rtol=0, atol=0)


@pytest.mark.parametrize("n", [1, 2, 4, 16, 32])
def test_alibi_slopes_power_of_two_are_geometric(n):
    # start at 2^(−8/n), ratio 2^(−8/n)
    expected = torch.tensor([2.0 ** (-8.0 * (h + 1) / n) for h in range(n)])
    torch.testing.assert_close(alibi_slopes(n), expected, rtol=1e-6, atol=0)


@pytest.mark.parametrize(
    ("n", "exponents"),
    [
        # paper's rule: the slopes of the closest smaller power of two (4: 2^-2, -4, -6, -8),
        # then every other slope of the next power of two (8: 2^-1, 2^-3, ...) until n are filled
        (6, [2, 4, 6, 8, 1, 3]),
        (12, [1, 2, 3, 4, 5, 6, 7, 8, 0.5, 1.5, 2.5, 3.5]),
        (3, [4, 8, 2]),
    ],
)
def test_alibi_slopes_for_other_head_counts_follow_the_paper(n, exponents):
    expected = torch.tensor([2.0**-e for e in exponents])
    torch.testing.assert_close(alibi_slopes(n), expected, rtol=1e-6, atol=0)


def test_alibi_bias_is_minus_slope_times_distance():
    slopes = alibi_slopes(4)
    bias = alibi_bias(slopes, torch.arange(3), torch.arange(5))
    assert bias.shape == (4, 3, 5)
    for h in range(4):
        for i in range(3):
            for j in range(5):
                assert bias[h, i, j].item() == pytest.approx(-slopes[h].item() * abs(i - j))
    per_row = alibi_bias(slopes, torch.tensor([[0, 1, 2], [2, 3, 4]]), torch.arange(5))
    assert per_row.shape == (2, 4, 3, 5)
    torch.testing.assert_close(per_row[0], bias)


def test_rope_frequencies_stay_fp32_when_the_model_is_cast_to_bf16():
    rope = RotaryEmbedding(64, theta=10000.0)
    exact = rope.inv_freq.clone()
    rope.to(torch.bfloat16)
    assert rope.inv_freq.dtype == torch.float32 and torch.equal(rope.inv_freq, exact)


def test_absolute_positions_keep_their_earlier_module():
    # the 1-D tables moved into layers/block.py; layers.position.absolute still names them
    from attnlab.layers import block  # noqa: PLC0415
    from attnlab.layers.position import absolute  # noqa: PLC0415

    for name in ("LearnedPositionalEmbedding", "SinusoidalPositionalEmbedding"):
        assert getattr(absolute, name) is getattr(block, name)
