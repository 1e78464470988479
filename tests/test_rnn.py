"""RNN encoder–decoders: the bottleneck is real, Bahdanau attention is recomputed per step."""

import pytest
import torch
from torch import nn

from attnlab.models.rnn import AttnRNNSeq2Seq, RNNSeq2Seq, RNNSeq2SeqConfig

V_SRC, V_TGT = 17, 13


def make(cls, **kw):
    cfg = RNNSeq2SeqConfig.preset("tiny", src_vocab_size=V_SRC, tgt_vocab_size=V_TGT, **kw)
    return cls(cfg).eval()


def batch(B=3, S=6, T=5, lengths=(6, 3, 1)):
    src = torch.randint(4, V_SRC, (B, S))
    mask = torch.arange(S)[None, :] < torch.tensor(lengths)[:, None]
    return src.masked_fill(~mask, 0), mask, torch.randint(4, V_TGT, (B, T))


@pytest.mark.parametrize("cls", [RNNSeq2Seq, AttnRNNSeq2Seq])
@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_padding_changes_nothing(cls, cell):
    """Packed sequences: padded source positions (their ids, or extra padding) change nothing."""
    model = make(cls, cell=cell)
    src, mask, tgt = batch()
    with torch.no_grad():
        base = model(src, mask, tgt)
        garbled = torch.where(mask, src, torch.randint(4, V_SRC, src.shape))
        longer = torch.cat([garbled, torch.randint(4, V_SRC, (3, 2))], 1)
        longer_mask = torch.cat([mask, torch.zeros(3, 2, dtype=torch.bool)], 1)
        torch.testing.assert_close(model(garbled, mask, tgt), base, atol=1e-6, rtol=0)
        torch.testing.assert_close(model(longer, longer_mask, tgt), base, atol=1e-6, rtol=0)


def test_final_state_is_the_last_real_step_of_each_direction():
    """h_fin = [forward state after the last real token ; backward state after the first token]."""
    model = make(RNNSeq2Seq)
    src, mask, _ = batch()
    with torch.no_grad():
        keys, final = model.encode(src, mask)
        H = model.config.hidden
        for b, n in enumerate(mask.sum(1).tolist()):
            torch.testing.assert_close(final[b, :H], keys[b, n - 1, :H])
            torch.testing.assert_close(final[b, H:], keys[b, 0, H:])
            assert keys[b, n:].abs().max() == 0 if n < src.shape[1] else True


def test_bottleneck_decoder_sees_only_the_final_state():
    """rnn: replacing every encoder state except h_fin changes nothing; rnn-attn: it does."""
    src, mask, tgt = batch()
    for cls, should_change in ((RNNSeq2Seq, False), (AttnRNNSeq2Seq, True)):
        torch.manual_seed(0)
        model = make(cls)
        with torch.no_grad():
            outs = []
            for scramble in (False, True):
                state = model.start_decoding(src, mask)
                if scramble:
                    state.keys = torch.randn_like(state.keys)
                    if state.keys_proj is not None:
                        state.keys_proj = model.attention.project_keys(state.keys)
                logits = []
                for t in range(tgt.shape[1]):
                    step, state = model.decode_step(tgt[:, t : t + 1], state)
                    logits.append(step)
                outs.append(torch.stack(logits, 1))
        changed = (outs[0] - outs[1]).abs().max() > 1e-4
        assert bool(changed) == should_change, cls.kind


def test_bahdanau_weights_follow_the_formula_each_step():
    """α_t = softmax_j(vᵀ tanh(W_s s_{t-1} + W_h h_j)) over real positions, recomputed per step."""
    model = make(AttnRNNSeq2Seq)
    src, mask, tgt = batch()
    with torch.no_grad():
        logits, w = model(src, mask, tgt, need_weights=True)  # w: (B, T, S)
        torch.testing.assert_close(logits, model(src, mask, tgt))
        state = model.start_decoding(src, mask)
        att = model.attention
        for t in range(tgt.shape[1]):
            e = att.v(torch.tanh(att.W_s(state.s)[:, None] + att.W_h(state.keys))).squeeze(-1)
            alpha = e.masked_fill(~mask, float("-inf")).softmax(-1)
            torch.testing.assert_close(w[:, t], alpha)
            _, state = model.decode_step(tgt[:, t : t + 1], state)
    assert w.masked_select(~mask[:, None, :].expand_as(w)).abs().max() == 0
    torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:2]))
    assert (w[0, 0] - w[0, 1]).abs().max() > 1e-6  # a new distribution at each step


@pytest.mark.parametrize("cls", [RNNSeq2Seq, AttnRNNSeq2Seq])
@pytest.mark.parametrize(
    "cfg", [{"cell": "lstm", "n_layers": 2, "dropout": 0.1}, {"bidirectional": False}]
)
def test_every_parameter_gets_a_gradient(cls, cfg):
    model = make(cls, **cfg).train()
    src, mask, tgt = batch()
    loss = nn.functional.cross_entropy(model(src, mask, tgt).flatten(0, 1), tgt.flatten())
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        if "emb" not in name:
            assert p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("cls", [RNNSeq2Seq, AttnRNNSeq2Seq])
@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_decode_steps_equal_teacher_forced_forward(cls, cell):
    """decode_step one token at a time, or a prefix in one call then one at a time, gives the
    teacher-forced forward's logits; the fixed-context rnn returns no attention weights."""
    model = make(cls, cell=cell)
    src, mask, tgt = batch()
    T = tgt.shape[1]
    with torch.no_grad():
        full, weights = model(src, mask, tgt, need_weights=True)
        state = model.start_decoding(src, mask, T)
        steps = [model.decode_step(tgt[:, t : t + 1], state)[0] for t in range(T)]
        state = model.start_decoding(src, mask, T)
        prefix, state = model.decode_step(tgt[:, :2], state)
        rest = [model.decode_step(tgt[:, t : t + 1], state)[0] for t in range(2, T)]
    torch.testing.assert_close(torch.stack(steps, 1), full, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(prefix, full[:, 1], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(torch.stack(rest, 1), full[:, 2:], atol=1e-6, rtol=1e-6)
    assert (weights is None) == (cls is RNNSeq2Seq)
    assert not any(hasattr(m, "last_weights") or hasattr(m, "weights") for m in model.modules())


def test_kinds_and_config():
    assert RNNSeq2Seq.kind == "rnn" and AttnRNNSeq2Seq.kind == "rnn-attn"
    assert make(RNNSeq2Seq).attention is None
    cfg = RNNSeq2SeqConfig.preset("small", cell="lstm", src_vocab_size=5, tgt_vocab_size=6)
    assert RNNSeq2SeqConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="unknown cell 'elman'"):
        RNNSeq2SeqConfig(cell="elman")
    with pytest.raises(ValueError, match="preset"):
        RNNSeq2SeqConfig.preset("huge")


@pytest.mark.parametrize("preset", RNNSeq2SeqConfig.presets())
@pytest.mark.parametrize("cls", [RNNSeq2Seq, AttnRNNSeq2Seq])
def test_preset_sweep_forward_backward(cls, preset):
    """Every preset: finite logits, every parameter gets a finite gradient."""
    cfg = RNNSeq2SeqConfig.preset(preset, src_vocab_size=V_SRC, tgt_vocab_size=V_TGT, dropout=0.0)
    model = cls(cfg).train()
    src, mask, tgt = batch()
    logits = model(src, mask, tgt)
    assert logits.shape == (3, 5, V_TGT) and torch.isfinite(logits).all()
    nn.functional.cross_entropy(logits.flatten(0, 1), tgt.flatten()).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
