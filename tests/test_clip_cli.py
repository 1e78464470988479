"""CLI: attnlab train clip, attnlab.load on the run, zero-shot, eval, the explorer, bad input."""

import pytest
import torch

import attnlab
from attnlab.cli import main
from attnlab.explore.explorer import Explorer
from attnlab.models.multimodal.clip import DualEncoder


@pytest.fixture(scope="module")
def clip_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("clip")
    args = ["train", "clip", "--out", str(root / "run"), "--image-size", "16", "--steps", "3"]
    args += ["--batch-size", "8", "--n-train", "40", "--n-val", "12", "--eval-every", "3"]
    args += ["--eval-batches", "1", "--no-progress", "--device", "cpu"]
    args += ["--set", "task.eval_scenes=12", "--set", "model.text.n_layers=1"]
    assert main(args) == 0
    assert main(["scene", "--out", str(root / "scenes"), "--n", "2", "--image-size", "16"]) == 0
    return root


def test_train_clip_prints_zero_shot_and_recall_and_loads(clip_run, capsys):
    run = attnlab.load(clip_run / "run")
    assert isinstance(run.model, DualEncoder) and run.kind == "clip"
    assert run.model.config.text.n_layers == 1 and run.model.config.image_size == 16
    images = torch.rand(2, 3, 16, 16)
    ids = torch.tensor([[2, 4, 3], [2, 5, 3]])
    emb = run.model.encode_image(images)
    assert emb.shape == (2, run.model.config.projection_dim)
    assert run.model(images, ids).shape == (2, 2)
    assert main(["eval", str(clip_run / "run")]) == 0
    out = capsys.readouterr().out
    assert "zero-shot val: accuracy" in out and "recall@5 image->text" in out


def test_zero_shot_command_picks_one_of_the_prompts(clip_run, capsys):
    image = str(clip_run / "scenes" / "scene_0.png")
    prompts = ["a red circle", "a blue square"]
    assert main(["zero-shot", str(clip_run / "run"), image, "--prompts", *prompts]) == 0
    assert capsys.readouterr().out.strip() in prompts


def test_zero_shot_command_refuses_prompts_that_name_no_class(clip_run, capsys):
    image = str(clip_run / "scenes" / "scene_0.png")
    assert main(["zero-shot", str(clip_run / "run"), image, "--prompts", "something"]) != 0
    assert "name no class" in capsys.readouterr().err


def test_explorer_shows_both_towers(clip_run):
    explorer = Explorer(clip_run / "run")
    payload = explorer.explain(explorer.default_input())
    views = {v["id"]: v for v in payload["views"]}
    assert views["image"]["queries"][0] == "[CLS]" and len(views["image"]["keys"]) == 1 + 16
    words = views["text"]["queries"]
    assert words[0] == "<start>" and words[-1] == "<end>"
    assert payload["summary"][0].startswith("zero-shot: ")
