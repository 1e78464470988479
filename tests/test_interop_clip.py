"""Hugging Face ``CLIPModel`` <-> attnlab's dual encoder, against live ``transformers`` models.

The reference is built offline from a tiny ``CLIPConfig`` with every parameter re-randomised
(HF's init zeroes biases and sets LayerNorms to 1, which would hide a mapping bug). Image and text
embeddings (HF ``get_*_features``) and ``logits_per_image`` must agree within 1e-4, after
``from_hf`` of a saved folder, and a folder written by ``to_hf`` must load in
``CLIPModel.from_pretrained`` with the same tensors. Both of HF's pooling rules are covered: the
first ``eos_token_id``, and the largest id when ``eos_token_id == 2``.
"""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from attnlab.errors import UserError
from attnlab.interop import from_hf, to_hf
from attnlab.interop.hf.clip import clip_from_hf, clip_to_hf
from attnlab.models.multimodal.clip import DualEncoder

ATOL = 1e-4
V, T, S = 40, 10, 16


def randomise(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every parameter random: N(0, 0.05), norm weights 1 + 0.1·N(0, 1), logit_scale kept."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name == "logit_scale":
                p.fill_(2.0)
                continue
            noise = torch.randn(p.shape, generator=gen)
            is_norm = p.dim() == 1 and "norm" in name and name.endswith("weight")
            p.copy_(1 + 0.1 * noise if is_norm else 0.05 * noise)
    return model


def build_hf(eos: int = 3) -> transformers.CLIPModel:
    cfg = transformers.CLIPConfig(
        text_config=dict(
            vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, max_position_embeddings=T, bos_token_id=1, eos_token_id=eos,
            pad_token_id=0,
        ),
        vision_config=dict(
            hidden_size=24, intermediate_size=40, num_hidden_layers=2, num_attention_heads=3,
            image_size=S, patch_size=4,
        ),
        projection_dim=20,
    )  # fmt: skip
    torch.manual_seed(0)
    return randomise(transformers.CLIPModel(cfg)).eval()


def batch(eos: int) -> tuple[torch.Tensor, torch.Tensor]:
    """3 images and 5 texts of different lengths, right-padded after their end-of-text token
    (HF's legacy rule, eos 2, pools at the largest id: the texts end with id V - 1 there)."""
    gen = torch.Generator().manual_seed(1)
    images = torch.randn(3, 3, S, S, generator=gen)
    ids = torch.randint(4, V - 1, (5, T), generator=gen)
    end = eos if eos != 2 else V - 1
    for i, n in enumerate([3, 5, 9, 4, 6]):
        ids[i, 0], ids[i, n] = 1, end
        ids[i, n + 1 :] = 0
    return images, ids


def hf_outputs(hf, images, ids) -> tuple[torch.Tensor, ...]:
    with torch.no_grad():
        img = hf.get_image_features(pixel_values=images).pooler_output
        txt = hf.get_text_features(input_ids=ids).pooler_output
        logits = hf(input_ids=ids, pixel_values=images).logits_per_image
    return img, txt, logits


@pytest.mark.parametrize("eos", [3, 2])
def test_from_hf_matches_clip_embeddings_and_logits(tmp_path, eos):
    hf = build_hf(eos)
    hf.save_pretrained(tmp_path)
    model = from_hf(tmp_path)
    assert isinstance(model, DualEncoder)
    assert model.config.text.eos_pooling == ("argmax" if eos == 2 else "first")
    images, ids = batch(eos)
    want = hf_outputs(hf, images, ids)
    with torch.no_grad():
        got = (model.encode_image(images), model.encode_text(ids), model(images, ids))
    for name, w, g in zip(("image", "text", "logits_per_image"), want, got, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=ATOL, msg=name)


@pytest.mark.parametrize("eos", [3, 2])
def test_to_hf_loads_in_transformers_with_the_same_tensors_and_logits(tmp_path, eos):
    hf = build_hf(eos)
    model = clip_from_hf(hf.config.to_dict(), hf.state_dict())
    to_hf(model, tmp_path / "out")
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["architectures"] == ["CLIPModel"]
    assert cfg["text_config"]["hidden_act"] == cfg["vision_config"]["hidden_act"] == "quick_gelu"
    back = transformers.CLIPModel.from_pretrained(tmp_path / "out").eval()
    ref = hf.state_dict()
    for name, t in back.state_dict().items():
        torch.testing.assert_close(t, ref[name], rtol=0, atol=0, msg=name)
    images, ids = batch(eos)
    for w, g in zip(hf_outputs(hf, images, ids), hf_outputs(back, images, ids), strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=ATOL)


def test_export_refuses_what_clip_cannot_express():
    model = clip_from_hf(build_hf().config.to_dict(), build_hf().state_dict())
    bow = DualEncoder(model.config.replace(text={**model.config.text.to_dict(), "arch": "bow"}))
    with pytest.raises(UserError, match="arch='transformer'"):
        clip_to_hf(bow)
    bidir = model.config.replace(text={**model.config.text.to_dict(), "causal": False})
    with pytest.raises(UserError, match="causal=True"):
        clip_to_hf(DualEncoder(bidir))
