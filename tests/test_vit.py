"""ViT: parity with Hugging Face ViTModel / ViTForImageClassification, patch/token arithmetic,
position interpolation, bidirectional attention, presets and bad input."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import transformers  # test extra, pinned in pyproject
from safetensors.torch import load_file

from attnlab.attention import collect_aux_losses
from attnlab.config.vision import VIT_PRESETS, ViTConfig
from attnlab.errors import UserError
from attnlab.interop import from_hf
from attnlab.interop.hf.vision import vit_from_hf_state_dict, vit_to_hf
from attnlab.layers.position import sincos_2d
from attnlab.layers.position.grid import interpolate_positions
from attnlab.metrics.classification import evaluate_classifier
from attnlab.models.registry import get_kind
from attnlab.models.vision import VisionTransformer


def rerandomise(model: torch.nn.Module, norm: str = "layernorm") -> None:
    """HF's init zeroes biases (and Swin's relative-position tables) and sets norms to (1, 0):
    random values expose mapping bugs. Weights of parameters named with ``norm`` stay near 1."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if norm in name and name.endswith("weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0, 0.05)
    # every parameter is now non-constant: no zero bias or table and no unit norm weight survives
    for name, p in model.named_parameters():
        assert p.numel() == 1 or float(p.detach().std()) > 0.01, name


def assert_exports_back(hf, export: tuple[dict, dict], config_cls, x: torch.Tensor) -> None:
    """``export = (config, state dict)`` of ours holds exactly ``hf``'s tensors, and the config
    rebuilds an HF model (``config_cls``) with ``hf``'s logits on ``x``."""
    cfg, back = export
    sd = hf.state_dict()
    assert sorted(back) == sorted(sd)
    for k in sd:
        assert torch.equal(back[k], sd[k]), k
    hf2 = type(hf)(config_cls(**cfg, attn_implementation="eager")).eval()
    hf2.load_state_dict(back, strict=True)
    with torch.no_grad():
        torch.testing.assert_close(hf2(x).logits, hf(x).logits, atol=1e-6, rtol=0)


def _hf_vit(cls, **kw):
    cfg = transformers.ViTConfig(
        image_size=32,
        patch_size=8,
        num_channels=3,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        num_labels=10,
        attn_implementation="eager",
        **kw,
    )
    model = cls(cfg).eval()
    rerandomise(model)
    return model


def test_vit_model_matches_hf_features_and_pooler():
    hf = _hf_vit(transformers.ViTModel)
    ours = vit_from_hf_state_dict(hf.config.to_dict(), hf.state_dict()).eval()
    assert ours.config.num_classes == 0 and ours.config.pooler
    assert ours.config.norm_eps == hf.config.layer_norm_eps
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        ref = hf(x)
        tokens = ours.encode(x)
        torch.testing.assert_close(tokens, ref.last_hidden_state, atol=1e-5, rtol=0)
        torch.testing.assert_close(ours.pooler_output(x), ref.pooler_output, atol=1e-5, rtol=0)
        # features() = the patch tokens, pooled_features() = the class token
        torch.testing.assert_close(
            ours.features(x), ref.last_hidden_state[:, 1:], atol=1e-5, rtol=0
        )
        torch.testing.assert_close(
            ours.pooled_features(x), ref.last_hidden_state[:, 0], atol=1e-5, rtol=0
        )


def test_vit_classifier_matches_hf_logits_and_round_trips():
    hf = _hf_vit(transformers.ViTForImageClassification)
    sd = hf.state_dict()
    ours = vit_from_hf_state_dict(hf.config.to_dict(), sd).eval()
    assert ours.config.num_classes == 10
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), hf(x).logits, atol=1e-5, rtol=0)
        ref = hf.vit(x).last_hidden_state
        torch.testing.assert_close(ours.encode(x), ref, atol=1e-5, rtol=0)
    assert_exports_back(hf, vit_to_hf(ours), transformers.ViTConfig, x)


def test_vit_accepts_pre_5_9_key_names():
    hf = _hf_vit(transformers.ViTForImageClassification)
    old = {}
    renames = {
        "attention.q_proj": "attention.attention.query",
        "attention.k_proj": "attention.attention.key",
        "attention.v_proj": "attention.attention.value",
        "attention.o_proj": "attention.output.dense",
        "mlp.fc1": "intermediate.dense",
        "mlp.fc2": "output.dense",
    }
    for k, v in hf.state_dict().items():
        if k.startswith("vit.layers."):
            i, rest = k[len("vit.layers.") :].split(".", 1)
            for new, was in renames.items():
                rest = rest.replace(new, was)
            k = f"vit.encoder.layer.{i}.{rest}"
        old[k] = v
    ours = vit_from_hf_state_dict(hf.config.to_dict(), old).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), hf(x).logits, atol=1e-5, rtol=0)


