"""Bahdanau additive attention against a hand computation of e_j = vᵀ tanh(W_s s + W_h h_j)."""

from __future__ import annotations

import math

import pytest
import torch

from attnlab.attention import AdditiveAttention, capture_attention, padding_mask


@torch.no_grad()
def _by_hand(attn: AdditiveAttention, s: torch.Tensor, h: torch.Tensor, real: torch.Tensor):
    """Loop over batch rows and source positions; returns (context (B, Dh), weights (B, S))."""
    W_s, W_h, b_h, v = attn.W_s.weight, attn.W_h.weight, attn.W_h.bias, attn.v.weight[0]
    contexts, weights = [], []
    for b in range(h.shape[0]):
        scores = [
            float(v @ torch.tanh(W_s @ s[b] + W_h @ h[b, j] + b_h)) for j in range(h.shape[1])
        ]
        exps = [math.exp(e) if real[b, j] else 0.0 for j, e in enumerate(scores)]
        a = torch.tensor([x / sum(exps) for x in exps], dtype=h.dtype)
        weights.append(a)
        contexts.append((a[:, None] * h[b]).sum(0))
    return torch.stack(contexts), torch.stack(weights)


def test_additive_attention_matches_hand_computation():
    attn = AdditiveAttention(query_dim=6, key_dim=5, attn_dim=7).double()
    s, h = torch.randn(3, 6, dtype=torch.float64), torch.randn(3, 4, 5, dtype=torch.float64)
    real = padding_mask([4, 2, 3], 4)
    context, weights = attn(s, h, real)
    ref_context, ref_weights = _by_hand(attn, s, h, real)
    torch.testing.assert_close(weights, ref_weights)
    torch.testing.assert_close(context, ref_context)
    assert (weights[~real] == 0).all()  # padding gets exactly zero weight
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, dtype=torch.float64))


def test_precomputed_keys_and_several_queries_give_the_same_result():
    attn = AdditiveAttention(6, 5)
    s, h = torch.randn(2, 3, 6), torch.randn(2, 4, 5)  # three decoder steps at once
    real = padding_mask([4, 3], 4)
    context, weights = attn(s, h, real, keys_proj=attn.project_keys(h))
    assert context.shape == (2, 3, 5) and weights.shape == (2, 3, 4)
    for t in range(3):
        c_t, w_t = attn(s[:, t], h, real)
        torch.testing.assert_close(context[:, t], c_t)
        torch.testing.assert_close(weights[:, t], w_t)


def test_fully_masked_source_gives_zero_context_not_nan():
    attn = AdditiveAttention(6, 5)
    s = torch.randn(2, 6, requires_grad=True)
    context, weights = attn(s, torch.randn(2, 3, 5), padding_mask([0, 3], 3))
    assert torch.isfinite(context).all() and (context[0] == 0).all() and (weights[0] == 0).all()
    context.sum().backward()
    assert torch.isfinite(s.grad).all()


def test_bad_shapes_raise_naming_them():
    attn = AdditiveAttention(6, 5)
    with pytest.raises(ValueError, match=r"mask must be \(B, S\) = \(2, 3\), got \(2, 4\)"):
        attn(torch.randn(2, 6), torch.randn(2, 3, 5), torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"keys must be \(B=2, S, Dh\), got \(3, 3, 5\)"):
        attn(torch.randn(2, 6), torch.randn(3, 3, 5))


def test_weights_are_reported_to_a_capture_and_not_kept():
    """Inside capture_attention the layer reports exactly the α it returns, per call; outside a
    capture nothing is recorded and the module holds no weights afterwards."""
    attn = AdditiveAttention(6, 5)
    s, h = torch.randn(2, 3, 6), torch.randn(2, 4, 5)
    real = padding_mask([4, 2], 4)
    with capture_attention(attn) as maps:
        _, w_step = attn(s[:, 0], h, real)
        _, w_all = attn(s, h, real)
    calls = maps.calls("")  # the root module's name is ""
    assert len(calls) == 2
    torch.testing.assert_close(calls[0], w_step)
    torch.testing.assert_close(calls[1], w_all)
    assert not [k for k in vars(attn) if "weight" in k and not k.startswith("_")]
