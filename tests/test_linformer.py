"""Linformer: keys and values projected along the sequence by learned E, F (k × N).

With k = N and identity projections it is full non-causal attention; it refuses causal use (the
projection mixes the future into every key) and other requests it cannot honour, each with a
message naming the value."""

from __future__ import annotations

import pytest
import torch

from attnlab.attention import key_padding_mask
from attnlab.attention.cache import KVCache
from attnlab.attention.linformer import LinformerProjection
from attnlab.config import BlockConfig, ConfigError, ModelConfig
from attnlab.experiments.sparse_bench import linformer_error
from attnlab.layers.builders import build_block
from attnlab.models.builders import multi_head_attention
from attnlab.models.lm import DecoderLM


def _pair(N: int, k: int, **kw):
    """A full-attention layer and a Linformer layer with the same Q/K/V/O weights."""
    full = multi_head_attention(32, 4, backend="math", **kw)
    lin = multi_head_attention(32, 4, backend="math", linformer_k=k, max_seq_len=N, **kw)
    lin.load_state_dict(full.state_dict(), strict=False)
    return full, lin


@pytest.mark.parametrize("n_kv_heads", [4, 2])
@pytest.mark.parametrize("position", ["none", "rope"])
def test_identity_projections_with_k_equal_n_give_full_attention(n_kv_heads, position):
    N = 24
    full, lin = _pair(N, N, n_kv_heads=n_kv_heads, position=position)
    with torch.no_grad():
        lin.linformer.E.copy_(torch.eye(N))
        lin.linformer.F.copy_(torch.eye(N))
    x = torch.randn(3, N, 32)
    ref, _ = full(x)
    got, _ = lin(x)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    # a permutation of the rows is also exact: softmax does not care about key order
    perm = torch.randperm(N)
    with torch.no_grad():
        lin.linformer.E.copy_(torch.eye(N)[perm])
        lin.linformer.F.copy_(torch.eye(N)[perm])
    torch.testing.assert_close(lin(x)[0], ref, atol=1e-5, rtol=0)


def test_projection_shapes_and_padding_adds_nothing():
    N, k = 32, 8
    _, lin = _pair(N, k)
    x = torch.randn(2, 20, 32)  # S = 20 < N: the first 20 columns of E and F
    out, weights = lin(x, need_weights=True)
    assert out.shape == (2, 20, 32) and weights.shape == (2, 4, 20, k)
    # padded positions are zeroed before mixing: their content cannot change the real tokens
    mask = key_padding_mask(torch.tensor([20, 13]), 20)
    y = x.clone()
    y[1, 13:] = torch.randn(7, 32) * 10
    a, _ = lin(x, mask=mask)
    b, _ = lin(y, mask=mask)
    torch.testing.assert_close(a[:, :13], b[:, :13], atol=1e-5, rtol=0)


def test_e_and_f_learn_in_a_non_causal_block():
    cfg = BlockConfig(d_model=32, n_heads=4, linformer_k=6, position="none")
    block = build_block(cfg, max_seq_len=16)
    x = torch.randn(2, 16, 32)
    block(x).pow(2).sum().backward()
    lin = block.attn.linformer
    assert tuple(lin.E.shape) == (6, 16) and lin.E.grad.abs().sum() > 0
    assert lin.F.grad.abs().sum() > 0


def test_causal_use_is_refused_with_the_reason():
    _, lin = _pair(16, 4)
    with pytest.raises(ValueError, match="cannot be causal.*mixes every position.*encoder"):
        lin(torch.randn(1, 8, 32), is_causal=True)
    # a decoder LM is causal: configuring Linformer there fails at the first forward
    model = DecoderLM(ModelConfig.preset("tiny", linformer_k=8, position="learned"))
    with pytest.raises(ValueError, match="cannot be causal"):
        model(torch.randint(0, 256, (1, 10)))


def test_bad_requests_name_the_value():
    with pytest.raises(ValueError, match="linformer_k=40 exceeds the sequence length N=32"):
        multi_head_attention(32, 4, linformer_k=40, max_seq_len=32)
    with pytest.raises(ValueError, match="linformer_k must be a positive integer, got 0"):
        LinformerProjection(0, 8)
    with pytest.raises(ValueError, match="needs the sequence length N"):
        multi_head_attention(32, 4, linformer_k=4)
    with pytest.raises(ValueError, match="position='alibi'"):
        multi_head_attention(32, 4, linformer_k=4, max_seq_len=8, position="alibi")
    with pytest.raises(ValueError, match="self-attention, not cross-attention"):
        multi_head_attention(32, 4, cross=True, linformer_k=4, max_seq_len=8)
    _, lin = _pair(16, 4)
    with pytest.raises(ValueError, match="20 positions exceed its sequence length N=16"):
        lin(torch.randn(1, 20, 32))
    with pytest.raises(ValueError, match="takes no KV cache"):
        lin(torch.randn(1, 4, 32), cache=KVCache(1, 4, 16, 8))
    with pytest.raises(ValueError, match=r"only a key padding mask.*\(4, 4\)"):
        lin(torch.randn(1, 4, 32), mask=torch.ones(4, 4, dtype=torch.bool))
    with pytest.raises(
        ConfigError, match=r"linformer_k \(200\) must not exceed .*max_seq_len \(128\)"
    ):
        ModelConfig.preset("tiny", linformer_k=200)
    with pytest.raises(ConfigError, match="linformer_k"):
        BlockConfig(linformer_k=0)
    with pytest.raises(ConfigError, match="position='t5'"):
        BlockConfig(linformer_k=4, position="t5")


def test_measured_error_falls_when_e_and_f_are_fitted_on_smooth_inputs():
    row = linformer_error(64, 16, inputs="smooth", heads=2, head_dim=16, fit_steps=60)
    assert row["fitted"] < 0.5 * row["random"]
    exact = linformer_error(16, 16, inputs="iid", heads=1, head_dim=8, fit_steps=0)
    assert exact["random"] > 0.1  # a random projection is not attention, even with k = N
    with pytest.raises(ValueError, match="k=20 must be between 1 and the sequence length N=16"):
        linformer_error(16, 20)
