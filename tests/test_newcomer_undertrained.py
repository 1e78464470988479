"""Issue 26, item 7: a short budget gives "train longer", not a conclusion.

``experiments.common.undertrained`` is the one rule (every run must pass a stated score on the
easiest condition); the experiments' summaries use it. Results are built by hand here, with the
numbers of the README's runs (trained) and of ``--max-time 20`` (not).
"""

from __future__ import annotations

import re

from attnlab.experiments import bottleneck, extrapolation, label_smoothing
from attnlab.experiments.common import undertrained


def test_the_rule():
    assert undertrained({"a": 0.9, "b": 0.6}, threshold=0.5, what="accuracy") is None
    msg = undertrained({"a": 0.9, "b": 0.07}, threshold=0.5, what="accuracy", max_time=20)
    assert msg.startswith("Undertrained: accuracy is b 0.07") and "a 0.9" not in msg
    longer = int(re.search(r"--max-time (\d+)", msg).group(1))
    assert 40 <= longer <= 160  # two to eight times the budget
    assert "no conclusion" in msg
    loss = undertrained(
        {"rope": 3.1}, threshold=2.6, what="loss", higher_is_better=False, steps=300
    )
    assert "at most 2.6" in loss and re.search(r"--steps (\d+)", loss)
    assert undertrained({"rope": 2.0}, threshold=2.6, what="loss", higher_is_better=False) is None
    assert "n/a" in undertrained({"x": None}, threshold=1.0, what="score")


def _bottleneck(em_rnn: list[float]) -> dict:
    buckets = ["1-4", "5-8", "25-28"]
    attn = [0.93, 0.94, 0.93]
    models = {
        k: {"buckets": {b: {"n": 50, "exact_match": v} for b, v in zip(buckets, ems)}}
        for k, ems in (("rnn", em_rnn), ("rnn-attn", attn), ("transformer", attn))
    }
    return {"buckets": buckets, "models": models, "config": {"max_time": 20, "steps": None}}


def test_bottleneck_says_train_longer_when_the_rnn_cannot_do_short_sources():
    text = bottleneck.summarise(_bottleneck([0.074, 0.05, 0.0]))
    assert "Undertrained: exact match on 1-4-word sources is rnn 7.4 %" in text
    assert "--max-time" in text and "does not degrade" not in text and "bottleneck is" not in text
    trained = bottleneck.summarise(_bottleneck([0.93, 0.9, 0.0]))
    assert "the bottleneck is visible" in trained and "Undertrained" not in trained


def test_label_smoothing_compares_calibration_only_once_the_models_translate():
    def runs(acc):
        return {
            "config": {"max_time": 30},
            "runs": [
                {"epsilon": e, "token_accuracy": acc, "mean_confidence": 0.5, "ece": ece}
                for e, ece in ((0.0, 0.14), (0.1, 0.02))
            ],
        }

    assert label_smoothing.summarise(runs(0.12)).startswith("Undertrained")
    assert "Lowest calibration error with ε=0.1" in label_smoothing.summarise(runs(0.48))


def test_extrapolation_needs_the_trained_length_learnt_first():
    def results(loss_at_l):
        lengths = {"64": {"loss": loss_at_l}, "256": {"loss": loss_at_l + 0.1}}
        return {
            "data": {"context": 64, "lengths": [64, 256]},
            "config": {"steps": 200},
            "runs": [{"position": "rope", "lengths": lengths}],
        }

    short = extrapolation.summarise(results(3.3))
    assert short.startswith("Undertrained") and "--steps" in short
    assert "Loss at L = 64 → 256" in extrapolation.summarise(results(2.03))


def test_inductive_bias_reads_no_gap_from_models_that_cannot_read_digits():
    from attnlab.experiments import inductive_bias

    def result(acc):
        row = {"fraction": 1.0, "n_train": 1257, "gap": 0.0}
        for k in ("cnn", "vit"):
            row.update({f"{k}_acc": acc, f"{k}_std": 0.0, f"{k}_n": 1})
        settings = {"data": "digits", "steps": 50, "batch_size": 64, "lr": 1e-3, "seeds": 1}
        return {"settings": settings, "params": {}, "n_test": 180, "table": [row]}

    assert "Undertrained" in inductive_bias.format_table(result(0.12))
    assert "--steps" in inductive_bias.format_table(result(0.12))
    assert "Undertrained" not in inductive_bias.format_table(result(0.95))
