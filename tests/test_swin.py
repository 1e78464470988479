"""Swin: parity with Hugging Face SwinModel / SwinForImageClassification, the shifted-window mask
and relative-position index against the paper's constructions, window locality, patch merging,
presets and bad input."""

from __future__ import annotations

import pytest
import torch
import transformers  # test extra, pinned in pyproject
from safetensors.torch import load_file

from attnlab.attention import collect_aux_losses
from attnlab.config.base import BlockConfig
from attnlab.config.vision import SwinConfig
from attnlab.errors import UserError
from attnlab.interop import from_hf
from attnlab.interop.hf.vision import swin_from_hf_state_dict, swin_to_hf
from attnlab.layers.drop_path import DropPath
from attnlab.layers.position.relative import RelativePositionBias
from attnlab.models.registry import get_kind
from attnlab.models.vision.swin import (
    PatchMerging,
    SwinBlock,
    SwinTransformer,
    build_swin_block,
    shifted_window_mask,
    window_partition,
    window_reverse,
)
from test_vit import assert_exports_back, rerandomise


def _rerandomise(model: torch.nn.Module) -> None:
    rerandomise(model, norm="norm")
    # the relative-position tables are parameters, so they were re-randomised above
    assert any(n.endswith("relative_position_bias_table") for n, _ in model.named_parameters())


def _hf_swin(cls, **kw):
    # stage resolutions 16 and 8 with 4×4 windows: both stages have shifted blocks with masks
    cfg = transformers.SwinConfig(
        image_size=32,
        patch_size=2,
        num_channels=3,
        embed_dim=16,
        depths=[2, 2],
        num_heads=[2, 4],
        window_size=4,
        mlp_ratio=2.0,
        num_labels=10,
        attn_implementation="eager",
        **kw,
    )
    model = cls(cfg).eval()
    _rerandomise(model)
    return model


def test_swin_model_matches_hf_features_and_pooled_output():
    hf = _hf_swin(transformers.SwinModel, use_absolute_embeddings=True)
    ours = swin_from_hf_state_dict(hf.config.to_dict(), hf.state_dict()).eval()
    assert ours.config.absolute_positions and ours.config.num_classes == 0
    assert [b.shift for s in ours.stages for b in s.blocks] == [0, 2, 0, 2]
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        ref = hf(x)
        torch.testing.assert_close(ours.features(x), ref.last_hidden_state, atol=1e-5, rtol=0)
        torch.testing.assert_close(ours.pooled_features(x), ref.pooler_output, atol=1e-5, rtol=0)
    assert ours.features(x).shape == (2, 8 * 8, 32)


def test_swin_classifier_matches_hf_logits_and_round_trips():
    hf = _hf_swin(transformers.SwinForImageClassification)
    sd = hf.state_dict()
    ours = swin_from_hf_state_dict(hf.config.to_dict(), sd).eval()
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), hf(x).logits, atol=1e-5, rtol=0)
        ref = hf.swin(x)
        torch.testing.assert_close(ours.features(x), ref.last_hidden_state, atol=1e-5, rtol=0)
        torch.testing.assert_close(ours.pooled_features(x), ref.pooler_output, atol=1e-5, rtol=0)
    assert_exports_back(hf, swin_to_hf(ours), transformers.SwinConfig, x)


def test_swin_accepts_old_key_names_and_stored_index():
    hf = _hf_swin(transformers.SwinForImageClassification)
    renames = {
        "attention.q_proj": "attention.self.query",
        "attention.k_proj": "attention.self.key",
        "attention.v_proj": "attention.self.value",
        "attention.relative_position_bias.relative_position_bias_table": "attention.self.relative_position_bias_table",
        "attention.o_proj": "attention.output.dense",
        "mlp.fc1": "intermediate.dense",
        "mlp.fc2": "output.dense",
    }
    old = {}
    for k, v in hf.state_dict().items():
        for new, was in renames.items():
            k = k.replace(new, was)
        old[k] = v
    for name in list(old):  # transformers 5.0–5.6 stored the index as a persistent buffer
        if name.endswith("relative_position_bias_table"):
            old[name.replace("_bias_table", "_index")] = torch.zeros(16, 16, dtype=torch.long)
    ours = swin_from_hf_state_dict(hf.config.to_dict(), old).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), hf(x).logits, atol=1e-5, rtol=0)


def _paper_mask(H: int, W: int, w: int, s: int) -> torch.Tensor:
    """The Swin reference code's construction: label 9 slices, compare labels inside windows."""
    img = torch.zeros(1, H, W, 1)
    cnt = 0
    for hs in (slice(0, -w), slice(-w, -s), slice(-s, None)):
        for ws in (slice(0, -w), slice(-w, -s), slice(-s, None)):
            img[:, hs, ws, :] = cnt
            cnt += 1
    win = window_partition(img, w).squeeze(-1)  # (nW, w²)
    diff = win[:, None, :] - win[:, :, None]
    return diff == 0


