"""MultiHeadAttention: parity with torch.nn.MultiheadAttention, the KV cache, equivariance, errors.

Mask conventions differ: attnlab's boolean masks are True = may attend, torch's
``key_padding_mask`` and boolean ``attn_mask`` are True = ignore.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnlab.attention import MultiHeadAttention, key_padding_mask, padding_mask
from attnlab.layers import SinusoidalPositionalEmbedding
from attnlab.models.builders import multi_head_attention

ATOL = 1e-5


def _torch_causal(T: int) -> torch.Tensor:
    # torch's boolean attn_mask: True = not allowed, i.e. strictly above the diagonal
    return torch.ones(T, T, dtype=torch.bool).triu(diagonal=1)


def _copy_self_attention(ours: MultiHeadAttention, ref: nn.MultiheadAttention) -> None:
    with torch.no_grad():
        ours.qkv.weight.copy_(ref.in_proj_weight)  # rows Q | K | V in both
        ours.qkv.bias.copy_(ref.in_proj_bias)
        ours.out_proj.weight.copy_(ref.out_proj.weight)
        ours.out_proj.bias.copy_(ref.out_proj.bias)


def _copy_cross_attention(ours: MultiHeadAttention, ref: nn.MultiheadAttention) -> None:
    E = ref.embed_dim
    with torch.no_grad():
        if ref._qkv_same_embed_dim:
            w_q, w_k, w_v = ref.in_proj_weight.split(E)
        else:  # kdim/vdim != embed_dim: torch keeps separate q/k/v projection weights
            w_q, w_k, w_v = ref.q_proj_weight, ref.k_proj_weight, ref.v_proj_weight
        ours.q_proj.weight.copy_(w_q)
        ours.kv_proj.weight.copy_(torch.cat([w_k, w_v]))
        ours.q_proj.bias.copy_(ref.in_proj_bias[:E])
        ours.kv_proj.bias.copy_(ref.in_proj_bias[E:])
        ours.out_proj.weight.copy_(ref.out_proj.weight)
        ours.out_proj.bias.copy_(ref.out_proj.bias)


@pytest.mark.parametrize("masks", ["none", "padding", "causal", "causal_and_padding"])
def test_self_attention_equals_torch_multihead_attention(masks):
    B, T, C, H = 3, 6, 16, 4
    ref = nn.MultiheadAttention(C, H, batch_first=True).eval()
    ours = multi_head_attention(C, H, backend="math").eval()
    _copy_self_attention(ours, ref)
    x = torch.randn(B, T, C)
    real = padding_mask([6, 4, 2], T)  # True = real token
    use_pad = "padding" in masks
    use_causal = "causal" in masks
    ref_out, ref_w = ref(
        x,
        x,
        x,
        key_padding_mask=~real if use_pad else None,
        attn_mask=_torch_causal(T) if use_causal else None,
        need_weights=True,
        average_attn_weights=False,
    )
    out, w = ours(
        x, mask=key_padding_mask(real) if use_pad else None, is_causal=use_causal, need_weights=True
    )
    torch.testing.assert_close(out, ref_out, rtol=0, atol=ATOL)
    torch.testing.assert_close(w, ref_w, rtol=0, atol=ATOL)
    # the fused backend gives the same output
    ours.backend = "sdpa"
    out_sdpa, _ = ours(x, mask=key_padding_mask(real) if use_pad else None, is_causal=use_causal)
    torch.testing.assert_close(out_sdpa, ref_out, rtol=0, atol=ATOL)


@pytest.mark.parametrize("context_dim", [16, 10])  # 10: torch uses separate q/k/v weights
def test_cross_attention_equals_torch_multihead_attention(context_dim):
    B, T, S, C, H = 2, 5, 7, 16, 4
    ref = nn.MultiheadAttention(C, H, kdim=context_dim, vdim=context_dim, batch_first=True).eval()
    assert ref._qkv_same_embed_dim == (context_dim == C)
    ours = multi_head_attention(C, H, cross=True, context_dim=context_dim, backend="math").eval()
    _copy_cross_attention(ours, ref)
    x, ctx = torch.randn(B, T, C), torch.randn(B, S, context_dim)
    real = padding_mask([7, 3], S)
    ref_out, ref_w = ref(
        x, ctx, ctx, key_padding_mask=~real, need_weights=True, average_attn_weights=False
    )
    out, w = ours(x, ctx, mask=key_padding_mask(real), need_weights=True)
    assert out.shape == (B, T, C) and w.shape == (B, H, T, S)
    torch.testing.assert_close(out, ref_out, rtol=0, atol=ATOL)
    torch.testing.assert_close(w, ref_w, rtol=0, atol=ATOL)
    ours.backend = "sdpa"
    torch.testing.assert_close(
        ours(x, ctx, mask=key_padding_mask(real))[0], ref_out, rtol=0, atol=ATOL
    )


def test_gqa_equals_full_attention_with_repeated_kv_heads():
    """GQA with Hkv heads = MHA whose K/V projections repeat each KV head H/Hkv times."""
    C, H, Hkv, D = 24, 6, 2, 4
    gqa = multi_head_attention(C, H, n_kv_heads=Hkv, head_dim=D)
    mha = multi_head_attention(C, H, head_dim=D)
    wq, wk, wv = gqa.qkv.weight.split([H * D, Hkv * D, Hkv * D])
    bq, bk, bv = gqa.qkv.bias.split([H * D, Hkv * D, Hkv * D])

    def rep(t):  # (Hkv·D, ...) -> (H·D, ...): KV head j serves query heads j·H/Hkv ...
        rest = t.shape[1:]
        return t.view(Hkv, D, *rest).repeat_interleave(H // Hkv, 0).reshape(H * D, *rest)

    with torch.no_grad():
        mha.qkv.weight.copy_(torch.cat([wq, rep(wk), rep(wv)]))
        mha.qkv.bias.copy_(torch.cat([bq, rep(bk), rep(bv)]))
        mha.out_proj.load_state_dict(gqa.out_proj.state_dict())
    x = torch.randn(2, 5, C)
    torch.testing.assert_close(
        gqa(x, is_causal=True)[0], mha(x, is_causal=True)[0], rtol=0, atol=ATOL
    )
    assert gqa.qkv.weight.shape[0] == (H + 2 * Hkv) * D


# ----------------------------------------------------------------------------------------------
# KV cache


CACHE_CONFIGS = {
    "plain": {},
    "rope": {"position": "rope"},
    "rope_theta": {"position": "rope", "rope_theta": 500000.0},
    "alibi": {"position": "alibi"},
    "gqa_rope": {"n_kv_heads": 2, "position": "rope"},
    "mqa_alibi": {"n_kv_heads": 1, "position": "alibi"},
    "qk_norm_rms": {"qk_norm": "rmsnorm", "position": "rope"},
    "qk_norm_ln_gqa": {"qk_norm": "layernorm", "n_kv_heads": 2},
}


@pytest.mark.parametrize("backend", ["math", "sdpa"])
@pytest.mark.parametrize("config", list(CACHE_CONFIGS))
def test_incremental_decoding_equals_full_recomputation(config, backend):
    B, T, C, H = 2, 9, 32, 4
    mha = multi_head_attention(C, H, backend=backend, **CACHE_CONFIGS[config]).eval()
    x = torch.randn(B, T, C)
    full, _ = mha(x, is_causal=True)
    cache = mha.make_cache(B, T)
    # prefill 4 tokens, then one token at a time, then a chunk of 2
    pieces = []
    for start, end in [(0, 4), (4, 5), (5, 6), (6, 7), (7, 9)]:
        out, _ = mha(x[:, start:end], is_causal=True, cache=cache)
        pieces.append(out)
        assert cache.length == end
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=0, atol=ATOL)


def test_cross_attention_cache_is_filled_once_and_reused():
    B, T, S, C, H = 2, 4, 6, 16, 4
    mha = multi_head_attention(C, H, cross=True, context_dim=12, qk_norm="rmsnorm").eval()
    x, ctx = torch.randn(B, T, C), torch.randn(B, S, 12)
    real = padding_mask([6, 4], S)
    full, _ = mha(x, ctx, mask=key_padding_mask(real))
    cache = mha.make_cache(B, S)
    steps = [
        mha(x[:, t : t + 1], ctx if t == 0 else None, mask=key_padding_mask(real), cache=cache)[0]
        for t in range(T)
    ]
    assert cache.length == S
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=ATOL)


def test_cache_overflow_and_reorder():
    mha = multi_head_attention(16, 2)
    cache = mha.make_cache(3, 4)
    mha(torch.randn(3, 3, 16), is_causal=True, cache=cache)
    k_before = cache.get()[0].clone()
    cache.reorder(torch.tensor([2, 0, 0]))
    torch.testing.assert_close(cache.get()[0], k_before[[2, 0, 0]])
    with pytest.raises(ValueError, match="overflow.*max_seq_len=4"):
        mha(torch.randn(3, 2, 16), is_causal=True, cache=cache)
    cache.reset()
    assert cache.length == 0


@pytest.mark.parametrize("position", ["none", "rope", "alibi"])
def test_left_padding_with_per_row_positions_matches_unpadded(position):
    """A left-padded row with positions counted from its first real token gives the same outputs
    as the unpadded sequence, also when decoding from the cache."""
    C, H, n_pad, T = 16, 4, 3, 5
    mha = multi_head_attention(C, H, position=position).eval()
    x = torch.randn(1, T, C)
    ref, _ = mha(x, is_causal=True)
    padded = torch.cat([torch.randn(1, n_pad, C), x], dim=1)  # (1, n_pad + T, C)
    batch = torch.cat([padded, torch.randn(1, n_pad + T, C)])  # a second, unpadded row
    real = torch.ones(2, n_pad + T, dtype=torch.bool)
    real[0, :n_pad] = False
    positions = (real.long().cumsum(-1) - 1).clamp(min=0)  # (B, T)
    out, _ = mha(batch, mask=key_padding_mask(real), is_causal=True, positions=positions)
    torch.testing.assert_close(out[0, n_pad:], ref[0], rtol=0, atol=ATOL)
    # the same through the cache: prefill all but the last token, then one step
    cache = mha.make_cache(2, n_pad + T)
    mha(
        batch[:, :-1],
        mask=key_padding_mask(real[:, :-1]),
        is_causal=True,
        positions=positions[:, :-1],
        cache=cache,
    )
    last, _ = mha(
        batch[:, -1:],
        mask=key_padding_mask(real),
        is_causal=True,
        positions=positions[:, -1:],
        cache=cache,
    )
    torch.testing.assert_close(last[0, 0], ref[0, -1], rtol=0, atol=ATOL)


# ----------------------------------------------------------------------------------------------
# order


def test_self_attention_without_positions_is_permutation_equivariant():
    mha = multi_head_attention(16, 4).eval()
    x = torch.randn(2, 7, 16)
    perm = torch.randperm(7)
    out, _ = mha(x)
    out_perm, _ = mha(x[:, perm])
    torch.testing.assert_close(out_perm, out[:, perm], rtol=0, atol=ATOL)  # F(σX) = σF(X)


@pytest.mark.parametrize("position", ["rope", "sinusoidal", "alibi"])
def test_positions_break_permutation_equivariance(position):
    T, C = 7, 16
    mha = multi_head_attention(C, 4, position=position if position != "sinusoidal" else "none")
    mha.eval()
    pe = SinusoidalPositionalEmbedding(T, C)

    def f(x):
        if position == "sinusoidal":
            x = x + pe(torch.arange(T))  # added to the token embeddings
        return mha(x)[0]

    x = torch.randn(2, T, C)
    # not a reversal: bidirectional ALiBi depends on |i - j| only, which a reversal preserves
    perm = torch.tensor([2, 0, 5, 1, 6, 3, 4])
    assert (f(x[:, perm]) - f(x)[:, perm]).abs().max() > 1e-2


def test_causal_output_at_i_ignores_later_tokens():
    mha = multi_head_attention(16, 4, position="rope", n_kv_heads=2).eval()
    x = torch.randn(2, 8, 16)
    i = 3
    x2 = x.clone()
    x2[:, i + 1 :] = torch.randn(2, 8 - i - 1, 16)
    out, _ = mha(x, is_causal=True)
    out2, _ = mha(x2, is_causal=True)
    torch.testing.assert_close(out2[:, : i + 1], out[:, : i + 1], rtol=0, atol=1e-6)


def test_weights_are_returned_per_head_and_sum_to_one():
    mha = multi_head_attention(16, 4, n_kv_heads=2, position="alibi").eval()
    out, w = mha(torch.randn(2, 5, 16), is_causal=True, need_weights=True)
    assert w.shape == (2, 4, 5, 5)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, 5), rtol=0, atol=1e-6)
    assert (w.triu(1) == 0).all()
    assert mha(torch.randn(2, 5, 16))[1] is None


def test_attention_dropout_only_in_training():
    mha = multi_head_attention(16, 4, attn_dropout=0.5)
    x = torch.randn(2, 6, 16)
    mha.eval()
    torch.testing.assert_close(mha(x)[0], mha(x)[0])
    mha.train()
    assert not torch.allclose(mha(x)[0], mha(x)[0])


# ----------------------------------------------------------------------------------------------
# bad input


def test_d_model_not_divisible_by_n_heads_raises_naming_values():
    with pytest.raises(ValueError, match=r"d_model \(10\).*n_heads \(3\)"):
        multi_head_attention(10, 3)
    multi_head_attention(10, 3, head_dim=4)  # an explicit head_dim lifts the constraint


def test_n_heads_not_divisible_by_n_kv_heads_raises_naming_values():
    with pytest.raises(ValueError, match=r"n_heads \(6\).*n_kv_heads \(4\)"):
        multi_head_attention(24, 6, n_kv_heads=4)


def test_wrong_input_widths_raise_naming_shapes():
    mha = multi_head_attention(16, 4)
    with pytest.raises(ValueError, match=r"d_model=16.*\(2, 5, 12\)"):
        mha(torch.randn(2, 5, 12))
    cross = multi_head_attention(16, 4, cross=True, context_dim=8)
    with pytest.raises(ValueError, match=r"context_dim=8.*\(2, 3, 16\)"):
        cross(torch.randn(2, 5, 16), torch.randn(2, 3, 16))
    with pytest.raises(ValueError, match="context"):
        cross(torch.randn(2, 5, 16))
    with pytest.raises(ValueError, match="cross=True"):
        mha(torch.randn(2, 5, 16), torch.randn(2, 5, 16))


def test_mha_mask_that_does_not_broadcast_raises():
    mha = multi_head_attention(16, 4)
    with pytest.raises(ValueError, match=r"mask of shape \(3, 1, 1, 5\)"):
        mha(torch.randn(2, 5, 16), mask=torch.ones(3, 1, 1, 5, dtype=torch.bool))


def test_need_weights_on_a_fused_backend_switches_to_the_math_path():
    """A backend that cannot return weights (sdpa) computes them on the math path instead of
    refusing: the same output, and the weights the math backend returns."""
    torch.manual_seed(0)
    fused = multi_head_attention(16, 4, backend="sdpa")
    math_ = multi_head_attention(16, 4, backend="math")
    math_.load_state_dict(fused.state_dict())
    x = torch.randn(2, 5, 16)
    out, w = fused(x, is_causal=True, need_weights=True)
    ref, ref_w = math_(x, is_causal=True, need_weights=True)
    assert w is not None and w.shape == (2, 4, 5, 5)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(w, ref_w)
    torch.testing.assert_close(out, fused(x, is_causal=True)[0], atol=1e-6, rtol=1e-5)


def test_bad_options_raise():
    with pytest.raises(ValueError, match="'learned'"):
        multi_head_attention(16, 4, position="learned")
    with pytest.raises(ValueError, match="cross-attention"):
        multi_head_attention(16, 4, cross=True, position="rope")
    with pytest.raises(ValueError, match="dropout"):
        multi_head_attention(16, 4, attn_dropout=1.0)
