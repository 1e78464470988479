"""CLI: train caption, caption (greedy, beam, attention maps), eval, and bad input."""

import json

import numpy as np
import pytest
from PIL import Image

from attnlab.cli import main
from attnlab.data.scenes import build_vocab


@pytest.fixture(scope="module")
def cap_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("cap")
    common = [
        "--steps",
        "3",
        "--batch-size",
        "16",
        "--n-train",
        "60",
        "--n-val",
        "20",
        "--eval-every",
        "3",
        "--eval-batches",
        "1",
        "--log-every",
        "1",
        "--no-progress",
        "--device",
        "cpu",
    ]
    assert (
        main(
            [
                "train",
                "caption",
                "--model",
                "transformer",
                "--encoder",
                "vit",
                "--out",
                str(root / "tr"),
            ]
            + common
        )
        == 0
    )
    assert (
        main(
            [
                "train",
                "caption",
                "--model",
                "lstm",
                "--freeze-encoder",
                "--pretrain-steps",
                "2",
                "--out",
                str(root / "lstm"),
            ]
            + common
        )
        == 0
    )
    assert main(["scene", "--out", str(root / "scenes"), "--n", "2"]) == 0
    return root


@pytest.mark.parametrize("run,beam", [("tr", "1"), ("tr", "3"), ("lstm", "2")])
def test_caption_prints_vocabulary_words(cap_run, capsys, run, beam):
    capsys.readouterr()
    assert (
        main(
            ["caption", str(cap_run / run), str(cap_run / "scenes" / "scene_0.png"), "--beam", beam]
        )
        == 0
    )
    words = capsys.readouterr().out.split()
    vocab = build_vocab()
    assert all(w in vocab.stoi for w in words) and not {"<start>", "<end>"} & set(words)


def test_attention_maps_png(cap_run, tmp_path, capsys):
    png = tmp_path / "att.png"
    assert (
        main(
            [
                "caption",
                str(cap_run / "tr"),
                str(cap_run / "scenes" / "scene_0.png"),
                "--attention",
                str(png),
            ]
        )
        == 0
    )
    assert Image.open(png).size[0] > 100
    capsys.readouterr()
    assert (
        main(
            [
                "caption",
                str(cap_run / "lstm"),
                str(cap_run / "scenes" / "scene_0.png"),
                "--attention",
                str(png),
            ]
        )
        == 2
    )
    out, err = capsys.readouterr()
    assert "Transformer captioner" in err and out == ""  # refused before captioning


def _losses(run):
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r.get("step"), r.get("loss"), r.get("val_loss")) for r in rows]


@pytest.mark.parametrize("run", ["tr", "lstm"])
def test_training_again_from_the_saved_config_reproduces_the_losses(cap_run, tmp_path, run):
    """--config with a run's own config.json (model, train and task sections, encoder
    pre-training included) trains the same model on the same batches."""
    saved = json.loads((cap_run / run / "config.json").read_text())
    out = tmp_path / "again"
    assert (
        main(
            ["train", "caption", "--config", str(cap_run / run / "config.json"), "--out", str(out)]
        )
        == 0
    )
    again = json.loads((out / "config.json").read_text())
    assert {k: again[k] for k in ("kind", "model", "task")} == {
        k: saved[k] for k in ("kind", "model", "task")
    }
    assert _losses(out) == _losses(cap_run / run) and len(_losses(out)) >= 4


def test_flags_and_set_override_the_config_file(cap_run, tmp_path):
    """defaults < --config < typed flags < --set; an undotted --set key is a model field."""
    out = tmp_path / "x"
    args = ["train", "caption", "--config", str(cap_run / "tr" / "config.json"), "--out", str(out)]
    args += ["--steps", "1", "--lr", "1e-3", "--n-train", "40", "--set", "train.lr=5e-4"]
    args += ["--set", "position=rope", "--set", "model.n_kv_heads=1", "--set", "qk_norm=rmsnorm"]
    assert main(args + ["--set", "task.scene.colour_bias=0.5"]) == 0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["train"]["steps"] == 1 and cfg["train"]["lr"] == 5e-4
    assert cfg["task"]["n_train"] == 40 and cfg["task"]["scene"]["colour_bias"] == 0.5
    m = cfg["model"]
    assert (m["position"], m["n_kv_heads"], m["qk_norm"], m["encoder"]["kind"]) == (
        "rope",
        1,
        "rmsnorm",
        "vit",
    )


