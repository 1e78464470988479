"""DecoderLM and its config: every preset trains (forward, backward, gradients everywhere, no NaN),
causality, left-padding invariance, checkpointing, tying, MoE aux losses reported (not stored),
attention weights equal to the softmax recomputed from each layer's projections, no per-call
state on modules, config validation."""

import math

import pytest
import torch

from attnlab.attention import capture_attention, collect_aux_losses, repeat_kv
from attnlab.config import PRESETS, ModelConfig
from attnlab.layers.moe import MoE, load_balancing_loss
from attnlab.layers.position import RotaryEmbedding
from attnlab.layers.position.alibi import alibi_slopes
from attnlab.models.lm import DecoderLM

# the big presets keep their style and width but get one layer and a small vocabulary here
SHRINK = {
    "gpt2-small": dict(n_layers=1, vocab_size=64, max_seq_len=64),
    "gpt2": dict(n_layers=1, vocab_size=64, max_seq_len=64),
    "llama-small": dict(n_layers=1, vocab_size=64, max_seq_len=64),
    "mixtral-small": dict(n_layers=1, vocab_size=64, max_seq_len=64),
}
KNOBS = [
    ("tiny", dict(qk_norm="rmsnorm")),
    ("tiny", dict(position="alibi")),
    ("tiny", dict(norm_position="post")),
    ("tiny", dict(position="sinusoidal")),
    ("tiny", dict(position="none")),
    ("llama-tiny", dict(n_kv_heads=1, qk_norm="layernorm")),
    ("tiny", dict(dropout=0.1, attn_dropout=0.1)),
    ("tiny", dict(activation_checkpointing=True)),
    ("mixtral-tiny", dict(activation="gelu_tanh")),
]


def small(name, **kw):
    return ModelConfig.preset(name, **{**SHRINK.get(name, {}), **kw})


@pytest.mark.parametrize(
    "name,overrides",
    [(n, {}) for n in PRESETS] + KNOBS,
    ids=[n for n in PRESETS] + [f"{n}-{'-'.join(o)}" for n, o in KNOBS],
)
def test_preset_sweep_forward_backward_every_parameter_gets_a_gradient(name, overrides):
    cfg = small(name, **overrides)
    model = DecoderLM(cfg).train()
    idx = torch.randint(0, cfg.vocab_size, (2, 12))
    with collect_aux_losses() as aux:
        logits = model(idx)
    assert logits.shape == (2, 12, cfg.vocab_size)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), idx.roll(-1, 1).flatten())
    if cfg.ffn == "moe":
        assert len(aux.losses) == cfg.n_layers
        assert aux.total().requires_grad and aux.total() > 0
        loss = loss + cfg.moe_aux_coef * aux.total()
    else:
        assert aux.losses == []
    loss.backward()
    assert torch.isfinite(loss)
    for pname, p in model.named_parameters():
        assert p.grad is not None, f"{pname} got no gradient"
        assert torch.isfinite(p.grad).all(), f"{pname} has a non-finite gradient"
        if "router" not in pname and "w_" not in pname:  # a routed expert may get no tokens
            assert p.grad.abs().sum() > 0, f"{pname} has an all-zero gradient"


def test_gpt2_small_preset_is_124m_parameters():
    # GPT-2 small: 124,439,808 parameters (tied embeddings, 1024 positions) — computed from the
    # architecture: 12·(12·768² + 13·768) + 50257·768 + 1024·768 + 2·768
    d, L, V, T = 768, 12, 50257, 1024
    expected = L * (12 * d * d + 13 * d) + V * d + T * d + 2 * d
    with torch.device("meta"):
        model = DecoderLM(ModelConfig.preset("gpt2"))
    assert model.num_parameters() == expected


@pytest.mark.parametrize("name", ["tiny", "llama-tiny", "mixtral-tiny"])
def test_causal_future_tokens_do_not_change_past_logits(name):
    model = DecoderLM(small(name)).eval()
    a = torch.randint(0, 256, (1, 16))
    b = a.clone()
    b[:, 10:] = torch.randint(0, 256, (1, 6))
    torch.testing.assert_close(model(a)[:, :10], model(b)[:, :10], atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "overrides", [{}, {"position": "rope"}, {"position": "alibi"}, {"position": "sinusoidal"}]
)
def test_left_padded_row_gives_same_logits_as_the_unpadded_sequence(overrides):
    model = DecoderLM(small("tiny", **overrides)).eval()
    seq = torch.randint(0, 256, (1, 9))
    padded = torch.cat([torch.zeros(1, 4, dtype=torch.long), seq], dim=1)
    mask = torch.tensor([[False] * 4 + [True] * 9])
    torch.testing.assert_close(
        model(padded, attention_mask=mask)[:, 4:], model(seq), atol=1e-5, rtol=0
    )


