"""attnlab.interop against live Hugging Face models (transformers pinned in pyproject's test extra).

Each reference model is built offline from a tiny config, every parameter re-randomised (HF's
init zeroes biases and sets norms to 1, which would hide mapping bugs), saved to a temporary folder
and loaded with ``from_hf``. Then: logits agree on random batches (left padding included, compared
on real tokens), greedy generation of 20 tokens is token-identical, and ``to_hf`` writes a folder
that ``transformers`` loads back to the very same weights and logits.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
import torch
import transformers  # test extra, pinned in pyproject
from safetensors import safe_open
from safetensors.torch import save_file

from attnlab.decoding import generate
from attnlab.interop import from_hf, to_hf

V = 97  # vocabulary of every tiny reference model
ATOL = 1e-4


# ---- building references ------------------------------------------------------------------------


def randomise(
    model: torch.nn.Module, seed: int = 0, norms: tuple[str, ...] = ("norm", "ln_")
) -> torch.nn.Module:
    """Every parameter random: N(0, 0.05), norm weights (1-D ``weight`` parameters whose name
    holds one of ``norms``) 1 + 0.1·N(0, 1)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            is_norm = p.dim() == 1 and name.endswith("weight") and any(n in name for n in norms)
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1 + 0.1 * noise if is_norm else 0.05 * noise)
    return model


def build_hf(family: str, **overrides) -> torch.nn.Module:
    """A tiny HF causal LM with random weights, eager attention, eval mode."""
    if family == "gpt2":
        kw = dict(
            vocab_size=V,
            n_positions=64,
            n_embd=32,
            n_layer=2,
            n_head=4,
            bos_token_id=0,
            eos_token_id=0,
        )
        cfg = transformers.GPT2Config(**{**kw, **overrides}, attn_implementation="eager")
        model = transformers.GPT2LMHeadModel(cfg)
    elif family == "llama":
        kw = dict(
            vocab_size=V,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=8,
            num_key_value_heads=2,
            max_position_embeddings=64,
        )
        cfg = transformers.LlamaConfig(**{**kw, **overrides}, attn_implementation="eager")
        model = transformers.LlamaForCausalLM(cfg)
    elif family == "mixtral":
        kw = dict(
            vocab_size=V,
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_local_experts=4,
            num_experts_per_tok=2,
            max_position_embeddings=64,
        )
        cfg = transformers.MixtralConfig(**{**kw, **overrides}, attn_implementation="eager")
        model = transformers.MixtralForCausalLM(cfg)
    else:  # pragma: no cover
        raise ValueError(family)
    return randomise(model).eval()


