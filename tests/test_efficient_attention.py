"""The operator-changing backends: ``window`` (banded sliding window) and ``linear`` (kernelised).

References: the ``math`` path with an explicit banded mask for ``window``; the quadratic form
φ(Q)φ(K)ᵀ V / φ(Q)φ(K)ᵀ1 written out here for ``linear``; exact softmax attention for the error of
FAVOR+ random features.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from attnlab.attention.core import causal_mask, key_padding_mask, scaled_dot_product_attention
from attnlab.attention.efficient import elu_feature_map, window_attention

ATOL = 1e-5


def _band(n_q: int, n_k: int, w: int, causal: bool) -> torch.Tensor:
    """Keys in the window of each (bottom-right aligned) query: 0 ≤ p − j < w, or |p − j| < w."""
    dist = (torch.arange(n_q)[:, None] + n_k - n_q) - torch.arange(n_k)[None, :]
    return (dist >= 0) & (dist < w) if causal else dist.abs() < w


def _qkv(B, H, Hkv, Tq, Tk, D=8, Dv=6):
    return (
        torch.randn(B, H, Tq, D, requires_grad=True),
        torch.randn(B, Hkv, Tk, D, requires_grad=True),
        torch.randn(B, Hkv, Tk, Dv, requires_grad=True),
    )


def _out_and_grads(q, k, v, **kw):
    out = scaled_dot_product_attention(q, k, v, **kw)
    d_out = torch.linspace(-1, 1, out.numel()).view_as(out)
    return (out, *torch.autograd.grad((out * d_out).sum(), (q, k, v)))


# ----------------------------------------------------------------------------------------------
# window


@pytest.mark.parametrize("w", [29, 64])
def test_window_at_least_n_is_full_causal_attention(w):
    q, k, v = _qkv(2, 4, 2, 29, 29)
    mask = key_padding_mask(torch.tensor([29, 17]), 29)
    ref = _out_and_grads(q, k, v, mask=mask, is_causal=True, backend="math")
    got = _out_and_grads(q, k, v, mask=mask, is_causal=True, backend="window", window=w)
    for a, b in zip(ref, got):
        torch.testing.assert_close(b, a, atol=ATOL, rtol=0)


# w up to and beyond both lengths: with n_q > n_k a two-sided window reaches n_q − 1 keys ahead
@pytest.mark.parametrize("w,chunk", [(1, None), (5, None), (5, 3), (12, 7), (33, 4), (50, None)])
@pytest.mark.parametrize("is_causal", [True, False])
@pytest.mark.parametrize("n_q,n_k", [(37, 37), (16, 41), (41, 30)])
def test_window_zero_weight_beyond_w_and_equals_banded_math(w, chunk, is_causal, n_q, n_k):
    q, k, v = _qkv(2, 4, 2, n_q, n_k)
    pad = key_padding_mask(torch.tensor([n_k, n_k - 6]), n_k)
    band = _band(n_q, n_k, w, is_causal)
    opts = {} if chunk is None else {"chunk": chunk}
    out, weights = scaled_dot_product_attention(
        q,
        k,
        v,
        mask=pad,
        is_causal=is_causal,
        backend="window",
        window=w,
        return_weights=True,
        **opts,
    )
    assert torch.equal(weights[..., ~band], torch.zeros_like(weights[..., ~band]))  # exactly 0
    ref = _out_and_grads(q, k, v, mask=pad & band, backend="math")
    got = _out_and_grads(q, k, v, mask=pad, is_causal=is_causal, backend="window", window=w, **opts)
    for a, b in zip(ref, got):
        torch.testing.assert_close(b, a, atol=ATOL, rtol=0)
    ref_w = scaled_dot_product_attention(
        q, k, v, mask=pad & band, backend="math", return_weights=True
    )[1]
    torch.testing.assert_close(weights, ref_w, atol=ATOL, rtol=0)


def test_window_with_query_dependent_mask_and_bias_matches_math():
    q, k, v = _qkv(2, 4, 4, 30, 30)
    mask = torch.rand(2, 1, 30, 30) > 0.3
    bias = torch.randn(4, 30, 30)
    band = _band(30, 30, 6, True)
    ref = scaled_dot_product_attention(q, k, v, mask=mask & band, bias=bias, backend="math")
    got = scaled_dot_product_attention(
        q, k, v, mask=mask, bias=bias, is_causal=True, backend="window", window=6, chunk=4
    )
    torch.testing.assert_close(got, ref, atol=ATOL, rtol=0)


class _LargestTensor(TorchDispatchMode):
    """Records the element count of the largest tensor any operation produces."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize(
    "backend,opts",
    [
        ("window", {"window": 8}),
        ("linear", {"feature_map": "elu", "chunk": 32}),
        ("linear", {"feature_map": "favor", "n_features": 16, "chunk": 32}),
    ],
)
def test_no_n_by_n_tensor_forward_or_backward(backend, opts):
    # banded / linear: every intermediate is O(N·(c + w)) or O(N·F), never the (H, N, N) scores
    H, N = 2, 256
    q, k, v = _qkv(1, H, H, N, N, D=8, Dv=8)
    pad = key_padding_mask(torch.tensor([N - 10]), N)
    with _LargestTensor() as mode:
        out = scaled_dot_product_attention(
            q, k, v, mask=pad, is_causal=True, backend=backend, **opts
        )
        out.square().sum().backward()
    assert mode.largest < H * N * N / 4