@pytest.mark.parametrize("H,w,s", [(8, 4, 2), (12, 4, 2), (14, 7, 3)])
def test_shifted_window_mask_matches_the_paper_construction(H, w, s):
    mask = shifted_window_mask(H, H, w, s)
    assert torch.equal(mask, _paper_mask(H, H, w, s))
    # windows away from the wrapped bottom/right edges are unmasked; the corner one is split in 4
    assert mask[0].all()
    allowed = mask[-1].sum(-1)  # keys each query of the corner window may see
    assert set(allowed.tolist()) == {a * b for a in (w - s, s) for b in (w - s, s)}


def test_relative_position_index_formula():
    w = 3
    rpb = RelativePositionBias(w, n_heads=2)
    coords = [(r, c) for r in range(w) for c in range(w)]
    for i, (ri, ci) in enumerate(coords):
        for j, (rj, cj) in enumerate(coords):
            assert rpb.index[i, j] == (ri - rj + w - 1) * (2 * w - 1) + (ci - cj + w - 1)
    with torch.no_grad():
        rpb.table.copy_(torch.randn_like(rpb.table))
    bias = rpb.bias()
    assert bias.shape == (2, w * w, w * w)
    # same offset -> same bias
    assert torch.equal(bias[:, 0, 4], bias[:, 4, 8])  # (0,0)-(1,1) and (1,1)-(2,2)


def test_window_partition_and_reverse_are_inverse():
    x = torch.randn(2, 8, 12, 5)
    win = window_partition(x, 4)
    assert win.shape == (2 * 2 * 3, 16, 5)
    assert torch.equal(win[0], x[0, :4, :4].reshape(16, 5))  # first window, row-major
    assert torch.equal(win[1], x[0, :4, 4:8].reshape(16, 5))
    assert torch.equal(window_reverse(win, 4, 8, 12), x)


def test_patch_merging_concatenates_2x2_neighbours_in_hf_order():
    pm = PatchMerging(dim=3, resolution=4)
    x = torch.randn(1, 16, 3)
    grid = x.view(1, 4, 4, 3)
    expected_in = torch.cat(
        [grid[:, 0::2, 0::2], grid[:, 1::2, 0::2], grid[:, 0::2, 1::2], grid[:, 1::2, 1::2]], dim=-1
    ).view(1, 4, 12)
    torch.testing.assert_close(pm(x), pm.reduction(pm.norm(expected_in)))
    assert pm(x).shape == (1, 4, 6)  # H·W/4 tokens, 2C channels


def _block(shift: int) -> SwinBlock:
    cfg = BlockConfig(d_model=8, n_heads=2, ffn_hidden=16, activation="gelu")
    blk = build_swin_block(cfg, resolution=8, window_size=4, shift=shift).eval()
    with torch.no_grad():
        blk.rel_pos.table.normal_()
    return blk


def test_window_attention_is_local_and_bidirectional():
    blk = _block(shift=0)
    x = torch.randn(1, 64, 8)
    y = x.clone().view(1, 8, 8, 8)
    y[:, 7, 7] += torch.randn(8)  # last token: bottom-right window
    y = y.view(1, 64, 8)
    with torch.no_grad():
        a, b = blk(x), blk(y)
    a, b = a.view(8, 8, 8), b.view(8, 8, 8)
    # tokens of other windows are untouched ...
    assert torch.equal(a[:4], b[:4]) and torch.equal(a[:, :4], b[:, :4])
    # ... and the first token of its window (row 4, col 4) sees it: no causal mask
    assert (a[4, 4] - b[4, 4]).abs().max() > 1e-4


def test_shifted_block_connects_windows_but_not_wrapped_edges():
    blk = _block(shift=2)
    x = torch.randn(1, 64, 8)
    grid = x.clone().view(1, 8, 8, 8)
    grid[:, 3, 3] += torch.randn(8)  # a token at the corner of the top-left regular window
    with torch.no_grad():
        a, b = blk(x).view(8, 8, 8), blk(grid.view(1, 64, 8)).view(8, 8, 8)
    changed = (a - b).abs().amax(-1) > 1e-6
    # the shifted window covering rows/cols 2..5 now links it to (4, 4) across the old border
    assert changed[4, 4] and changed[2, 2]
    # the bottom-right corner is rolled next to the top-left, but the mask keeps them apart
    grid2 = x.clone().view(1, 8, 8, 8)
    grid2[:, 7, 7] += torch.randn(8)
    with torch.no_grad():
        c = blk(grid2.view(1, 64, 8)).view(8, 8, 8)
    assert torch.equal(a[0, 0], c[0, 0]) and torch.equal(a[1, 1], c[1, 1])


