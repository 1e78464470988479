"""Sparse patterns (Longformer, BigBird) as masks, and the ``block_sparse`` backend.

The backend must equal ``math`` with the same mask (outputs and gradients, 1e-5), compute exactly
the tiles that hold an allowed entry (counted), and train a decoder LM from its config and from
``--set``; bad options fail with a message naming the value."""

from __future__ import annotations

import json

import pytest
import torch

from attnlab.attention import capture_attention, key_padding_mask, scaled_dot_product_attention
from attnlab.attention.core import causal_mask, check_backend
from attnlab.attention.sparse import (
    bigbird_mask,
    expand_block_mask,
    longformer_mask,
    pattern_mask,
    tile_mask,
)
from attnlab.attention.tiled import count_tiles
from attnlab.cli import main
from attnlab.config import ModelConfig
from attnlab.config.overrides import apply_overrides, parse_overrides
from attnlab.models.builders import multi_head_attention
from attnlab.models.lm import DecoderLM

ATOL = 1e-5


def _qkv(B=2, H=4, Hkv=4, Tq=37, Tk=37, D=16):
    q = torch.randn(B, H, Tq, D, requires_grad=True)
    k = torch.randn(B, Hkv, Tk, D, requires_grad=True)
    v = torch.randn(B, Hkv, Tk, D, requires_grad=True)
    return q, k, v


def _run(backend, q, k, v, bias=None, **kw):
    out = scaled_dot_product_attention(q, k, v, backend=backend, bias=bias, **kw)
    d_out = torch.linspace(-1, 1, out.numel()).view_as(out)  # every output element weighs in
    inputs = [q, k, v] + ([bias] if bias is not None else [])
    return (out, *torch.autograd.grad((out * d_out).sum(), inputs))


def _assert_same(ref, got):
    for name, a, b in zip(["out", "dq", "dk", "dv", "dbias"], ref, got):
        assert torch.isfinite(b).all(), name
        torch.testing.assert_close(b, a, atol=ATOL, rtol=0, msg=lambda m, n=name: f"{n}: {m}")


# ----------------------------------------------------------------------------------------------
# patterns


@pytest.mark.parametrize("n_q,n_k", [(12, 12), (3, 12), (1, 9)])
def test_longformer_mask_is_window_plus_global_by_definition(n_q, n_k):
    w, glob = 3, [1, 10]
    got = longformer_mask(n_q, n_k, window=w, global_tokens=[g for g in glob if g < n_k])
    for i in range(n_q):
        p = i + n_k - n_q  # queries are the last n_q positions
        for j in range(n_k):
            want = abs(p - j) < w or j in glob or p in glob
            assert bool(got[i, j]) == want, (i, j)


def test_bigbird_mask_window_random_and_global_blocks():
    b, n = 4, 48  # 12 blocks
    plain = bigbird_mask(n, block_size=b, window_blocks=1, random_blocks=2, seed=3)
    blocks = tile_mask(plain, b, b)  # (12, 12)
    assert torch.equal(plain, expand_block_mask(blocks, b, b, n, n))  # block-granular
    for a in range(12):
        window = {c for c in range(12) if abs(a - c) <= 1}
        assert all(blocks[a, c] for c in window)
        others = set(torch.nonzero(blocks[a]).flatten().tolist()) - window
        assert len(others) == 2  # the random blocks
    # global tokens add a full row and column
    m = bigbird_mask(n, block_size=b, random_blocks=2, seed=3, global_tokens=[0, 9])
    glob = torch.zeros(n, dtype=torch.bool)
    glob[[0, 9]] = True
    assert torch.equal(m, plain | glob[None, :] | glob[:, None])
    # seeded: the same seed draws the same blocks, another seed others
    assert torch.equal(plain, bigbird_mask(n, block_size=b, seed=3))
    assert not torch.equal(plain, bigbird_mask(n, block_size=b, seed=4))
    # causal: random blocks only among earlier blocks, and a cached step sees the full row
    c = bigbird_mask(n, block_size=b, random_blocks=2, causal=True)
    assert not tile_mask(c, b, b).triu(2).any()  # nothing right of the window
    # two random blocks for blocks 3 … 11, one for block 2 (only block 0 is outside its window)
    assert tile_mask(c, b, b).tril(-2).sum() == 1 + 2 * 9
    rows = bigbird_mask(5, 40, block_size=b, random_blocks=2, causal=True)
    torch.testing.assert_close(rows, bigbird_mask(40, block_size=b, causal=True)[35:])