def test_vit_interpolated_positions_match_hf():
    hf = _hf_vit(transformers.ViTModel)
    ours = vit_from_hf_state_dict(hf.config.to_dict(), hf.state_dict()).eval()
    x = torch.randn(1, 3, 48, 40)  # 6×5 patches instead of 4×4
    with torch.no_grad():
        ref = hf(x, interpolate_pos_encoding=True).last_hidden_state
        got = ours.encode(x, interpolate_pos_encoding=True)
    assert got.shape == (1, 1 + 6 * 5, 64)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)


def test_unknown_hf_weights_are_reported():
    hf = _hf_vit(transformers.ViTModel)
    sd = dict(hf.state_dict())
    sd["layers.0.extra.weight"] = torch.zeros(1)
    with pytest.raises(UserError, match="extra"):
        vit_from_hf_state_dict(hf.config.to_dict(), sd)
    del sd["layers.0.extra.weight"], sd["layernorm.bias"]
    with pytest.raises(UserError, match="layernorm.bias"):
        vit_from_hf_state_dict(hf.config.to_dict(), sd)


def test_token_count_is_hw_over_p_squared():
    # ViT-B/16's geometry (224, 16) with a narrow width so the test stays cheap
    cfg = ViTConfig.preset("vit-b16", d_model=32, n_layers=1, n_heads=2, ffn_hidden=32)
    assert (cfg.image_size, cfg.patch_size) == (224, 16)
    assert cfg.num_patches == 224 * 224 // 16**2 == 196
    model = VisionTransformer(cfg).eval()
    with torch.no_grad():
        assert model.features(torch.randn(1, 3, 224, 224)).shape == (1, 196, 32)
        assert model.encode(torch.randn(1, 3, 224, 224)).shape == (1, 197, 32)
    assert model.pos_embed.weight.shape == (1, 197, 32)
    # the full ViT-B/16 preset has the paper's width and ~86M parameters
    full = ViTConfig.preset("vit-b16")
    assert (full.d_model, full.n_layers, full.n_heads, full.ffn_hidden) == (768, 12, 12, 3072)


def test_patch_embedding_is_a_linear_map_of_flattened_patches():
    model = VisionTransformer(
        ViTConfig(image_size=8, patch_size=4, in_channels=3, d_model=16, n_layers=1, n_heads=2)
    )
    x = torch.randn(2, 3, 8, 8)
    # cut patches by hand, row by row: (B, Gh, P, Gw, P, C) -> (B, N, C·P·P)
    patches = x.view(2, 3, 2, 4, 2, 4).permute(0, 2, 4, 1, 3, 5).reshape(2, 4, 3 * 16)
    w = model.patch_embed.proj.weight.reshape(16, -1)
    expected = patches @ w.T + model.patch_embed.proj.bias
    torch.testing.assert_close(model.patch_embed(x), expected, atol=1e-5, rtol=1e-5)


