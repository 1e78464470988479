"""T5's relative position bias: equal to Hugging Face's ``T5Attention.compute_bias`` with copied
weights (encoder and decoder forms, unequal lengths, cached rows); ``position="t5"`` in a model is
one table shared by all layers, registered once, and cached decoding equals recomputation."""

from __future__ import annotations

import pytest
import torch

from attnlab.attention.cache import KVCache
from attnlab.config import BlockConfig, ModelConfig
from attnlab.layers import T5RelativeBias
from attnlab.layers.builders import build_block, build_positions
from attnlab.models.builders import multi_head_attention, transformer_block
from attnlab.models.lm import DecoderLM

transformers = pytest.importorskip("transformers")


def _hf_attention(n_heads: int, num_buckets: int, max_distance: int, decoder: bool):
    # heavy optional reference (the test extra): imported by the tests that compare with it
    from transformers import T5Config
    from transformers.models.t5.modeling_t5 import T5Attention

    cfg = T5Config(
        d_model=8 * n_heads,
        d_kv=8,
        num_heads=n_heads,
        relative_attention_num_buckets=num_buckets,
        relative_attention_max_distance=max_distance,
        is_decoder=decoder,
    )
    hf = T5Attention(cfg, has_relative_attention_bias=True, layer_idx=0)
    torch.nn.init.normal_(hf.relative_attention_bias.weight)  # random, not HF's init
    return hf


def _copied(hf, decoder: bool) -> T5RelativeBias:
    n_buckets, n_heads = hf.relative_attention_bias.weight.shape
    ours = T5RelativeBias(
        n_heads, n_buckets, hf.relative_attention_max_distance, bidirectional=not decoder
    )
    with torch.no_grad():
        ours.weight.copy_(hf.relative_attention_bias.weight)  # the whole conversion
    return ours


@pytest.mark.parametrize("decoder", [False, True], ids=["encoder", "decoder"])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (8, 20), (6, 7)])
@pytest.mark.parametrize("q_len,k_len", [(200, 200), (7, 300), (300, 9), (1, 1)])
def test_bias_equals_hf_compute_bias(decoder, num_buckets, max_distance, q_len, k_len):
    # lengths beyond max_distance exercise the log-spaced buckets and the clamp to the last one
    hf = _hf_attention(4, num_buckets, max_distance, decoder)
    ours = _copied(hf, decoder)
    with torch.no_grad():
        ref = hf.compute_bias(q_len, k_len)
        got = ours(q_len, k_len)
    assert got.shape == (1, 4, q_len, k_len)
    torch.testing.assert_close(got, ref, atol=0, rtol=0)


@pytest.mark.parametrize("decoder", [False, True], ids=["encoder", "decoder"])
def test_cached_rows_equal_hf_and_the_last_rows_of_the_full_bias(decoder):
    hf = _hf_attention(3, 32, 128, decoder)
    ours = _copied(hf, decoder)
    full = ours(150, 150)
    with torch.no_grad():
        for past, T in [(0, 150), (140, 10), (149, 1), (60, 5)]:
            S = past + T
            rows = ours.bias(torch.arange(past, S), torch.arange(S))  # what attention asks for
            torch.testing.assert_close(rows[None], hf.compute_bias(T, S, past_seen_tokens=past))
            torch.testing.assert_close(rows, full[0, :, past:S, :S])


def test_buckets_are_exact_then_log_spaced_per_direction():
    b = T5RelativeBias(1, num_buckets=32, max_distance=128, bidirectional=True)
    rel = torch.arange(-200, 201)
    buckets = b.buckets(torch.zeros(1, dtype=torch.long), rel)[0]  # key j − query 0
    past, future = buckets[rel <= 0].flip(0), buckets[rel > 0]  # distance 0, 1, 2, ...
    assert past[:8].tolist() == list(range(8))  # 16 buckets per side, 8 exact
    assert future[:7].tolist() == list(range(17, 24))  # the future half starts at 16
    assert past.diff().ge(0).all() and future.diff().ge(0).all()  # monotone in distance
    assert past.max() == 15 and future.max() == 31  # beyond max_distance: the last bucket
    assert (past[128:] == 15).all()
    causal = T5RelativeBias(1, 32, 128, bidirectional=False)
    cb = causal.buckets(torch.zeros(1, dtype=torch.long), rel)[0]
    assert (cb[rel >= 0] == 0).all()  # the future (and the token itself) share bucket 0
    assert cb[rel < 0].flip(0)[:15].tolist() == list(range(1, 16))  # 16 exact, starting at 1


