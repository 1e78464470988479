"""Bahdanau's variants: the alignment scores, the decoder's first state, the vanilla tanh RNN cell.

Every score is checked against its formula computed element by element in Python loops (no
module code on the reference side); the first state against the encoder run by hand on each
unpadded sentence; the vanilla cell against h_t = tanh(W x_t + U h_{t-1} + b) written out.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from attnlab.attention import AdditiveAttention, padding_mask
from attnlab.config.base import ConfigError
from attnlab.experiments.bottleneck import VARIANTS, BottleneckConfig, run_bottleneck
from attnlab.layers.rnn import rnn_cell, stacked_rnn
from attnlab.models.rnn import AttnRNNSeq2Seq, RNNSeq2Seq, RNNSeq2SeqConfig

V_SRC, V_TGT = 17, 13


def _dot(a, b) -> float:
    return sum(float(x) * float(y) for x, y in zip(a, b, strict=True))


def _matvec(W, x) -> list[float]:
    return [_dot(row, x) for row in W]


def _score_by_hand(attn: AdditiveAttention, s, h) -> float:
    """e = score(s, h) for one decoder state and one encoder state, from the weights."""
    if attn.score == "additive":
        pre = [
            a + b + c
            for a, b, c in zip(
                _matvec(attn.W_s.weight, s), _matvec(attn.W_h.weight, h), attn.W_h.bias, strict=True
            )
        ]
        return _dot(attn.v.weight[0], [math.tanh(x) for x in pre])
    if attn.score == "concat":  # one linear layer on the concatenation [s; h]
        sh = [*s.tolist(), *h.tolist()]
        return _dot(attn.w.weight[0], sh) + float(attn.w.bias[0])
    if attn.score == "dot":
        return _dot(s, h)
    # general: sᵀ W h with W (Ds, Dh) = attn.W.weight
    return sum(
        float(s[i]) * float(attn.W.weight[i, j]) * float(h[j])
        for i in range(len(s))
        for j in range(len(h))
    )


@torch.no_grad()
def _attend_by_hand(attn, s, h, real):
    """(context (B, Dh), weights (B, S)): scores in a loop, softmax over real positions."""
    contexts, weights = [], []
    for b in range(h.shape[0]):
        e = [_score_by_hand(attn, s[b], h[b, j]) for j in range(h.shape[1])]
        top = max(x for j, x in enumerate(e) if real[b, j])
        exps = [math.exp(x - top) if real[b, j] else 0.0 for j, x in enumerate(e)]
        a = [x / sum(exps) for x in exps]
        weights.append(a)
        contexts.append(
            [sum(a[j] * float(h[b, j, d]) for j in range(h.shape[1])) for d in range(h.shape[2])]
        )
    return torch.tensor(contexts, dtype=h.dtype), torch.tensor(weights, dtype=h.dtype)


@pytest.mark.parametrize("score", ["additive", "concat", "dot", "general"])
def test_each_score_is_its_formula_and_weights_are_a_masked_distribution(score):
    torch.manual_seed(0)
    Ds, Dh = (5, 5) if score == "dot" else (6, 5)
    attn = AdditiveAttention(Ds, Dh, score=score).double()
    for p in attn.parameters():  # non-zero biases, so a dropped bias term would show
        torch.nn.init.normal_(p)
    s, h = torch.randn(3, Ds, dtype=torch.float64), torch.randn(3, 4, Dh, dtype=torch.float64)
    real = padding_mask([4, 2, 3], 4)
    context, weights = attn(s, h, real)
    ref_context, ref_weights = _attend_by_hand(attn, s, h, real)
    torch.testing.assert_close(weights, ref_weights)
    torch.testing.assert_close(context, ref_context)
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, dtype=torch.float64))
    assert (weights[~real] == 0).all()
    # padded positions' contents change nothing
    garbled = torch.where(real[..., None], h, torch.randn_like(h) * 100)
    torch.testing.assert_close(attn(s, garbled, real)[0], context)
    # several queries at once with precomputed keys = one query at a time
    many, w_many = attn(s[:, None].expand(3, 2, Ds), h, real, keys_proj=attn.project_keys(h))
    torch.testing.assert_close(w_many[:, 1], weights)


def test_concat_weights_do_not_depend_on_the_decoder_state():
    """wᵀ[s; h] + b = w_sᵀ s + w_hᵀ h + b: the s term is the same for every j, the softmax removes
    it, so the one-linear-layer score attends the same way at every decoder step; the additive
    score does not."""
    torch.manual_seed(1)
    h, real = torch.randn(2, 5, 4), padding_mask([5, 3], 5)
    s1, s2 = torch.randn(2, 6), torch.randn(2, 6) * 3
    concat, additive = AdditiveAttention(6, 4, score="concat"), AdditiveAttention(6, 4)
    torch.testing.assert_close(concat(s1, h, real)[1], concat(s2, h, real)[1])
    assert (additive(s1, h, real)[1] - additive(s2, h, real)[1]).abs().max() > 1e-3


def test_concat_model_reads_one_fixed_context_at_every_step():
    """In ``rnn-attn`` with the concat score, α_t (so c_t) is the same at every decoder step: a
    fixed summary of the source, like the ``rnn`` model's h_fin; with the additive score it moves."""
    src, mask, tgt = _batch(T=5)
    for score, fixed in (("concat", True), ("additive", False)):
        torch.manual_seed(6)
        model = _model(AttnRNNSeq2Seq, score=score)
        with torch.no_grad():
            _, w = model(src, mask, tgt, need_weights=True)  # (B, T, S)
        moved = (w - w[:, :1]).abs().max()
        assert (moved < 1e-6) == fixed, (score, float(moved))


