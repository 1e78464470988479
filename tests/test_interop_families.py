"""Each family's key map against a real Hugging Face state dict (transformers, random weights):
every tensor is claimed, the names and shapes are exactly the attnlab model's, and the map
round-trips both state dicts exactly (theirs -> ours -> theirs, ours -> theirs -> ours)."""

from __future__ import annotations

import pytest
import torch
import transformers  # test extra, pinned in pyproject
from safetensors.torch import load_file

from attnlab.config import ModelConfig
from attnlab.errors import UserError
from attnlab.interop import from_hf, to_hf
from attnlab.interop.hf.api import FAMILIES, family_of_config
from attnlab.interop.hf.family import expected_shapes, prepare
from attnlab.interop.hf.lm import llama_keymap
from attnlab.models.lm import DecoderLM
from test_deit import build_hf_deit
from test_interop_bert import build_hf as build_bert
from test_interop_clip import build_hf as build_clip
from test_interop_hf import build_hf, randomise
from test_interop_vision import build_swin, build_vit, old_swin_name, save_with_names
from test_t5 import build_hf as build_t5


def check_keymap(hf_model: torch.nn.Module, state_dict: dict | None = None) -> None:
    """The contract of one family's key map on one Hugging Face checkpoint."""
    hf = hf_model.config.to_dict()
    sd = dict(hf_model.state_dict() if state_dict is None else state_dict)
    family = family_of_config(hf)
    model, keymap = prepare(family, hf, list(sd))
    # every tensor of theirs is claimed (to_ours refuses one that no rule, tie or ignore takes)
    ours = keymap.to_ours(sd)
    want = {n: t.shape for n, t in model.state_dict().items() if not keymap.ignored(n, "ours")}
    assert {n: t.shape for n, t in ours.items()} == want
    # theirs -> ours -> theirs: the checkpoint back, value for value (tied copies, buffers aside)
    canonical = keymap.canonical(sd)
    theirs = keymap.to_theirs(ours)
    assert set(theirs) == set(canonical)
    for current, given in canonical.items():
        assert torch.equal(theirs[current], sd[given]), given
    assert {n: tuple(t.shape) for n, t in theirs.items()} == expected_shapes(model, keymap)
    # ours -> theirs -> ours on attnlab's side, random weights
    randomise(model)
    mine = {n: t for n, t in model.state_dict().items() if not keymap.ignored(n, "ours")}
    back = keymap.to_ours(keymap.to_theirs(mine))
    assert set(back) == set(mine)
    for name, t in mine.items():
        assert torch.equal(back[name], t), name


@pytest.mark.parametrize("tied", [True, False])
def test_gpt2(tied):
    check_keymap(build_hf("gpt2", n_layer=1, tie_word_embeddings=tied))


def test_gpt2_file_without_prefix_and_with_mask_buffers():
    hf = build_hf("gpt2", n_layer=1)
    sd = {k.removeprefix("transformer."): v for k, v in hf.state_dict().items()}
    sd["h.0.attn.bias"] = torch.ones(1, 1, 64, 64)
    check_keymap(hf, sd)


@pytest.mark.parametrize("tied", [True, False])
def test_llama_gqa(tied):
    check_keymap(build_hf("llama", num_hidden_layers=1, tie_word_embeddings=tied))


def test_llama_with_attention_biases_only():
    """attnlab's one bias switch: the MLP biases HF lacks are zeros that never reach HF."""
    hf = build_hf("llama", num_hidden_layers=1, attention_bias=True, mlp_bias=False)
    hf_dict = hf.config.to_dict()
    model, keymap = prepare(family_of_config(hf_dict), hf_dict, list(hf.state_dict()))
    ours = keymap.to_ours(hf.state_dict())
    assert not ours["blocks.0.ffn.up.bias"].any() and ours["blocks.0.attn.qkv.bias"].any()
    back = keymap.to_theirs(ours)
    assert set(back) == set(hf.state_dict())  # untied: lm_head is a tensor of its own
    for name, t in back.items():
        assert torch.equal(t, hf.state_dict()[name]), name
    ours["blocks.0.ffn.up.bias"] = torch.ones_like(ours["blocks.0.ffn.up.bias"])
    with pytest.raises(UserError, match=r"blocks\.0\.ffn\.up\.bias .*not zero"):
        keymap.to_theirs(ours)


def test_mixtral_fused_layout():
    check_keymap(build_hf("mixtral", num_hidden_layers=1))