# ----------------------------------------------------------------------------------------------
# the backend equals math with the same mask


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize(
    "pattern",
    [
        dict(pattern="longformer", window=5, global_tokens=[0, 20]),
        dict(pattern="bigbird", window_blocks=1, random_blocks=1, global_tokens=[3]),
    ],
    ids=["longformer", "bigbird"],
)
@pytest.mark.parametrize("n_kv", [4, 1])
def test_block_sparse_equals_math_with_the_pattern_mask(is_causal, pattern, n_kv):
    q, k, v = _qkv(Hkv=n_kv)  # 37 tokens: ragged last tile
    bias = torch.randn(4, 37, 37, requires_grad=True)  # a learned bias (ALiBi, T5) gets its grad
    opts = {key: val for key, val in pattern.items() if key != "pattern"}
    mask = pattern_mask(pattern["pattern"], 37, causal=is_causal, block_size=8, **opts)
    pad = key_padding_mask(torch.tensor([37, 30]), 37)
    ref = _run("math", q, k, v, bias, mask=mask & pad, is_causal=is_causal)
    got = _run(
        "block_sparse", q, k, v, bias, mask=pad, is_causal=is_causal, block_size=8, **pattern
    )
    _assert_same(ref, got)


@pytest.mark.parametrize("is_causal", [False, True])
def test_block_sparse_equals_math_with_any_mask_or_block_mask(is_causal):
    q, k, v = _qkv()
    mask = torch.rand(37, 37) < 0.1  # arbitrary: many empty tiles, some empty rows
    _assert_same(
        _run("math", q, k, v, mask=mask, is_causal=is_causal),
        _run("block_sparse", q, k, v, mask=mask, is_causal=is_causal, block_size=8),
    )
    blocks = torch.rand(5, 5) < 0.4  # a tile mask: chosen tiles computed in full
    full = expand_block_mask(blocks, 8, 8, 37, 37)
    _assert_same(
        _run("math", q, k, v, mask=full, is_causal=is_causal),
        _run("block_sparse", q, k, v, is_causal=is_causal, block_size=8, block_mask=blocks),
    )


@pytest.mark.parametrize("n_q", [1, 5, 13])
def test_block_sparse_kv_cache_rows_equal_math(n_q):
    # fewer queries than keys: the last n_q rows of the pattern, bottom-right aligned
    q, k, v = _qkv(Tq=n_q, Tk=40)
    opts = dict(pattern="longformer", window=6, global_tokens=[2])
    mask = longformer_mask(n_q, 40, window=6, global_tokens=[2])
    _assert_same(
        _run("math", q, k, v, mask=mask, is_causal=True),
        _run("block_sparse", q, k, v, is_causal=True, block_size=8, **opts),
    )


def test_weights_come_from_math_with_the_same_allowed_set():
    q, k, v = _qkv()
    opts = dict(pattern="longformer", window=4, global_tokens=[0], block_size=8)
    out, w = scaled_dot_product_attention(
        q, k, v, backend="block_sparse", is_causal=True, return_weights=True, **opts
    )
    mask = longformer_mask(37, window=4, global_tokens=[0])
    ref_out, ref_w = scaled_dot_product_attention(
        q, k, v, backend="math", mask=mask, is_causal=True, return_weights=True
    )
    torch.testing.assert_close(w, ref_w)
    assert (w[..., ~(mask & causal_mask(37))] == 0).all()
    # an attention layer reports these through a capture, with its own options kept
    mha = multi_head_attention(64, 4, backend="block_sparse", backend_options=opts)
    with capture_attention(mha) as maps:
        mha(torch.randn(1, 37, 64), is_causal=True)
    assert (maps[""][..., ~(mask & causal_mask(37))] == 0).all()


# ----------------------------------------------------------------------------------------------
# fully masked tiles are never computed


@pytest.mark.parametrize("is_causal", [False, True])
def test_exactly_the_live_tiles_are_computed_forward_and_backward(is_causal):
    n, b = 64, 8  # 8 × 8 = 64 tiles
    q, k, v = _qkv(Tq=n, Tk=n)
    opts = dict(pattern="longformer", window=4, global_tokens=[0], block_size=b)
    allowed = longformer_mask(n, window=4, global_tokens=[0])
    if is_causal:
        allowed = allowed & causal_mask(n)
    live = {tuple(t) for t in torch.nonzero(tile_mask(allowed, b, b)).tolist()}
    with count_tiles() as counted:
        out = scaled_dot_product_attention(
            q, k, v, backend="block_sparse", is_causal=is_causal, **opts
        )
        out.sum().backward()
    assert sorted(counted.forward) == sorted(live)  # each live tile once, nothing else
    assert sorted(counted.backward) == sorted(live)
    # the band (8 + 2·7 tiles, 8 + 7 causal) and the global row and column, no more
    assert len(live) == (21 if is_causal else 34)
    # the dense tiled backend, by contrast, computes all 64 (36 causal) tiles
    with count_tiles() as dense:
        scaled_dot_product_attention(
            q, k, v, backend="tiled", is_causal=is_causal, block_q=b, block_k=b
        )
    assert len(dense.forward) == (36 if is_causal else 64)


