"""from_hf / to_hf for ViT and Swin folders, against live Hugging Face models.

The conversions themselves live in attnlab.interop.vision (tested in test_vit / test_swin); these
tests cover the folder path: config + safetensors in, the same logits out, older key names
accepted, and the exported folder read back by transformers weight for weight.
"""

from __future__ import annotations

import re

import pytest
import torch
import transformers  # test extra, pinned in pyproject
from safetensors.torch import save_file

import attnlab
from attnlab.cli import main
from attnlab.errors import UserError
from attnlab.interop import from_hf, to_hf
from test_interop_hf import randomise


def build_vit():
    cfg = transformers.ViTConfig(
        image_size=16,
        patch_size=8,
        num_channels=3,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=48,
        num_labels=5,
        attn_implementation="eager",
    )
    return randomise(transformers.ViTForImageClassification(cfg)).eval()


def build_swin():
    cfg = transformers.SwinConfig(
        image_size=16,
        patch_size=2,
        num_channels=3,
        embed_dim=8,
        depths=[2, 2],
        num_heads=[2, 4],
        window_size=4,
        mlp_ratio=2.0,
        drop_path_rate=0.0,
        num_labels=5,
        attn_implementation="eager",
    )
    return randomise(transformers.SwinForImageClassification(cfg)).eval()


def save_with_names(hf_model, path, rename):
    """Save by hand with keys renamed as older transformers releases wrote them."""
    path.mkdir()
    sd = {rename(k): v.contiguous() for k, v in hf_model.state_dict().items()}
    save_file(sd, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(hf_model.config.to_json_string())
    return sd


def old_vit_name(k: str) -> str:
    """transformers 5.24 ViT names -> the < 5.9 ones."""
    m = re.match(r"vit\.layers\.(\d+)\.(.*)", k)
    if not m:
        return k
    i, rest = m.groups()
    for new, old in (
        ("attention.q_proj.", "attention.attention.query."),
        ("attention.k_proj.", "attention.attention.key."),
        ("attention.v_proj.", "attention.attention.value."),
        ("attention.o_proj.", "attention.output.dense."),
        ("mlp.fc1.", "intermediate.dense."),
        ("mlp.fc2.", "output.dense."),
    ):
        if rest.startswith(new):
            rest = old + rest[len(new) :]
    return f"vit.encoder.layer.{i}.{rest}"


def old_swin_name(k: str) -> str:
    for new, old in (
        ("attention.q_proj.", "attention.self.query."),
        ("attention.k_proj.", "attention.self.key."),
        ("attention.v_proj.", "attention.self.value."),
        (
            "attention.relative_position_bias.relative_position_bias_table",
            "attention.self.relative_position_bias_table",
        ),
        ("attention.o_proj.", "attention.output.dense."),
        ("mlp.fc1.", "intermediate.dense."),
        ("mlp.fc2.", "output.dense."),
    ):
        k = k.replace("." + new, "." + old)
    return k


def check_vision(hf_model, src, tmp_path, auto=None):
    images = torch.randn(2, 3, 16, 16)
    model = from_hf(src)
    with torch.no_grad():
        ref = hf_model(pixel_values=images).logits
        ours = model(images)
    assert (ours - ref).abs().max().item() < 1e-4
    out = to_hf(model, tmp_path / "exported")
    back = transformers.AutoModelForImageClassification.from_pretrained(out, dtype=torch.float32)
    for k, v in hf_model.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    return model


def test_vit_save_pretrained_folder(tmp_path):
    """transformers 5.24's save_pretrained writes the older ViT names (encoder.layer.N...)."""
    hf = build_vit()
    hf.save_pretrained(tmp_path / "hf")
    model = check_vision(hf, tmp_path / "hf", tmp_path)
    assert model.kind == "vit"


def test_vit_older_and_current_key_names(tmp_path):
    hf = build_vit()
    sd = save_with_names(hf, tmp_path / "old", old_vit_name)
    assert "vit.encoder.layer.0.attention.attention.query.weight" in sd
    check_vision(hf, tmp_path / "old", tmp_path / "a")
    sd = save_with_names(hf, tmp_path / "new", lambda k: k)  # the in-memory 5.24 names
    assert "vit.layers.0.attention.q_proj.weight" in sd
    check_vision(hf, tmp_path / "new", tmp_path / "b")


def test_swin_save_pretrained_and_current_names(tmp_path):
    hf = build_swin()
    hf.save_pretrained(tmp_path / "hf")
    model = check_vision(hf, tmp_path / "hf", tmp_path / "a")
    assert model.kind == "swin"
    sd = save_with_names(hf, tmp_path / "new", lambda k: k)
    assert any(".attention.q_proj." in k for k in sd)
    check_vision(hf, tmp_path / "new", tmp_path / "b")


def test_swin_older_key_names_and_index_buffer(tmp_path):
    """< 5.9 names, plus the relative_position_index that 5.0–5.6 stored as a weight."""
    hf = build_swin()
    index_key = "swin.encoder.layers.0.blocks.0.attention.self.relative_position_index"
    block = hf.swin.encoder.layers[0].blocks[0].attention
    sd = save_with_names(hf, tmp_path / "hf", old_swin_name)
    assert "swin.encoder.layers.0.blocks.0.attention.self.query.weight" in sd

    sd[index_key] = block.relative_position_bias.relative_position_index.clone()
    save_file(sd, str(tmp_path / "hf" / "model.safetensors"), metadata={"format": "pt"})
    check_vision(hf, tmp_path / "hf", tmp_path)


def test_vision_shape_mismatch_names_tensor(tmp_path):
    hf = build_vit()
    hf.save_pretrained(tmp_path / "hf")
    cfg = (tmp_path / "hf" / "config.json").read_text()
    (tmp_path / "hf" / "config.json").write_text(
        cfg.replace('"intermediate_size": 48', '"intermediate_size": 40')
    )
    expect = r"layer\.0\.intermediate\.dense\.weight has shape \[48, 32\].*implies \[40, 32\]"
    with pytest.raises(UserError, match=expect):
        from_hf(tmp_path / "hf")


def test_convert_cli_vision_run(tmp_path):
    hf = build_swin()
    hf.save_pretrained(tmp_path / "hf")
    run = tmp_path / "run"
    assert main(["convert", "--from-hf", str(tmp_path / "hf"), "--out", str(run)]) == 0
    model, _ = attnlab.load(run)
    images = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        assert (model(images) - hf(pixel_values=images).logits).abs().max().item() < 1e-4
    out = tmp_path / "out"
    assert (
        main(["convert", "--to-hf", str(run), "--out", str(out), "--max-shard-size", "20KB"]) == 0
    )
    assert (out / "model.safetensors.index.json").exists()
    back = transformers.AutoModelForImageClassification.from_pretrained(out, dtype=torch.float32)
    for k, v in hf.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
