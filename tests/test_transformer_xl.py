"""Transformer-XL: the attention against Dai et al.'s score written out with loops, the
relative shift against its index formula, memory against recomputation over the concatenated
context, and the errors of a memory longer than the model allows."""

from __future__ import annotations

import math

import pytest
import torch

from attnlab.attention.relative_xl import SegmentMemory, XLAttention, rel_shift
from attnlab.config.base import ConfigError
from attnlab.config.variants import TransformerXLConfig
from attnlab.errors import UserError
from attnlab.layers.position.xl import XLRelativePositions
from attnlab.models.transformer_xl import TransformerXL


def _tiny(**kw) -> TransformerXL:
    torch.manual_seed(0)
    cfg = TransformerXLConfig.preset("tiny", d_model=16, n_heads=2, vocab_size=11, **kw)
    model = TransformerXL(cfg).eval()
    for blk in model.blocks:  # u, v start at 0; give them values so their terms are tested
        torch.nn.init.normal_(blk.attn.u, std=0.5)
        torch.nn.init.normal_(blk.attn.v, std=0.5)
    return model


def test_rel_shift_moves_distance_columns_to_key_columns():
    T, M = 3, 2
    K = M + T
    x = torch.randn(2, T, K)
    out = rel_shift(x)
    for i in range(T):
        for j in range(M + i + 1):  # the allowed keys; the rest is filler
            assert out[:, i, j].equal(x[:, i, j + T - 1 - i])


def _sinusoid(distance: int, C: int) -> list[float]:
    half = [distance / 10000 ** (2 * c / C) for c in range(C // 2)]
    return [math.sin(a) for a in half] + [math.cos(a) for a in half]


def test_attention_equals_the_papers_score_written_out():
    """A_ij = q_i·k_j + q_i·W_R R_{i-j} + u·k_j + v·W_R R_{i-j}, causal over [memory; segment],
    softmax(A / √D) V, per batch row, head, query and key in plain loops."""
    torch.manual_seed(1)
    C, H, T, M = 8, 2, 3, 4
    D = C // H
    attn = XLAttention(
        H, torch.nn.Linear(C, 3 * C), torch.nn.Linear(C, C, bias=False), torch.nn.Linear(C, C)
    ).eval()
    torch.nn.init.normal_(attn.u)
    torch.nn.init.normal_(attn.v)
    x, mem = torch.randn(2, T, C), torch.randn(2, M, C)
    out, _ = attn(x, cache=SegmentMemory(mem), pos_emb=XLRelativePositions(C))

    xt = torch.cat([mem, x], 1)
    Wq, Wk, Wv = attn.qkv.weight.split(C)
    bq, bk, bv = attn.qkv.bias.split(C)
    WR = attn.r_proj.weight
    expected = torch.zeros(2, T, C)
    for b in range(2):
        for h in range(H):
            sl = slice(h * D, (h + 1) * D)
            for i in range(T):
                q = Wq[sl] @ x[b, i] + bq[sl]
                scores, values = [], []
                for j in range(M + i + 1):  # query i sits at M + i: keys up to itself
                    k = Wk[sl] @ xt[b, j] + bk[sl]
                    r = WR[sl] @ torch.tensor(_sinusoid(M + i - j, C))
                    a = q @ k + q @ r + attn.u[h] @ k + attn.v[h] @ r
                    scores.append(a / math.sqrt(D))
                    values.append(Wv[sl] @ xt[b, j] + bv[sl])
                w = torch.stack(scores).softmax(0)
                expected[b, i, sl] = sum(wj * vj for wj, vj in zip(w, values))
    expected = attn.out_proj(expected)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mem_len", [6, 4])
def test_memory_equals_recomputation_over_the_concatenated_context(mem_len):
    """Segment 2 read after segment 1's memory = the segment-2 rows of one forward over
    [seg1; seg2] whose segment-2 queries see keys back to seg1's last mem_len tokens."""
    model = _tiny(mem_len=mem_len)
    T = 6
    idx = torch.randint(0, 11, (2, 2 * T))
    first = model(idx[:, :T])
    second = model(idx[:, T:], memory=first.memory)
    q = torch.arange(2 * T)[:, None]
    k = torch.arange(2 * T)[None, :]
    span = (q < T) | (k >= T - mem_len)  # (2T, 2T): the memory's reach for segment-2 queries
    full = model(idx, mask=span).out
    torch.testing.assert_close(first.out, full[:, :T], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(second.out, full[:, T:], atol=1e-5, rtol=1e-5)
    assert [m.shape[1] for m in second.memory] == [mem_len] * 2


def test_memory_grows_to_mem_len_and_keeps_the_latest_states():
    model = _tiny(mem_len=20)
    memory, seen = None, []
    for _ in range(4):
        out = model(torch.randint(0, 11, (1, 8)), memory=memory)
        if memory is not None:  # the older states move left; this segment's 8 come last
            kept = min(memory[0].shape[1], 20 - 8)
            for old, new in zip(memory, out.memory):
                assert new[:, :kept].equal(old[:, old.shape[1] - kept :])
        memory = out.memory
        seen.append(memory[0].shape[1])
    assert seen == [8, 16, 20, 20]


def test_memory_carries_no_gradient_but_the_segment_does():
    model = _tiny(mem_len=4).train()
    idx = torch.randint(0, 11, (1, 8))
    first = model(idx[:, :4])
    assert not any(m.requires_grad for m in first.memory)
    loss = model(idx[:, 4:], memory=first.memory, targets=idx[:, 4:]).out
    loss.backward()
    for blk in model.blocks:
        assert blk.attn.u.grad.abs().sum() > 0 and blk.attn.v.grad.abs().sum() > 0
        assert blk.attn.r_proj.weight.grad.abs().sum() > 0


def test_a_memory_longer_than_the_model_allows_is_a_clear_error():
    with pytest.raises(ConfigError, match=r"mem_len=128 is longer than the model allows"):
        TransformerXLConfig.preset("tiny", mem_len=128)  # max_seq_len 128: no room for a token
    model = _tiny(mem_len=4)
    idx = torch.randint(0, 11, (1, 4))
    long = [torch.zeros(1, 5, 16)] * 2
    with pytest.raises(UserError, match=r"memory of 5 states is longer than the model allows"):
        model(idx, memory=long)
    with pytest.raises(UserError, match=r"exceed max_seq_len=128"):
        model(torch.randint(0, 11, (1, 126)), memory=[torch.zeros(1, 4, 16)] * 2)
