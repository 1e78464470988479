"""What training produces (issue 28): grokking and induction heads, pinned at small size.

Every run is seeded and single-threaded so the numbers repeat; the thresholds sit well inside
the margins measured (see docs/experiments.md).
"""

from __future__ import annotations

import math

import pytest
import torch

import attnlab
from attnlab.data.textstream import pydoc_text
from attnlab.experiments.grokking import (
    GrokkingConfig,
    fourier_concentration,
    grokking_model,
    modular_addition,
    run_grokking,
    train_modular,
)
from attnlab.experiments.induction import (
    InductionConfig,
    TokenSource,
    analyse,
    attention_only_lm,
    copy_any_loss,
    insert_repeats,
    probe,
    repeated_spans,
    repeated_tokens,
    run_induction,
    train_induction,
)
from attnlab.inspect import ablate_heads

# ----------------------------------------------------------------------------------------------
# grokking


def test_modular_addition_covers_every_pair_once():
    d = modular_addition(7, 0.5, seed=3)
    x = torch.cat([d["x_train"], d["x_test"]])
    y = torch.cat([d["y_train"], d["y_test"]])
    assert len({tuple(r) for r in x.tolist()}) == 49
    assert (x[:, 2] == 7).all()  # the "=" token
    assert torch.equal(y, (x[:, 0] + x[:, 1]) % 7)
    assert len(d["y_train"]) == round(0.5 * 49)


def test_fourier_concentration_of_a_pure_frequency_and_of_noise():
    p, k = 31, 5
    a = torch.arange(p, dtype=torch.float64)
    pure = torch.stack([torch.cos(2 * math.pi * k * a / p), torch.sin(2 * math.pi * k * a / p)], 1)
    got = fourier_concentration(torch.cat([pure, torch.ones(1, 2)]), p, 1)  # "=" row ignored
    assert got["top"] == [k] and got["fraction"] == pytest.approx(1.0)
    noise = torch.randn(p, 256, generator=torch.Generator().manual_seed(0))
    spread = fourier_concentration(noise, p, 4)
    assert spread["fraction"] < 2 * spread["uniform"]  # white noise: no frequency stands out
    assert sum(spread["spectrum"]) == pytest.approx(1.0)


@pytest.mark.slow
def test_weight_decay_groks_and_no_decay_stays_memorised(one_thread):
    cfg = GrokkingConfig(p=23, train_fraction=0.7, d_model=32, ffn_hidden=128, lr=1e-2, top_k=4)
    data = modular_addition(cfg.p, cfg.train_fraction, seed=0)
    runs = {}
    # full-batch AdamW at this rate spikes: at 250 steps and weight decay 2.0 the test accuracy
    # peaked at 0.94 on an AVX-512 machine (>= 0.95 on the AVX2 ones before), and at 400 steps
    # at 0.34-0.99 over seeds 0-4; at 600 steps and 1.0 every assertion below held for seeds
    # 0-4 there, the weight-decay run reaching 0.98-1.0
    for wd in (1.0, 0.0):
        runs[wd] = train_modular(
            grokking_model(cfg), data, steps=600, lr=cfg.lr, weight_decay=wd, p=cfg.p,
            top_k=cfg.top_k, eval_points=20,
        )  # fmt: skip
    wd, plain = runs[1.0], runs[0.0]
    # both memorise the training pairs; only weight decay then generalises, much later
    assert wd["memorised_at"] is not None and plain["memorised_at"] is not None
    assert wd["generalised_at"] is not None and wd["generalised_at"] > wd["memorised_at"]
    assert max(r["test_acc"] for r in wd["history"]) >= 0.95
    assert plain["generalised_at"] is None
    assert max(r["test_acc"] for r in plain["history"]) < 0.85
    # after grokking the embedding sits in a few Fourier frequencies; memorised, it does not
    f = wd["fourier"]
    assert f["end"]["fraction"] > f["start"]["fraction"] + 0.2
    assert f["end"]["fraction"] > plain["fourier"]["end"]["fraction"] + 0.1