def test_bad_score_choices_raise_naming_the_problem():
    with pytest.raises(ValueError, match="unknown alignment score 'cosine'"):
        AdditiveAttention(4, 4, score="cosine")
    with pytest.raises(ValueError, match="query_dim=4 and key_dim=8"):
        AdditiveAttention(4, 8, score="dot")
    with pytest.raises(ValueError, match="attn_dim applies to score='additive' only"):
        AdditiveAttention(4, 4, 16, score="general")
    with pytest.raises(ConfigError, match="set bidirectional=false or use score='general'"):
        RNNSeq2SeqConfig(score="dot")  # bidirectional encoder: states twice as wide as s


def _model(cls, **kw):
    cfg = RNNSeq2SeqConfig.preset("tiny", src_vocab_size=V_SRC, tgt_vocab_size=V_TGT, **kw)
    return cls(cfg).eval()


def _batch(lengths=(6, 3, 1), S=6, T=4):
    torch.manual_seed(2)
    mask = torch.arange(S)[None, :] < torch.tensor(lengths)[:, None]
    src = torch.randint(4, V_SRC, (len(lengths), S)).masked_fill(~mask, 0)
    return src, mask, torch.randint(4, V_TGT, (len(lengths), T))


@pytest.mark.parametrize("cell", ["gru", "lstm", "rnn"])
def test_init_state_last_is_the_encoders_state_after_the_last_real_token(cell):
    """s_0 = forward encoder state after each row's last real token: the encoder's own nn.RNN run
    on the row alone, without padding; ``zeros`` gives zeros; both leave no unused bridge."""
    torch.manual_seed(3)
    model = _model(AttnRNNSeq2Seq, cell=cell, init_state="last")
    assert model.bridge is None
    src, mask, _ = _batch()
    H = model.config.hidden
    with torch.no_grad():
        s0 = model.start_decoding(src, mask).s
        for b, n in enumerate(mask.sum(1).tolist()):
            out, _ = model.encoder(model.src_emb(src[b : b + 1, :n]))  # (1, n, 2H), unpadded
            torch.testing.assert_close(s0[b], out[0, -1, :H])
            assert (s0[b] - out[0, 0, :H]).abs().max() > 0 or n == 1  # not the first token's
        zeros = _model(RNNSeq2Seq, cell=cell, init_state="zeros")
        assert zeros.bridge is None
        assert (zeros.start_decoding(src, mask).s == 0).all()
        projected = _model(AttnRNNSeq2Seq, cell=cell)  # the default: tanh(W_b h_fin)
        st = projected.start_decoding(src, mask)
        torch.testing.assert_close(st.s, torch.tanh(projected.bridge(st.final)))


def _tanh_step(W, U, b, x, h):
    """h' = tanh(W x + U h + b), element by element."""
    return [math.tanh(a + c + d) for a, c, d in zip(_matvec(W, x), _matvec(U, h), b, strict=True)]