def test_eval_reports_bleu_and_retrieval(cap_run, capsys):
    capsys.readouterr()
    assert main(["eval", str(cap_run / "lstm"), "--max-batches", "1", "--batch-size", "8"]) == 0
    out = capsys.readouterr().out
    assert "val: BLEU" in out and "held-out combination named" in out


def test_caption_bad_images(cap_run, tmp_path, capsys):
    big = tmp_path / "big.png"
    Image.fromarray(np.zeros((40, 40, 3), np.uint8)).save(big)
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"\x00\x01garbage")
    strict = ["--no-resize"]  # (by default another size is resized, as classify does: issue 26)
    for path, msg in ((big, "40x40"), (bad, "cannot read"), (tmp_path / "no.png", "not exist")):
        capsys.readouterr()
        assert main(["caption", str(cap_run / "tr"), str(path), *strict]) == 2
        assert msg in capsys.readouterr().err
    assert main(["caption", str(cap_run / "tr"), str(big), "--beam", "0"]) == 2
    # every image is checked before any caption is printed
    good = str(cap_run / "scenes" / "scene_0.png")
    capsys.readouterr()
    assert main(["caption", str(cap_run / "tr"), good, str(big), *strict]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "40x40" in err
    # resized, an enlarged copy of a scene gets the scene's own caption
    x8 = tmp_path / "scene_0_x8.png"
    Image.open(good).resize((256, 256), Image.NEAREST).save(x8)
    assert main(["caption", str(cap_run / "tr"), good, str(x8), str(big)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and lines[0].split(": ", 1)[1] == lines[1].split(": ", 1)[1]


@pytest.mark.parametrize(
    "name,expect",
    [
        ("caption-retrieval", ["| cnn+lstm |", "| patches+transformer |", "nearest neighbour"]),
        ("caption-features", ["| logits |", "| penultimate |", "frozen classifier"]),
    ],
)
def test_caption_experiments_print_their_tables(tmp_path, capsys, name, expect):
    capsys.readouterr()
    extra = ["--pretrain-steps", "2", "--encoder-width", "8"] if name == "caption-features" else []
    assert (
        main(
            [
                "experiment",
                name,
                "--out",
                str(tmp_path),
                "--steps",
                "2",
                "--batch-size",
                "16",
                "--n-train",
                "60",
                "--n-eval",
                "16",
                "--no-progress",
                "--device",
                "cpu",
            ]
            + extra
        )
        == 0
    )
    out = capsys.readouterr().out
    assert all(e in out for e in expect), out
    assert "Undertrained" in out  # 2 steps name nothing
    if name == "caption-features":  # the table is also written, with its colour counts
        res = json.loads((tmp_path / "results.json").read_text())
        assert "| logits |" in (tmp_path / "table.md").read_text()
        for source, row in res["rows"].items():
            test = res["colour_test"][source]
            assert test["named"] == row["named"]
            assert test["hits"] == round(row["colour_precision"] * row["named"])
        assert set(res["colour_probe"]) == {"logits", "penultimate", "majority"}
    # a second run into the same --out refuses before training anything
    assert main(["experiment", name, "--out", str(tmp_path), "--no-progress"]) == 2
    assert "--overwrite" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv,msg",
    [
        (["train", "caption", "--model", "transformer", "--features", "logits"], "arch='lstm'"),
        (["train", "caption", "--pretrain-steps", "-1"], "--pretrain-steps"),
        (["experiment", "caption-retrieval", "--beam", "0"], "beam"),
        (["experiment", "caption-features", "--n-eval", "0"], "n_eval"),
        (["train", "caption", "--set", "n_heads=5"], "n_heads"),
        (["train", "caption", "--set", "task.n_trian=5"], "n_trian"),
    ],
)
def test_bad_settings_stop_before_training(tmp_path, capsys, argv, msg):
    capsys.readouterr()
    assert main(argv + ["--out", str(tmp_path / "x"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnlab: error:") and msg in err and "Traceback" not in err
    assert not (tmp_path / "x").exists()
