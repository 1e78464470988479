"""The adaptive-computation experiment at a seeded small size: what holds there (the fixed
depths bracket the ACT model's mean steps and train as many optimizer steps; every model learns
the 1-bit strings; the runs load), the parity data, and the rank correlation. Whether steps grow
with length, and whether ACT beats the fixed depths, is measured by the experiment, not pinned
here (see docs/experiments.md)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from attnlab.data.parity import CLS, PAD, encode_bits, parity_batch
from attnlab.errors import UserError
from attnlab.experiments.adaptive_computation import (
    AdaptiveComputationConfig,
    fixed_depths,
    run_adaptive_computation,
    spearman,
)
from attnlab.runs import load


def test_parity_batch_labels_are_the_parity_of_the_real_bits():
    idx, mask, labels = parity_batch(torch.tensor([1, 3, 2]), torch.Generator().manual_seed(0))
    assert idx.shape == (3, 4) and (idx[:, 0] == CLS).all()
    for row, m, y in zip(idx, mask, labels):
        bits = row[1:][m[1:]]
        assert ((bits == 0) | (bits == 1)).all() and (row[1:][~m[1:]] == PAD).all()
        assert int(bits.sum()) % 2 == int(y)
    assert mask.sum(1).tolist() == [2, 4, 3]
    assert encode_bits("01 1") == [CLS, 0, 1, 1]
    with pytest.raises(UserError, match="made of 0 and 1"):
        encode_bits("012")


def test_spearman_and_the_fixed_depths():
    assert spearman([1, 2, 3, 4], [1.0, 1.5, 1.7, 3.0]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4.0, 3.0, 2.5, 1.0]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3], [1.0, 3.0, 2.0]) == pytest.approx(0.5)  # 1 - 6·2 / (3·8)
    assert math.isnan(spearman([1, 2, 3], [2.0, 2.0, 2.0]))
    assert fixed_depths(1.57) == [1, 2] and fixed_depths(3.0) == [3] and fixed_depths(0.5) == [1]


def test_adaptive_computation_at_small_size(tmp_path):
    cfg = AdaptiveComputationConfig(
        steps=80, max_len=3, d_model=32, n_test=50, lr=3e-3, progress=False, seed=0
    )
    res = run_adaptive_computation(cfg, tmp_path / "ac")
    act = res["act"]["by_length"]
    assert all(1 <= act[n]["steps"] <= cfg.max_steps for n in act)
    depths = [f["depth"] for f in res["fixed"]]
    assert depths == fixed_depths(res["mean_steps"])
    assert depths[0] <= res["mean_steps"] <= depths[-1]
    assert all(f["steps"] == res["act"]["steps"] == 80 for f in res["fixed"])
    assert act[1]["accuracy"] >= 0.9  # the bit itself: learnt by every model
    assert all(f["by_length"][1]["accuracy"] >= 0.9 for f in res["fixed"])
    saved = json.loads((tmp_path / "ac" / "results.json").read_text())
    assert saved["mean_steps"] == pytest.approx(res["mean_steps"])
    run = load(tmp_path / "ac" / "runs" / "act")
    assert run.kind == "universal_transformer" and run.model.config.halting == "act"
    assert (tmp_path / "ac" / "steps_and_accuracy.png").stat().st_size > 0


def test_a_ponder_budget_below_one_step_is_refused():
    with pytest.raises(UserError, match=r"ponder budget max_steps=0 is below one step"):
        AdaptiveComputationConfig(max_steps=0)