def test_grokking_runs_are_run_directories(tmp_path, one_thread):
    cfg = GrokkingConfig(p=7, train_fraction=0.5, d_model=16, ffn_hidden=32, steps=3,
                         weight_decays=(1.0, 0.0), progress=False)  # fmt: skip
    res = run_grokking(cfg, tmp_path)
    assert (tmp_path / "grokking.png").exists() and (tmp_path / "table.md").exists()
    for wd in (1.0, 0.0):
        run = attnlab.load(tmp_path / "runs" / f"wd-{wd:g}")
        assert run.task["p"] == 7 and run.task["train_fraction"] == 0.5
        assert run.train["weight_decay"] == wd
        x = modular_addition(7, 0.5)["x_test"]
        assert run.model(x).shape == (len(x), 3, 8)
    assert [r["steps"] for r in res["runs"]] == [3, 3]


# ----------------------------------------------------------------------------------------------
# induction heads: the measurements


def test_inspect_head_ablation_equals_zeroing_that_heads_columns_of_w_o(one_thread):
    cfg = InductionConfig(vocab_size=16, seq_len=8, d_model=16, n_heads=2)
    model = attention_only_lm(cfg, 2).eval()
    x = repeated_tokens(3, 8, 16, torch.Generator().manual_seed(0))
    zeroed = attention_only_lm(cfg, 2).eval()  # the same seed: the same weights
    with torch.no_grad():
        zeroed.blocks[0].attn.out_proj.weight[:, 8:] = 0  # head 1's slice of W_O
        want = zeroed(x)
        with ablate_heads(model, {"blocks.0.attn": [1]}):
            got = model(x)
        assert not torch.allclose(model(x), want)  # the head mattered
    torch.testing.assert_close(got, want)


def test_attention_only_blocks_have_no_ffn():
    model = attention_only_lm(InductionConfig(d_model=16, n_heads=2, seq_len=8), 2)
    assert not any("ffn" in n or "norm2" in n for n, _ in model.named_parameters())


def test_probe_scores_of_hand_made_attention():
    """A fake model whose one layer attends exactly to the token after the previous
    occurrence (and to itself in the first copy), predicting the second copy exactly."""

    class Oracle(torch.nn.Module):
        training = False

        def eval(self):
            return self

        def train(self, mode=True):
            return self

        def forward(self, idx, need_weights=False):
            B, T = idx.shape
            half = T // 2
            w = torch.zeros(B, 1, T, T)
            for t in range(T):
                w[:, 0, t, t + 1 - half if t >= half else t] = 1.0
            logits = torch.full((B, T, 16), -30.0)
            for t in range(half, T - 1):
                logits[torch.arange(B), t, idx[:, t + 1 - half]] = 30.0
            return (logits, [w]) if need_weights else logits

    rep = repeated_tokens(4, 8, 16, torch.Generator().manual_seed(0))
    held = repeated_spans(4, 8, 16, torch.Generator().manual_seed(1))
    got = probe(Oracle(), rep, held)
    assert got["prefix"][0][0] == pytest.approx(1.0)
    assert got["prev"][0][0] == 0.0  # no query attends to the token right before it
    assert got["second_copy_loss"] < 1e-6
    assert got["first_copy_loss"] == pytest.approx(math.log(16), abs=1e-4)


def test_insert_repeats_repeats_one_span_to_the_end():
    base = torch.arange(1000, 1032).repeat(200, 1)  # distinct tokens: every repeat is inserted
    x, copied = insert_repeats(base, torch.Generator().manual_seed(0), min_span=0.125)
    lengths = set()
    for row, mask in zip(x.tolist(), copied.tolist()):
        first = mask.index(True)  # p + L: the repeats run from here to the end
        assert all(mask[first:]) and not any(mask[:first])
        period = next(n for n in range(1, 33) if row[first] == row[first - n])
        assert all(row[t] == row[t - period] for t in range(first, 32))
        assert row[:first] == list(range(1000, 1000 + first))  # the rest untouched
        assert first >= period  # the span's first occurrence precedes its repeats
        lengths.add(period)
    assert min(lengths) == 4 and max(lengths) == 16  # 0.125·T … 0.5·T: no fixed offset