def test_activation_checkpointing_gives_identical_gradients():
    torch.manual_seed(1)
    plain = DecoderLM(small("llama-tiny"))
    ckpt = DecoderLM(small("llama-tiny", activation_checkpointing=True))
    ckpt.load_state_dict(plain.state_dict())
    idx = torch.randint(0, 256, (2, 10))
    for m in (plain, ckpt):
        m(idx).logsumexp(-1).mean().backward()
    for (n, p), q in zip(plain.named_parameters(), ckpt.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-6, rtol=1e-5, msg=n)


def test_layout_and_tying():
    gpt = DecoderLM(ModelConfig.preset("tiny"))
    assert gpt.lm_head.weight is gpt.tok_emb.weight
    assert gpt.pos_emb.weight.shape == (128, 64)
    blk = gpt.blocks[0]
    assert blk.attn.qkv.weight.shape == (3 * 64, 64) and blk.ffn.fc1.weight.shape == (256, 64)
    llama = DecoderLM(ModelConfig.preset("llama-tiny"))
    assert llama.lm_head.weight is not llama.tok_emb.weight
    assert isinstance(llama.pos_emb, RotaryEmbedding) and not list(llama.pos_emb.parameters())
    assert llama.blocks[0].attn.positions is None  # the model passes its one module to every block
    assert llama.blocks[0].attn.qkv.weight.shape == ((4 + 2 * 2) * 16, 64)
    assert llama.blocks[0].attn.qkv.bias is None
    assert all(hasattr(llama.blocks[0].ffn, n) for n in ("gate", "up", "down"))
    mix = DecoderLM(ModelConfig.preset("mixtral-tiny"))
    assert isinstance(mix.blocks[0].ffn, MoE) and mix.blocks[0].ffn.w_in.shape == (4, 192, 64)
    post = DecoderLM(ModelConfig.preset("tiny", norm_position="post"))
    assert isinstance(post.norm_f, torch.nn.Identity)


def test_mixtral_reports_each_layers_load_balancing_loss():
    """collect_aux_losses gets one loss per MoE layer, equal to load_balancing_loss recomputed
    from that layer's router on the input it saw; nothing is kept on the modules."""
    model = DecoderLM(ModelConfig.preset("mixtral-tiny"))
    inputs = []
    hooks = [
        b.ffn.register_forward_pre_hook(lambda m, a: inputs.append(a[0])) for b in model.blocks
    ]
    with collect_aux_losses() as aux:
        model(torch.randint(0, 256, (2, 8)))
    for h in hooks:
        h.remove()
    expected = []
    for block, x in zip(model.blocks, inputs):
        moe = block.ffn
        probs = moe.router(x.reshape(-1, x.shape[-1])).float().softmax(-1)  # (N, E)
        top = probs.topk(moe.top_k, dim=-1).indices  # (N, K)
        expected.append(load_balancing_loss(probs, top, moe.n_experts))
        assert torch.equal(
            aux.expert_counts[len(expected) - 1],
            torch.bincount(top.flatten(), minlength=moe.n_experts),
        )
    assert len(aux.losses) == len(expected) == 2
    for got, want in zip(aux.losses, expected):
        torch.testing.assert_close(got, want)
    torch.testing.assert_close(aux.total(), sum(expected))
    # uniform routing would give top_k per layer; a random init is close to it
    assert 0.5 * 2 * 2 < float(aux.total().detach()) < 2 * 2 * 2
    # outside a collection a forward reports nowhere and keeps nothing
    model(torch.randint(0, 256, (2, 8)))
    assert not any(hasattr(m, "aux_loss") or hasattr(m, "expert_counts") for m in model.modules())


