"""Bad input to attnlab.interop: clear UserErrors naming the file, tensor and shapes."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from attnlab.cli import main
from attnlab.config import ModelConfig
from attnlab.errors import UserError
from attnlab.interop import SUPPORTED_ARCHITECTURES, from_hf, load_hf_tokenizer, to_hf
from attnlab.models.lm import DecoderLM
from test_interop_hf import build_hf


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama")
    build_hf("llama", num_hidden_layers=1).save_pretrained(path)
    return path


def copy_checkpoint(src, dst, *, edit_config=None, edit_weights=None):
    dst.mkdir()
    cfg = json.loads((src / "config.json").read_text())
    if edit_config:
        edit_config(cfg)
    (dst / "config.json").write_text(json.dumps(cfg))
    sd = load_file(str(src / "model.safetensors"))
    if edit_weights:
        edit_weights(sd)
    save_file(sd, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def test_missing_path_and_file_instead_of_folder(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        from_hf(tmp_path / "nope")
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"x")
    with pytest.raises(UserError, match="not a directory"):
        from_hf(f)


def test_folder_that_is_not_a_checkpoint(tmp_path):
    with pytest.raises(UserError, match="not a Hugging Face checkpoint: no config.json"):
        from_hf(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(UserError, match="not valid JSON"):
        from_hf(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"kind": "decoder_lm", "model": {}}))
    with pytest.raises(UserError, match="not a Hugging Face model config"):
        from_hf(tmp_path)


def test_unsupported_architecture_lists_supported(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({"architectures": ["BartForConditionalGeneration"], "model_type": "bart"})
    )
    with pytest.raises(
        UserError, match="unsupported Hugging Face architecture BartForConditionalGeneration"
    ) as e:
        from_hf(tmp_path)
    for arch in (
        "GPT2LMHeadModel",
        "LlamaForCausalLM",
        "MixtralForCausalLM",
        "ViTModel",
        "BertForMaskedLM",
        "T5ForConditionalGeneration",
    ):
        assert arch in str(e.value) and arch in SUPPORTED_ARCHITECTURES


def test_no_weights(tmp_path, llama_dir):
    (tmp_path / "config.json").write_text((llama_dir / "config.json").read_text())
    with pytest.raises(UserError, match="has no model.safetensors"):
        from_hf(tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(UserError, match="only safetensors"):
        from_hf(tmp_path)


def test_missing_tensor_named_with_shape(tmp_path, llama_dir):
    name = "model.layers.0.self_attn.k_proj.weight"
    bad = copy_checkpoint(llama_dir, tmp_path / "bad", edit_weights=lambda sd: sd.pop(name))
    with pytest.raises(UserError, match=r"missing tensors \(1\): " + name + r" \[16, 64\]"):
        from_hf(bad)


def test_extra_tensor_named(tmp_path, llama_dir):
    def add(sd):
        sd["model.layers.0.self_attn.q_norm.weight"] = torch.ones(8)

    bad = copy_checkpoint(llama_dir, tmp_path / "bad", edit_weights=add)
    with pytest.raises(UserError, match=r"unexpected tensors \(1\): .*q_norm\.weight"):
        from_hf(bad)


def test_shape_mismatch_names_tensor_and_both_shapes(tmp_path, llama_dir):
    def edit(cfg):
        cfg["intermediate_size"] = 80

    bad = copy_checkpoint(llama_dir, tmp_path / "bad", edit_config=edit)
    with pytest.raises(UserError) as e:
        from_hf(bad)
    msg = str(e.value)
    assert "model.layers.0.mlp.gate_proj.weight has shape [96, 64] in the file" in msg
    assert "implies [80, 64]" in msg and "nothing was loaded" in msg
    # nor written: the CLI leaves no half-made run directory behind

    assert main(["convert", "--from-hf", str(bad), "--out", str(tmp_path / "run")]) == 2
    assert not (tmp_path / "run").exists()


def test_sharded_index_pointing_at_missing_shard(tmp_path):
    build_hf("llama", num_hidden_layers=1).save_pretrained(tmp_path, max_shard_size="40KB")
    shard = sorted(tmp_path.glob("model-*.safetensors"))[0]
    shard.unlink()
    with pytest.raises(UserError, match=f"shard files that are not in .*{shard.name}"):
        from_hf(tmp_path)


def test_sharded_index_that_does_not_match_its_shards(tmp_path):
    build_hf("llama", num_hidden_layers=1).save_pretrained(tmp_path, max_shard_size="40KB")
    index_path = tmp_path / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    shard = sorted(set(index["weight_map"].values()))[0]
    index["weight_map"]["model.layers.0.mlp.extra.weight"] = shard  # held by no shard
    index_path.write_text(json.dumps(index))
    with pytest.raises(UserError, match=rf"do not hold: model.layers.0.mlp.extra.weight \({shard}"):
        from_hf(tmp_path)
    index["weight_map"] = {"model.norm.weight": 3}
    index_path.write_text(json.dumps(index))
    with pytest.raises(UserError, match="'weight_map' must map tensor names to shard file names"):
        from_hf(tmp_path)


def test_unsupported_options(tmp_path, llama_dir):
    def llama3(cfg):
        cfg["rope_parameters"] = {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}

    bad = copy_checkpoint(llama_dir, tmp_path / "a", edit_config=llama3)
    with pytest.raises(UserError, match="RoPE scaling 'llama3' is not supported"):
        from_hf(bad)

    def act(cfg):
        cfg["hidden_act"] = "gelu"

    bad = copy_checkpoint(llama_dir, tmp_path / "b", edit_config=act)
    with pytest.raises(UserError, match="hidden_act 'gelu' is not supported"):
        from_hf(bad)


def test_gpt2_checkpoint_without_prefix_and_with_mask_buffers(tmp_path):
    """Older GPT-2 files: no ``transformer.`` prefix, causal-mask buffers stored as tensors."""
    hf = build_hf("gpt2", n_layer=1)
    sd = {k.removeprefix("transformer."): v.contiguous() for k, v in hf.state_dict().items()}
    sd.pop("lm_head.weight", None)
    sd["h.0.attn.bias"] = torch.tril(torch.ones(1, 1, 64, 64))
    sd["h.0.attn.masked_bias"] = torch.tensor(-1e4)
    tmp_path.joinpath("config.json").write_text(hf.config.to_json_string())
    save_file(sd, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    model = from_hf(tmp_path)
    ids = torch.randint(0, 97, (2, 7))
    with torch.no_grad():
        assert (model(ids) - hf(input_ids=ids).logits).abs().max().item() < 1e-4


def test_to_hf_refuses_models_without_hf_counterpart(tmp_path):
    alibi = DecoderLM(ModelConfig.preset("tiny", position="alibi"))
    with pytest.raises(UserError, match="matches no supported Hugging Face architecture"):
        to_hf(alibi, tmp_path / "a")
    post = DecoderLM(ModelConfig.preset("gpt2-tiny", norm_position="post"))
    with pytest.raises(UserError, match="norm_position='post'"):
        to_hf(post, tmp_path / "b")
    with pytest.raises(UserError, match="exports attnlab DecoderLM"):
        to_hf(torch.nn.Linear(2, 2), tmp_path / "c")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_to_hf_does_not_overwrite(tmp_path):
    model = DecoderLM(ModelConfig.preset("gpt2-tiny"))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("x")
    with pytest.raises(UserError, match="not empty"):
        to_hf(model, tmp_path / "out")
    # files of the replaced checkpoint that would describe another model are removed
    (tmp_path / "out" / "tokenizer.json").write_text("{}")
    (tmp_path / "out" / "generation_config.json").write_text('{"eos_token_id": 7}')
    (tmp_path / "out" / "model-00001-of-00002.safetensors").write_bytes(b"x")
    to_hf(model, tmp_path / "out", overwrite=True)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "config.json",
        "keep.txt",
        "model.safetensors",
    ]


def test_bad_tokenizer_json(tmp_path, llama_dir):
    assert load_hf_tokenizer(llama_dir) is None
    (tmp_path / "tokenizer.json").write_text(json.dumps({"type": "char", "chars": ["a"]}))
    with pytest.raises(UserError, match="not a Hugging Face tokenizer.json"):
        load_hf_tokenizer(tmp_path)


def test_corrupted_weights_file(tmp_path, llama_dir):
    (tmp_path / "config.json").write_text((llama_dir / "config.json").read_text())
    (tmp_path / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    with pytest.raises(UserError, match="cannot read .*model.safetensors as safetensors"):
        from_hf(tmp_path)


def test_per_expert_layout_missing_expert(tmp_path):
    build_hf("mixtral", num_hidden_layers=1).save_pretrained(tmp_path / "src")
    name = "model.layers.0.block_sparse_moe.experts.2.w2.weight"
    bad = copy_checkpoint(tmp_path / "src", tmp_path / "bad", edit_weights=lambda sd: sd.pop(name))
    with pytest.raises(UserError, match=r"missing tensors \(1\): " + name + r" \[32, 48\]"):
        from_hf(bad)
