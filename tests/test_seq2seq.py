"""The Transformer encoder–decoder: parity with torch.nn.Transformer, masks, KV cache, presets."""

import pytest
import torch
from torch import nn

from attnlab.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer

V_SRC, V_TGT = 23, 19


def tiny(**kw) -> Seq2SeqTransformer:
    cfg = Seq2SeqConfig.preset("tiny", src_vocab_size=V_SRC, tgt_vocab_size=V_TGT, **kw)
    return Seq2SeqTransformer(cfg).eval()


def batch(B=3, S=7, T=5, lengths=(7, 4, 2)):
    src = torch.randint(4, V_SRC, (B, S))
    mask = torch.arange(S)[None, :] < torch.tensor(lengths)[:, None]
    src = src.masked_fill(~mask, 0)
    tgt = torch.randint(4, V_TGT, (B, T))
    return src, mask, tgt


def copy_into_torch(ours: Seq2SeqTransformer, ref: nn.Transformer) -> None:
    """Our weights -> torch.nn.Transformer (same layouts: fused Q|K|V rows, K|V rows for cross)."""

    def lin(dst: nn.Linear, src: nn.Linear):
        dst.weight.copy_(src.weight)
        dst.bias.copy_(src.bias)

    def norm(dst: nn.LayerNorm, src):
        dst.weight.copy_(src.weight)
        dst.bias.copy_(src.bias)

    with torch.no_grad():
        for mine, theirs in zip(ours.encoder, ref.encoder.layers):
            theirs.self_attn.in_proj_weight.copy_(mine.attn.qkv.weight)
            theirs.self_attn.in_proj_bias.copy_(mine.attn.qkv.bias)
            lin(theirs.self_attn.out_proj, mine.attn.out_proj)
            lin(theirs.linear1, mine.ffn.fc1)
            lin(theirs.linear2, mine.ffn.fc2)
            norm(theirs.norm1, mine.norm1)
            norm(theirs.norm2, mine.norm2)
        for mine, theirs in zip(ours.decoder, ref.decoder.layers):
            theirs.self_attn.in_proj_weight.copy_(mine.attn.qkv.weight)
            theirs.self_attn.in_proj_bias.copy_(mine.attn.qkv.bias)
            lin(theirs.self_attn.out_proj, mine.attn.out_proj)
            q_w, q_b = mine.cross_attn.q_proj.weight, mine.cross_attn.q_proj.bias
            kv_w, kv_b = mine.cross_attn.kv_proj.weight, mine.cross_attn.kv_proj.bias
            theirs.multihead_attn.in_proj_weight.copy_(torch.cat([q_w, kv_w]))
            theirs.multihead_attn.in_proj_bias.copy_(torch.cat([q_b, kv_b]))
            lin(theirs.multihead_attn.out_proj, mine.cross_attn.out_proj)
            lin(theirs.linear1, mine.ffn.fc1)
            lin(theirs.linear2, mine.ffn.fc2)
            norm(theirs.norm1, mine.norm1)
            norm(theirs.norm2, mine.norm_cross)
            norm(theirs.norm3, mine.norm2)
        if ref.encoder.norm is not None:
            norm(ref.encoder.norm, ours.enc_norm)
            norm(ref.decoder.norm, ours.dec_norm)


@pytest.mark.parametrize("final_norm", [True, False])
def test_equals_torch_transformer_with_copied_weights(final_norm):
    """Post-norm, ReLU, dropout 0, source padding mask + causal mask: same output as torch."""
    model = tiny(final_norm=final_norm)
    c = model.config
    ref = nn.Transformer(
        c.d_model,
        c.n_heads,
        c.n_enc_layers,
        c.n_dec_layers,
        c.ffn_hidden,
        dropout=0.0,
        activation="relu",
        batch_first=True,
        norm_first=False,
    )
    if not final_norm:  # the paper's post-norm stacks end without an extra norm
        ref.encoder.norm = None
        ref.decoder.norm = None
    copy_into_torch(model, ref)
    ref.train()  # dropout is 0; train mode avoids torch's nested-tensor fast path
    src, mask, tgt = batch()
    x, y = model.embed_source(src), model.embed_target(tgt)
    T = tgt.shape[1]
    causal = torch.triu(torch.full((T, T), float("-inf")), diagonal=1)
    with torch.no_grad():
        expected = ref(
            x, y, tgt_mask=causal, src_key_padding_mask=~mask, memory_key_padding_mask=~mask
        )
        memory = model.run_encoder(x, mask)
        got = model.run_decoder(y, memory, mask)
        ref_memory = ref.encoder(x, src_key_padding_mask=~mask)
        logits = model(src, mask, tgt)
    torch.testing.assert_close(memory, ref_memory, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits, model.lm_head(expected), atol=1e-5, rtol=1e-5)


def test_decoder_self_attention_is_causal():
    """Changing target token t changes no logits before t; it does change logits at t."""
    model = tiny()
    src, mask, tgt = batch()
    with torch.no_grad():
        base = model(src, mask, tgt)
        t = 3
        tgt2 = tgt.clone()
        tgt2[:, t:] = (tgt2[:, t:] + 5) % (V_TGT - 4) + 4
        changed = model(src, mask, tgt2)
    torch.testing.assert_close(changed[:, :t], base[:, :t], atol=1e-6, rtol=0)
    assert (changed[:, t:] - base[:, t:]).abs().max() > 1e-3


