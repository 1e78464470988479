"""attnlab experiment swin-cost: the counted forward FLOPs of a Swin and a ViT equal their
written-out formulas; a Swin's grow in proportion to the tokens (windows of fixed size), a ViT's
towards the square of them (global attention); a small run writes its table."""

from __future__ import annotations

import json

import pytest
import torch

from attnlab.cli import main
from attnlab.experiments.patch_size import vit_forward_flops
from attnlab.experiments.swin_cost import forward_flops, swin_forward_flops
from attnlab.models.vision.factory import build_image_classifier

CLASSES = [str(i) for i in range(10)]


def _meta(kind, side, **overrides):
    """An untrained model on the meta device: FLOPs are counted without computing anything."""
    with torch.device("meta"):
        return build_image_classifier(kind, (3, side, side), CLASSES, preset="small",
                                      overrides=overrides)  # fmt: skip


def _flops(model, side, batch=2):
    return forward_flops(model, torch.empty(batch, 3, side, side, device="meta"))


@pytest.mark.parametrize(("side", "patch"), [(16, 2), (32, 4), (64, 4), (64, 2)])
def test_counted_swin_flops_are_the_formula(side, patch):
    model = _meta("swin", side, patch_size=patch)
    assert _flops(model, side) == swin_forward_flops(model.config, 2)
    vit = _meta("vit", side, patch_size=patch)
    assert _flops(vit, side) == vit_forward_flops(vit.config, 2)


@pytest.mark.slow
def test_swin_grows_linearly_and_vit_quadratically_in_tokens():
    sides = [32, 64, 128, 256]  # tokens (side/4)²: 64 … 4,096, ×4 at every step
    swin = [_flops(_meta("swin", s, patch_size=4), s, batch=1) for s in sides]
    vit = [_flops(_meta("vit", s, patch_size=4, pooling="mean"), s, batch=1) for s in sides]
    head = 2 * 192 * 10  # Swin's head: the one term that does not grow with the tokens
    # from 64 px on every stage holds whole 4×4 windows: each step multiplies the cost by 4
    for a, b in zip(swin[1:], swin[2:]):
        assert (b - head) == 4 * (a - head)
    # the ViT: f(N) = head + b·N + c·N² with c = 4·C·layers (QKᵀ and AV); the ratio climbs to 16
    c = 4 * 128 * 6
    tokens = [(s // 4) ** 2 for s in sides]
    linear = [f - c * n * n for f, n in zip(vit, tokens)]  # what is left is linear in N
    for (n1, l1), (n2, l2) in zip(zip(tokens, linear), zip(tokens[1:], linear[1:])):
        assert (l2 - 2 * 128 * 10) == (n2 // n1) * (l1 - 2 * 128 * 10)
    # so ×4 tokens multiply the ViT's cost by more each time, towards 16, as N² takes over
    ratios = [b / a for a, b in zip(vit, vit[1:])]
    assert all(4 < r1 < r2 < 16 for r1, r2 in zip(ratios, ratios[1:]))
    share = [c * n * n / f for f, n in zip(vit, tokens)]
    assert all(a < b for a, b in zip(share, share[1:])) and share[-1] > 0.8


@pytest.mark.slow
def test_swin_cost_writes_its_table(tmp_path, capsys):
    out = tmp_path / "cost"
    argv = ["experiment", "swin-cost", "--image-sizes", "32,64", "--repeats", "1"]
    assert main([*argv, "--out", str(out), "--device", "cpu"]) == 0
    assert "| image | tokens | ViT GFLOPs |" in capsys.readouterr().out
    result = json.loads((out / "results.json").read_text())
    rows = {(r["image_size"], r["model"]): r for r in result["rows"]}
    assert set(rows) == {(32, "vit"), (32, "swin"), (64, "vit"), (64, "swin")}
    assert all(r["flops"] == r["formula_flops"] and r["seconds"] > 0 for r in rows.values())
    assert result["growth"]["swin"] == pytest.approx(4.0, rel=0.01)
    assert (out / "swin_cost.png").exists() and (out / "table.md").exists()
    # a size Swin's windows cannot tile is named
    assert main([*argv[:2], "--image-sizes", "32,48", "--out", str(tmp_path / "b")]) == 2
    assert "image size 48" in capsys.readouterr().err
