"""The ``tiled`` backend: exact attention by tiles, online softmax, recomputing backward.

Every check compares against the explicit ``math`` path (the reference) in fp32, outputs and the
gradients of q, k, v (and of a bias), at 1e-5.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from attnlab.attention import core
from attnlab.attention.core import key_padding_mask, scaled_dot_product_attention
from attnlab.models.builders import multi_head_attention

ATOL = 1e-5


def _grads(backend, q, k, v, *, bias=None, **kw):
    out = scaled_dot_product_attention(q, k, v, backend=backend, bias=bias, **kw)
    # a fixed, non-uniform upstream gradient so every output element matters differently
    d_out = torch.linspace(-1, 1, out.numel()).view_as(out)
    inputs = [q, k, v] + ([bias] if bias is not None else [])
    return (out, *torch.autograd.grad((out * d_out).sum(), inputs))


def _assert_matches_math(q, k, v, *, bias=None, block_q=16, block_k=8, **kw):
    ref = _grads("math", q, k, v, bias=bias, **kw)
    got = _grads("tiled", q, k, v, bias=bias, block_q=block_q, block_k=block_k, **kw)
    names = ["out", "dq", "dk", "dv", "dbias"]
    for name, a, b in zip(names, ref, got):
        assert torch.isfinite(b).all(), name
        torch.testing.assert_close(b, a, atol=ATOL, rtol=0, msg=lambda m, n=name: f"{n}: {m}")


def _qkv(B, H, Hkv, Tq, Tk, D=16, Dv=None):
    q = torch.randn(B, H, Tq, D, requires_grad=True)
    k = torch.randn(B, Hkv, Tk, D, requires_grad=True)
    v = torch.randn(B, Hkv, Tk, Dv or D, requires_grad=True)
    return q, k, v


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("padding", [False, True])
@pytest.mark.parametrize("n_kv", [4, 2, 1])  # MHA, GQA, MQA
def test_tiled_equals_math_across_masks_and_gqa(is_causal, padding, n_kv):
    # 37 tokens: neither a multiple of block_q=16 nor of block_k=8 (ragged last tiles)
    q, k, v = _qkv(2, 4, n_kv, 37, 37, Dv=12)
    mask = key_padding_mask(torch.tensor([37, 21]), 37) if padding else None
    _assert_matches_math(q, k, v, mask=mask, is_causal=is_causal)


@pytest.mark.parametrize("n_q,n_k", [(5, 40), (19, 64), (40, 23), (1, 33)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_tiled_equals_math_when_query_and_key_lengths_differ(n_q, n_k, is_causal):
    # causal with n_q != n_k is bottom-right aligned; with n_q > n_k the first rows see no key
    q, k, v = _qkv(2, 4, 2, n_q, n_k)
    mask = key_padding_mask(torch.tensor([n_k, n_k - 3]), n_k)
    _assert_matches_math(q, k, v, mask=mask, is_causal=is_causal, block_q=8, block_k=16)


def test_tiled_bias_and_its_gradient_match_math():
    # an ALiBi-like per-head bias (H, Tq, Tk) that is learned: its gradient must match too
    q, k, v = _qkv(2, 4, 2, 30, 30)
    bias = torch.randn(4, 30, 30, requires_grad=True)
    _assert_matches_math(q, k, v, bias=bias, is_causal=True)
    per_key = torch.randn(2, 1, 1, 30, requires_grad=True)  # broadcast over heads and queries
    _assert_matches_math(q, k, v, bias=per_key, mask=key_padding_mask(torch.tensor([30, 9]), 30))


def test_tiled_query_dependent_mask_and_fully_masked_rows_give_zeros():
    q, k, v = _qkv(2, 4, 4, 33, 33)
    mask = torch.rand(2, 4, 33, 33) > 0.5
    mask[:, :, 3] = False  # query 3 may attend to nothing
    _assert_matches_math(q, k, v, mask=mask)
    out = scaled_dot_product_attention(q, k, v, mask=mask, backend="tiled", block_q=8, block_k=8)
    assert torch.equal(out[:, :, 3], torch.zeros_like(out[:, :, 3]))


def test_tiled_accepts_3d_and_5d_inputs():
    q, k, v = torch.randn(4, 21, 8), torch.randn(2, 21, 8), torch.randn(2, 21, 8)
    ref = scaled_dot_product_attention(q, k, v, is_causal=True, backend="math")
    got = scaled_dot_product_attention(q, k, v, is_causal=True, backend="tiled", block_q=4)
    torch.testing.assert_close(got, ref, atol=ATOL, rtol=0)
    q, k, v = torch.randn(2, 3, 4, 11, 8), torch.randn(2, 3, 2, 11, 8), torch.randn(2, 3, 2, 11, 8)
    mask = torch.rand(3, 1, 11, 11) > 0.3
    ref = scaled_dot_product_attention(q, k, v, mask=mask, backend="math")
    got = scaled_dot_product_attention(q, k, v, mask=mask, backend="tiled", block_q=4, block_k=4)
    torch.testing.assert_close(got, ref, atol=ATOL, rtol=0)


class _CountMatmuls(TorchDispatchMode):
    """Counts the batched matrix products that reach the kernels."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.bmm.default, torch.ops.aten.mm.default):
            self.n += 1
        return func(*args, **(kwargs or {}))


