"""T5 against live ``transformers.T5ForConditionalGeneration`` models with random weights.

Each reference is built offline from a tiny ``T5Config`` in the 1.0 layout (ReLU FFN, tied and
scaled head) and the 1.1 layout (gated GELU, untied head without the scaling), every parameter
re-randomised (HF's init sets the norms to 1, which would hide a mapping bug). Teacher-forced
logits must agree to 1e-4 on a batch whose sources are right-padded, greedy decoding through
attnlab's KV caches must give HF's ``generate`` tokens, and conversion works both ways: the
state dict in, ``to_hf``'s folder back into ``from_pretrained``.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import transformers
from safetensors.torch import save_file

from attnlab.attention import capture_attention
from attnlab.config.t5 import T5Config
from attnlab.decoding import beam_search, greedy_search
from attnlab.errors import UserError
from attnlab.inspect import run_with_hooks
from attnlab.inspect.families import causal_stacks, readout
from attnlab.interop import from_hf, to_hf
from attnlab.interop.hf.t5 import t5_config_from_hf, t5_from_hf, t5_to_hf
from attnlab.layers.position import relative_position_bucket
from attnlab.models.t5 import T5

V, S, T = 53, 9, 6
ATOL = 1e-4
LAYOUTS = {
    "1.0": dict(feed_forward_proj="relu"),
    "1.1": dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False),
}


def build_hf(layout: str) -> transformers.T5ForConditionalGeneration:
    cfg = transformers.T5Config(
        vocab_size=V,
        d_model=32,
        d_kv=8,
        d_ff=48,
        num_layers=2,
        num_decoder_layers=3,
        num_heads=4,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=20,
        dropout_rate=0.0,
        decoder_start_token_id=0,
        attn_implementation="eager",
        **LAYOUTS[layout],
    )
    model = transformers.T5ForConditionalGeneration(cfg)
    if layout == "1.1":  # transformers 5 ties the head whatever the config says: untie it
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1 + 0.1 * noise if "layer_norm" in name else 0.3 * noise)
    return model.eval()


def hf_config(model: transformers.T5ForConditionalGeneration) -> dict:
    return {**model.config.to_dict(), "architectures": ["T5ForConditionalGeneration"]}


def batch(seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(2, V, (3, S), generator=gen)
    mask = torch.ones(3, S, dtype=torch.bool)
    mask[1, 6:] = False  # right-padded rows
    mask[2, 3:] = False
    src = src.masked_fill(~mask, 0)
    tgt = torch.randint(2, V, (3, T), generator=gen)
    tgt[:, 0] = 0  # T5 starts the decoder with the pad id
    return src, mask, tgt


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_logits_equal_hf_with_padding_and_conversion_both_ways(layout, tmp_path):
    hf = build_hf(layout)
    ours = t5_from_hf(hf_config(hf), hf.state_dict())
    c = ours.config
    assert (c.ffn, c.tie_embeddings, c.scale_output) == (
        ("mlp", True, True) if layout == "1.0" else ("gated", False, False)
    )
    assert (ours.lm_head.weight is ours.tgt_emb.weight) == (layout == "1.0")
    src, mask, tgt = batch()
    with torch.no_grad():
        want = hf(input_ids=src, attention_mask=mask.long(), decoder_input_ids=tgt).logits
        got = ours(src, mask, tgt)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    # the other way: to_hf's folder loads in transformers to the same logits
    to_hf(ours, tmp_path / "hf")
    back = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path / "hf").eval()
    assert back.config.scale_decoder_outputs == (layout == "1.0")
    with torch.no_grad():
        again = back(input_ids=src, attention_mask=mask.long(), decoder_input_ids=tgt).logits
    torch.testing.assert_close(again, want, atol=ATOL, rtol=0)
    # and from_hf reads the folder back to the same tensors
    reread = from_hf(tmp_path / "hf")
    for name, t in ours.state_dict().items():
        torch.testing.assert_close(reread.state_dict()[name], t, atol=0, rtol=0)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_greedy_tokens_equal_hf_generate(layout):
    hf = build_hf(layout)
    ours = t5_from_hf(hf_config(hf), hf.state_dict())
    src, mask, _ = batch(seed=2)
    n = 8
    with torch.no_grad():
        want = hf.generate(
            input_ids=src,
            attention_mask=mask.long(),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            num_beams=1,
            eos_token_id=None,
            use_cache=False,  # transformers 5.24's cache assumes num_decoder_layers = num_layers
        )
    with torch.no_grad():
        state = ours.start_decoding(src, mask, n + 1)
        got = greedy_search(ours, state, torch.zeros(3, 1, dtype=torch.long), max_len=n)
    assert [h.ids for h in got] == want[:, 1 : n + 1].tolist()


def test_each_stack_computes_its_bias_once_with_t5_buckets():
    # the encoder's table is read with bidirectional buckets, the decoder's with causal ones,
    # each once per forward pass (not once per layer); the weights equal softmax of the
    # unscaled q·k plus that bias, computed here by hand
    model = T5(T5Config.preset("tiny", src_vocab_size=V, tgt_vocab_size=V, num_buckets=8)).eval()
    calls = {"enc": 0, "dec": 0}
    model.enc_bias.register_forward_hook(lambda *a: calls.__setitem__("enc", calls["enc"] + 1))
    model.dec_bias.register_forward_hook(lambda *a: calls.__setitem__("dec", calls["dec"] + 1))
    src, mask, tgt = batch()
    with torch.no_grad(), capture_attention(model) as maps:
        model(src, mask, tgt)
    assert calls == {"enc": 1, "dec": 1}
    rel = torch.arange(S)[None, :] - torch.arange(S)[:, None]
    buckets = relative_position_bucket(rel, bidirectional=True, num_buckets=8, max_distance=128)
    bias = model.enc_bias.weight[buckets].permute(2, 0, 1)  # (H, S, S)
    with torch.no_grad():
        x = model.src_emb(src)
        block = model.encoder[0]
        h = block.norm1(x)
        H, D = block.attn.n_heads, block.attn.head_dim
        q, k, _ = block.attn.qkv(h).split(H * D, dim=-1)
        q = q.view(3, S, H, D).transpose(1, 2)
        k = k.view(3, S, H, D).transpose(1, 2)
        scores = q @ k.transpose(-1, -2) + bias  # no 1/√D
        scores = scores.masked_fill(~mask[:, None, None, :], -math.inf)
    torch.testing.assert_close(maps["encoder.0.attn"], scores.softmax(-1), atol=1e-5, rtol=0)


def test_beam_search_and_incremental_decoding_follow_the_shared_interface():
    model = T5(T5Config.preset("tiny-v1_1", src_vocab_size=V, tgt_vocab_size=V)).eval()
    src, mask, _ = batch(seed=3)
    start = torch.zeros(3, 1, dtype=torch.long)

    def search(beam: int):
        with torch.no_grad():
            state = model.start_decoding(src, mask, 7)
            return beam_search(model, state, start, beam=beam, max_len=6, end_id=1, alpha=0.0)

    greedy, beams = search(1), search(3)
    # a wider beam never ends with a lower log-probability than greedy search
    assert all(b.logprob >= g.logprob - 1e-5 for b, g in zip(beams, greedy, strict=True))
    # incremental decoding (KV caches, the decoder's bias row by row) = one teacher-forced pass
    out = torch.tensor([[0, *(h.ids + [1] * 6)[:5]] for h in greedy])  # (3, 6)
    with torch.no_grad():
        full = model(src, mask, out)
        state = model.start_decoding(src, mask, 6)
        for t in range(6):
            step, state = model.decode_step(out[:, t : t + 1], state)
            torch.testing.assert_close(step, full[:, t], atol=1e-5, rtol=0)


def test_unsupported_t5_layouts_are_named(tmp_path):
    hf = build_hf("1.0")
    cfg = hf_config(hf)
    with pytest.raises(UserError, match="feed_forward_proj 'gated-gelu-x'"):
        t5_config_from_hf({**cfg, "feed_forward_proj": "gated-gelu-x"})
    with pytest.raises(UserError, match="activation 'mish'"):
        t5_config_from_hf({**cfg, "feed_forward_proj": "mish"})
    with pytest.raises(UserError, match="T5EncoderModel"):
        t5_config_from_hf({**cfg, "architectures": ["T5EncoderModel"]})
    sd = dict(hf.state_dict())
    sd["encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight"] = torch.zeros(8, 4)
    with pytest.raises(UserError, match="UMT5"):
        t5_from_hf(cfg, sd)
    # a folder says which checkpoint and what is wrong
    folder = tmp_path / "umt5"
    folder.mkdir()
    save_file(
        {
            k: v.contiguous()
            for k, v in sd.items()
            if "embed_tokens" not in k and k != "lm_head.weight"
        },
        folder / "model.safetensors",
    )
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UserError, match="relative_attention_bias beyond the first layer"):
        from_hf(folder)


def test_export_refuses_what_hf_t5_cannot_express():
    model = T5(T5Config.preset("tiny", src_vocab_size=V, tgt_vocab_size=V + 1))
    with pytest.raises(UserError, match="share_embeddings=True"):
        t5_to_hf(model)
    c = T5Config.preset("tiny", src_vocab_size=V, tgt_vocab_size=V, share_embeddings=True)
    with pytest.raises(UserError, match="tie_embeddings=True, scale_output=False"):
        t5_to_hf(T5(c.replace(scale_output=False)))
    with pytest.raises(UserError, match="activation='gelu'"):
        t5_to_hf(T5(c.replace(ffn="gated", activation="gelu")))


def test_config_checks_name_the_value():
    with pytest.raises(UserError, match="share_embeddings needs one vocabulary"):
        T5Config.preset("tiny", src_vocab_size=5, tgt_vocab_size=6, share_embeddings=True)
    with pytest.raises(UserError, match="num_buckets must be at least 4"):
        T5Config.preset("tiny", src_vocab_size=5, tgt_vocab_size=5, num_buckets=2)


def test_the_logit_lens_readout_is_the_models_head():
    # inspection reads the decoder's residual stream through T5's own head (d_model^-1/2 first)
    model = T5(T5Config.preset("tiny", src_vocab_size=V, tgt_vocab_size=V)).eval()
    src, mask, tgt = batch()
    seen = {}
    model.decoder[-1].register_forward_hook(lambda m, a, out: seen.__setitem__("x", out))
    with torch.no_grad():
        logits = model(src, mask, tgt)
        stack, head = readout(model)
        assert stack == "decoder" and causal_stacks(model) == {"decoder"}
        torch.testing.assert_close(head(model, seen["x"], None), logits, atol=1e-5, rtol=0)


def test_hooked_scores_are_the_unscaled_scores_the_fast_path_uses():
    # with a hook on the scores the layer takes the explicit path: T5's scale (1, not 1/√d)
    # and bias must be the same there, so an identity hook changes no logit
    hf = build_hf("1.0")
    model = t5_from_hf(hf_config(hf), hf.state_dict())
    src, mask, tgt = batch()
    seen = {}

    def keep(scores, name):
        seen[name] = scores
        return scores

    layers = [("encoder", i) for i in range(2)] + [("decoder", i) for i in range(3)]
    names = [f"{stack}.{i}.attn.hook_attn_scores" for stack, i in layers]
    with torch.no_grad():
        plain = model(src, mask, tgt)
        hooked = run_with_hooks(model, (src, mask, tgt), hooks=[(names, keep)])
        want = hf(input_ids=src, attention_mask=mask.long(), decoder_input_ids=tgt).logits
    torch.testing.assert_close(hooked, plain, atol=1e-5, rtol=0)
    torch.testing.assert_close(hooked, want, atol=ATOL, rtol=0)
    assert set(seen) == set(names)