# ----------------------------------------------------------------------------------------------
# configuration and training


def test_decoder_lm_trains_with_block_sparse_and_decodes_with_the_cache():
    torch.manual_seed(0)
    opts = {"pattern": "longformer", "window": 8, "global_tokens": [0], "block_size": 8}
    cfg = ModelConfig.preset("tiny", backend="block_sparse", backend_options=opts, max_seq_len=48)
    model = DecoderLM(cfg)
    idx = torch.randint(0, cfg.vocab_size, (2, 41))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(5):
        logits = model(idx[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), idx[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    model.eval()
    with torch.no_grad():
        full = model(idx)
        caches = model.make_caches(2)
        steps = [model(idx[:, :12], caches=caches)]
        steps += [model(idx[:, t : t + 1], caches=caches) for t in range(12, 41)]
        torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)
        # the same model with math and the pattern as a mask gives the same logits
        dense = DecoderLM(cfg.replace(backend="auto", backend_options={}))
        dense.load_state_dict(model.state_dict())
        assert not torch.allclose(dense.eval()(idx), full, atol=1e-3)  # the pattern matters


def test_bigbird_lm_with_t5_positions_decodes_with_the_cache():
    opts = {"pattern": "bigbird", "random_blocks": 1, "block_size": 4}
    cfg = ModelConfig.preset("tiny", backend="block_sparse", backend_options=opts, position="t5")
    model = DecoderLM(cfg).eval()
    idx = torch.randint(0, cfg.vocab_size, (2, 30))
    with torch.no_grad():
        full = model(idx)
        caches = model.make_caches(2)
        steps = [model(idx[:, :5], caches=caches)]
        steps += [model(idx[:, t : t + 1], caches=caches) for t in range(5, 30)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)


def test_set_overrides_reach_the_model_config():
    opts = '{"pattern": "longformer", "window": 8, "global_tokens": [0], "block_size": 8}'
    sets = ["backend=block_sparse", f"backend_options={opts}", "position=t5", "d_model=32"]
    sections = apply_overrides({"model": {}}, parse_overrides(sets))
    cfg = ModelConfig.preset("tiny", **sections["model"])
    assert cfg.backend_options == json.loads(opts) and cfg.position == "t5"
    model = DecoderLM(cfg)
    model(torch.randint(0, 256, (2, 20))).sum().backward()
    assert model.pos_emb.weight.grad is not None


@pytest.mark.slow
def test_train_lm_with_block_sparse_and_t5_from_set(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    run = tmp_path / "run"
    opts = '{"pattern": "longformer", "window": 8, "global_tokens": [0], "block_size": 8}'
    argv = ["train", "lm", "--preset", "tiny", "--set", "d_model=32", "--set", "n_layers=1"]
    argv += ["--seq-len", "32", "--batch-size", "4", "--no-progress", "--max-chars", "20000"]
    argv += ["--set", "backend=block_sparse", "--set", f"backend_options={opts}"]
    argv += ["--set", "position=t5", "--steps", "3", "--out", str(run)]
    assert main(argv) == 0
    model = json.loads((run / "config.json").read_text())["model"]
    assert model["backend"] == "block_sparse" and model["position"] == "t5"
    assert model["backend_options"]["global_tokens"] == [0]
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert any("loss" in r for r in records)
    bad = [*argv[:-2], "--set", 'backend_options={"pattern": "star", "window": 8}']
    assert main([*bad, "--out", str(tmp_path / "bad")]) == 2
    assert "unknown sparse pattern 'star'" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


# ----------------------------------------------------------------------------------------------
# bad input


def test_config_time_check_leaves_sequence_dependent_checks_to_the_call():
    # a global token beyond a tiny probe is fine when the config is checked ...
    check_backend("block_sparse", {"pattern": "longformer", "window": 4, "global_tokens": [100]})
    # ... and named when a sequence is too short for it
    q, k, v = _qkv(Tq=50, Tk=50)
    with pytest.raises(
        ValueError, match=r"global token index 100 is outside the sequence of length 50"
    ):
        scaled_dot_product_attention(
            q, k, v, backend="block_sparse", pattern="longformer", window=4, global_tokens=[100]
        )


@pytest.mark.parametrize(
    "options,match",
    [
        (
            {"pattern": "star"},
            r"unknown sparse pattern 'star'; choose from \['bigbird', 'longformer'\]",
        ),
        ({"pattern": "longformer"}, r"'longformer' needs window"),
        ({"pattern": "longformer", "window": 0}, r"window must be a positive integer, got 0"),
        (
            {"pattern": "longformer", "window": 4, "random_blocks": 2},
            r"does not take \['random_blocks'\]",
        ),
        ({"pattern": "longformer", "window": 4, "global_tokens": [-1]}, r"global token index -1"),
        ({"pattern": "bigbird", "window": 4}, r"'bigbird' does not take \['window'\]"),
        ({"pattern": "bigbird", "random_blocks": -1}, r"random_blocks must be a non-negative"),
        ({"window": 4}, r"belong to a pattern"),
        ({"block_size": 0}, r"block_size must be a positive integer, got 0"),
        ({"blok_size": 8}, r"does not take option\(s\) \['blok_size'\]"),
    ],
)
def test_bad_options_name_the_value_at_config_time_and_at_call_time(options, match):
    with pytest.raises(ValueError, match=match):
        check_backend("block_sparse", options)
    q, k, v = _qkv(Tq=16, Tk=16)
    with pytest.raises(ValueError, match=match):
        scaled_dot_product_attention(q, k, v, backend="block_sparse", **options)


def test_other_bad_requests():
    with pytest.raises(ValueError, match="dropout"):
        check_backend("block_sparse", {"pattern": "longformer", "window": 4}, dropout_p=0.1)
    q, k, v = _qkv(Tq=16, Tk=16)
    with pytest.raises(ValueError, match=r"block_mask must be a boolean .*\(2, 2\)"):
        scaled_dot_product_attention(
            q,
            k,
            v,
            backend="block_sparse",
            block_size=8,
            block_mask=torch.ones(3, 3, dtype=torch.bool),
        )
    with pytest.raises(
        ValueError, match="global token index 16 is outside the sequence of length 16"
    ):
        longformer_mask(16, window=2, global_tokens=[16])
    with pytest.raises(ValueError, match="unknown sparse pattern 'dilated'"):
        pattern_mask("dilated", 16)
    with pytest.raises(ValueError, match="unknown sparse pattern"):
        DecoderLM(
            ModelConfig.preset("tiny", backend="block_sparse", backend_options={"pattern": "x"})
        )


# ----------------------------------------------------------------------------------------------
# the benchmark


@pytest.mark.slow
def test_bench_attention_measures_block_sparse_and_linformer_against_full(tmp_path, capsys):
    out = tmp_path / "bench"
    argv = ["bench", "attention", "--n", "64", "--backends", "math", "block_sparse", "linformer"]
    argv += ["--window", "16", "--block-size", "16", "--linformer-k", "32", "--heads", "2"]
    argv += ["--head-dim", "16", "--min-time", "0.01", "--threads", "1", "--modes", "fwd"]
    # linformer is refused for causal attention before any case runs
    assert main([*argv, "--out", str(tmp_path / "x")]) == 2
    assert "non-causal" in capsys.readouterr().err
    extra = ["--non-causal", "--linformer-error", "--fit-steps", "5", "--out", str(out)]
    assert main([*argv, *extra]) == 0
    rows = json.loads((out / "attention.json").read_text())["rows"]
    got = {(r["backend"], r["n"], r["mode"]) for r in rows if "time_s" in r}
    assert len(got) == 3, [r for r in rows if "time_s" not in r]  # math, block_sparse, linformer
    table = (out / "attention.md").read_text()
    assert "block_sparse" in table and "math/block_sparse time" in table
    errors = json.loads((out / "linformer_error.json").read_text())
    assert {(r["n"], r["inputs"]) for r in errors} == {(64, "iid"), (64, "smooth")}
    assert all(r["fitted"] < r["random"] for r in errors)  # fitting E, F helps
    assert "Linformer relative error" in capsys.readouterr().out
    bad = ["bench", "attention", "--n", "64", "--backends", "block_sparse", "--global-tokens", "64"]
    assert main([*bad, "--out", str(tmp_path / "y")]) == 2
    assert "index 64 is outside the sequence N=64" in capsys.readouterr().err
