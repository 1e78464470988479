"""Issue 26, item 6: pictures a learner can read, checked on the matplotlib figures themselves.

The attention grid (``runs/demo/attention.png``) has horizontal 9-pt labels with spaces shown as
``␣``; ``classify --attention`` shows the attention beside the image in one single-hue scale
whose colour bar is the panels' own; a loss curve's validation line starts at the first
evaluation. Pictures: docs/plots/demo_attention.png, classify_attention.png, loss_tiny.png.
"""

from __future__ import annotations

import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from attnlab.train.curves import plot_curves  # noqa: E402
from attnlab.viz import plot_attention_grid  # noqa: E402
from attnlab.viz.attention import visible  # noqa: E402
from attnlab.viz.vision import overlay_attention  # noqa: E402


@pytest.fixture
def figures(monkeypatch):
    kept = []
    monkeypatch.setattr(plt, "close", lambda fig=None: kept.append(fig))
    yield kept
    monkeypatch.undo()
    plt.close("all")


def test_the_attention_grid_reads_horizontally_with_visible_spaces(tmp_path, figures):
    text = "The return value of the function"
    w = torch.rand(4, len(text), len(text)).softmax(-1)
    title = "last layer (2 of 2), 4 heads: attention over 'The return ...'"
    plot_attention_grid(w, tmp_path / "a.png", rows=list(text), cols=list(text), title=title)
    fig = figures[-1]
    panels = [a for a in fig.axes if a.get_label() != "<colorbar>" and a.get_images()]
    assert len(panels) == 5 and fig._suptitle.get_text() == title
    for ax in panels:
        xs, ys = ax.get_xticklabels(), ax.get_yticklabels()
        assert [t.get_text() for t in xs] == [visible(c) for c in text]
        assert "␣" in [t.get_text() for t in xs] and " " not in [t.get_text() for t in xs]
        assert all(t.get_rotation() == 0 and t.get_fontsize() >= 9 for t in xs)
        assert all(t.get_rotation() == 0 for t in ys)


def test_long_tokens_stand_upright_never_slanted(tmp_path, figures):
    tokens = [f" token{i}" for i in range(30)]
    plot_attention_grid(torch.rand(2, 30, 30), tmp_path / "a.png", rows=tokens, cols=tokens)
    ax = figures[-1].axes[0]
    assert {t.get_rotation() for t in ax.get_xticklabels()} == {90.0}
    assert ax.get_xticklabels()[0].get_text() == "␣token0"
    assert visible("\n") == "↵" and visible("a\tb") == "a⇥b"


def test_classify_attention_sits_beside_the_image_in_the_colour_bar_s_colours(tmp_path, figures):
    overlay_attention(torch.rand(1, 8, 8), {"rollout": torch.rand(4, 4)}, tmp_path / "v.png")
    fig = figures[-1]
    image_ax, map_ax, bar = fig.axes
    assert bar.get_label() == "<colorbar>" and len(map_ax.get_images()) == 1  # not blended
    shown = map_ax.get_images()[0]
    assert shown.get_alpha() in (None, 1.0) and shown.get_cmap().name not in ("jet",)
    assert shown.colorbar is not None and shown.colorbar.cmap.name == shown.get_cmap().name
    assert image_ax.get_images()[0].get_cmap().name == "gray"


def test_validation_is_drawn_only_at_its_evaluations(tmp_path, figures):
    rows = [{"step": s, "loss": 4.0 - s / 100} for s in range(10, 101, 10)]
    rows += [{"step": s, "val_loss": 3.9 - s / 100} for s in (40, 80, 100)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    plot_curves(tmp_path / "metrics.jsonl", tmp_path / "loss.png")
    ax = figures[-1].axes[0]
    val = next(line for line in ax.get_lines() if line.get_label().startswith("validation"))
    assert list(val.get_xdata()) == [40, 80, 100]  # starts at the first evaluation, not step 0
    assert val.get_marker() == "o"
    train = next(line for line in ax.get_lines() if line.get_label().startswith("train"))
    assert train.get_xdata()[0] == 10