def test_copy_any_loss_counts_distinct_tokens():
    rep = torch.tensor([[1, 1, 2, 3, 1, 1, 2, 3], [5, 6, 7, 8, 5, 6, 7, 8]])
    assert copy_any_loss(rep) == pytest.approx((math.log(3) + math.log(4)) / 2)


def test_pydoc_source_reads_the_corpus_by_characters():
    src = TokenSource("pydoc", InductionConfig(seq_len=16, max_chars=5000))
    x = src.sample(4, torch.Generator().manual_seed(0), "val")
    text = ["".join(src.chars[i] for i in row) for row in x.tolist()]
    corpus = pydoc_text()[:5000]
    assert all(t in corpus[4500:] for t in text)  # held-out windows from the last 10 %


# ----------------------------------------------------------------------------------------------
# induction heads: the claims, at the experiment's own settings for a short run


@pytest.mark.slow
def test_two_layers_form_an_induction_head_and_one_layer_does_not(one_thread):
    """Seeded, the experiment's settings for 400 steps (its head forms at ~275): the 2-layer
    model has a layer-2 head of high prefix-matching score, fed by layer-1 previous-token heads,
    and predicts the second copy far below ln V; the 1-layer model, trained alike, has neither;
    ablating the previous-token heads (attnlab.inspect) takes the effect away, ablating the
    other layer-1 heads does not."""
    cfg = InductionConfig(steps=400, eval_every=25)
    rep = repeated_tokens(64, cfg.seq_len, cfg.vocab_size, torch.Generator().manual_seed(10**6))
    got = {}
    for n in (2, 1):
        model = attention_only_lm(cfg, n)
        res = train_induction(model, cfg, steps=cfg.steps)
        got[n] = analyse(res, n, cfg, model, rep)
    two, one = got[2], got[1]
    chance = math.log(cfg.vocab_size)
    assert two["is_induction"] and two["prefix_score"] > 0.5
    assert two["second_copy_loss"] < chance - 2.0
    assert two["second_copy_loss"] < two["copy_any"] - 1.0  # more than knowing the context
    assert two["first_copy_loss"] > chance - 0.3  # the first copy stays unpredictable
    assert not one["is_induction"] and one["prefix_score"] < 0.2
    assert one["second_copy_loss"] > two["second_copy_loss"] + 1.5
    abl = two["ablation"]
    prev = abl["previous-token heads"]
    assert prev["prev_score"] > 0.3  # the heads it composes with
    assert prev["prefix_score"] < 0.35 < two["prefix_score"] - 0.2
    assert prev["second_copy_loss"] > two["second_copy_loss"] + 1.5
    assert abl["other layer-1 heads"]["second_copy_loss"] < two["second_copy_loss"] + 0.5
    # abrupt: the score rises from 20 % to 80 % within a fifth of the run, as the loss drops
    assert two["rise_fraction"] <= 0.2
    assert abs(two["score_jump"][1] - two["loss_drop"][1]) <= 50


def test_induction_runs_are_run_directories(tmp_path, one_thread):
    cfg = InductionConfig(seq_len=16, d_model=16, n_heads=2, steps=3, max_chars=5000,
                          progress=False)  # fmt: skip
    res = run_induction(cfg, tmp_path)
    assert (tmp_path / "induction_heads.png").exists() and (tmp_path / "table.md").exists()
    assert [(r["setting"], r["n_layers"]) for r in res["runs"]] == [
        ("random", 1), ("random", 2), ("pydoc", 1), ("pydoc", 2)
    ]  # fmt: skip
    for setting, vocab in (("random", 32), ("pydoc", len(TokenSource("pydoc", cfg).chars))):
        run = attnlab.load(tmp_path / "runs" / f"{setting}-2-layer")
        assert run.task["setting"] == setting and run.task["vocab_size"] == vocab
        x = repeated_tokens(2, 16, vocab, torch.Generator().manual_seed(0))
        assert run.model(x).shape == (2, 16, vocab)
