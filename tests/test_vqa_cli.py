"""CLI: attnlab scene, train vqa, ask (unknown words, bad images), eval, and exit codes."""

import json
import shutil

import numpy as np
import pytest
from PIL import Image

from attnlab.cli import main
from attnlab.data.scenes import COLOURS, answer_list


@pytest.fixture(scope="module")
def vqa_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("vqa")
    rc = main(
        [
            "train",
            "vqa",
            "--model",
            "lstm-product",
            "--out",
            str(root / "run"),
            "--steps",
            "4",
            "--batch-size",
            "16",
            "--n-train",
            "60",
            "--n-val",
            "20",
            "--eval-every",
            "4",
            "--eval-batches",
            "1",
            "--log-every",
            "1",
            "--no-progress",
            "--device",
            "cpu",
        ]
    )
    assert rc == 0
    assert main(["scene", "--out", str(root / "scenes"), "--n", "2", "--seed", "3"]) == 0
    return root


def test_scene_writes_image_captions_and_answers(vqa_run):
    img = np.asarray(Image.open(vqa_run / "scenes" / "scene_1.png"))
    assert img.shape == (32, 32, 3)
    info = json.loads((vqa_run / "scenes" / "scene_1.json").read_text())
    assert info["captions"] and info["questions"] and info["objects"]

    for o in info["objects"]:  # the saved PNG shows each listed object in its colour
        assert tuple(img[int(o["y"]), int(o["x"])]) == COLOURS[o["colour"]]


def test_ask_answers_from_the_answer_list(vqa_run, capsys):
    capsys.readouterr()
    rc = main(
        [
            "ask",
            str(vqa_run / "run"),
            str(vqa_run / "scenes" / "scene_0.png"),
            "What colour is the circle?",
        ]
    )
    out, err = capsys.readouterr()
    assert rc == 0 and out.strip() in answer_list() and "unknown" not in err


def test_unknown_words_get_a_notice_not_a_crash(vqa_run, capsys):
    capsys.readouterr()
    rc = main(
        [
            "ask",
            str(vqa_run / "run"),
            str(vqa_run / "scenes" / "scene_0.png"),
            "what colour is the zebra's hat?",
        ]
    )
    out, err = capsys.readouterr()
    assert rc == 0 and out.strip()
    assert "unknown word" in err and "'zebra'" in err and "'hat'" in err


@pytest.mark.parametrize(
    "case", ["missing", "not-an-image", "a-directory", "wrong-size", "not-a-run", "empty", "top"]
)
def test_bad_input_exits_nonzero_with_a_clear_message(vqa_run, tmp_path, capsys, case):
    run, image, question = str(vqa_run / "run"), str(vqa_run / "scenes" / "scene_0.png"), "why?"
    expect = {
        "missing": "does not exist",
        "not-an-image": "cannot read",
        "wrong-size": "64x64",  # (with --no-resize: by default it is resized, issue 26)
        "a-directory": "not an image file",
        "not-a-run": "run directory",
        "empty": "empty",
        "top": "--top",
    }[case]
    extra = {"top": ["--top", "0"], "wrong-size": ["--no-resize"]}.get(case, [])
    if case == "missing":
        image = str(tmp_path / "nope.png")
    elif case == "not-an-image":
        image = str(tmp_path / "text.png")
        (tmp_path / "text.png").write_text("hello")
    elif case == "wrong-size":
        image = str(tmp_path / "big.png")
        Image.fromarray(np.zeros((64, 64, 3), np.uint8)).save(image)
    elif case == "a-directory":
        image = str(tmp_path)
    elif case == "not-a-run":
        run = str(tmp_path)
    elif case == "empty":
        question = "  "
    capsys.readouterr()
    assert main(["ask", run, image, question, *extra]) == 2
    assert expect in capsys.readouterr().err


def test_scene_out_must_be_a_directory(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    assert main(["scene", "--out", str(tmp_path / "file")]) == 2
    assert "not a directory" in capsys.readouterr().err


def test_eval_reports_accuracy_and_baselines(vqa_run, capsys):
    capsys.readouterr()
    assert main(["eval", str(vqa_run / "run"), "--max-batches", "1", "--batch-size", "14"]) == 0
    out = capsys.readouterr().out
    assert "val: accuracy" in out and "unseen: accuracy" in out and "majority per question" in out


def test_ask_refuses_a_captioning_run(vqa_run, tmp_path, capsys):
    cfg = json.loads((vqa_run / "run" / "config.json").read_text())
    cfg["kind"] = "caption_lstm"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert main(["ask", str(tmp_path), str(vqa_run / "scenes" / "scene_0.png"), "why"]) == 2
    err = capsys.readouterr().err
    assert "'caption_lstm'" in err and "vqa_lstm" in err  # what it holds, what is needed


def _losses(run):
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r.get("step"), r.get("loss"), r.get("val_loss")) for r in rows]


def test_training_again_from_the_saved_config_reproduces_the_losses(vqa_run, tmp_path):
    out = tmp_path / "again"
    saved = vqa_run / "run" / "config.json"
    assert main(["train", "vqa", "--config", str(saved), "--out", str(out)]) == 0
    again = json.loads((out / "config.json").read_text())
    assert again["model"] == json.loads(saved.read_text())["model"]
    assert _losses(out) == _losses(vqa_run / "run") and len(_losses(out)) >= 4


def test_resume_reads_the_runs_own_settings(vqa_run, tmp_path):
    """--resume continues with the run's config.json: the data and model flags need not be
    typed again (their defaults differ from what the run was trained with)."""
    run = tmp_path / "run"
    shutil.copytree(vqa_run / "run", run)
    assert main(["train", "vqa", "--out", str(run), "--resume", "--steps", "5"]) == 0
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["train"]["steps"] == 5 and cfg["task"]["n_train"] == 60
    assert cfg["model"]["fusion"] == "product"
    assert [r["step"] for r in map(json.loads, (run / "metrics.jsonl").open()) if "loss" in r][
        -1
    ] == 5


def test_model_flag_is_two_model_fields_below_set(vqa_run, tmp_path):
    """--model names (arch, fusion): typed, it overrides the config file; --set still wins."""
    saved = str(vqa_run / "run" / "config.json")
    common = ["--steps", "1", "--n-train", "30", "--n-val", "10", "--eval-batches", "0"]
    for extra, want in (
        ([], ("lstm", "product")),  # from the file, not --model's default lstm-concat
        (["--model", "blind"], ("lstm", "none")),
        (["--model", "blind", "--set", "fusion=concat"], ("lstm", "concat")),
    ):
        out = tmp_path / "_".join(extra or ["file"])
        assert main(["train", "vqa", "--config", saved, "--out", str(out), *common, *extra]) == 0
        m = json.loads((out / "config.json").read_text())["model"]
        assert (m["arch"], m["fusion"]) == want, extra


def test_vqa_bias_experiment_prints_a_table_per_question_type(tmp_path, capsys):
    capsys.readouterr()
    assert (
        main(
            [
                "experiment",
                "vqa-bias",
                "--out",
                str(tmp_path),
                "--steps",
                "2",
                "--batch-size",
                "16",
                "--n-train",
                "60",
                "--models",
                "blind",
                "lstm-concat",
                "--no-progress",
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    for word in (
        "| question type | blind | lstm-concat |",
        "| closest |",
        "| all |",
        "majority per type",
    ):
        assert word in out
    assert "Undertrained" in out  # 2 steps: below the per-type answer prior
    assert (tmp_path / "results.json").exists()
