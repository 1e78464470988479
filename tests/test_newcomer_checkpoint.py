"""Issue 26, item 2: one checkpoint default everywhere (best: the lowest validation loss, or the
last weights when no validation ran), said in one line where a result depends on it.

On a copy of the bundled ViT run whose ``best.safetensors`` is made to differ from its last
weights (the head scaled), so that reading the wrong one shows.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

import pytest
import torch

import attnlab
from attnlab.cli import build_parser, main
from attnlab.explore import ExploreInput, Explorer
from attnlab.runs import describe_weights, load_model
from attnlab.train.checkpoint import save_weights

RUNS = Path(__file__).parent / "fixtures" / "release_0_1" / "runs"


@pytest.fixture
def run(tmp_path) -> Path:
    """The ViT run with best weights at step 2000 (val loss 0.25) unlike the last (step 3000)."""
    run = tmp_path / "vit"
    shutil.copytree(RUNS / "img_vit", run)
    model = load_model(run, weights="last")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("head"):
                p.mul_(0.1)
    save_weights(model, run / "best.safetensors", 2000)
    records = [{"step": 2000, "val_loss": 0.25}, {"step": 3000, "val_loss": 0.3}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


def _digit(tmp_path, capsys, run) -> Path:
    assert main(["samples", str(run), "--out", str(tmp_path / "s"), "--n", "10"]) == 0
    capsys.readouterr()
    return tmp_path / "s" / "7.png"


def _classify(capsys, argv) -> tuple[dict[str, float], str]:
    assert main(["classify", *argv, "--top-k", "3"]) == 0
    res = capsys.readouterr()
    probs = {label: float(p) for label, p in (line.split() for line in res.out.splitlines())}
    return probs, res.err


def _explorer(run: Path, image: Path, **kw) -> dict[str, float]:
    page = Explorer(run, **kw).explain(ExploreInput(image=image.read_bytes(), image_name="7"))
    guesses = page["summary"][0].removeprefix("prediction: ")
    return {label: float(p) for label, p in (g.split() for g in guesses.split(", "))}


def test_explorer_and_classify_read_the_same_checkpoint(run, tmp_path, capsys):
    image = _digit(tmp_path, capsys, run)
    best, err = _classify(capsys, [str(run), str(image)])
    assert "best checkpoint (best.safetensors, step 2000, val loss 0.25)" in err
    last, err = _classify(capsys, [str(run), str(image), "--weights", "last"])
    assert "last checkpoint (model.safetensors, step 3000, val loss 0.3)" in err
    top = max(best, key=best.get)
    assert abs(best[top] - last[top]) > 0.02  # the two checkpoints are told apart
    shown = _explorer(run, image)  # the page shows two decimals
    assert shown.keys() == best.keys()
    assert all(abs(shown[k] - best[k]) <= 0.005 + 1e-9 for k in best)
    shown_last = _explorer(run, image, weights="last")
    assert all(abs(shown_last[k] - last[k]) <= 0.005 + 1e-9 for k in last)


def test_attnlab_load_reads_the_best_by_default(run):
    model, _ = attnlab.load(run)
    best = load_model(run, weights="best")
    for (n, a), (_, b) in zip(model.state_dict().items(), best.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=n)
    assert attnlab.load(run).checkpoint == describe_weights(run, "best")
    head = next(k for k in model.state_dict() if k.startswith("head"))
    last = load_model(run, weights="last").state_dict()[head]
    assert not torch.equal(model.state_dict()[head], last)


def test_without_validation_best_means_last_and_says_so(tmp_path):
    run = tmp_path / "vit"
    shutil.copytree(RUNS / "img_vit", run)
    line = describe_weights(run)
    assert re.fullmatch(r"last checkpoint \(model\.safetensors, step \d+; .*no best.*\)", line)


def test_every_command_defaults_to_best():
    parser, found = build_parser(), {}

    def walk(p, prefix):
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, [*prefix, name])
            elif "--weights" in action.option_strings:
                found[" ".join(prefix)] = action.default

    walk(parser, [])
    assert {"explore", "classify", "generate", "eval", "fill-mask", "convert"} <= found.keys()
    assert set(found.values()) == {"best"}, found
