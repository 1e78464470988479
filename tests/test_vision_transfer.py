"""Transfer between image classifiers (``attnlab train image --init-from RUN``): exactly the
weights it names are copied (the head too when the classes are the same, a fresh head when they
differ), and a run of another kind or another architecture is refused by name."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from attnlab.cli import main
from attnlab.errors import UserError
from attnlab.models.vision.factory import build_image_classifier
from attnlab.models.vision.transfer import transfer_weights

SHAPES = ["circle", "square", "triangle", "cross"]
BOTH = [f"{c} {s}" for s in SHAPES for c in ("red", "green", "blue")]


def _model(kind, classes, seed, **overrides):
    torch.manual_seed(seed)
    return build_image_classifier(kind, (3, 16, 16), classes, overrides=overrides)


def _state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("kind", ["vit", "swin", "cnn", "deit"])
def test_new_classes_copy_everything_but_the_head(kind):
    source = _model(kind, SHAPES, seed=1)
    if kind == "cnn":  # batch-norm statistics are weights too: make them differ from a fresh net
        for m in source.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-1, 1)
    target = _model(kind, BOTH, seed=2)
    fresh, theirs = _state(target), _state(source)
    report = transfer_weights(source, target, source_name="runs/pre")
    after = target.state_dict()
    heads = {k for k in after if k.startswith(("head.", "head_dist."))}
    assert heads and set(report.reinitialised) == heads
    assert set(report.copied) == set(after) - heads
    for k in report.copied:
        assert torch.equal(after[k], theirs[k]), k
    for k in heads:  # the new head is the target's own initialisation, untouched
        assert after[k].shape[0] == len(BOTH) and torch.equal(after[k], fresh[k]), k
    assert report.values == sum(after[k].numel() for k in report.copied)
    assert "4 classes there, 12 here" in report.describe()


def test_the_same_classes_copy_the_head_too():
    source, target = _model("vit", SHAPES, seed=1), _model("vit", SHAPES, seed=2)
    report = transfer_weights(source, target, source_name="runs/pre")
    assert report.reinitialised == []
    for k, v in source.state_dict().items():
        assert torch.equal(target.state_dict()[k], v), k
    # the same count in another order is other classes: a new head
    other = _model("vit", SHAPES[::-1], seed=2)
    assert transfer_weights(source, other, source_name="x").reinitialised == [
        "head.weight",
        "head.bias",
    ]


def test_another_architecture_is_refused_naming_the_field():
    source = _model("vit", SHAPES, seed=1)
    with pytest.raises(UserError, match=r"runs/pre.*patch_size 2 there, 4 here"):
        transfer_weights(source, _model("vit", SHAPES, 0, patch_size=4), source_name="runs/pre")
    with pytest.raises(UserError, match=r"runs/pre.*d_model 64 there, 32 here"):
        transfer_weights(source, _model("vit", SHAPES, 0, d_model=32), source_name="runs/pre")
    with pytest.raises(UserError, match=r"runs/pre holds a 'vit' model, this run trains a 'cnn'"):
        transfer_weights(source, _model("cnn", SHAPES, 0), source_name="runs/pre")
    target = _model("vit", SHAPES, seed=3)
    before = _state(target)
    with pytest.raises(UserError):
        transfer_weights(source, _model("vit", SHAPES, 0, n_layers=3), source_name="runs/pre")
    assert all(torch.equal(target.state_dict()[k], v) for k, v in before.items())


@pytest.mark.slow
def test_train_image_init_from(tmp_path, capsys):
    """End to end: the saved weights of a run started --init-from (trained at lr 1e-30, so they
    stay what the initialisation made them, up to 1e-30 steps of zero biases) equal the source's
    outside the head."""
    data = ["--data", "shapes", "--shapes-n", "120", "--image-size", "16", "--no-progress"]
    steps = ["--steps", "1", "--batch-size", "8", "--eval-every", "1", "--warmup", "0"]
    src, dst = tmp_path / "pre", tmp_path / "fine"
    assert main(["train", "image", *data, *steps, "--out", str(src)]) == 0
    argv = ["train", "image", *data, *steps, "--lr", "1e-30", "--shapes-label", "both"]
    assert main([*argv, "--init-from", str(src), "--out", str(dst)]) == 0
    out = capsys.readouterr().out
    assert f"initialised from {src}" in out and "a new head" in out
    theirs, mine = load_file(src / "model.safetensors"), load_file(dst / "model.safetensors")
    assert mine["head.weight"].shape[0] == 12 and theirs["head.weight"].shape[0] == 4
    body = [k for k in mine if not k.startswith("head.")]
    assert body and all(torch.allclose(mine[k], theirs[k], rtol=0, atol=1e-20) for k in body)
    assert json.loads((dst / "config.json").read_text())["task"]["init_from"] == str(src)
    # refused by name, before anything is written
    for extra, words in [
        (["--patch-size", "4"], "patch_size 2 there, 4 here"),
        (["--model", "cnn"], "holds a 'vit' model, this run trains a 'cnn'"),
    ]:
        bad = tmp_path / extra[1]
        assert main([*argv, *extra, "--init-from", str(src), "--out", str(bad)]) == 2
        err = capsys.readouterr().err
        assert str(src) in err and words in err
        assert not bad.exists()
    assert main([*argv, "--init-from", str(tmp_path / "nowhere"), "--out", str(bad)]) == 2
    assert "nowhere" in capsys.readouterr().err
