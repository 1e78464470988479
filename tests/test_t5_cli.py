"""T5 through attnlab's shared translation path: ``attnlab train translate --arch t5``, the
translate command's beam search, resume from config.json, and the explorer's three views."""

from __future__ import annotations

import base64
import json

import numpy as np
import torch

from attnlab.cli import main
from attnlab.explore import ExploreInput, Explorer
from attnlab.models.t5 import T5
from attnlab.runs import load
from explore_runs import translation_run


def decode(arr: dict) -> torch.Tensor:
    """A payload array back to a tensor."""
    data = np.frombuffer(base64.b64decode(arr["data"]), dtype="<f4")
    return torch.from_numpy(data.copy()).view(arr["shape"])


def test_train_translate_arch_t5_trains_translates_and_repeats_from_config(tmp_path, capsys):
    common = ["--high", "999", "--n-examples", "200", "--preset", "tiny-v1_1", "--steps", "6"]
    common += ["--batch-size", "8", "--eval-every", "3", "--no-progress", "--lr", "3e-3"]
    a, b = tmp_path / "a", tmp_path / "b"
    sets = ["--set", "task.eval_examples=2"]
    assert main(["train", "translate", "--arch", "t5", *common, *sets, "--out", str(a)]) == 0
    cfg = json.loads((a / "config.json").read_text())
    assert cfg["kind"] == "t5" and cfg["model"]["ffn"] == "gated"
    assert cfg["train"]["label_smoothing"] == 0.0  # T5's training default
    rows = [json.loads(x) for x in (a / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows if "loss" in r]
    assert losses[-1] < losses[0]  # it learns
    run = load(a)
    assert isinstance(run.model, T5) and run.model.lm_head.weight is not run.model.tgt_emb.weight
    capsys.readouterr()
    assert main(["translate", str(a), "twenty one", "three hundred", "--beam", "3"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2
    # the run's config.json reproduces the losses
    again = ["train", "translate", "--config", str(a / "config.json"), "--no-progress"]
    assert main([*again, "--out", str(b)]) == 0
    rows_b = [json.loads(x) for x in (b / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("loss") for r in rows] == [r.get("loss") for r in rows_b]


def test_the_explorer_shows_t5_encoder_decoder_and_cross_attention(tmp_path):
    run = translation_run(tmp_path / "t5", "t5")
    payload = Explorer(run).explain(ExploreInput(text="Two hundred and three"))
    assert [v["id"] for v in payload["views"]] == ["cross", "encoder", "decoder"]
    cross, encoder = payload["views"][0], payload["views"][1]
    assert cross["keys"] == ["two", "hundred", "and", "three"]
    L, H, T, S = cross["weights"]["shape"]
    assert (L, S) == (2, 4)
    weights = decode(encoder["weights"])
    torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]))
    # T5's scores are q·k (no 1/√d) plus the relative bias in self-attention
    assert (encoder["score_label"], encoder["scores_have_bias"]) == ("q·k + b(j − i)", True)
    assert (cross["score_label"], cross["scores_have_bias"], cross["head_dim"]) == (
        "q·k",
        False,
        None,
    )