def save_fused_mixtral(hf_model, path: Path) -> Path:
    """Write the in-memory (fused ``experts.gate_up_proj``) layout by hand, as some tools do.

    ``save_pretrained`` in transformers 5.24 writes the per-expert layout instead.
    """
    path.mkdir(parents=True)
    sd = {k: v.contiguous() for k, v in hf_model.state_dict().items()}
    assert any(k.endswith("experts.gate_up_proj") for k in sd)
    save_file(sd, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(hf_model.config.to_json_string())
    return path


# ---- comparisons --------------------------------------------------------------------------------


def batch(seed: int = 1, B: int = 3, T: int = 10, pads=(0, 3, 6)):
    """Random ids with left padding: row b has ``pads[b]`` pad slots (id 0) before its tokens."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, V, (B, T), generator=gen)
    mask = torch.ones(B, T, dtype=torch.bool)
    for b, p in enumerate(pads):
        mask[b, :p] = False
        ids[b, :p] = 0
    return ids, mask


def hf_logits(hf_model, ids, mask):
    pos = (mask.long().cumsum(-1) - 1).clamp(min=0)  # what HF generate passes for left padding
    with torch.no_grad():
        return hf_model(
            input_ids=ids, attention_mask=mask.long(), position_ids=pos, use_cache=False
        ).logits


def ours_logits(model, ids, mask):
    with torch.no_grad():
        return model(ids, attention_mask=mask)


def greedy(model, ids, mask, n, use_cache=True):
    """attnlab.generate at temperature 0 (greedy), with or without the KV cache."""
    out = generate(model, ids, n, temperature=0.0, attention_mask=mask, use_cache=use_cache)
    return out[:, ids.shape[1] :]


def hf_greedy(hf_model, ids, mask, n):
    with torch.no_grad():
        out = hf_model.generate(
            ids,
            attention_mask=mask.long(),
            max_new_tokens=n,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[:, ids.shape[1] :]


def check_family(hf_model, src: Path, tmp_path: Path, *, padding: bool = True):
    """The full contract: logits, greedy generation, and the way back to HF."""
    model = from_hf(src)
    assert not model.training
    # 1) logits on a left-padded batch (real tokens only) and on an unpadded one
    ids, mask = batch(pads=(0, 3, 6) if padding else (0, 0, 0))
    ref, ours = hf_logits(hf_model, ids, mask), ours_logits(model, ids, mask)
    assert (ours[mask] - ref[mask]).abs().max().item() < ATOL
    ids2, mask2 = batch(seed=2, B=2, T=16, pads=(0, 0))
    with torch.no_grad():
        ref2 = hf_model(input_ids=ids2, use_cache=False).logits
        ours2 = model(ids2)
    assert (ours2 - ref2).abs().max().item() < ATOL
    # 2) greedy generation, 20 new tokens, token-identical
    p_ids, p_mask = batch(seed=3, B=2, T=8, pads=(0, 3) if padding else (0, 0))
    expected = hf_greedy(hf_model, p_ids, p_mask, 20)
    assert torch.equal(greedy(model, p_ids, p_mask, 20), expected)
    assert torch.equal(greedy(model, p_ids, p_mask, 20, use_cache=False), expected)
    # 3) to_hf -> transformers loads it -> same weights and logits
    out = to_hf(model, tmp_path / "exported")
    back = transformers.AutoModelForCausalLM.from_pretrained(
        out, attn_implementation="eager", dtype=torch.float32
    ).eval()
    assert type(back) is type(hf_model)
    ref_sd, back_sd = hf_model.state_dict(), back.state_dict()
    assert set(ref_sd) == set(back_sd)
    for k in ref_sd:
        assert torch.equal(ref_sd[k], back_sd[k]), k
    assert (hf_logits(back, ids, mask)[mask] - ref[mask]).abs().max().item() < 1e-6
    return model


# ---- GPT-2 ---------------------------------------------------------------------------------------


def test_gpt2_tied_conv1d_learned_positions(tmp_path):
    hf = build_hf("gpt2")
    hf.save_pretrained(tmp_path / "hf")
    model = check_family(hf, tmp_path / "hf", tmp_path)
    assert model.lm_head.weight is model.tok_emb.weight
    # Conv1D stores (in, out): our Linear holds the transpose
    w = hf.transformer.h[0].attn.c_attn.weight
    assert torch.equal(model.blocks[0].attn.qkv.weight, w.t())
    exported = json.loads((tmp_path / "exported" / "config.json").read_text())
    assert exported["eos_token_id"] == 0 and exported["tie_word_embeddings"] is True


def test_gpt2_untied_other_width_and_eps(tmp_path):
    hf = build_hf(
        "gpt2",
        n_inner=48,
        layer_norm_epsilon=1e-3,
        activation_function="gelu",
        tie_word_embeddings=False,
    )
    hf.save_pretrained(tmp_path / "hf")
    model = check_family(hf, tmp_path / "hf", tmp_path)
    assert model.lm_head.weight is not model.tok_emb.weight
    assert model.config.norm_eps == 1e-3 and model.config.ffn_hidden == 48


# ---- Llama ---------------------------------------------------------------------------------------


def test_llama_gqa_untied_theta_sharded(tmp_path):
    """8 query heads share 2 key/value heads; θ = 50 000; weights in shards plus an index."""
    hf = build_hf("llama", rope_theta=5e4, rms_norm_eps=1e-5, tie_word_embeddings=False)
    hf.save_pretrained(tmp_path / "hf", max_shard_size="40KB")
    assert (tmp_path / "hf" / "model.safetensors.index.json").exists()
    model = check_family(hf, tmp_path / "hf", tmp_path)
    c = model.config
    assert (c.n_heads, c.n_kv_heads, c.rope_theta, c.norm_eps) == (8, 2, 5e4, 1e-5)
    assert not c.tie_embeddings


def test_llama_mqa_tied_biases_head_dim(tmp_path):
    """One key/value head (MQA), tied embeddings, attention biases without MLP biases, head_dim
    that is not hidden/heads."""
    hf = build_hf(
        "llama",
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=8,
        tie_word_embeddings=True,
        attention_bias=True,
        mlp_bias=False,
    )
    hf.save_pretrained(tmp_path / "hf")
    model = check_family(hf, tmp_path / "hf", tmp_path)
    assert (model.config.n_kv_heads, model.config.head_dim) == (1, 8)
    assert model.lm_head.weight is model.tok_emb.weight


# ---- Mixtral -------------------------------------------------------------------------------------


def test_mixtral_per_expert_layout(tmp_path):
    """save_pretrained writes block_sparse_moe.experts.N.w1/w2/w3 (the older layout)."""
    hf = build_hf("mixtral")
    hf.save_pretrained(tmp_path / "hf")

    with safe_open(str(tmp_path / "hf" / "model.safetensors"), "pt") as f:
        assert "model.layers.0.block_sparse_moe.experts.3.w1.weight" in set(f.keys())
    model = check_family(hf, tmp_path / "hf", tmp_path)
    assert (model.config.n_experts, model.config.top_k) == (4, 2)


def test_mixtral_fused_layout_top1(tmp_path):
    hf = build_hf("mixtral", num_experts_per_tok=1, num_local_experts=3, rope_theta=1e4)
    src = save_fused_mixtral(hf, tmp_path / "hf")
    model = check_family(hf, src, tmp_path)
    assert model.config.top_k == 1 and model.config.rope_theta == 1e4
    # the fused export is read back by transformers too
    fused = to_hf(model, tmp_path / "fused", moe_layout="fused")
    back = transformers.AutoModelForCausalLM.from_pretrained(fused, dtype=torch.float32)
    for k, v in hf.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k


def test_mixtral_router_renormalises_top_k():
    """The router is softmax → top-k → renormalise, as in HF's MixtralTopKRouter."""
    hf = build_hf("mixtral", num_hidden_layers=1)
    x = torch.randn(5, 32)
    with torch.no_grad():
        ref = hf.model.layers[0].mlp(x[None])[0]

    with tempfile.TemporaryDirectory() as d:
        hf.save_pretrained(d)
        model = from_hf(d)
    with torch.no_grad():
        ours = model.blocks[0].ffn(x)
    assert (ours - ref).abs().max().item() < 1e-5


def test_exported_checkpoint_sharded_index(tmp_path):
    """to_hf can shard; transformers reads the shards through the index we write."""
    hf = build_hf("llama", num_hidden_layers=1)
    hf.save_pretrained(tmp_path / "hf")
    model = from_hf(tmp_path / "hf")
    out = to_hf(model, tmp_path / "sharded", max_shard_size=30_000)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    back = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    for k, v in hf.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    again = from_hf(out)
    for k, v in model.state_dict().items():
        assert torch.equal(again.state_dict()[k], v), k


def test_dtype_option(tmp_path):
    hf = build_hf("llama", num_hidden_layers=1)
    hf.save_pretrained(tmp_path / "hf")
    model = from_hf(tmp_path / "hf", dtype="bfloat16")
    assert model.tok_emb.weight.dtype == torch.bfloat16
    # RoPE frequencies stay fp32: θ^(−2i/D) exactly, not rounded to bf16's 8-bit mantissa
    inv_freq = model.pos_emb.inv_freq  # the one RoPE module every block uses
    D = model.config.head_dim or model.config.d_model // model.config.n_heads
    expected = 1.0 / model.config.rope_theta ** (torch.arange(0, D, 2).float() / D)
    assert inv_freq.dtype == torch.float32 and torch.equal(inv_freq, expected)
    ids = torch.randint(0, V, (1, 12))
    with torch.no_grad():  # bf16 weights: the fp32 reference's logits to bf16 precision
        ref = hf(input_ids=ids).logits
        assert (model(ids).float() - ref).abs().max().item() < 0.05 * ref.abs().max().item()
    assert from_hf(tmp_path / "hf", dtype="auto").tok_emb.weight.dtype == torch.float32


def test_mixtral_sliding_window_caps_context(tmp_path):
    """Within the window, sliding-window attention is full causal attention; attnlab limits the
    context to the window, so every sequence it accepts is computed exactly."""
    hf = build_hf("mixtral", sliding_window=12)
    hf.save_pretrained(tmp_path / "hf")
    model = from_hf(tmp_path / "hf")
    assert model.config.max_seq_len == 12
    ids, mask = batch(T=12)
    assert (ours_logits(model, ids, mask)[mask] - hf_logits(hf, ids, mask)[mask]).abs().max() < ATOL
    with pytest.raises(ValueError, match="max_seq_len"):
        model(torch.zeros(1, 13, dtype=torch.long))


def test_transformers_is_the_pinned_version():
    """Key names moved between 5.x releases: the references must come from the pinned one."""
    pyproject = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    assert f'"transformers=={transformers.__version__}"' in pyproject