def test_mixtral_per_expert_layout(tmp_path):
    hf = build_hf("mixtral", num_hidden_layers=1)
    hf.save_pretrained(tmp_path)  # writes block_sparse_moe.experts.e.w1/w2/w3
    sd = load_file(tmp_path / "model.safetensors")
    assert "model.layers.0.block_sparse_moe.experts.3.w3.weight" in sd
    check_keymap(hf, sd)


def test_the_two_mixtral_layouts_hold_the_same_tensors():
    hf = build_hf("mixtral", num_hidden_layers=1)
    hf_dict = hf.config.to_dict()
    model, fused = prepare(family_of_config(hf_dict), hf_dict, list(hf.state_dict()))
    per_expert = llama_keymap(model.config, moe_layout="per_expert")
    sd = per_expert.to_theirs(fused.to_ours(hf.state_dict()))
    I = hf.config.intermediate_size  # noqa: E741
    w_in = hf.state_dict()["model.layers.0.mlp.experts.gate_up_proj"]  # (E, 2I, C)
    assert torch.equal(sd["model.layers.0.block_sparse_moe.experts.2.w1.weight"], w_in[2, :I])
    assert torch.equal(sd["model.layers.0.block_sparse_moe.experts.2.w3.weight"], w_in[2, I:])


@pytest.mark.parametrize("head", [True, False])
def test_vit_current_names(head):
    hf = build_vit()
    check_keymap(hf if head else hf.vit)


def test_vit_older_names_as_save_pretrained_writes_them(tmp_path):
    hf = build_vit()
    hf.save_pretrained(tmp_path)
    sd = load_file(tmp_path / "model.safetensors")
    assert "vit.encoder.layer.0.attention.attention.query.weight" in sd
    check_keymap(hf, sd)


@pytest.mark.parametrize("head", [True, False])
def test_deit_current_and_saved_names(head, tmp_path):
    hf = build_hf_deit()
    check_keymap(hf if head else hf.deit)  # DeiTForImageClassificationWithTeacher / DeiTModel
    hf.save_pretrained(tmp_path)
    check_keymap(hf, load_file(tmp_path / "model.safetensors"))  # the names save_pretrained writes


def test_swin_current_and_older_names_with_the_index_buffer(tmp_path):
    hf = build_swin()
    check_keymap(hf)
    check_keymap(hf.swin)
    sd = save_with_names(hf, tmp_path / "old", old_swin_name)
    sd["swin.encoder.layers.0.blocks.0.attention.self.relative_position_index"] = torch.zeros(
        16, 16, dtype=torch.long
    )
    check_keymap(hf, sd)


@pytest.mark.parametrize("cls", [transformers.BertForMaskedLM, transformers.BertModel])
def test_bert(cls):
    check_keymap(build_bert(cls))


@pytest.mark.parametrize("layout", ["1.0", "1.1"])
def test_t5(layout):
    hf = build_t5(layout)
    # old checkpoints carry an unused bias table in the first cross-attention: ignored
    unused = "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight"
    sd = {**hf.state_dict(), unused: torch.zeros(8, 4)}
    check_keymap(hf, sd if layout == "1.0" else None)


@pytest.mark.parametrize("eos", [3, 2])
def test_clip(eos):
    check_keymap(build_clip(eos))


def test_every_family_is_covered():
    """The tests above touch every family from_hf reads."""
    names = {f.name for f in FAMILIES}
    assert names == {"gpt2", "llama", "mixtral", "vit", "deit", "swin", "bert", "t5", "clip"}


def test_a_bias_free_gpt2_is_written_with_zero_biases(tmp_path):
    """GPT-2 always has biases: a bias-free attnlab model gets zero ones (Chain(ZeroBias,
    Transpose)) and transformers computes the same logits."""

    model = randomise(DecoderLM(ModelConfig.preset("gpt2-tiny", n_layers=1, bias=False))).eval()
    to_hf(model, tmp_path)
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path, attn_implementation="eager")
    assert not hf.transformer.h[0].attn.c_attn.bias.any() and not hf.transformer.ln_f.bias.any()
    ids = torch.randint(0, 256, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(hf.eval()(input_ids=ids).logits, model(ids), atol=1e-5, rtol=0)
        back = from_hf(tmp_path)  # read back as GPT-2 (with biases, all zero): the same function
        torch.testing.assert_close(back(ids), model(ids), atol=1e-6, rtol=0)
