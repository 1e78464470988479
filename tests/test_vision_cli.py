"""Vision command line: train image / eval / classify / experiment inductive-bias, good and bad input
through ``attnlab.cli.main`` return codes, and the attention-map figures."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from attnlab.cli import main
from attnlab.config.overrides import parse_value
from attnlab.config.vision import ViTConfig
from attnlab.data.images import load_digits
from attnlab.errors import UserError
from attnlab.experiments import common
from attnlab.experiments import inductive_bias as ib
from attnlab.models.vision import VisionTransformer
from attnlab.viz.vision import (
    attention_rollout,
    cls_attention,
    overlay_attention,
    plot_vit_attention,
)

FAST = ["--steps", "3", "--batch-size", "16", "--eval-every", "3", "--warmup", "1", "--no-progress"]


@pytest.fixture(scope="module")
def vit_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "vit"
    assert (
        main(["train", "image", "--data", "digits", "--model", "vit", "--out", str(out), *FAST])
        == 0
    )
    return out


def _digit_png(path, size=8):
    x = load_digits().test[0][0, 0]
    Image.fromarray((x.numpy() * 255).astype(np.uint8)).resize((size, size)).save(path)
    return path


def test_train_eval_classify_round_trip(vit_run, tmp_path, capsys):
    for name in ("config.json", "model.safetensors", "labels.json", "metrics.jsonl"):
        assert (vit_run / name).exists(), name
    cfg = json.loads((vit_run / "config.json").read_text())
    assert cfg["kind"] == "vit" and cfg["task"]["data"] == "digits"
    capsys.readouterr()
    assert main(["eval", str(vit_run)]) == 0
    assert "accuracy" in capsys.readouterr().out
    png = _digit_png(tmp_path / "digit.png", size=20)  # resized to 8×8 on the way in
    att = tmp_path / "att.png"
    assert main(["classify", str(vit_run), str(png), "--top-k", "3", "--attention", str(att)]) == 0
    lines = [ln.split() for ln in capsys.readouterr().out.splitlines() if ln.strip()][:3]
    probs = [float(p) for _, p in lines]
    assert probs == sorted(probs, reverse=True) and all(0 <= p <= 1 for p in probs)
    assert {c for c, _ in lines} <= {str(i) for i in range(10)}
    assert Image.open(att).size[0] > 100


@pytest.mark.parametrize("model,size", [("swin", "16"), ("cnn", "8")])
def test_train_swin_and_cnn(model, size, tmp_path, capsys):
    # --image-size resizes the fixed-size sources too; eval reloads the data at that size
    out = tmp_path / model
    argv = ["train", "image", "--model", model, "--image-size", size, "--out", str(out)]
    assert main([*argv, *FAST]) == 0
    s = int(size)
    assert json.loads((out / "labels.json").read_text())["image_shape"] == [1, s, s]
    assert main(["eval", str(out), "--weights", "last"]) == 0
    assert f"{model} on digits test split" in capsys.readouterr().out
    # class-token maps are ViT-only: refused before anything is classified or printed
    png = _digit_png(tmp_path / "d.png")
    assert main(["classify", str(out), str(png), "--attention", str(tmp_path / "a.png")]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and f"this run is '{model}'" in captured.err


def test_train_on_shapes_folder(tmp_path):
    root = tmp_path / "imgs"
    for k, colour in enumerate([(255, 0, 0), (0, 0, 255)]):
        (root / f"c{k}").mkdir(parents=True)
        for i in range(5):
            arr = np.zeros((20, 20, 3), dtype=np.uint8)
            arr[2 + i : 10 + i, 3:12] = colour
            Image.fromarray(arr).save(root / f"c{k}" / f"{i}.png")
    out = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "image",
                "--data",
                "folder",
                "--data-path",
                str(root),
                "--image-size",
                "16",
                "--model",
                "cnn",
                "--out",
                str(out),
                *FAST,
            ]
        )
        == 0
    )
    assert json.loads((out / "labels.json").read_text())["classes"] == ["c0", "c1"]
    assert (
        main(
            [
                "train",
                "image",
                "--data",
                "shapes",
                "--shapes-n",
                "40",
                "--image-size",
                "16",
                "--model",
                "vit",
                "--patch-size",
                "4",
                "--out",
                str(tmp_path / "s"),
                *FAST,
            ]
        )
        == 0
    )


def _err(capsys, argv) -> str:
    assert main(argv) == 2
    return capsys.readouterr().err


def test_bad_input_exit_2_with_named_values(vit_run, tmp_path, capsys):
    out = str(tmp_path / "x")
    err = _err(
        capsys, ["train", "image", "--model", "vit", "--patch-size", "3", "--out", out, *FAST]
    )
    assert "image_size=8 is not divisible by patch_size=3" in err
    err = _err(
        capsys, ["train", "image", "--model", "swin", "--window-size", "3", "--out", out, *FAST]
    )
    assert "not divisible by window_size=3" in err
    err = _err(capsys, ["train", "image", "--data", "cifar10", "--out", out, *FAST])
    assert "--data-path" in err
    empty = tmp_path / "folder"
    (empty / "a").mkdir(parents=True)
    Image.fromarray(np.zeros((4, 4, 3), dtype=np.uint8)).save(empty / "a" / "1.png")
    (empty / "b").mkdir()
    err = _err(
        capsys,
        ["train", "image", "--data", "folder", "--data-path", str(empty), "--out", out, *FAST],
    )
    assert "b' contains no images" in err
    (empty / "b" / "2.png").write_bytes(b"\x89PNG truncated")
    err = _err(
        capsys,
        ["train", "image", "--data", "folder", "--data-path", str(empty), "--out", out, *FAST],
    )
    assert "cannot read image" in err and "2.png" in err
    # classify: unreadable file, wrong size with --no-resize, missing file
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"\x89PNG broken")
    assert "bad.png" in _err(capsys, ["classify", str(vit_run), str(bad)])
    big = _digit_png(tmp_path / "big.png", size=12)
    err = _err(capsys, ["classify", str(vit_run), str(big), "--no-resize"])
    assert "12×12" in err and "8×8" in err
    assert "nope.png" in _err(capsys, ["classify", str(vit_run), str(tmp_path / "nope.png")])
    assert "--top-k must be at least 1, got 0" in _err(
        capsys, ["classify", str(vit_run), str(big), "--top-k", "0"]
    )
    # options of another architecture and unknown presets/fields are named, not ignored
    err = _err(capsys, ["train", "image", "--model", "cnn", "--pooling", "mean", "--out", out])
    assert "--pooling applies to --model vit only" in err
    err = _err(capsys, ["train", "image", "--preset", "huge", "--out", out, *FAST])
    assert "unknown vit preset 'huge'" in err and "vit-b16" in err
    err = _err(capsys, ["train", "image", "--set", "depth=3", "--out", out, *FAST])
    assert "vit has no config field 'depth'" in err and "n_layers" in err
    assert not (tmp_path / "x").exists()


def test_model_rejects_wrong_channels_through_the_library():
    model = VisionTransformer(ViTConfig.preset("tiny"))
    with pytest.raises(UserError, match="1-channel images, got 3 channels"):
        model(torch.zeros(1, 3, 8, 8))


def test_inductive_bias_experiment_small(tmp_path, capsys):
    """A budget of 1 s: the same steps for every run (at least 10) (``--steps N`` is run by
    test_cli_properties)."""
    out = tmp_path / "ib"
    args = ["experiment", "inductive-bias", "--fractions", "0.2,0.5,1", "--max-time", "1"]
    assert main([*args, "--batch-size", "8", "--out", str(out), "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "| fraction | train images | CNN test acc | ViT test acc | DeiT test acc" in text
    result = json.loads((out / "results.json").read_text())
    steps = {r["steps"] for r in result["runs"]}
    # every run the same number of steps, at least the floor of 10 (how many more a 1 s budget
    # buys depends on the machine; the exact formula is test_inductive_bias_max_time_sizes_...)
    assert len(result["runs"]) == 9 and len(steps) == 1
    # the CNN trains first at each fraction: it is the DeiT's teacher
    assert [r["model"] for r in result["runs"][:3]] == ["cnn", "vit", "deit"]
    n_steps = steps.pop()
    assert n_steps >= 10 and result["steps"] == n_steps
    assert f"{n_steps} steps × batch 8" in text
    assert "max_time must be a positive" in _err(capsys, [*args[:2], "--max-time", "-1"])
    assert [r["fraction"] for r in result["table"]] == [0.2, 0.5, 1.0]
    n = [r["n_train"] for r in result["table"]]
    assert n[0] < n[1] < n[2]
    assert (out / "inductive_bias.png").exists() and (out / "table.md").exists()
    assert "at least three" in _err(
        capsys, ["experiment", "inductive-bias", "--fractions", "0.5,1", "--out", str(out)]
    )
    # an earlier sweep is not silently replaced
    err = _err(capsys, ["experiment", "inductive-bias", "--steps", "1", "--out", str(out)])
    assert "already holds inductive-bias results" in err and "--overwrite" in err
    # a bad model override is reported before any model is trained
    bad = tmp_path / "bad"
    err = _err(capsys, ["experiment", "inductive-bias", "--vit-set", "depth=2", "--out", str(bad)])
    assert "vit has no config field 'depth'" in err and not bad.exists()
    assert "models must include cnn with deit" in _err(
        capsys, ["experiment", "inductive-bias", "--models", "vit,deit", "--out", str(bad)]
    )
    assert "steps and batch_size must be at least 1, got 0" in _err(
        capsys, ["experiment", "inductive-bias", "--steps", "0", "--out", str(tmp_path / "z")]
    )


def test_inductive_bias_max_time_sizes_equal_steps_from_measured_speed(monkeypatch):
    """With --max-time every run gets the same steps: (1 - RESERVE) of the budget over the
    (seed, fraction) pairs, divided by the CNN's plus the ViT's measured seconds per step."""
    speeds = iter([0.01, 0.03])  # the CNN, then the ViT
    monkeypatch.setattr(common, "seconds_per_step", lambda *a, **k: next(speeds))
    now = [0.0]
    budget = common.Budget(100.0, clock=lambda: now[0])
    now[0] = 4.0  # the data took 4 s
    settings = ib.InductiveBiasSettings(max_time=100.0, seeds=[0, 1], warmup=30)
    splits = load_digits()
    models = {k: ib._build(k, splits, {}) for k in ("cnn", "vit")}
    steps, warmup = ib._steps_within_budget(settings, budget, splits, models)
    # (100 - 4 - 20) s left over 2 seeds x 4 fractions, 0.04 s per pair of steps
    assert steps == int((100 - 4 - ib.RESERVE * 100) / 8 / 0.04) == 237
    assert warmup == 30
    with pytest.raises(ValueError, match="positive number of seconds"):
        ib.InductiveBiasSettings(max_time=0)


# ----------------------------------------------------------------------------------------------
# attention maps


def _stochastic(B, H, T, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(B, H, T, T, generator=g).softmax(-1)


def test_rollout_is_the_product_of_residual_mixed_attention():
    w1, w2 = _stochastic(2, 3, 5, 0), _stochastic(2, 3, 5, 1)
    eye = torch.eye(5)

    def mix(w):
        a = 0.5 * w.mean(1) + 0.5 * eye
        return a / a.sum(-1, keepdim=True)

    expected = (mix(w2) @ mix(w1))[:, 0, 1:]
    torch.testing.assert_close(attention_rollout([w1, w2]), expected)
    # without the residual term and with one layer it is the head-averaged attention itself
    torch.testing.assert_close(attention_rollout([w1], residual=0.0), w1.mean(1)[:, 0, 1:])
    torch.testing.assert_close(cls_attention([w1, w2]), w2.mean(1)[:, 0, 1:])
    # mean pooling (no class token): the mean of all rows
    torch.testing.assert_close(cls_attention([w1], n_prefix=0), w1.mean(1).mean(1))


def test_model_attention_maps_and_overlay(tmp_path):
    model = VisionTransformer(ViTConfig.preset("tiny")).eval()
    with torch.no_grad():
        _, w = model(torch.randn(1, 1, 8, 8), need_weights=True)
    assert len(w) == 2 and w[0].shape == (1, 4, 17, 17)
    torch.testing.assert_close(w[0].sum(-1), torch.ones(1, 4, 17))
    r = attention_rollout(w)
    assert r.shape == (1, 16) and (r >= 0).all()
    overlay_attention(torch.rand(1, 8, 8), {"rollout": r[0].view(4, 4)}, tmp_path / "o.png")
    assert Image.open(tmp_path / "o.png").format == "PNG"
    with pytest.raises(ValueError, match="need_weights"):
        attention_rollout([])


def test_plot_vit_attention_maps_are_softmax_qk_of_the_last_block(tmp_path):
    """The class-token map equals softmax(QKᵀ/√d) of the last block recomputed from its weights."""
    model = VisionTransformer(ViTConfig.preset("tiny")).eval()
    block_inputs = []
    model.blocks[-1].register_forward_pre_hook(lambda m, args: block_inputs.append(args[0]))
    image = torch.rand(1, 8, 8)
    maps = plot_vit_attention(model, image, tmp_path / "att.png")
    assert Image.open(tmp_path / "att.png").format == "PNG"
    blk, (T, C, H) = model.blocks[-1], (17, 64, 4)
    with torch.no_grad():
        q, k, _ = blk.attn.qkv(blk.norm1(block_inputs[0])).split(C, dim=-1)  # (1, T, C) each
        q, k = (t.view(1, T, H, C // H).transpose(1, 2) for t in (q, k))  # (1, H, T, D)
        w = (q @ k.transpose(-1, -2) / (C // H) ** 0.5).softmax(-1)  # (1, H, T, T)
    torch.testing.assert_close(maps["cls_attention"], w.mean(1)[0, 0, 1:].view(4, 4))
    assert maps["rollout"].shape == (4, 4) and bool((maps["rollout"] >= 0).all())


# ----------------------------------------------------------------------------------------------
# --config / --set


def _losses(run) -> list[tuple[int, float]]:
    """(step, loss) of every training and validation record of metrics.jsonl."""
    out = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        for key in ("loss", "val_loss", "val_acc"):
            if key in rec:
                out.append((rec["step"], key, rec[key]))
    return out


@pytest.mark.parametrize(
    "model,sets",
    [
        ("vit", ["model.d_model=32", "n_kv_heads=2", "train.lr=3e-3", "task.train_fraction=0.5"]),
        ("swin", ["mlp_ratio=1.0", "model.drop_path=0.1", "task.augment=true"]),
        ("cnn", ["channels=[8, 16]", "dropout=0.1", "train.label_smoothing=0.1"]),
    ],
)
def test_config_from_a_run_reproduces_its_losses(model, sets, tmp_path):
    """Train a few steps with flags and --set, then again from the saved config.json alone: the
    same settings, hence exactly the same losses."""
    first, second = tmp_path / "first", tmp_path / "second"
    argv = ["train", "image", "--model", model, "--out", str(first), *FAST, "--log-every", "1"]
    assert main([*argv, *(a for s in sets for a in ("--set", s))]) == 0
    saved = json.loads((first / "config.json").read_text())
    assert (
        main(["train", "image", "--config", str(first / "config.json"), "--out", str(second)]) == 0
    )
    again = json.loads((second / "config.json").read_text())
    assert again == saved
    losses = _losses(first)
    assert len([x for x in losses if x[1] == "loss"]) == 3 and losses == _losses(second)
    # the --set values reached their sections (a key without one is a model field)
    for item in sets:
        key, _, value = item.partition("=")
        section, _, name = key.rpartition(".")
        assert saved[section or "model"][name] == parse_value(value), item


def test_config_file_flags_and_set_priority(tmp_path):
    """defaults < --config FILE < typed flags < --set; a preset named in the file is the start."""
    cfg = tmp_path / "vit.toml"
    cfg.write_text(
        '[model]\npreset = "tiny"\nd_model = 32\npooling = "mean"\n'
        "[train]\nsteps = 2\nlr = 0.01\nbatch_size = 8\n"
        '[task]\ndata = "shapes"\nshapes_n = 40\nimage_size = 16\n'
    )
    out = tmp_path / "run"
    argv = ["train", "image", "--config", str(cfg), "--out", str(out), "--no-progress"]
    assert main([*argv, "--lr", "0.02", "--patch-size", "4", "--set", "train.lr=0.03"]) == 0
    saved = json.loads((out / "config.json").read_text())
    assert saved["kind"] == "vit"
    assert (saved["model"]["d_model"], saved["model"]["pooling"]) == (32, "mean")
    assert (saved["model"]["patch_size"], saved["model"]["image_size"]) == (4, 16)
    assert (saved["train"]["steps"], saved["train"]["lr"], saved["train"]["batch_size"]) == (
        2,
        0.03,
        8,
    )
    assert (saved["task"]["data"], saved["task"]["shapes_n"]) == ("shapes", 40)


def test_config_errors_name_the_key(tmp_path, capsys):
    out = str(tmp_path / "x")
    assert "vit has no config field 'depth'" in _err(
        capsys, ["train", "image", "--set", "model.depth=3", "--out", out]
    )
    assert "unknown ImageTaskConfig field(s) ['colour']" in _err(
        capsys, ["train", "image", "--set", "task.colour=red", "--out", out]
    )
    assert "unknown section 'data'" in _err(
        capsys, ["train", "image", "--set", "data.x=1", "--out", out]
    )
    run = tmp_path / "run"
    assert main(["train", "image", "--model", "cnn", "--out", str(run), *FAST]) == 0
    err = _err(
        capsys,
        ["train", "image", "--config", str(run / "config.json"), "--model", "vit", "--out", out],
    )
    assert "--model vit" in err and "'cnn'" in err
    assert not (tmp_path / "x").exists()
    # --resume reads the run's own settings: no model or data flags needed
    assert (
        main(["train", "image", "--resume", "--steps", "4", "--out", str(run), "--no-progress"])
        == 0
    )
    assert json.loads((run / "config.json").read_text())["kind"] == "cnn"
    assert max(step for step, *_ in _losses(run)) == 4