def test_whole_model_first_token_sees_last_pixel():
    model = SwinTransformer(SwinConfig.preset("tiny")).eval()
    # digits preset: 4×4 map of 2×2 windows (second block shifted by 1), then one 2×2 window
    assert [b.shift for s in model.stages for b in s.blocks] == [0, 1, 0, 0]
    x = torch.randn(1, 1, 8, 8)
    y = x.clone()
    y[..., -1, -1] += 1.0
    with torch.no_grad():
        assert (model.features(x)[:, 0] - model.features(y)[:, 0]).abs().max() > 1e-5


def test_swin_t_preset_is_the_paper_geometry():
    cfg = SwinConfig.preset("swin-t")
    assert cfg.stage_resolutions == [56, 28, 14, 7] and cfg.stage_dims == [96, 192, 384, 768]
    small = SwinConfig.preset("swin-t", embed_dim=8, n_heads=[1, 1, 1, 1], depths=[1, 1, 2, 1])
    model = SwinTransformer(small).eval()
    assert [b.shift for s in model.stages for b in s.blocks] == [0, 0, 0, 3, 0]  # 7×7: no shift
    with torch.no_grad():
        assert model.features(torch.randn(1, 3, 224, 224)).shape == (1, 49, 64)


@pytest.mark.parametrize("name", ["tiny", "small"])
def test_presets_forward_backward_every_parameter_gets_a_gradient(name):
    cfg = SwinConfig.preset(name)
    model = SwinTransformer(cfg)
    x = torch.randn(2, cfg.in_channels, cfg.image_size, cfg.image_size)
    out = model(x)
    assert out.shape == (2, cfg.num_classes) and torch.isfinite(out).all()
    out.square().mean().backward()
    for n, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, n
    assert SwinConfig.from_dict(cfg.to_dict()) == cfg


def test_bad_sizes_name_the_values():
    with pytest.raises(ValueError, match=r"resolution 6×6.*not divisible by window_size=4"):
        SwinConfig(image_size=12, patch_size=2, window_size=4, depths=[2], n_heads=[2])
    with pytest.raises(ValueError, match="image_size=30 is not divisible by patch_size=4"):
        SwinConfig(image_size=30, patch_size=4)
    with pytest.raises(ValueError, match="odd"):
        SwinConfig(
            image_size=12, patch_size=1, window_size=3, depths=[1, 1, 1, 1], n_heads=[1, 1, 1, 1]
        )
    model = SwinTransformer(SwinConfig.preset("tiny"))
    with pytest.raises(UserError, match=r"8×8 images, got 16×16"):
        model(torch.randn(1, 1, 16, 16))
    with pytest.raises(UserError, match="got 3 channels"):
        model(torch.randn(1, 3, 8, 8))


def test_swin_without_qkv_bias_matches_hf():
    hf = _hf_swin(transformers.SwinModel, qkv_bias=False)
    ours = swin_from_hf_state_dict(hf.config.to_dict(), hf.state_dict()).eval()
    assert ours.stages[0].blocks[0].block.attn.qkv.bias is None
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours.features(x), hf(x).last_hidden_state, atol=1e-5, rtol=0)


def test_from_hf_folder_goes_through_this_conversion(tmp_path):
    """attnlab.interop.from_hf loads Swin folders through the same key map as swin_from_hf_state_dict,
    the function the parity tests above check: the same weights, the same logits."""
    hf = _hf_swin(transformers.SwinForImageClassification)
    hf.save_pretrained(tmp_path)
    ours = from_hf(tmp_path)
    direct = swin_from_hf_state_dict(hf.config.to_dict(), load_file(tmp_path / "model.safetensors"))
    assert set(ours.state_dict()) == set(direct.state_dict())
    for name, t in direct.state_dict().items():
        assert torch.equal(ours.state_dict()[name], t), name
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), hf(x).logits, atol=1e-5, rtol=0)


def test_need_weights_are_softmax_of_qk_plus_table_and_shift_mask():
    """A shifted block's returned weights = softmax(QKᵀ/√d + B) over the windows, with the pairs
    the shift mask separates at zero; the model keeps no weights."""
    model = SwinTransformer(SwinConfig.preset("tiny")).eval()
    swin_blk = model.stages[0].blocks[1]  # 4×4 map, 2×2 windows shifted by 1
    assert swin_blk.shift == 1
    seen = {}

    def hook(module, args, kwargs):
        seen.update(h=args[0], mask=kwargs["mask"], bias=kwargs["attn_bias"])

    swin_blk.block.register_forward_pre_hook(hook, with_kwargs=True)
    x = torch.randn(2, 1, 8, 8)
    with torch.no_grad():
        logits, weights = model(x, need_weights=True)
        torch.testing.assert_close(logits, model(x))
    assert len(weights) == 4 and not hasattr(model, "attn_weights")
    blk, h = swin_blk.block, seen["h"]  # h: (B·nW, Nw, C) = (8, 4, 32)
    with torch.no_grad():
        q, k, _ = blk.attn.qkv(blk.norm1(h)).split(32, dim=-1)
        q, k = (t.view(8, 4, 2, 16).transpose(1, 2) for t in (q, k))  # (B·nW, Hh, Nw, D)
        scores = q @ k.transpose(-1, -2) / 16**0.5 + swin_blk.rel_pos.bias()
        ref = scores.masked_fill(~seen["mask"], float("-inf")).softmax(-1)
    torch.testing.assert_close(weights[1], ref, atol=1e-5, rtol=1e-5)
    assert seen["mask"].shape == (8, 1, 4, 4) and (weights[1] == 0).any()