def test_window_returns_weights_only_when_asked():
    q = torch.randn(1, 2, 10, 4)
    out, weights = window_attention(q, q, q, scale=0.5, window=3)
    assert weights is None and out.shape == (1, 2, 10, 4)


# ----------------------------------------------------------------------------------------------
# linear


def _quadratic_linear(q, k, v, mask):
    """φ(Q)φ(K)ᵀ masked, row-normalised, times V: the O(N²) form of elu+1 linear attention."""
    n_rep = q.shape[1] // k.shape[1]
    fq, fk = F.elu(q) + 1, (F.elu(k) + 1).repeat_interleave(n_rep, 1)
    a = (fq @ fk.transpose(-2, -1)) * mask
    den = a.sum(-1, keepdim=True)
    return (a @ v.repeat_interleave(n_rep, 1)) / den.masked_fill(den == 0, 1)


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("n_q,n_k", [(37, 37), (13, 40), (40, 13)])
@pytest.mark.parametrize("chunk", [8, 128])
def test_elu_linear_attention_equals_its_quadratic_form(is_causal, n_q, n_k, chunk):
    q, k, v = (t.detach().double() for t in _qkv(2, 4, 2, n_q, n_k))
    pad = key_padding_mask(torch.tensor([n_k, n_k - 5]), n_k)
    allowed = pad & causal_mask(n_q, n_k) if is_causal else pad.expand(2, 1, n_q, n_k)
    ref = _quadratic_linear(q, k, v, allowed)
    got = scaled_dot_product_attention(
        q, k, v, mask=pad, is_causal=is_causal, backend="linear", chunk=chunk
    )
    torch.testing.assert_close(got, ref, atol=1e-12, rtol=0)


def test_elu_feature_map_is_elu_plus_one_and_stays_positive():
    x = torch.linspace(-60, 60, 121, dtype=torch.float64)
    torch.testing.assert_close(elu_feature_map(x), F.elu(x) + 1, atol=1e-15, rtol=0)
    assert (elu_feature_map(x.float()) > 0).all()  # even where fp32 elu(x) + 1 rounds to 0


