"""attnlab experiment vit-data: a tiny seeded sweep trains every model on every size from
scratch, pre-trains and fine-tunes, and writes its table, JSON and plot; the reading of a gap
follows the binomial standard error; relabelled shapes keep their images."""

from __future__ import annotations

import json

import pytest
import torch

from attnlab.cli import main
from attnlab.data.images import make_shapes, relabel_shapes
from attnlab.experiments.vit_data import ViTDataSettings, meets


def test_relabelled_shapes_are_the_images_labelled_by_shape_or_colour():
    both = make_shapes(60, 8, label="both", seed=3)
    shape, colour = (
        make_shapes(60, 8, label="shape", seed=3),
        make_shapes(60, 8, label="colour", seed=3),
    )
    for mine, ref in (
        (relabel_shapes(both, "shape"), shape),
        (relabel_shapes(both, "colour"), colour),
    ):
        assert mine.classes == ref.classes
        for split in ("train", "val", "test"):
            assert torch.equal(mine.split(split)[0], ref.split(split)[0])
            assert torch.equal(mine.split(split)[1], ref.split(split)[1])
    with pytest.raises(ValueError, match="labelled 'both'"):
        relabel_shapes(shape, "colour")


def test_meets_uses_two_standard_errors():
    # 0.9 vs 0.88 on 1000 images: se = √((0.09 + 0.1056) / 1000) ≈ 0.014, 2·se ≈ 0.028
    assert meets(0.9, 0.88, 1000) == "meets"
    assert meets(0.9, 0.84, 1000) == "below"
    assert meets(0.9, 0.94, 1000) == "passes"
    assert meets(0.9, 0.88, 100_000) == "below"  # the same gap on more images is real


def test_settings_are_checked():
    with pytest.raises(ValueError, match="among the sizes"):
        ViTDataSettings(sizes=[100, 200], finetune_sizes=[150])
    with pytest.raises(ValueError, match="increasing"):
        ViTDataSettings(sizes=[200, 100])


@pytest.mark.slow
def test_tiny_sweep_writes_its_files(tmp_path, capsys):
    out = tmp_path / "vd"
    argv = ["experiment", "vit-data", "--sizes", "24,48", "--finetune-sizes", "24", "--n-val", "8"]
    argv += ["--n-test", "16", "--steps", "2", "--batch-size", "8", "--image-size", "8"]
    assert main([*argv, "--models", "vit", "--out", str(out), "--no-progress"]) == 0
    assert (
        "| train images | epochs seen | ViT test acc | ViT fine-tuned |" in capsys.readouterr().out
    )
    result = json.loads((out / "results.json").read_text())
    runs = result["runs"]
    assert sorted((r["init"], r["size"]) for r in runs) == [
        ("pretrained", 24), ("pretraining", 48), ("scratch", 24), ("scratch", 48)
    ]  # fmt: skip
    assert all(r["epochs"] == 2 * 8 / r["size"] for r in runs)  # equal steps, not epochs
    tuned = next(r for r in runs if r["init"] == "pretrained")
    assert tuned["reinitialised"] == ["head.weight", "head.bias"]  # 4 shape classes -> 12
    assert [row["size"] for row in result["table"]] == [24, 48]
    assert (out / "vit_data.png").exists() and (out / "table.md").exists()