def test_drop_path_drops_whole_images_not_windows():
    """Stochastic depth in a Swin block draws once per image for all of its windows."""
    cfg = BlockConfig(d_model=8, n_heads=2, ffn_hidden=16)
    blk = build_swin_block(cfg, resolution=8, window_size=4, shift=2, drop_path=0.5)
    assert isinstance(blk.block.drop_path, DropPath) and blk.block.drop_path.group == 4
    dp = DropPath(0.5, group=4).train()
    out = dp(torch.ones(64, 3))  # 16 images of 4 windows each
    per_image = out.view(16, 4, 3)
    assert torch.equal(per_image, per_image[:, :1].expand(16, 4, 3))  # one fate per image
    assert set(out.unique().tolist()) == {0.0, 2.0}
    model = SwinTransformer(SwinConfig.preset("tiny", drop_path=0.2))
    rates = [getattr(b.block.drop_path, "p", 0.0) for s in model.stages for b in s.blocks][1:]
    torch.testing.assert_close(torch.tensor(rates), torch.tensor([0.2 / 3, 0.4 / 3, 0.2]))


@pytest.mark.parametrize(
    "block",
    [
        dict(n_kv_heads=[1, 2], qk_norm="rmsnorm", ffn="swiglu", activation="silu"),
        dict(ffn="moe", n_experts=4, top_k=1, norm="rmsnorm", head_dim=8),
        dict(position="none", qkv_bias=False, absolute_positions=True, dropout=0.1),
    ],
)
def test_block_fields_work_for_swin(block):
    """GQA per stage, QK-norm, SwiGLU, MoE and RMSNorm come from the shared block config."""
    cfg = SwinConfig.preset("tiny", **block)
    model = SwinTransformer(cfg).train()
    for s, stage in enumerate(model.stages):
        attn = stage.blocks[0].block.attn
        assert attn.n_kv_heads == cfg.stage_block(s).n_kv_heads
    with collect_aux_losses() as aux:
        out = model(torch.randn(4, 1, 8, 8))
    assert out.shape == (4, 10) and torch.isfinite(out).all()
    assert bool(aux.losses) == (cfg.ffn == "moe")
    (out.square().mean() + aux.total()).backward()
    for n, p in model.named_parameters():
        assert p.grad is not None, n
    has_tables = any(n.endswith("rel_pos.table") for n, _ in model.named_parameters())
    assert has_tables == (cfg.position == "relative")


def test_first_release_names_and_config_keys_load():
    """First-release Swin runs: ``embed_dim`` is ``d_model``; a block's parts moved into its
    shared ``block`` and absolute positions into ``pos_embed.weight`` (the kind's upgrade)."""
    old_cfg = SwinConfig.preset("tiny", absolute_positions=True).to_dict()
    old_cfg["embed_dim"] = old_cfg.pop("d_model")
    for derived in ("n_kv_heads", "head_dim", "ffn_hidden", "ffn", "norm", "qk_norm", "position"):
        old_cfg.pop(derived)
    cfg = SwinConfig.from_dict(old_cfg)
    assert cfg == SwinConfig.preset("tiny", absolute_positions=True)
    model = SwinTransformer(cfg)
    old = {
        k.replace(".block.", ".").replace("pos_embed.weight", "pos_embed"): v
        for k, v in model.state_dict().items()
    }
    assert "stages.0.blocks.1.attn.qkv.weight" in old and "pos_embed" in old
    fresh = SwinTransformer(cfg)
    fresh.load_state_dict(get_kind("swin").upgrade(old), strict=True)
    x = torch.randn(2, 1, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(fresh.eval()(x), model.eval()(x))


def test_stage_blocks_are_checked_per_stage():
    with pytest.raises(ValueError, match=r"stage 1 \(width 64\).*n_kv_heads"):
        SwinConfig(n_heads=[2, 4], n_kv_heads=[2, 3])
    with pytest.raises(ValueError, match="mlp_ratio"):
        SwinConfig(ffn_hidden=64)
    assert SwinConfig.preset("swin-t").stage_block(3).ffn_hidden == 4 * 768
