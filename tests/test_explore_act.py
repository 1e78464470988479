"""The explorer's page of a Universal Transformer with ACT: the payload carries the steps,
remainders and ponder costs the model returned, one attention "layer" per step; bad strings are
named; and in a real browser (marked ``browser``) the "Steps per position" panel shows exactly
those numbers, and clicking a token makes it the query."""

from __future__ import annotations

import pytest
import torch

from attnlab.attention import capture_attention
from attnlab.config.variants import UniversalConfig
from attnlab.data.parity import encode_bits
from attnlab.errors import UserError
from attnlab.experiments.adaptive_computation import save_run
from attnlab.explore import ExploreInput, Explorer
from attnlab.models.universal import UniversalTransformer
from attnlab.runs import load
from explore_browser import assert_shown, browser_fixture, file_page  # noqa: F401


def act_run(path):
    torch.manual_seed(0)
    cfg = UniversalConfig.preset(
        "tiny", vocab_size=4, d_model=16, max_seq_len=12, halting_bias=-1.0
    )
    save_run(UniversalTransformer(cfg), path, {"steps": 0})
    return path


def test_payload_carries_the_models_steps_and_one_view_layer_per_step(tmp_path):
    run = act_run(tmp_path / "act")
    payload = Explorer(run).explain(ExploreInput(text="0110 1"))
    model = load(run).model
    out = model(torch.tensor([encode_bits("01101")]))
    act = payload["act"]
    assert act["tokens"] == ["[CLS]", "0", "1", "1", "0", "1"]
    assert act["steps"] == out.steps[0].tolist()
    assert act["ponder"] == pytest.approx(out.ponder[0].tolist(), abs=1e-4)
    assert max(act["steps"]) > 1  # a negative halting bias: several steps
    view = payload["views"][0]
    assert view["layers"] == [f"step {n + 1}" for n in range(max(act["steps"]))]
    assert any("steps per position" in s for s in payload["summary"])


def test_a_string_that_is_not_bits_is_named(tmp_path):
    explorer = Explorer(act_run(tmp_path / "act"))
    with pytest.raises(UserError, match=r"made of 0 and 1; found 'x'"):
        explorer.explain(ExploreInput(text="01x"))
    with pytest.raises(UserError, match=r"at most 11"):
        explorer.explain(ExploreInput(text="0" * 12))


@pytest.mark.browser
def test_act_page_shows_the_steps_per_position(browser, tmp_path):
    run = act_run(tmp_path / "act")
    payload = Explorer(run).explain(ExploreInput(text="10110"))
    page = file_page(browser, payload, tmp_path / "act.html")
    assert page.page.is_visible("#steps-panel")
    shown = page.attr("#act-steps tr.act-row", "data-steps")
    assert [int(s) for s in shown] == payload["act"]["steps"]
    page.page.click('#act-steps tr.act-row[data-query="3"]')
    assert page.state()["query"] == 3
    assert page.attr("#act-steps tr.act-row.active", "data-query") == ["3"]
    model = load(run).model
    with torch.no_grad(), capture_attention(model, scores=True) as maps:
        model(torch.tensor([encode_bits("10110")]))
    first = maps.calls("block.attn")[0][0, 0, 3]
    assert_shown(page, first, maps.score_calls("block.attn")[0][0, 0, 3])  # step 1, head 0
    page.check_clean()
    page.close()