def test_interpolating_to_the_same_size_is_the_identity():
    model = VisionTransformer(ViTConfig.preset("tiny")).eval()
    g = model.config.grid_size
    assert model.pos_embed.table((g, g)) is model.pos_embed.weight
    pos = torch.randn(1, 1 + 16, 8)
    assert interpolate_positions(pos, (4, 4), (4, 4)) is pos
    x = torch.randn(2, 1, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(model(x, interpolate_pos_encoding=True), model(x))


def test_interpolation_keeps_the_class_slot_and_resamples_the_grid():
    pos = torch.randn(1, 1 + 9, 4)
    out = interpolate_positions(pos, (3, 3), (6, 6))
    assert out.shape == (1, 1 + 36, 4)
    assert torch.equal(out[:, 0], pos[:, 0])
    grid = pos[:, 1:].reshape(1, 3, 3, 4).permute(0, 3, 1, 2)
    ref = F.interpolate(grid, size=(6, 6), mode="bicubic", align_corners=False)
    torch.testing.assert_close(out[:, 1:], ref.permute(0, 2, 3, 1).reshape(1, 36, 4))


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_no_causal_mask_first_token_sees_last_patch(pooling):
    model = VisionTransformer(ViTConfig.preset("tiny", pooling=pooling)).eval()
    x = torch.randn(1, 1, 8, 8)
    y = x.clone()
    y[..., -2:, -2:] += 1.0  # only the last patch changes
    with torch.no_grad():
        a, b = model.encode(x), model.encode(y)
        _, a_w = model(x, need_weights=True)
    assert len(a_w) == model.config.n_layers
    # token 0 (class token, or the first patch) is influenced by the last patch
    assert (a[:, 0] - b[:, 0]).abs().max() > 1e-4
    # and every query puts weight on keys after it (no upper-triangular zeros)
    for w in a_w:
        assert torch.triu(w[0], diagonal=1).sum(-1)[:, :-1].min() > 0


def test_sincos_positions_are_fixed_2d_tables():
    model = VisionTransformer(ViTConfig.preset("tiny", position="sincos"))
    assert not any(n.startswith("pos_embed") for n, _ in model.named_parameters())
    assert "pos_embed.weight" not in model.state_dict()  # fixed: nothing to store
    assert torch.equal(model.pos_embed.weight[0, 1:], sincos_2d(4, 4, 64))
    assert torch.equal(model.pos_embed.weight[0, 0], torch.zeros(64))
    with torch.no_grad():  # other sizes recompute the table rather than interpolate
        out = model.features(torch.randn(1, 1, 12, 12), interpolate_pos_encoding=True)
    assert out.shape == (1, 36, 64)


def test_mean_pooling_averages_patch_tokens():
    model = VisionTransformer(ViTConfig.preset("tiny", pooling="mean", num_classes=0)).eval()
    x = torch.randn(2, 1, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(model(x), model.features(x).mean(1))
    assert not hasattr(model, "cls_token")


@pytest.mark.parametrize("name", ["tiny", "small"])
def test_presets_forward_backward_every_parameter_gets_a_gradient(name):
    cfg = ViTConfig.preset(name)
    model = VisionTransformer(cfg)
    x = torch.randn(2, cfg.in_channels, cfg.image_size, cfg.image_size)
    out = model(x)
    assert out.shape == (2, cfg.num_classes) and torch.isfinite(out).all()
    out.square().mean().backward()
    for n, p in model.named_parameters():
        if n.startswith("pooler"):
            continue
        assert p.grad is not None and p.grad.abs().sum() > 0, n


def test_evaluate_classifier_hands_a_training_model_back_in_training_mode_even_on_error():
    model = VisionTransformer(ViTConfig.preset("tiny", num_classes=3, dropout=0.1)).train()
    seen = []
    model.register_forward_pre_hook(lambda m, args: seen.append(m.training))
    images = torch.randn(4, 1, 8, 8)
    acc, _ = evaluate_classifier(model, images, torch.tensor([0, 1, 2, 0]), batch_size=2)
    assert seen == [False, False] and 0.0 <= acc <= 1.0  # evaluated in eval mode
    assert all(m.training for m in model.modules())
    with pytest.raises(IndexError):  # label 7 of 3 classes: the loss fails inside the loop
        evaluate_classifier(model, images, torch.tensor([0, 1, 7, 0]), batch_size=2)
    assert all(m.training for m in model.modules())


def test_config_round_trip_and_unknown_preset():
    cfg = ViTConfig.preset("tiny", pooling="mean")
    assert ViTConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="vit-b16"):
        ViTConfig.preset("vit-huge")
    assert set(VIT_PRESETS) >= {"tiny", "vit-b16"}


def test_bad_input_messages_name_the_values():
    model = VisionTransformer(ViTConfig.preset("tiny"))
    with pytest.raises(UserError, match=r"8×8.*got 12×12"):
        model(torch.randn(1, 1, 12, 12))
    with pytest.raises(UserError, match="1-channel.*got 3 channels"):
        model(torch.randn(1, 3, 8, 8))
    with pytest.raises(UserError, match=r"9×9 is not divisible by 2"):
        model(torch.randn(1, 1, 9, 9), interpolate_pos_encoding=True)
    with pytest.raises(UserError, match=r"\(B, C, H, W\)"):
        model(torch.randn(1, 8, 8))
    with pytest.raises(ValueError, match="image_size=30 is not divisible by patch_size=16"):
        ViTConfig(image_size=30, patch_size=16)
    with pytest.raises(ValueError, match=r"d_model \(30\).*n_heads \(4\)"):
        ViTConfig(d_model=30, n_heads=4)


def test_vit_without_qkv_bias_and_with_tanh_gelu_matches_hf():
    hf = _hf_vit(transformers.ViTForImageClassification, qkv_bias=False, hidden_act="gelu_new")
    ours = vit_from_hf_state_dict(hf.config.to_dict(), hf.state_dict()).eval()
    assert ours.blocks[0].attn.qkv.bias is None and ours.blocks[0].attn.out_proj.bias is not None
    assert ours.config.activation == "gelu_tanh"
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), hf(x).logits, atol=1e-5, rtol=0)
    assert sorted(vit_to_hf(ours)[1]) == sorted(hf.state_dict())


