"""scaled_dot_product_attention: the lecture's worked example, backend agreement, masks, scaling.

References are independent: Python's ``math.exp`` for the worked example, the ``math`` backend
(explicit formula) for the fused ``sdpa`` backend, and probability facts for the scaling claims.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.attention import (
    causal_mask,
    combine_masks,
    key_padding_mask,
    padding_mask,
    scaled_dot_product_attention,
)

ATOL = 1e-5

# ----------------------------------------------------------------------------------------------
# the lecture's worked example


def _worked_example_inputs():
    """Scores e = (3.2, 2.8, 0.1, -1.0) as q·k (q = (1,), scale 1); values h1..h4 from the notes."""
    scores = torch.tensor([3.2, 2.8, 0.1, -1.0], dtype=torch.float64)
    q = torch.ones(1, 1, dtype=torch.float64)  # (Tq=1, D=1)
    k = scores[:, None]  # (Tk=4, D=1): q·k_j = e_j
    h = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0], [-0.5, 0.5]], dtype=torch.float64)
    return scores, q, k, h


def test_worked_example_weights_match_softmax_by_hand():
    scores, q, k, h = _worked_example_inputs()
    _, weights = scaled_dot_product_attention(
        q, k, h, scale=1.0, backend="math", return_weights=True
    )
    exps = [math.exp(s) for s in scores.tolist()]
    by_hand = torch.tensor([e / sum(exps) for e in exps], dtype=torch.float64)
    torch.testing.assert_close(weights[0], by_hand, rtol=0, atol=1e-12)
    # the notes round the weights to two significant digits: (0.58, 0.39, 0.026, 0.009)
    notes = torch.tensor([0.58, 0.39, 0.026, 0.009], dtype=torch.float64)
    assert torch.allclose(weights[0], notes, rtol=0.02, atol=5e-4), weights


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_worked_example_context_vector(backend):
    scores, q, k, h = _worked_example_inputs()
    context = scaled_dot_product_attention(q, k, h, scale=1.0, backend=backend)[0]
    exps = [math.exp(s) for s in scores.tolist()]
    a = [e / sum(exps) for e in exps]
    by_hand = torch.tensor(
        [sum(a[j] * h[j, c].item() for j in range(4)) for c in range(2)], dtype=torch.float64
    )
    torch.testing.assert_close(context, by_hand, rtol=0, atol=1e-12)
    # The notes quote c1 ≈ (0.89, 0.25). The exact context is (0.884, 0.263), and even the notes'
    # own rounded weights give (0.888, 0.265): their second coordinate is ~0.013 off, hence 0.015.
    assert torch.allclose(context, torch.tensor([0.89, 0.25], dtype=torch.float64), atol=0.015)
    # almost all of it comes from h1 ("We") and h2 ("see")
    assert a[0] + a[1] > 0.96


# ----------------------------------------------------------------------------------------------
# math vs sdpa


def _both_backends(q, k, v, **kw):
    """Outputs and input gradients from the math and sdpa backends for the same inputs."""
    results = []
    g = torch.randn(*q.shape[:-1], v.shape[-1], generator=torch.Generator().manual_seed(1))
    for backend in ("math", "sdpa"):
        qq, kk, vv = (t.detach().clone().requires_grad_() for t in (q, k, v))
        out = scaled_dot_product_attention(qq, kk, vv, backend=backend, **kw)
        (out * g).sum().backward()
        results.append((out.detach(), qq.grad, kk.grad, vv.grad))
    return results


def _assert_backends_agree(q, k, v, **kw):
    (o1, *g1), (o2, *g2) = _both_backends(q, k, v, **kw)
    assert torch.isfinite(o1).all() and torch.isfinite(o2).all()
    torch.testing.assert_close(o2, o1, rtol=0, atol=ATOL)
    for name, a, b in zip(("dq", "dk", "dv"), g1, g2):
        assert torch.isfinite(a).all() and torch.isfinite(b).all(), name
        torch.testing.assert_close(b, a, rtol=0, atol=ATOL, msg=lambda m, n=name: f"{n}: {m}")


def _qkv(B=2, H=4, Hkv=4, Tq=7, Tk=7, D=8, Dv=8):
    return torch.randn(B, H, Tq, D), torch.randn(B, Hkv, Tk, D), torch.randn(B, Hkv, Tk, Dv)


CASES = {
    "no_mask": ({}, {}),
    "causal": ({}, {"is_causal": True}),
    "causal_cache_shape": ({"Tq": 3, "Tk": 9}, {"is_causal": True}),  # bottom-right aligned
    "padding": ({}, {"mask": key_padding_mask([7, 4])}),
    "causal_and_padding": ({}, {"mask": key_padding_mask([7, 4]), "is_causal": True}),
    "combined_mask_tensor": ({}, {"mask": combine_masks(causal_mask(7), key_padding_mask([5, 7]))}),
    "gqa": ({"Hkv": 2}, {"is_causal": True}),
    "mqa_padding": ({"Hkv": 1}, {"mask": key_padding_mask([7, 2])}),
    "cross_shapes": ({"Tq": 3, "Tk": 11}, {"mask": key_padding_mask([11, 6])}),
    "dv_ne_dk": ({"D": 8, "Dv": 5, "Tq": 4, "Tk": 6}, {}),
    "dv_ne_dk_gqa_cross_causal": (
        {"Hkv": 2, "D": 4, "Dv": 12, "Tq": 5, "Tk": 9},
        {"is_causal": True, "mask": key_padding_mask([9, 8])},
    ),
    "bias": ({}, {"bias": torch.randn(4, 7, 7), "mask": key_padding_mask([7, 3])}),
    "custom_scale": ({}, {"scale": 0.3, "is_causal": True}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_math_and_sdpa_agree_outputs_and_gradients(case):
    shape_kw, kw = CASES[case]
    _assert_backends_agree(*_qkv(**shape_kw), **kw)


def test_backends_agree_on_3d_inputs_without_head_dim():
    q, k, v = torch.randn(3, 5, 8), torch.randn(3, 6, 8), torch.randn(3, 6, 4)
    _assert_backends_agree(q, k, v, mask=padding_mask([6, 2, 4])[:, None, :])


@settings(max_examples=40, deadline=None)
@given(
    B=st.integers(1, 2),
    Hkv=st.integers(1, 2),
    rep=st.integers(1, 3),
    Tq=st.integers(1, 6),
    Tk=st.integers(1, 6),
    D=st.integers(1, 9),
    Dv=st.integers(1, 9),
    kind=st.sampled_from(["none", "causal", "padding", "both"]),
    seed=st.integers(0, 2**16),
)
def test_backends_agree_shape_sweep(B, Hkv, rep, Tq, Tk, D, Dv, kind, seed):
    torch.manual_seed(seed)
    q, k, v = _qkv(B=B, H=Hkv * rep, Hkv=Hkv, Tq=Tq, Tk=Tk, D=D, Dv=Dv)
    lengths = torch.randint(0, Tk + 1, (B,))  # length 0 = a fully masked batch row
    mask = key_padding_mask(lengths, Tk) if kind in ("padding", "both") else None
    is_causal = kind in ("causal", "both")
    _assert_backends_agree(q, k, v, mask=mask, is_causal=is_causal)
    _, w = scaled_dot_product_attention(
        q, k, v, mask=mask, is_causal=is_causal, backend="math", return_weights=True
    )
    allowed = torch.ones(B, 1, Tq, Tk, dtype=torch.bool)
    if mask is not None:
        allowed = allowed & mask
    if is_causal:
        allowed = allowed & causal_mask(Tq, Tk)
    row_sums = w.sum(-1)
    expected = allowed.any(-1).to(w.dtype).expand_as(row_sums)  # 1, or 0 for a row with no key
    torch.testing.assert_close(row_sums, expected, rtol=0, atol=1e-6)
    assert (w.masked_select(~allowed.expand_as(w)) == 0).all()


# ----------------------------------------------------------------------------------------------
# masks


def test_weights_rows_sum_to_one():
    q, k, v = _qkv(Tq=5, Tk=9)
    _, w = scaled_dot_product_attention(
        q, k, v, mask=key_padding_mask([9, 3]), backend="math", return_weights=True
    )
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, 5), rtol=0, atol=1e-6)
    assert (w >= 0).all()


def test_causal_weights_above_diagonal_are_exactly_zero():
    q, k, v = _qkv(Tq=6, Tk=6)
    _, w = scaled_dot_product_attention(
        q, k, v, is_causal=True, backend="math", return_weights=True
    )
    assert (w.triu(diagonal=1) == 0).all()
    assert (w[..., causal_mask(6)] > 0).all()  # and nothing on or below it is masked
    # with a cache (Tq < Tk) query i is key position Tk - Tq + i
    q, k, v = _qkv(Tq=3, Tk=8)
    _, w = scaled_dot_product_attention(
        q, k, v, is_causal=True, backend="math", return_weights=True
    )
    assert (w.triu(diagonal=8 - 3 + 1) == 0).all() and (w[..., causal_mask(3, 8)] > 0).all()


def test_mask_helpers():
    tri = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 1]]).bool()
    torch.testing.assert_close(causal_mask(3), tri)
    torch.testing.assert_close(causal_mask(2, 4), torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]).bool())
    pm = padding_mask([2, 0, 3], 4)
    torch.testing.assert_close(pm, torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 0]]).bool())
    kpm = key_padding_mask(torch.tensor([2, 0, 3]), 4)
    assert kpm.shape == (3, 1, 1, 4) and torch.equal(kpm[:, 0, 0], pm)
    assert torch.equal(key_padding_mask(pm), kpm)
    both = combine_masks(causal_mask(4), None, kpm)
    assert both.shape == (3, 1, 4, 4) and torch.equal(both, causal_mask(4) & pm[:, None, None, :])
    assert combine_masks(None, None) is None


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_outputs_before_i_ignore_tokens_after_i(backend):
    q, k, v = _qkv(Tq=8, Tk=8)
    out = scaled_dot_product_attention(q, k, v, is_causal=True, backend=backend)
    i = 4
    q2, k2, v2 = q.clone(), k.clone(), v.clone()
    for t in (q2, k2, v2):
        t[:, :, i + 1 :] = torch.randn_like(t[:, :, i + 1 :]) * 10
    out2 = scaled_dot_product_attention(q2, k2, v2, is_causal=True, backend=backend)
    torch.testing.assert_close(out2[:, :, : i + 1], out[:, :, : i + 1], rtol=0, atol=1e-6)
    assert not torch.allclose(out2[:, :, i + 1 :], out[:, :, i + 1 :], atol=1e-3)


@pytest.mark.parametrize("backend", ["math", "sdpa"])
@pytest.mark.parametrize("how", ["padding", "causal_more_queries"])
def test_fully_masked_row_gives_zeros_not_nan(backend, how):
    if how == "padding":  # batch row 0 has no real key at all
        q, k, v = _qkv(Tq=4, Tk=5)
        kw = {"mask": key_padding_mask([0, 5])}
        empty = torch.zeros(2, 4, 4, dtype=torch.bool)
        empty[0] = True
    else:  # Tq > Tk, bottom-right causal: the first Tq - Tk queries see no key
        q, k, v = _qkv(Tq=5, Tk=3)
        kw = {"is_causal": True}
        empty = torch.zeros(2, 4, 5, dtype=torch.bool)
        empty[:, :, :2] = True
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = scaled_dot_product_attention(q, k, v, backend=backend, **kw)
    assert torch.isfinite(out).all()
    assert (out[empty] == 0).all() and (out[~empty].abs() > 0).any()
    out.pow(2).sum().backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
    assert (q.grad[empty] == 0).all()
    if backend == "math":
        _, w = scaled_dot_product_attention(q, k, v, backend="math", return_weights=True, **kw)
        assert (w[empty] == 0).all() and torch.isfinite(w).all()


def test_auto_backend_returns_weights_through_math():
    q, k, v = _qkv()
    out, w = scaled_dot_product_attention(q, k, v, is_causal=True, return_weights=True)
    torch.testing.assert_close(out, w @ v, rtol=0, atol=1e-6)
    torch.testing.assert_close(
        out, scaled_dot_product_attention(q, k, v, is_causal=True), rtol=0, atol=ATOL
    )


def test_math_backend_is_the_formula():
    q, k, v = _qkv(Tq=5, Tk=6, Dv=3)
    d_k = q.shape[-1]
    expected = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d_k), dim=-1) @ v
    torch.testing.assert_close(
        scaled_dot_product_attention(q, k, v, backend="math"), expected, rtol=0, atol=1e-6
    )


# ----------------------------------------------------------------------------------------------
# why 1/√d_k


def test_scaling_keeps_score_variance_at_one():
    n, d_k = 20000, 64
    q, k = torch.randn(n, d_k, dtype=torch.float64), torch.randn(n, d_k, dtype=torch.float64)
    dots = (q * k).sum(-1)
    # each q_i k_i has variance 1 and they are independent: Var(q·k) = d_k. The sample variance
    # has relative standard error ≈ √(2/n) ≈ 1%, so 5% is a five-sigma band.
    assert abs(dots.var().item() / d_k - 1) < 0.05
    assert abs((dots / math.sqrt(d_k)).var().item() - 1) < 0.05


def _softmax_input_grads(d_k: int, scale: float, n_queries=2048, n_keys=8):
    """Per-query ‖∂L/∂(softmax input)‖ for unit-variance q, k, and the mean largest weight."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(n_queries, d_k, generator=gen, dtype=torch.float64)
    k = torch.randn(n_keys, d_k, generator=gen, dtype=torch.float64)
    v = torch.randn(n_keys, d_k, generator=gen, dtype=torch.float64)
    upstream = torch.randn(n_queries, d_k, generator=gen, dtype=torch.float64)
    logits = ((q @ k.T) * scale).requires_grad_()  # the softmax input, scale · q·k
    # feed the logits through our attention as queries against identity keys (scale 1)
    out, w = scaled_dot_product_attention(
        logits,
        torch.eye(n_keys, dtype=torch.float64),
        v,
        scale=1.0,
        backend="math",
        return_weights=True,
    )
    (out * upstream).sum().backward()
    return logits.grad.norm(dim=-1), w.max(dim=-1).values.mean().item()