def test_vanilla_rnn_cell_is_the_notes_formula_step_by_step():
    """The ``rnn`` cell and stack: h_t = tanh(W x_t + U h_{t-1} + b), b = torch's b_ih + b_hh."""
    torch.manual_seed(4)
    cell, stack = rnn_cell("rnn", 3, 4), stacked_rnn("rnn", 3, 4, 1)
    assert isinstance(cell, torch.nn.RNNCell) and cell.nonlinearity == "tanh"
    assert isinstance(stack, torch.nn.RNN) and stack.nonlinearity == "tanh"
    x = torch.randn(2, 5, 3)
    with torch.no_grad():
        out, _ = stack(x)  # (2, 5, 4)
        W, U = stack.weight_ih_l0, stack.weight_hh_l0
        b = (stack.bias_ih_l0 + stack.bias_hh_l0).tolist()
        for r in range(2):
            h = [0.0] * 4
            for t in range(5):
                h = _tanh_step(W, U, b, x[r, t], h)
                torch.testing.assert_close(out[r, t], torch.tensor(h), atol=1e-6, rtol=1e-5)
        h_cell = cell(x[:, 0], torch.zeros(2, 4))
        bc = (cell.bias_ih + cell.bias_hh).tolist()
        ref = [_tanh_step(cell.weight_ih, cell.weight_hh, bc, x[r, 0], [0.0] * 4) for r in (0, 1)]
        torch.testing.assert_close(h_cell, torch.tensor(ref), atol=1e-6, rtol=1e-5)
    with pytest.raises(ValueError, match="unknown RNN cell 'elman'"):
        rnn_cell("elman", 3, 4)


def test_vanilla_rnn_decoder_steps_by_the_formula():
    """In the model: the decoder state after step 1 is tanh(W [Emb(y_0); c_1] + U s_0 + b), and
    the encoder is torch's tanh nn.RNN."""
    torch.manual_seed(5)
    model = _model(AttnRNNSeq2Seq, cell="rnn")
    assert isinstance(model.encoder, torch.nn.RNN) and model.encoder.nonlinearity == "tanh"
    src, mask, tgt = _batch()
    with torch.no_grad():
        st = model.start_decoding(src, mask)
        s0 = st.s.clone()
        context, _ = model.attention(s0, st.keys, mask)
        model.decode_step(tgt[:, :1], st)
        cell = model.cell
        b = (cell.bias_ih + cell.bias_hh).tolist()
        for r in range(src.shape[0]):
            x = torch.cat([model.tgt_emb(tgt[r, 0]), context[r]])
            ref = _tanh_step(cell.weight_ih, cell.weight_hh, b, x, s0[r])
            torch.testing.assert_close(st.s[r], torch.tensor(ref), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "kw",
    [
        {"score": "concat"},
        {"score": "general"},
        {"score": "dot", "bidirectional": False},
        {"init_state": "zeros", "cell": "rnn"},
        {"init_state": "last", "cell": "lstm"},
    ],
)
def test_variants_decode_like_the_teacher_forced_forward_and_train_every_weight(kw):
    model = _model(AttnRNNSeq2Seq, **kw)
    src, mask, tgt = _batch()
    with torch.no_grad():
        full = model(src, mask, tgt)
        st = model.start_decoding(src, mask)
        steps = [model.decode_step(tgt[:, t : t + 1], st)[0] for t in range(tgt.shape[1])]
    torch.testing.assert_close(torch.stack(steps, 1), full, atol=1e-6, rtol=1e-6)
    model.train()
    loss = torch.nn.functional.cross_entropy(model(src, mask, tgt).flatten(0, 1), tgt.flatten())
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        if "emb" not in name:
            assert p.grad.abs().sum() > 0, name


@pytest.mark.slow  # ~7 s: nine tiny models trained for two steps each
def test_bottleneck_variants_run_writes_its_files(tmp_path):
    """A seconds-long seeded run with every variant: one row per variant in results.json and in
    variants.md, each trained for the same steps and scored on the same held-out sentences."""
    cfg = BottleneckConfig(
        models=("rnn-attn",),
        variants=True,
        high=999,
        n_examples=200,
        steps=2,
        batch_size=8,
        max_test=20,
        device="cpu",
        progress=False,
    )
    res = run_bottleneck(cfg, tmp_path / "bn")
    out = tmp_path / "bn"
    saved = json.loads((out / "results.json").read_text())
    assert set(saved["models"]) == {"rnn-attn", *VARIANTS}
    table = (out / "variants.md").read_text()
    n_test = res["models"]["rnn-attn"]["overall"]["n"]
    assert n_test > 0
    for name, r in res["models"].items():
        assert r["steps"] == 2 and r["overall"]["n"] == n_test, name
        assert sum(b["n"] for b in r["buckets"].values()) == n_test, name
        assert math.isfinite(r["loss"]) and 0 <= r["token_accuracy"] <= 1, name
        assert f"| {name} |" in table
    assert (out / "bottleneck.png").stat().st_size > 0
    assert saved["models"]["concat"]["model"]["score"] == "concat"
