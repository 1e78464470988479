"""What training produces (issue 28): grokking and induction heads, pinned at small size.

Every run is seeded and single-threaded so the numbers repeat; the thresholds sit well inside
the margins measured (see docs/experiments.md).
"""

from __future__ import annotations

import math

import pytest
import torch

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
    ablate_head,
    attention_only_lm,
    probe,
    repeated_spans,
    repeated_tokens,
)


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


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
    for wd in (2.0, 0.0):
        runs[wd] = train_modular(
            grokking_model(cfg), data, steps=250, lr=cfg.lr, weight_decay=wd, p=cfg.p,
            top_k=cfg.top_k, eval_points=20,
        )  # fmt: skip
    wd, plain = runs[2.0], runs[0.0]
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
    import attnlab

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


def test_ablate_head_equals_zeroing_that_heads_output(one_thread):
    cfg = InductionConfig(vocab_size=16, seq_len=8, d_model=16, n_heads=2)
    model = attention_only_lm(cfg, 2).eval()
    x = repeated_tokens(3, 8, 16, torch.Generator().manual_seed(0))
    d = 16 // 2

    def zero_head1(_mod, args):
        (h,) = args
        h = h.clone()
        h[..., d:] = 0  # head 1's slice of the concatenated head outputs
        return (h,)

    handle = model.blocks[0].attn.out_proj.register_forward_pre_hook(zero_head1)
    with torch.no_grad():
        want = model(x)
    handle.remove()
    with torch.no_grad():
        got = ablate_head(model, 0, 1)(x)
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


def test_repeated_spans_hold_one_copied_span():
    x = repeated_spans(64, 32, 1000, torch.Generator().manual_seed(0))
    for row in x.tolist():  # with 1000 tokens a chance 3-gram repeat is very unlikely
        grams = [tuple(row[i : i + 3]) for i in range(30)]
        assert len(grams) - len(set(grams)) >= 1