@pytest.mark.parametrize("position", ["sinusoidal", "rope"])
def test_padding_in_the_source_changes_nothing(position):
    """Encoder self-attention and cross-attention ignore padded source positions: rewriting them
    (and even making the batch's padding longer) leaves the real outputs unchanged."""
    model = tiny(position=position)
    src, mask, tgt = batch()
    with torch.no_grad():
        base = model(src, mask, tgt)
        src2 = src.masked_fill(~mask, 0) + torch.randint(1, V_SRC - 1, src.shape) * (~mask)
        src2 = src2.clamp(max=V_SRC - 1)
        assert not torch.equal(src2, src)
        garbled = model(src2, mask, tgt)
        longer = torch.cat([src2, torch.randint(4, V_SRC, (src.shape[0], 3))], 1)
        longer_mask = torch.cat([mask, torch.zeros(src.shape[0], 3, dtype=torch.bool)], 1)
        padded_more = model(longer, longer_mask, tgt)
    torch.testing.assert_close(garbled, base, atol=1e-5, rtol=0)
    torch.testing.assert_close(padded_more, base, atol=1e-5, rtol=0)
    with torch.no_grad():
        _, weights = model(src, mask, tgt, need_weights=True)
    w = torch.stack(weights["cross"])  # (L, B, H, T, S)
    assert w.shape[:2] == (model.config.n_dec_layers, src.shape[0])
    assert float(w.masked_select(~mask[None, :, None, None, :].expand_as(w)).abs().max()) == 0.0
    torch.testing.assert_close(w.sum(-1), torch.ones_like(w.sum(-1)))


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"norm_position": "pre", "position": "rope"},
        {"position": "learned", "n_kv_heads": 2},
        {"position": "alibi", "norm_position": "pre"},
    ],
)
def test_kv_cache_steps_equal_teacher_forced_forward(overrides):
    """Decoding one token at a time with self/cross KV caches gives the full forward's logits;
    so does feeding a prefix in one step and the rest one token at a time."""
    model = tiny(**overrides)
    src, mask, tgt = batch()
    T = tgt.shape[1]
    with torch.no_grad():
        full = model(src, mask, tgt)  # (B, T, V)
        state = model.start_decoding(src, mask, max_len=T)
        steps = []
        for t in range(T):
            logits, state = model.decode_step(tgt[:, t : t + 1], state)
            steps.append(logits)
        state2 = model.start_decoding(src, mask, max_len=T)
        prefix, state2 = model.decode_step(tgt[:, :3], state2)
        rest = [model.decode_step(tgt[:, t : t + 1], state2)[0] for t in range(3, T)]
    torch.testing.assert_close(torch.stack(steps, 1), full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(prefix, full[:, 2], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.stack(rest, 1), full[:, 3:], atol=1e-5, rtol=1e-5)
    assert state.self_caches[0].length == T
    assert state.cross_caches[0].length == src.shape[1]


@pytest.mark.parametrize("overrides", [{}, {"norm_position": "pre", "n_kv_heads": 2}])
def test_returned_weights_are_the_softmax_of_each_layers_projections(overrides):
    """need_weights: every encoder, decoder and cross-attention map equals
    softmax(q kᵀ/√D) recomputed from that layer's own projections of its inputs (encoder/cross:
    padding masked; decoder: causal), read with hooks on the layer inputs."""
    model = tiny(**overrides)
    c = model.config
    src, mask, tgt = batch()
    inputs = {}

    def keep(name):
        def hook(module, args, kwargs):
            inputs[name] = (args, kwargs)

        return hook

    for name, m in model.named_modules():
        if name.endswith("attn"):
            m.register_forward_pre_hook(keep(name), with_kwargs=True)
    with torch.no_grad():
        logits, weights = model(src, mask, tgt, need_weights=True)
        torch.testing.assert_close(logits, model(src, mask, tgt))  # same forward either way
        B, T = tgt.shape
        H, Hkv, D = c.n_heads, c.n_kv_heads, c.head_dim

        def softmax(q, k, allowed):  # q (B, Tq, H·D), k (B, Tk, Hkv·D), allowed (B|1, Tq, Tk)
            q = q.view(B, -1, H, D).transpose(1, 2)  # (B, H, Tq, D)
            k = k.view(B, -1, Hkv, D).transpose(1, 2).repeat_interleave(H // Hkv, 1)
            scores = q @ k.transpose(-1, -2) / D**0.5  # (B, H, Tq, Tk)
            return scores.masked_fill(~allowed[:, None], float("-inf")).softmax(-1)

        pad = mask[:, None, :]  # (B, 1, S)
        causal = torch.ones(T, T, dtype=torch.bool).tril()[None]  # (1, T, T)
        for i, block in enumerate(model.encoder):
            (x,), _ = inputs[f"encoder.{i}.attn"]
            q, k, _ = block.attn.qkv(x).split([H * D, Hkv * D, Hkv * D], -1)
            torch.testing.assert_close(weights["encoder"][i], softmax(q, k, pad))
        for i, block in enumerate(model.decoder):
            (y,), _ = inputs[f"decoder.{i}.attn"]
            q, k, _ = block.attn.qkv(y).split([H * D, Hkv * D, Hkv * D], -1)
            torch.testing.assert_close(weights["decoder"][i], softmax(q, k, causal))
            (h, memory), _ = inputs[f"decoder.{i}.cross_attn"]
            k, _ = block.cross_attn.kv_proj(memory).split(Hkv * D, -1)
            expected = softmax(block.cross_attn.q_proj(h), k, pad)
            torch.testing.assert_close(weights["cross"][i], expected)
    assert len(weights["encoder"]) == c.n_enc_layers and len(weights["cross"]) == c.n_dec_layers
    stored = ("cross_weights", "attn_weights", "weights")
    assert not any(hasattr(m, a) for m in model.modules() for a in stored)  # nothing kept


VARIANTS = [
    {},
    {"norm_position": "pre"},
    {"position": "rope"},
    {"position": "learned", "tie_embeddings": False},
    {"position": "none", "norm": "rmsnorm", "ffn": "swiglu", "bias": False},
    {"qk_norm": "rmsnorm", "n_kv_heads": 1},
    {"position": "alibi", "drop_path": 0.1},
]


@pytest.mark.parametrize("overrides", VARIANTS)
def test_variants_train_every_parameter(overrides):
    """Forward + backward: finite loss, and every parameter receives a gradient."""
    model = tiny(**overrides).train()
    src, mask, tgt = batch()
    logits = model(src, mask, tgt)
    loss = nn.functional.cross_entropy(logits.flatten(0, 1), tgt.flatten())
    loss.backward()
    assert torch.isfinite(loss)
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        if "emb" not in name:  # embedding rows of unused ids legitimately get zero gradient
            assert p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("preset, paper", [("vaswani", 65e6), ("vaswani-big", 213e6)])
def test_vaswani_presets_have_the_paper_size(preset, paper):
    """Base and big models: parameters counted on the ``meta`` device (nothing allocated) equal
    the layer formula (tied target/output embeddings, separate source embeddings), and with the
    paper's one vocabulary shared by both languages ("about 37000 tokens"), its Table 3 size
    (65M, 213M) within 5 % (the vocabulary is approximate, the sizes rounded)."""
    V = 37000
    cfg = Seq2SeqConfig.preset(preset, src_vocab_size=V, tgt_vocab_size=V)
    d, f, N = cfg.d_model, cfg.ffn_hidden, cfg.n_enc_layers
    attn = 4 * d * d + 4 * d
    ffn = 2 * d * f + f + d
    enc = N * (attn + ffn + 2 * 2 * d)
    dec = N * (2 * attn + ffn + 3 * 2 * d)
    expected = enc + dec + 2 * V * d
    with torch.device("meta"):
        model = Seq2SeqTransformer(cfg)
    assert sum(p.numel() for p in model.parameters()) == expected
    assert expected - V * d == pytest.approx(paper, rel=0.05)  # the paper shares one matrix
    assert cfg.norm_position == "post" and cfg.position == "sinusoidal"
    assert cfg.activation == "relu" and cfg.dropout == (0.1 if preset == "vaswani" else 0.3)


def test_config_validation_and_round_trip():
    cfg = Seq2SeqConfig.preset("tiny", src_vocab_size=10, tgt_vocab_size=12, position="rope")
    assert Seq2SeqConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="unknown Seq2SeqConfig preset 'huge'"):
        Seq2SeqConfig.preset("huge")
    with pytest.raises(ValueError, match="divisible"):
        Seq2SeqConfig(d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="position"):
        Seq2SeqConfig(position="alibi2")
    with pytest.raises(ValueError, match="unknown Seq2SeqConfig field"):
        Seq2SeqConfig.from_dict({"d_model": 8, "bogus": 1})
    assert Seq2SeqConfig(norm_position="pre").final_norm is True


#: presets run at one layer per stack (their size is counted above, on the meta device)
PAPER_PRESETS = {"vaswani", "vaswani-big"}


@pytest.mark.parametrize("preset", Seq2SeqConfig.presets())
def test_preset_sweep_forward_backward(preset):
    """Every preset (small vocabularies; the paper's sizes at one layer per stack): finite logits
    and loss, every parameter gets a gradient (dropout off so that the check is deterministic)."""
    one = dict(n_enc_layers=1, n_dec_layers=1) if preset in PAPER_PRESETS else {}
    cfg = Seq2SeqConfig.preset(
        preset, src_vocab_size=V_SRC, tgt_vocab_size=V_TGT, dropout=0.0, **one
    )
    model = Seq2SeqTransformer(cfg).train()
    src, mask, tgt = batch(B=2, T=4, lengths=(7, 3))
    logits = model(src, mask, tgt)
    assert logits.shape == (2, 4, V_TGT) and torch.isfinite(logits).all()
    nn.functional.cross_entropy(logits.flatten(0, 1), tgt.flatten()).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