def _reference_weights(model, attn, x, T):
    """softmax(QKᵀ/√D + ALiBi + causal mask) recomputed from a layer's projections."""
    c = model.config
    B, H, Hkv, D = x.shape[0], c.n_heads, c.n_kv_heads, c.head_dim
    q, k, _ = attn.qkv(x).split([H * D, Hkv * D, Hkv * D], dim=-1)
    q = attn.q_norm(q.view(B, T, H, D).transpose(1, 2))  # (B, H, T, D)
    k = attn.k_norm(k.view(B, T, Hkv, D).transpose(1, 2))  # (B, Hkv, T, D)
    pos = torch.arange(T)
    if c.position == "rope":
        q, k = model.pos_emb.rotate(q, k, pos, pos)
    scores = q @ repeat_kv(k, H // Hkv).transpose(-1, -2) / math.sqrt(D)  # (B, H, T, T)
    if c.position == "alibi":
        scores = scores - alibi_slopes(H)[:, None, None] * (pos[:, None] - pos[None, :]).abs()
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    return scores.masked_fill(~causal, float("-inf")).softmax(-1)


@pytest.mark.parametrize(
    "name,overrides",
    [("tiny", {}), ("llama-tiny", {"qk_norm": "rmsnorm"}), ("tiny", {"position": "alibi"})],
)
def test_attention_weights_are_the_softmax_of_each_layers_scores(name, overrides):
    """need_weights=True and capture_attention give, per block, softmax(QKᵀ/√D + bias + causal
    mask) recomputed from that block's Q/K projections of the input it saw."""
    model = DecoderLM(small(name, backend="sdpa", **overrides)).eval()
    inputs = []
    hooks = [
        b.attn.register_forward_pre_hook(lambda m, a: inputs.append(a[0])) for b in model.blocks
    ]
    idx = torch.randint(0, 256, (2, 9))
    with torch.no_grad():
        logits, weights = model(idx, need_weights=True)
        with capture_attention(model) as maps:
            captured = model(idx)
        for h in hooks:
            h.remove()
        expected = [_reference_weights(model, b.attn, x, 9) for b, x in zip(model.blocks, inputs)]
    torch.testing.assert_close(logits, captured)
    assert len(weights) == len(expected) == model.config.n_layers
    for i, (w, ref) in enumerate(zip(weights, expected)):
        assert w.shape == (2, model.config.n_heads, 9, 9)
        torch.testing.assert_close(w, ref, atol=1e-5, rtol=0)
        torch.testing.assert_close(maps[f"blocks.{i}.attn"], ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(logits, model(idx), atol=1e-5, rtol=0)  # same as the sdpa path


@pytest.mark.parametrize("name", ["tiny", "llama-tiny", "mixtral-tiny"])
def test_a_forward_leaves_no_per_call_state_on_any_module(name):
    """Every module's attributes (vars) are the same before and after forwards, training or not,
    with or without weights, caches or a capture: nothing of a call is kept."""
    model = DecoderLM(small(name))

    def snapshot():
        return {
            n: {k: v for k, v in vars(m).items() if k != "training"}
            for n, m in model.named_modules()
        }

    def same(a, b):
        assert a.keys() == b.keys()
        for name in a:
            assert a[name].keys() == b[name].keys(), name
            for k in a[name]:
                x, y = a[name][k], b[name][k]
                if isinstance(x, dict):  # _parameters, _buffers, _modules: the same objects
                    assert x.keys() == y.keys() and all(x[j] is y[j] for j in x), (name, k)
                else:
                    assert x is y or x == y, (name, k)

    before = snapshot()
    idx = torch.randint(0, 256, (2, 8))
    model.train()
    model(idx).sum().backward()
    model.eval()
    with torch.no_grad():
        model(idx, need_weights=True)
        with capture_attention(model), collect_aux_losses():
            model(idx)
        state = model.start_decoding(2, 10)
        model.decode_step(idx, state)
        model.decode_step(idx[:, :1], state)
    same(before, snapshot())


def test_config_roundtrip_and_derived_values():
    cfg = ModelConfig.preset("llama-tiny")
    assert cfg.head_dim == 16 and cfg.n_kv_heads == 2 and cfg.ffn_hidden == 176
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    assert ModelConfig.preset("tiny").ffn_hidden == 4 * 64


@pytest.mark.parametrize(
    "kw,words",
    [
        (dict(d_model=65), "divisible"),
        (dict(n_kv_heads=3), "multiple"),
        (dict(position="rotary"), "position"),
        (dict(ffn="moe", top_k=9), "top_k"),
        (dict(dropout=1.5), "dropout"),
        (dict(vocab_size=0), "vocab_size"),
        (dict(n_heads=4, head_dim=5, position="rope"), "even"),
        (dict(norm="groupnorm"), r"choose from \['layernorm', 'rmsnorm', 'batchnorm'\]"),
        (dict(qk_norm="batchnorm"), "qk_norm='batchnorm' is not supported"),
        (dict(residual="no"), "residual must be true or false, got 'no'"),
        # wrong types from JSON / --set: refused, never truthy strings or late TypeErrors
        (dict(bias="False"), "bias must be true or false, got 'False'"),
        (dict(dropout="abc"), "dropout must be a number"),
        (dict(n_kv_heads="2"), "n_kv_heads must be an integer or null"),
        (dict(top_k=True), "top_k must be an integer"),
        (dict(rope_theta=None), "rope_theta must be a number"),
    ],
)
def test_config_values_that_do_not_fit_raise_naming_them(kw, words):
    with pytest.raises(ValueError, match=words):
        ModelConfig.preset("tiny", **kw)


def test_unknown_preset_and_field():
    with pytest.raises(ValueError, match="gpt2-tiny"):
        ModelConfig.preset("gpt5")
    with pytest.raises(ValueError, match="d_modle"):
        ModelConfig.preset("tiny", d_modle=3)


def test_sequence_longer_than_context_raises():
    model = DecoderLM(ModelConfig.preset("tiny", max_seq_len=8))
    with pytest.raises(ValueError, match="max_seq_len"):
        model(torch.zeros(1, 9, dtype=torch.long))


def test_logits_to_keep_is_the_last_slice_of_the_full_logits():
    model = DecoderLM(ModelConfig.preset("tiny")).eval()
    idx = torch.randint(0, 256, (2, 10))
    torch.testing.assert_close(model(idx, logits_to_keep=3), model(idx)[:, -3:])
