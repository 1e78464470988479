"""The lecture notes' worked numbers, recomputed by attnlab's own code.

Each test feeds a number the notes state into the attnlab function that implements the formula
(softmax attention, the patch embedding, the learning-rate schedule) and compares the result with
the number the notes print, within the notes' rounding. The big Transformer's size is pinned in
``test_seq2seq.py::test_vaswani_presets_have_the_paper_size`` (213M within 5 %); here only the
notes' coarser "about 12 blocks, about 200M" is checked against the same preset.
"""

from __future__ import annotations

import math

import pytest
import torch

from attnlab.attention import scaled_dot_product_attention
from attnlab.config.translation import Seq2SeqConfig
from attnlab.layers.patch_embed import PatchEmbedding
from attnlab.models.seq2seq import Seq2SeqTransformer
from attnlab.train import TrainConfig
from attnlab.train.optim import LRSchedule

# the worked attention example: four encoder states, their alignment scores with s_0
H = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0], [-0.5, 0.5]])  # h_1..h_4 ("We see the sky")
SCORES = torch.tensor([3.2, 2.8, 0.1, -1.0])  # e
NOTES_EXP = (24.5, 16.4, 1.1, 0.37)  # e^{e_i} as the notes round them
NOTES_DENOMINATOR = 42.4


