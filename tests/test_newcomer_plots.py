"""Issue 18, plots a person reads: what the loss curve and the benchmark axes say."""

from __future__ import annotations

import json

import matplotlib
import numpy as np

from attnlab.experiments.attention_bench import BenchConfig, plot_results
from attnlab.viz import plot_attention, plot_attention_grid
from attnlab.viz.attention import tick_labels
from attnlab.viz.captions import plot_word_attention
from attnlab.viz.vision import overlay_attention

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from attnlab.train import curves  # noqa: E402
from attnlab.train.curves import plot_curves, smoothing_floor  # noqa: E402


@pytest.mark.parametrize("eps, vocab", [(0.1, 2), (0.1, 181), (0.3, 1000)])
def test_smoothing_floor_is_the_loss_of_the_target_distribution_itself(eps, vocab):
    """A model predicting exactly the smoothed targets gets torch's label-smoothed loss."""
    target = torch.full((1, vocab), eps / vocab)
    target[0, 0] += 1 - eps
    reference = F.cross_entropy(target.log(), torch.tensor([0]), label_smoothing=eps)
    assert smoothing_floor(eps, vocab) == pytest.approx(float(reference), rel=1e-5)
    assert smoothing_floor(0.0, vocab) == 0.0


@pytest.fixture
def figures(monkeypatch):
    """The figures a plot function draws (kept open instead of closed)."""
    kept = []
    monkeypatch.setattr(plt, "close", lambda fig=None: kept.append(fig))
    yield kept
    monkeypatch.undo()
    plt.close("all")


def _texts(fig) -> list[str]:
    ax = fig.axes[0]
    out = [t.get_text() for t in ax.texts]
    legend = ax.get_legend()
    out += [t.get_text() for t in legend.get_texts()] if legend else []
    return out


def test_loss_curve_labels_what_it_shows(tmp_path, figures):
    run = tmp_path / "run"
    run.mkdir()
    config = {"train": {"eval_batches": 4, "label_smoothing": 0.1}, "model": {"tgt_vocab_size": 50}}
    (run / "config.json").write_text(json.dumps(config))
    rows = [{"step": s, "loss": 3.0 - s / 1000} for s in range(0, 2001, 100)]
    rows += [{"step": 1000, "val_loss": 2.5}, {"step": 2000, "val_loss": 0.9}]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    plot_curves(run / "metrics.jsonl", run / "loss.png")
    assert (run / "loss.png").is_file()
    fig = figures[-1]
    texts = _texts(fig)
    assert "validation (4 batches)" in texts and "train (per step)" in texts
    floor = smoothing_floor(0.1, 50)
    assert f"label smoothing 0.1 floor: {floor:.2f}" in texts
    assert any(t.startswith("validation below training") for t in texts)
    ax = fig.axes[0]
    assert ax.xaxis.get_major_formatter()(2000, 0) == "2,000"  # thousands separators


def test_no_notes_without_smoothing_or_a_low_validation(tmp_path, figures):
    rows = [{"step": s, "loss": 3.0} for s in range(1, 5)] + [{"step": 4, "val_loss": 3.5}]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    plot_curves(tmp_path / "metrics.jsonl", tmp_path / "loss.png")
    assert _texts(figures[-1]) == ["train (per step)", "validation"]
    assert curves._run_settings(tmp_path / "metrics.jsonl") == {}


def test_attention_benchmark_axes_read_as_sequence_lengths(tmp_path, figures):
    rows = [
        {"backend": "math", "n": n, "mode": "fwd", "time_s": n * 1e-6, "peak_bytes": n * 100}
        for n in (512, 1024, 2048)
    ]
    cfg = BenchConfig(ns=(512, 1024, 2048), backends=("math",), modes=("fwd",))
    plot_results(rows, tmp_path / "a.png", cfg)
    ax = figures[-1].axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["512", "1,024", "2,048"]


def test_tick_labels_show_every_kth_token_of_a_long_input():
    assert tick_labels(list("abc")) == ([0, 1, 2], ["a", "b", "c"], 1)
    pos, labels, k = tick_labels([f"t{i}" for i in range(100)], limit=40)
    assert k == 3 and pos == list(range(0, 100, 3)) and labels[1] == "t3" and len(pos) <= 40


def test_heatmaps_have_colour_bars_readable_ticks_and_named_queries(tmp_path, figures):
    w = torch.rand(2, 5, 5).softmax(-1)
    plot_attention_grid(w, tmp_path / "g.png", rows=list("abcde"), cols=list("abcde"))
    fig = figures[-1]
    assert len(fig.axes) == 3 + 1  # two heads, their mean, one shared colour bar
    ticks = fig.axes[0].get_xticklabels()
    assert [t.get_text() for t in ticks] == list("abcde") and ticks[0].get_rotation() == 0
    plot_attention(w, tmp_path / "g3.png")  # 3-D weights: the same grid
    assert len(figures[-1].axes) == 3 + 1
    with pytest.raises(ValueError, match=r"2-D \(rows, cols\) or 3-D .* got \(5,\)"):
        plot_attention(torch.rand(5), tmp_path / "bad.png")
    with pytest.raises(ValueError, match=r"must be 3-D \(heads, rows, cols\), got \(5, 5\)"):
        plot_attention_grid(w[0], tmp_path / "bad.png")
    tokens = [f"word{i}" for i in range(60)]
    plot_attention(torch.rand(60, 60), tmp_path / "a.png", rows=tokens, cols=tokens)
    fig = figures[-1]
    ax = fig.axes[0]
    assert len(fig.axes) == 2 and len(ax.get_xticklabels()) == 30  # every 2nd of 60
    assert ax.get_xlabel() == "keys (attended to) (1 in 2 of 60 labelled)"
    image = np.zeros((16, 16, 3), dtype=np.uint8)
    plot_word_attention(image, ["a", "red", "<end>"], torch.rand(3, 4, 4), tmp_path / "c.png")
    fig = figures[-1]
    titles = [a.get_title() for a in fig.axes]
    assert "query: 'red' (word 2)" in titles and any(
        a.get_label() == "<colorbar>" for a in fig.axes
    )
    overlay_attention(torch.rand(1, 8, 8), {"rollout": torch.rand(4, 4)}, tmp_path / "v.png")
    fig = figures[-1]
    assert "rollout (per patch)" in [a.get_title() for a in fig.axes]
    assert fig.axes[1].images[0].get_interpolation() == "nearest"  # patches, not smoothed
    assert any(a.get_label() == "<colorbar>" for a in fig.axes)
