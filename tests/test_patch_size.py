"""attnlab experiment patch-size: tokens per image are (H/p)², the counted FLOPs are the ViT's
written-out formula and grow as patches shrink, and a tiny seeded sweep has that structure."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from attnlab.cli import main
from attnlab.config.vision import ViTConfig
from attnlab.experiments.patch_size import PatchSizeSettings, tokens_per_image, vit_forward_flops
from attnlab.models.vision import VisionTransformer


@pytest.mark.parametrize("p", [1, 2, 4, 8])
def test_counted_forward_flops_are_the_formula(p):
    config = ViTConfig.preset("tiny", patch_size=p)
    model = VisionTransformer(config)
    with FlopCounterMode(display=False) as counter:
        model(torch.randn(3, 1, 8, 8))
    assert tokens_per_image(config) == (8 // p) ** 2
    assert counter.get_total_flops() == vit_forward_flops(config, 3)


def test_patch_size_sweep_structure(tmp_path, capsys):
    out = tmp_path / "ps"
    argv = ["experiment", "patch-size", "--patch-sizes", "4,2,8", "--steps", "2"]
    assert (
        main([*argv, "--batch-size", "8", "--warmup", "1", "--out", str(out), "--no-progress"]) == 0
    )
    assert "| patch | tokens / image |" in capsys.readouterr().out
    result = json.loads((out / "results.json").read_text())
    rows = result["table"]
    assert [r["patch_size"] for r in rows] == [2, 4, 8]
    assert [r["tokens"] for r in rows] == [16, 4, 1]  # (8/p)²
    flops = [r["train_flops"] for r in rows]
    assert flops[0] > flops[1] > flops[2] > 0  # smaller patches, more compute
    assert all(r["steps"] == 2 for r in result["runs"])  # the same budget for every patch size
    assert (out / "patch_size.png").exists() and (out / "table.md").exists()
    # a patch size that does not divide the image is named; so is a repeated one
    assert main([*argv[:2], "--patch-sizes", "3,2", "--out", str(tmp_path / "b")]) == 2
    assert "patch size 3" in capsys.readouterr().err
    with pytest.raises(ValueError, match="two distinct"):
        PatchSizeSettings(patch_sizes=[2, 2])