def _attend(scores: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """attnlab's attention with the scores given: one query (1) against keys (scores) in one
    dimension, scale 1, so that q·k_i = e_i exactly."""
    q = torch.ones(1, 1, dtype=torch.float64)  # (Tq=1, D=1)
    k = scores.double().unsqueeze(-1)  # (Tk, 1)
    out, w = scaled_dot_product_attention(
        q, k, values.double(), scale=1.0, backend="math", return_weights=True
    )
    return out[0], w[0]  # (Dv,), (Tk,)


def test_worked_example_exponentials_and_denominator():
    """The notes' e^{e_i} and their sum, and attnlab's weights as those exponentials over that
    sum (the weights and the context vector against the notes' rounded values are pinned in
    ``test_attention_core.py::test_worked_example_*``)."""
    exps = torch.exp(SCORES.double())
    for got, notes in zip(exps.tolist(), NOTES_EXP):
        assert got == pytest.approx(notes, abs=0.05), (got, notes)  # the notes round to 0.1/0.01
    assert exps.sum().item() == pytest.approx(NOTES_DENOMINATOR, abs=0.1)
    assert sum(NOTES_EXP) == pytest.approx(NOTES_DENOMINATOR, abs=0.05)  # 42.37: they add up
    context, weights = _attend(SCORES, H)
    torch.testing.assert_close(weights, exps / exps.sum())  # attnlab's softmax: e^{e_i} / 42.45
    torch.testing.assert_close(weights, torch.tensor(NOTES_EXP).double() / 42.4, atol=2e-3, rtol=0)
    torch.testing.assert_close(context, weights @ H.double())


def test_sqrt_d_scaling_keeps_softmax_from_saturating():
    """All-ones vectors: dot products 10 and 100 for d = 10 and 100; divided by √10 ≈ 3.16 and
    √100 = 10 the scores are comparable again. With d = 64 and scores of ±20 the ratio of the
    two exponentials is e^40 ≈ 2.4·10^17, a one-hot softmax."""
    for d, dot in ((10, 10.0), (100, 100.0)):
        q = torch.ones(1, d, dtype=torch.float64)
        k = torch.stack([torch.ones(d), torch.zeros(d)]).double()  # (2, d): an all-ones key, a 0
        v = torch.eye(2, dtype=torch.float64)
        assert (q @ k.T)[0, 0].item() == dot
        _, raw = scaled_dot_product_attention(q, k, v, scale=1.0, return_weights=True)
        _, scaled = scaled_dot_product_attention(q, k, v, return_weights=True)  # default 1/√d
        assert raw[0, 1].item() < 1e-4  # unscaled: the all-ones key takes (nearly) everything
        assert scaled[0, 0].item() == pytest.approx(1 / (1 + math.exp(-dot / math.sqrt(d))))
        if d == 10:
            assert math.sqrt(d) == pytest.approx(3.16, abs=0.005)
    assert math.exp(20) / math.exp(-20) == pytest.approx(2.4e17, rel=0.02)  # e^40
    # ±20 unscaled: one-hot (the smaller weight is e^-40); divided by √64 = 8: ±2.5, not one-hot
    q = torch.tensor([[1.0]], dtype=torch.float64)
    k = torch.tensor([[20.0], [-20.0]], dtype=torch.float64)
    v = torch.eye(2, dtype=torch.float64)
    _, w = scaled_dot_product_attention(q, k, v, scale=1.0, return_weights=True)
    assert w[0, 1].item() == pytest.approx(math.exp(-40) / (1 + math.exp(-40)), rel=1e-6)
    _, w8 = scaled_dot_product_attention(q, k, v, scale=1 / 8, return_weights=True)
    assert w8[0, 1].item() == pytest.approx(1 / (1 + math.exp(5)))  # ≈ 0.0067
    # the softmax gradient p(1 - p) at the larger score: vanishing before, usable after
    assert w[0, 0] * w[0, 1] < 1e-17 < 1e-3 < w8[0, 0] * w8[0, 1]


def test_vit_cuts_224_by_224_into_196_patches_of_768_values():
    embed = PatchEmbedding(3, 768, 16)
    images = torch.randn(1, 3, 224, 224)
    tokens = embed(images)
    assert tokens.shape == (1, 196, 768)  # 14 × 14 patches
    assert (224 // 16) ** 2 == 196 and 16 * 16 * 3 == 768
    # the projection reads exactly one flattened 16×16×3 patch per token: its weight has 768
    # inputs, and token 15 (row 1, column 1) is W · patch + b
    w = embed.proj.weight  # (768, 3, 16, 16)
    assert w[0].numel() == 768
    patch = images[0, :, 16:32, 16:32].reshape(-1)  # (768,)
    torch.testing.assert_close(
        tokens[0, 15], w.reshape(768, -1) @ patch + embed.proj.bias, rtol=1e-4, atol=1e-4
    )


def test_big_transformer_has_about_12_blocks_and_200M_parameters():
    """The notes' "about 12 blocks, about 200M parameters" (the paper's big model, Table 3: 213M),
    counted on ``meta`` with the paper's shared vocabulary of about 37000 tokens."""
    V = 37000
    cfg = Seq2SeqConfig.preset("vaswani-big", src_vocab_size=V, tgt_vocab_size=V)
    assert cfg.n_enc_layers + cfg.n_dec_layers == 12
    with torch.device("meta"):
        model = Seq2SeqTransformer(cfg)
    n = sum(p.numel() for p in model.parameters()) - V * cfg.d_model  # the paper shares one
    assert n == pytest.approx(213e6, rel=0.05)
    assert 2e8 * 0.9 < n < 2e8 * 1.15  # "about 200M"


def test_warmup_reaches_1e_4_over_4000_steps():
    """ "Warm up to 1e-4 over the first 4,000 steps": linear from near 0, 1e-4 at step 4000."""
    for schedule in ("cosine", "constant", "inverse_sqrt"):
        cfg = TrainConfig(steps=100_000, lr=1e-4, warmup_steps=4000, schedule=schedule)
        lr = LRSchedule(cfg)
        assert lr(0) == pytest.approx(1e-4 / 4000)  # the first step
        assert lr(1999) == pytest.approx(0.5e-4)  # half-way
        assert lr(3999) == pytest.approx(1e-4)  # the 4,000th step: the peak
        assert max(lr(k) for k in range(8000)) == pytest.approx(1e-4)  # never above it
        assert all(lr(k) < lr(k + 1) for k in range(0, 3999, 97))  # rising throughout