def test_bias_inside_attention_with_kv_cache_equals_full_recomputation():
    torch.manual_seed(0)
    bias = T5RelativeBias(4, 16, 40, bidirectional=False)
    mha = multi_head_attention(32, 4)  # the model's table is passed to each call
    x = torch.randn(2, 50, 32)
    with torch.no_grad():
        full, _ = mha(x, is_causal=True, pos_emb=bias)
        cache = KVCache(2, 4, 50, 8)
        steps = [mha(x[:, :20], is_causal=True, cache=cache, pos_emb=bias)[0]]
        steps += [mha(x[:, t : t + 1], cache=cache, pos_emb=bias)[0] for t in range(20, 50)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)
    # the bias does act: the same layer without it gives something else
    assert not torch.allclose(mha(x, is_causal=True)[0], full, atol=1e-3)


def test_build_positions_t5_is_bidirectional_unless_causal():
    cfg = BlockConfig(d_model=32, n_heads=4, head_dim=8, position="t5")
    enc = build_positions(cfg, max_seq_len=64)
    dec = build_positions(cfg, max_seq_len=64, causal=True, num_buckets=16, max_distance=64)
    assert isinstance(enc, T5RelativeBias) and enc.bidirectional and enc.num_buckets == 32
    assert not dec.bidirectional and tuple(dec.weight.shape) == (16, 4)


def test_a_shared_table_is_registered_by_its_owner_only():
    cfg = BlockConfig(d_model=32, n_heads=4, position="t5", backend="math")
    blocks = torch.nn.ModuleList(build_block(cfg, shared_positions=True) for _ in range(3))
    assert all(b.attn.positions is None for b in blocks)  # the model passes its table
    assert not any("positions" in k for k in blocks.state_dict())  # owned elsewhere
    # a table built from the name belongs to its layer (one per layer, registered there)
    own = transformer_block(32, 4, position="t5")
    assert "attn.positions.weight" in own.state_dict()


def test_lm_with_t5_positions_trains_decodes_and_stores_the_table_once():
    torch.manual_seed(0)
    cfg = ModelConfig.preset("tiny", position="t5", max_seq_len=48)
    model = DecoderLM(cfg)
    sd = model.state_dict()
    assert [k for k in sd if "pos_emb" in k or "positions" in k] == ["pos_emb.weight"]
    assert tuple(sd["pos_emb.weight"].shape) == (32, cfg.n_heads)
    assert all(b.attn.positions is None for b in model.blocks)  # the model passes its table

    idx = torch.randint(0, cfg.vocab_size, (2, 40))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(5):
        logits = model(idx[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), idx[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        assert model.pos_emb.weight.grad.abs().sum() > 0  # the table learns
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]

    model.eval()
    with torch.no_grad():
        full = model(idx)
        caches = model.make_caches(2)
        steps = [model(idx[:, :15], caches=caches)]
        steps += [model(idx[:, t : t + 1], caches=caches) for t in range(15, 40)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)

    # a config round trip keeps the choice, and the saved weights load into a fresh model
    again = DecoderLM(ModelConfig.from_dict(cfg.to_dict()))
    again.load_state_dict(model.state_dict())
    torch.testing.assert_close(again.eval()(idx), full)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(num_buckets=0), r"num_buckets must be a positive integer, got 0"),
        (dict(num_buckets=-4), r"num_buckets must be a positive integer, got -4"),
        (dict(num_buckets=2), r"num_buckets=2 is too few for bidirectional"),
        (dict(num_buckets=1, bidirectional=False), r"num_buckets=1 is too few for causal"),
        (dict(max_distance=0), r"max_distance must be a positive integer, got 0"),
        (dict(num_buckets=32, max_distance=8), r"max_distance=8 must exceed the exact range"),
        (dict(n_heads=0), r"n_heads must be a positive integer, got 0"),
    ],
)
def test_bad_bucket_settings_say_which_value(kwargs, match):
    kwargs = {"n_heads": 2, **kwargs}
    with pytest.raises(ValueError, match=match):
        T5RelativeBias(**kwargs)
