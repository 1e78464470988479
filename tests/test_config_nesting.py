"""Configs that nest: a scene model (captioner, VQA) holds its image encoder's own vision config,
and the first release's flat encoder keys still read into it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from attnlab.config import (
    CaptionConfig,
    CNNConfig,
    ConfigError,
    Seq2SeqConfig,
    ViTConfig,
    VQAConfig,
)
from attnlab.config.multimodal import scene_encoder
from attnlab.layers.block import MLP, RMSNorm, SwiGLU
from attnlab.models.multimodal.captioner import build_captioner
from attnlab.models.seq2seq import Seq2SeqTransformer

RUNS = Path(__file__).parent / "fixtures" / "release_0_1" / "runs"


@pytest.mark.parametrize("run", ["cap_lstm", "cap_transformer", "vqa_lstm", "vqa_transformer"])
def test_first_release_flat_keys_become_the_encoders_config(run):
    model = json.loads((RUNS / run / "config.json").read_text())["model"]
    cls = CaptionConfig if run.startswith("cap") else VQAConfig
    cfg = cls.from_dict(model)
    enc = cfg.encoder
    assert isinstance(enc, CNNConfig)  # every first-release scene run had the CNN encoder
    width, depth = model["encoder_width"], model["encoder_depth"]
    assert enc.channels == [width // 2] + [width] * (depth - 1) and enc.blocks == [1] * depth
    assert (enc.image_size, enc.in_channels) == (model["image_size"], 3)
    assert cls.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg  # the nested form reads


def test_the_vit_encoder_is_a_vit_config_whose_heads_and_ffn_can_be_set():
    cfg = CaptionConfig.preset("tiny", arch="transformer", encoder="vit", vocab_size=20)
    enc = cfg.encoder
    assert isinstance(enc, ViTConfig)  # the first release's: heads 4 (width 16), FFN 2·width
    assert (enc.d_model, enc.n_layers, enc.n_heads, enc.ffn_hidden) == (16, 3, 4, 32)
    assert cfg.to_dict()["encoder"]["kind"] == "vit"
    wider = CaptionConfig.from_dict(
        {"arch": "transformer", "vocab_size": 20, "encoder": {"kind": "vit", "n_heads": 2}}
    )
    assert (wider.encoder.n_heads, wider.encoder.head_dim) == (2, 16)


def test_flat_and_nested_descriptions_build_the_same_captioner():
    flat = {"arch": "transformer", "vocab_size": 20, "encoder": "vit", "encoder_width": 16}
    nested = {
        "arch": "transformer",
        "vocab_size": 20,
        "encoder": {"kind": "vit", **scene_encoder("vit", 16).to_dict()},
    }
    models = []
    for d in (flat, nested):
        torch.manual_seed(0)
        models.append(build_captioner(CaptionConfig.from_dict(d)).eval())
    x, t = torch.rand(2, 3, 32, 32), torch.randint(4, 20, (2, 5))
    torch.testing.assert_close(models[0](x, t), models[1](x, t), rtol=0, atol=0)


def test_the_encoder_follows_the_scenes_image_size():
    cfg = CaptionConfig.from_dict({"vocab_size": 20, "image_size": 48})
    assert cfg.encoder.image_size == 48
    cfg = CaptionConfig.from_dict({**cfg.to_dict(), "image_size": 64})
    assert cfg.encoder.image_size == 64


@pytest.mark.parametrize(
    "encoder, match",
    [("resnet", "unknown encoder 'resnet'"), ({"n_heads": 2}, "needs kind"), (3, "'cnn', 'vit'")],
)
def test_a_bad_encoder_says_what_is_wrong(encoder, match):
    with pytest.raises(ConfigError, match=match):
        CaptionConfig.from_dict({"vocab_size": 20, "encoder": encoder})


# -- seq2seq: one block config per stack ------------------------------------------------------


def test_seq2seq_stacks_can_have_their_own_block_config():
    cfg = Seq2SeqConfig.preset(
        "tiny", src_vocab_size=30, tgt_vocab_size=40, decoder={"ffn": "swiglu", "norm": "rmsnorm"}
    )
    assert cfg.encoder is None and cfg.encoder_block == cfg.block  # the shared fields
    assert (cfg.decoder.ffn, cfg.decoder.n_heads, cfg.decoder.norm_position) == (
        "swiglu",
        4,
        "post",
    )
    model = Seq2SeqTransformer(cfg)
    assert all(isinstance(b.ffn, MLP) for b in model.encoder)
    assert all(isinstance(b.ffn, SwiGLU) and isinstance(b.norm1, RMSNorm) for b in model.decoder)
    assert Seq2SeqConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_a_first_release_seq2seq_config_has_no_stack_of_its_own():
    model = json.loads((RUNS / "tr_transformer" / "config.json").read_text())["model"]
    cfg = Seq2SeqConfig.from_dict(model)
    assert cfg.encoder is None and cfg.decoder is None
    assert cfg.encoder_block == cfg.decoder_block == cfg.block


@pytest.mark.parametrize("field, value", [("d_model", 32), ("position", "rope")])
def test_the_stacks_share_width_and_positions(field, value):
    with pytest.raises(ConfigError, match=f"decoder.{field}"):
        Seq2SeqConfig.from_dict({"decoder": {field: value}})
