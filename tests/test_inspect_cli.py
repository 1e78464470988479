"""``attnlab inspect RUN`` on the first release's run directories: the table, the flags, the JSON
and the plot, for every family with attention; a clear error for one without."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cli_harness import check_refused, invoke

FIXTURES = Path(__file__).parent / "fixtures" / "release_0_1" / "runs"
WITH_HEADS = [
    "lm_gpt2",
    "lm_moe_alibi",
    "tr_rnn_attn",
    "tr_transformer",
    "img_swin",
    "cap_transformer",
    "vqa_transformer",
]
FIELDS = {
    "entropy",
    "uniformity",
    "first_token",
    "previous_token",
    "diagonal",
    "causal_leak",
    "duplicate_token",
    "induction",
    "loss_delta",
    "alignment",
    "flags",
    "name",
}


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("inspect") / "work"
    shutil.copytree(FIXTURES, root / "runs")
    return root


@pytest.mark.parametrize("name", WITH_HEADS)
def test_inspect_prints_the_table_and_writes_json_and_plot(name, work):
    out = invoke(["inspect", f"runs/{name}", "--out", f"out/{name}", "--batch", "2"], work)
    assert out.status == 0, out.err
    assert "heads flagged as degenerate" in out.out and "entropy" in out.out
    report = json.loads((work / "out" / name / "heads.json").read_text())
    heads = report["heads"]
    assert heads and FIELDS <= set(heads[0])
    assert all(h["loss_delta"] is not None for h in heads)
    assert (work / "out" / name / "heads.png").stat().st_size > 1000
    for h in heads:  # a flagged head's reasons are in the table
        for reason in h["flags"]:
            assert reason in out.out
    if name.startswith("lm_"):
        assert all(h["causal_leak"] == 0.0 and h["induction"] is not None for h in heads)


def test_inspect_refuses_a_model_without_attention(work):
    out = invoke(["inspect", "runs/lm_lstm", "--out", "out/lstm"], work)
    check_refused(out, writes=["out/lstm"])
    assert "no probe for 'lstm_lm'" in out.err


def test_inspect_refuses_a_missing_run(work):
    check_refused(invoke(["inspect", "runs/nothing"], work))