def test_without_scaling_softmax_saturates_and_gradient_collapses():
    d_k = 64
    g_scaled, peak_scaled = _softmax_input_grads(d_k, 1 / math.sqrt(d_k))
    g_unscaled, peak_unscaled = _softmax_input_grads(d_k, 1.0)
    # unscaled logits have std √64 = 8: the softmax is close to one-hot ...
    assert peak_unscaled > 0.8 and peak_scaled < 0.45, (peak_unscaled, peak_scaled)
    # ... so its Jacobian diag(p) − ppᵀ nearly vanishes for a typical query. Typical = geometric
    # mean over queries; the arithmetic mean is dominated by the rare near-ties between the top two
    # scores (measured with 8 keys: geometric-mean ratio ≈ 21, arithmetic ≈ 2.6;
    # 25% of queries below 1% of the scaled median gradient, none with the scale).
    typical_ratio = (g_scaled.log().mean() - g_unscaled.log().mean()).exp().item()
    assert typical_ratio > 8, typical_ratio
    # a large share of queries get (almost) no gradient at all without the scale, none with it
    dead = 1e-2 * g_scaled.median()
    assert (g_unscaled < dead).float().mean() > 0.2
    assert (g_scaled < dead).float().mean() == 0


# ----------------------------------------------------------------------------------------------
# bad input