@pytest.mark.parametrize(
    "backend,opts",
    [
        ("linear", {"feature_map": "elu", "chunk": 8}),
        ("linear", {"feature_map": "favor", "n_features": 64, "chunk": 8}),
        ("window", {"window": 5, "chunk": 4}),
        ("tiled", {"block_q": 8, "block_k": 8}),
    ],
)
def test_causal_forms_do_not_look_ahead(backend, opts):
    q, k, v = (t.detach() for t in _qkv(1, 4, 2, 40, 40))
    out = scaled_dot_product_attention(q, k, v, is_causal=True, backend=backend, **opts)
    q2, k2, v2 = q.clone(), k.clone(), v.clone()
    for t in (q2, k2, v2):
        t[..., 25:, :] = torch.randn_like(t[..., 25:, :]) * 3  # rewrite the future
    out2 = scaled_dot_product_attention(q2, k2, v2, is_causal=True, backend=backend, **opts)
    assert torch.equal(out[..., :25, :], out2[..., :25, :])
    assert not torch.allclose(out[..., 25:, :], out2[..., 25:, :])


def _favor_error(n_features: int, is_causal: bool, seeds=range(3)) -> float:
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(1, 4, 128, 16, generator=gen) * 0.5
    k = torch.randn(1, 4, 128, 16, generator=gen) * 0.5
    v = torch.randn(1, 4, 128, 16, generator=gen)
    exact = scaled_dot_product_attention(q, k, v, is_causal=is_causal, backend="math")
    errs = []
    for seed in seeds:
        approx = scaled_dot_product_attention(
            q,
            k,
            v,
            is_causal=is_causal,
            backend="linear",
            feature_map="favor",
            n_features=n_features,
            seed=seed,
        )
        errs.append(((approx - exact).norm() / exact.norm()).item())
    return sum(errs) / len(errs)


@pytest.mark.parametrize("is_causal", [False, True])
def test_favor_error_against_softmax_shrinks_with_more_features(is_causal):
    # measured relative error ‖out − exact‖/‖exact‖ (mean of 3 seeds) at this input scale:
    # about 0.35 (16 features), 0.14 (256), 0.05 (4096) — Monte Carlo, roughly ∝ 1/√F
    errors = [_favor_error(m, is_causal) for m in (16, 256, 4096)]
    assert errors[0] > errors[1] > errors[2]
    assert errors[2] < 0.1
    assert errors[0] > 2 * errors[2]


def test_favor_projection_is_deterministic_in_the_seed():
    q, k, v = torch.randn(3, 1, 2, 10, 8).unbind(0)
    a = scaled_dot_product_attention(q, k, v, backend="linear", feature_map="favor", seed=3)
    b = scaled_dot_product_attention(q, k, v, backend="linear", feature_map="favor", seed=3)
    c = scaled_dot_product_attention(q, k, v, backend="linear", feature_map="favor", seed=4)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_linear_gradients_flow():
    q, k, v = _qkv(1, 2, 2, 20, 20)
    out = scaled_dot_product_attention(
        q, k, v, is_causal=True, backend="linear", feature_map="favor", chunk=8
    )
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() and t.grad.abs().sum() > 0 for t in (q, k, v))


# ----------------------------------------------------------------------------------------------
# bad input: the error names the backend and the option


@pytest.mark.parametrize(
    "backend,opts,pattern",
    [
        ("window", {}, r"'window'.*window"),
        ("window", {"window": 0}, r"'window'.*window"),
        ("window", {"window": 2.5}, r"'window'.*window"),
        ("window", {"window": 4, "chunk": -1}, r"'window'.*chunk"),
        ("linear", {"feature_map": "relu"}, r"'linear'.*feature_map"),
        ("linear", {"feature_map": "favor", "n_features": 0}, r"'linear'.*n_features"),
        ("linear", {"chunk": 0}, r"'linear'.*chunk"),
        ("linear", {"return_weights": True}, r"'linear'.*return_weights"),
        ("linear", {"bias": torch.zeros(6, 6)}, r"'linear'.*bias"),
        ("linear", {"mask": torch.ones(6, 6, dtype=torch.bool).tril()}, r"'linear'.*mask"),
        ("linear", {"dropout_p": 0.1}, r"'linear'.*dropout_p"),
    ],
)
def test_bad_options_are_clear_errors(backend, opts, pattern):
    q = torch.randn(1, 2, 6, 4)
    with pytest.raises(ValueError, match=pattern):
        scaled_dot_product_attention(q, q, q, backend=backend, **opts)