def test_from_hf_folder_goes_through_this_conversion(tmp_path):
    """attnlab.interop.from_hf loads ViT folders through the same key map as vit_from_hf_state_dict,
    the function the parity tests above check: the same weights, the same logits."""
    hf = _hf_vit(transformers.ViTForImageClassification)
    hf.save_pretrained(tmp_path)
    ours = from_hf(tmp_path)  # save_pretrained writes the older key names: both rename them
    direct = vit_from_hf_state_dict(hf.config.to_dict(), load_file(tmp_path / "model.safetensors"))
    assert set(ours.state_dict()) == set(direct.state_dict())
    for name, t in direct.state_dict().items():
        assert torch.equal(ours.state_dict()[name], t), name
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), hf(x).logits, atol=1e-5, rtol=0)


def test_need_weights_are_softmax_qk_of_every_layer():
    """forward(need_weights=True) returns, per layer, softmax(QKᵀ/√d) recomputed from that
    block's own projections of its input; the model keeps no weights afterwards."""
    model = VisionTransformer(ViTConfig.preset("tiny", n_kv_heads=2)).eval()  # GQA too
    inputs = []
    for blk in model.blocks:
        blk.register_forward_pre_hook(lambda m, args: inputs.append(args[0]))
    x = torch.randn(2, 1, 8, 8)
    with torch.no_grad():
        logits, weights = model(x, need_weights=True)
        torch.testing.assert_close(logits, model(x))
    assert len(weights) == len(model.blocks) == 2 and not hasattr(model, "attn_weights")
    T, C, H, Hkv = 17, 64, 4, 2
    D = C // H
    for blk, h, w in zip(model.blocks, inputs[:2], weights, strict=True):  # the first call
        with torch.no_grad():
            q, k, _ = blk.attn.qkv(blk.norm1(h)).split([C, Hkv * D, Hkv * D], dim=-1)
            q = q.view(2, T, H, D).transpose(1, 2)  # (B, H, T, D)
            k = k.view(2, T, Hkv, D).transpose(1, 2).repeat_interleave(H // Hkv, dim=1)
            ref = (q @ k.transpose(-1, -2) / D**0.5).softmax(-1)  # (B, H, T, T)
        torch.testing.assert_close(w, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "block",
    [
        dict(n_kv_heads=1, qk_norm="rmsnorm", ffn="swiglu", activation="silu"),
        dict(ffn="moe", n_experts=4, top_k=2, norm="rmsnorm", drop_path=0.1),
        dict(position="sincos", pooling="mean", qkv_bias=False, dropout=0.1),
    ],
)
def test_block_fields_work_for_vit(block):
    """GQA, QK-norm, SwiGLU, MoE, RMSNorm and drop-path come from the shared block config."""
    model = VisionTransformer(ViTConfig.preset("tiny", **block)).train()
    blk = model.blocks[-1]
    assert blk.attn.n_kv_heads == model.config.n_kv_heads
    with collect_aux_losses() as aux:
        out = model(torch.randn(4, 1, 8, 8))
    assert out.shape == (4, 10) and torch.isfinite(out).all()
    assert bool(aux.losses) == (block.get("ffn") == "moe")  # MoE reports its balance loss
    (out.square().mean() + aux.total()).backward()
    for n, p in model.named_parameters():
        assert p.grad is not None, n


def test_first_release_weight_names_load():
    """The first release stored the learned positions as ``pos_embed``: the vit kind's upgrade
    maps them to ``pos_embed.weight``."""
    model = VisionTransformer(ViTConfig.preset("tiny"))
    old = {
        ("pos_embed" if k == "pos_embed.weight" else k): v for k, v in model.state_dict().items()
    }
    assert "pos_embed" in old
    fresh = VisionTransformer(ViTConfig.preset("tiny"))
    fresh.load_state_dict(get_kind("vit").upgrade(old), strict=True)
    assert torch.equal(fresh.pos_embed.weight, model.pos_embed.weight)


def test_first_release_config_keys_load():
    first_release = {
        "image_size": 8, "patch_size": 2, "in_channels": 1, "num_classes": 10, "d_model": 64,
        "n_layers": 2, "n_heads": 4, "ffn_hidden": 128, "activation": "gelu", "norm_eps": 1e-06,
        "qkv_bias": True, "pooling": "cls", "position": "learned", "pooler": False,
        "dropout": 0.0, "attn_dropout": 0.0, "backend": "auto", "init_std": 0.02,
        "labels": [str(i) for i in range(10)],
    }  # fmt: skip
    cfg = ViTConfig.from_dict(first_release)
    assert cfg == ViTConfig.preset("tiny", labels=first_release["labels"])
    assert (cfg.ffn, cfg.norm, cfg.n_kv_heads, cfg.drop_path) == ("mlp", "layernorm", 4, 0.0)