def test_mismatched_qk_width_raises_naming_shapes():
    with pytest.raises(ValueError, match=r"q\(2, 4, 5, 8\).*k\(2, 4, 5, 6\)"):
        scaled_dot_product_attention(
            torch.randn(2, 4, 5, 8), torch.randn(2, 4, 5, 6), torch.randn(2, 4, 5, 6)
        )


def test_mismatched_kv_length_raises_naming_shapes():
    with pytest.raises(ValueError, match=r"k\(2, 4, 5, 8\).*v\(2, 4, 6, 8\)"):
        scaled_dot_product_attention(
            torch.randn(2, 4, 5, 8), torch.randn(2, 4, 5, 8), torch.randn(2, 4, 6, 8)
        )


def test_head_counts_that_do_not_group_raise():
    with pytest.raises(ValueError, match=r"query heads \(4\).*key/value heads \(3\)"):
        scaled_dot_product_attention(
            torch.randn(1, 4, 5, 8), torch.randn(1, 3, 5, 8), torch.randn(1, 3, 5, 8)
        )


def test_mask_that_does_not_broadcast_raises_naming_shapes():
    q, k, v = _qkv(Tq=5, Tk=6)
    with pytest.raises(ValueError, match=r"mask of shape \(2, 1, 1, 5\).*\(2, 4, 5, 6\)"):
        scaled_dot_product_attention(q, k, v, mask=torch.ones(2, 1, 1, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"bias of shape \(3, 5, 6\)"):
        scaled_dot_product_attention(q, k, v, bias=torch.zeros(3, 5, 6))


def test_non_boolean_mask_raises():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="torch.float32"):
        scaled_dot_product_attention(q, k, v, mask=torch.ones(7, 7))
    with pytest.raises(ValueError, match="boolean"):
        combine_masks(causal_mask(3), torch.ones(3, 3, dtype=torch.long))


def test_unknown_backend_and_weights_from_sdpa_raise():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="'nope'.*math.*sdpa"):
        scaled_dot_product_attention(q, k, v, backend="nope")
    with pytest.raises(ValueError, match="'sdpa'.*weights"):
        scaled_dot_product_attention(q, k, v, backend="sdpa", return_weights=True)
    with pytest.raises(ValueError, match="dropout_p"):
        scaled_dot_product_attention(q, k, v, dropout_p=1.5)


def test_padding_mask_rejects_length_beyond_max_len():
    with pytest.raises(ValueError, match="5.*max_len=4"):
        padding_mask([5, 2], 4)


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_an_option_the_backend_does_not_take_is_a_value_error_naming_both(backend):
    q = k = v = torch.randn(1, 2, 4, 8)
    with pytest.raises(
        ValueError, match=rf"backend '{backend}' does not take option\(s\) \['window'\]"
    ):
        scaled_dot_product_attention(q, k, v, backend=backend, window=3)