def test_tiled_causal_skips_tiles_above_the_diagonal():
    q, k, v = torch.randn(1, 2, 64, 8), torch.randn(1, 2, 64, 8), torch.randn(1, 2, 64, 8)
    counts = {}
    for causal in (False, True):
        with torch.no_grad(), _CountMatmuls() as mode:
            scaled_dot_product_attention(
                q, k, v, is_causal=causal, backend="tiled", block_q=16, block_k=16
            )
        counts[causal] = mode.n
    # 4×4 tiles, two matmuls each (Q Kᵀ, P V); causal visits the 4+3+2+1 on/below the diagonal
    assert counts[False] == 2 * 16
    assert counts[True] == 2 * 10


def test_tiled_saves_no_quadratic_tensor_for_backward():
    # the memory claim: what autograd keeps between forward and backward is O(N·d), not O(N²)
    T, D = 512, 16
    q, k, v = _qkv(1, 2, 2, T, T, D)
    saved = []

    def pack(t):
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = scaled_dot_product_attention(q, k, v, is_causal=True, backend="tiled")
    assert max(saved) <= 2 * T * D  # q/k/v/out-sized; a score matrix would be 2·T·T = 524288
    out.sum().backward()
    assert q.grad is not None


@pytest.mark.parametrize("position", ["none", "rope", "alibi"])
def test_multihead_with_tiled_backend_matches_math(position):
    torch.manual_seed(0)
    ref = multi_head_attention(32, 4, n_kv_heads=2, position=position, backend="math")
    tiled = multi_head_attention(
        32,
        4,
        n_kv_heads=2,
        position=position,
        backend="tiled",
        backend_options={"block_q": 8, "block_k": 16},
    )
    tiled.load_state_dict(ref.state_dict())
    x = torch.randn(2, 27, 32)
    mask = key_padding_mask(torch.tensor([27, 15]), 27)
    a, _ = ref(x, mask=mask, is_causal=True)
    b, _ = tiled(x, mask=mask, is_causal=True)
    torch.testing.assert_close(b, a, atol=ATOL, rtol=0)


@pytest.mark.parametrize(
    "option,value",
    [("block_q", 0), ("block_k", -4), ("block_q", 2.5), ("block_k", "64"), ("block_q", True)],
)
def test_bad_block_size_is_a_clear_error(option, value):
    q = torch.randn(1, 2, 8, 4)
    with pytest.raises(ValueError, match=rf"'tiled'.*{option}"):
        scaled_dot_product_attention(q, q, q, backend="tiled", **{option: value})


def test_tiled_refuses_weights_and_dropout_by_name():
    q = torch.randn(1, 2, 8, 4)
    with pytest.raises(ValueError, match=r"'tiled'.*return_weights"):
        scaled_dot_product_attention(q, q, q, backend="tiled", return_weights=True)
    with pytest.raises(ValueError, match=r"'tiled'.*dropout_p"):
        scaled_dot_product_attention(q, q, q, backend="tiled", dropout_p=0.1)


def test_tiled_is_registered():
    assert {"tiled", "window", "linear"} <= set(core.available_backends())
