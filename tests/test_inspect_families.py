"""attnlab.inspect's properties in every family: hooks change no output, patching a run into
itself restores it exactly, zero-ablating a head is zeroing its slice of W_O, the last logit-lens
layer is the output, a broken causal mask is caught."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from attnlab.config.encoder import EncoderConfig
from attnlab.config.lm import ModelConfig
from attnlab.config.multimodal import CaptionConfig, VQAConfig
from attnlab.config.translation import RNNSeq2SeqConfig, Seq2SeqConfig
from attnlab.config.vision import SwinConfig, ViTConfig
from attnlab.inspect import (
    diagnose,
    find_stacks,
    hooks,
    list_hook_names,
    logit_lens,
    patch,
    run_with_cache,
    run_with_hooks,
)
from attnlab.inspect.ablation import ablate_heads
from attnlab.layers.hook import hook_name
from attnlab.models.encoder import EncoderMLM
from attnlab.models.lm import DecoderLM
from attnlab.models.multimodal.captioner import TransformerCaptioner
from attnlab.models.multimodal.vqa import TransformerVQA
from attnlab.models.rnn import AttnRNNSeq2Seq
from attnlab.models.seq2seq import Seq2SeqTransformer
from attnlab.models.vision.swin import SwinTransformer
from attnlab.models.vision.vit import VisionTransformer


def _g(seed=0):
    return torch.Generator().manual_seed(seed)


def _lm(**kw):
    cfg = ModelConfig.preset("tiny", vocab_size=40, max_seq_len=32, **kw)
    return DecoderLM(cfg), torch.randint(0, 40, (2, 9), generator=_g())


def _translation_batch():
    src = torch.randint(4, 20, (2, 7), generator=_g())
    mask = torch.arange(7)[None] < torch.tensor([7, 4])[:, None]
    return src.masked_fill(~mask, 0), mask, torch.randint(4, 20, (2, 5), generator=_g(1))


def _images(c, B=2):
    return torch.randn(B, c.in_channels, c.image_size, c.image_size, generator=_g())


def _scene_images(c, B=2):
    return torch.randn(B, 3, c.image_size, c.image_size, generator=_g())


def build(family: str):
    """``(model in eval mode, inputs)`` of a tiny model of the family."""
    torch.manual_seed(0)
    if family == "lm":
        model, x = _lm(position="learned")
    elif family == "llama":
        model, x = _lm(norm="rmsnorm", ffn="swiglu", position="rope", n_kv_heads=2, bias=False)
    elif family == "moe":
        model, x = _lm(ffn="moe", n_experts=4, top_k=2)
    elif family == "mlm":
        model = EncoderMLM(EncoderConfig.preset("tiny", vocab_size=40, max_seq_len=16))
        x = torch.randint(0, 40, (2, 9), generator=_g())
    elif family == "rnn":
        cfg = RNNSeq2SeqConfig.preset("tiny", src_vocab_size=20, tgt_vocab_size=20, dropout=0.0)
        model, x = AttnRNNSeq2Seq(cfg), _translation_batch()
    elif family == "seq2seq":
        cfg = Seq2SeqConfig.preset("tiny", src_vocab_size=20, tgt_vocab_size=20)
        model, x = Seq2SeqTransformer(cfg), _translation_batch()
    elif family == "vit":
        cfg = ViTConfig.preset("tiny")
        model, x = VisionTransformer(cfg), _images(cfg)
    elif family == "swin":
        cfg = SwinConfig.preset("tiny")
        model, x = SwinTransformer(cfg), _images(cfg)
    elif family == "captioner":
        cfg = CaptionConfig.preset("tiny", arch="transformer", vocab_size=30)
        tokens = torch.randint(4, 30, (2, 6), generator=_g())
        model, x = TransformerCaptioner(cfg), (_scene_images(cfg), tokens)
    elif family == "vqa":
        cfg = VQAConfig.preset("tiny", arch="transformer", vocab_size=30, n_answers=7)
        q = torch.randint(4, 30, (2, 6), generator=_g())
        model, x = TransformerVQA(cfg), (_scene_images(cfg), q, torch.tensor([6, 4]))
    else:
        raise AssertionError(family)
    return model.eval(), x


FAMILIES = ["lm", "llama", "moe", "mlm", "rnn", "seq2seq", "vit", "swin", "captioner", "vqa"]
ATTENTION = [f for f in FAMILIES if f != "rnn"]  # multi-head attention (heads, W_O)
LENS = ["lm", "llama", "moe", "mlm", "seq2seq", "vit", "captioner", "vqa"]
CAUSAL = ["lm", "llama", "moe", "seq2seq", "captioner"]


def _run(model, x):
    return model(*x) if isinstance(x, tuple) else model(x)


@pytest.mark.parametrize("family", FAMILIES)
def test_hooks_change_no_output(family):
    model, x = build(family)
    with torch.no_grad():
        ref = _run(model, x)
        # hook points that need no explicit path: the very same computation
        out, cache = run_with_cache(model, x, names=lambda n: "resid" in n or "embed" in n)
        assert torch.equal(out, ref)
        assert len(cache) > 0 and all("resid" in n or "embed" in n for n in cache)
        # every hook point (math attention, step-by-step norms): the same numbers
        out, cache = run_with_cache(model, x)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
        assert set(cache) == set(list_hook_names(model))
        # hooks that return None or the activation itself change nothing either
        out = run_with_hooks(model, x, hooks=[(None, lambda a, n: None)])
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_patching_the_clean_run_into_itself_restores_it_exactly(family):
    model, x = build(family)
    names = [n for n in list_hook_names(model) if "resid" in n or n.endswith("hook_z")]
    names = names or [n for n in list_hook_names(model) if n.endswith("hook_context")]  # RNN
    with torch.no_grad():
        ref = _run(model, x)
        assert torch.equal(patch(model, x, x, names), ref)


def _first_attention(model):
    stack = next(iter(find_stacks(model).values()))
    block = model.get_submodule(_module_path(model, stack.blocks[0]))
    return stack, block


def _module_path(model, hook_prefix):
    return next(p for p, _ in model.named_modules() if p and hook_name(p) == hook_prefix)


@pytest.mark.parametrize("family", ATTENTION)
def test_zero_ablating_a_head_is_zeroing_its_slice_of_w_o(family):
    model, x = build(family)
    stack, block = _first_attention(model)
    parts = [("attn", block.attn)] + ([("cross_attn", block.cross_attn)] if stack.cross else [])
    for part, attn in parts:
        h, D = attn.n_heads - 1, attn.head_dim
        with torch.no_grad():
            with ablate_heads(model, {f"{stack.blocks[0]}.{part}": [h]}):
                ablated = _run(model, x)
            w = attn.out_proj.weight
            saved = w.clone()
            w[:, h * D : (h + 1) * D] = 0
            by_hand = _run(model, x)
            w.copy_(saved)
            ref = _run(model, x)
        torch.testing.assert_close(ablated, by_hand, atol=1e-6, rtol=0)
        assert not torch.allclose(ablated, ref)  # the head mattered


@pytest.mark.parametrize("family", LENS)
def test_logit_lens_of_the_last_layer_is_the_output(family):
    model, x = build(family)
    with torch.no_grad():
        lens = logit_lens(model, x)
        ref = _run(model, x)
    stack = find_stacks(model)["decoder" if family == "seq2seq" else "blocks"]
    assert lens.shape == (len(stack) + 1, *ref.shape)
    torch.testing.assert_close(lens[-1], ref, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(lens[0], ref)


@pytest.mark.parametrize("family", ["rnn", "swin"])
def test_logit_lens_says_why_a_family_has_none(family):
    model, x = build(family)
    with pytest.raises(ValueError, match="logit lens needs one residual stream"):
        logit_lens(model, x)


def _unmask(scores, name):
    return torch.where(torch.isneginf(scores), torch.zeros_like(scores), scores)


@pytest.mark.parametrize("family", CAUSAL)
def test_the_causal_check_fails_when_the_mask_is_broken(family):
    model, x = build(family)
    causal = [s for s in find_stacks(model).values() if s.causal]
    assert causal
    heads = diagnose(model, x)
    mine = [h for h in heads if h.causal]
    assert mine and all(h.causal_leak == 0.0 for h in mine)
    assert not any("causal leak" in f for h in heads for f in h.flags)
    broken = [
        (
            lambda n, s=s: n.startswith(s.name + ".") and n.endswith(".attn.hook_attn_scores"),
            _unmask,
        )
        for s in causal
    ]
    with hooks(model, broken):
        heads = diagnose(model, x)
    leaky = [h for h in heads if h.causal]
    assert all(h.causal_leak > 0.01 for h in leaky)
    assert all(any(f.startswith("causal leak") for f in h.flags) for h in leaky)


def test_rnn_bahdanau_weights_are_hooked_once_per_step_and_diagnosed():
    model, x = build("rnn")
    src, mask, tgt = x
    with torch.no_grad():
        _, weights = model(src, mask, tgt, need_weights=True)  # (B, T, S)
        _, cache = run_with_cache(model, x, names="attention.hook_pattern")
    assert len(cache.calls("attention.hook_pattern")) == tgt.shape[1]
    torch.testing.assert_close(cache.stacked("attention.hook_pattern", 1), weights)
    (head,) = diagnose(model, x)
    assert head.attention == "additive" and head.name == "attention.head0"
    assert 0 <= head.uniformity <= 1
    # the energies are the pattern's logits
    energies = cache_energies = run_with_cache(model, x, names="attention.hook_attn_scores")[1]
    e = cache_energies.stacked("attention.hook_attn_scores", 1)
    torch.testing.assert_close(e.softmax(-1), weights)
    assert energies is cache_energies


@pytest.mark.parametrize("family", FAMILIES)
def test_docs_list_every_hook_name(family):
    doc = (Path(__file__).parent.parent / "docs" / "inspect.md").read_text(encoding="utf-8")
    model, _ = build(family)
    stacks = find_stacks(model)
    missing = []
    for name in list_hook_names(model):
        prefix, _, leaf = name.rpartition(".")
        m = next(
            (
                re.match(rf"^(?P<stack>{re.escape(st)})\.\d+(\.block)?\.(?P<rest>.+)$", name)
                for st in stacks
                if name.startswith(st + ".")
            ),
            None,
        )
        if m:
            part = m["rest"].rpartition(".")[0]
            documented = f"{{stack}}.{{i}}.{part + '.' if part else ''}" in doc and leaf in doc
            stack_doc = re.sub(r"\.\d+\.", ".{s}.", m["stack"] + ".")[:-1]  # stages.{s}.blocks
            documented = documented and f"`{stack_doc}" in doc
        else:
            documented = leaf in doc and (not prefix or f"{prefix}." in doc)
        if not documented:
            missing.append(name)
    assert not missing, f"docs/inspect.md does not list {missing}"
