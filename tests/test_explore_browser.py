"""The explorer in a real browser: headless Chromium (Debian's package) driven by Playwright.

Each page opens with no script error and no request (every request but the page's own is
refused and recorded); clicking a head and hovering a token shows, in the page, exactly the
weights the model gives for that layer, head and token; the served page recomputes the view for
typed input. Marked ``browser``: skipped, with a line saying so, where Chromium is missing.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from attnlab.attention import capture_attention
from attnlab.explore import ExploreInput, Explorer, make_server
from attnlab.explore.images import decode_image
from attnlab.runs import load
from explore_browser import Page, assert_shown, browser_fixture, file_page  # noqa: F401
from explore_runs import image_file, image_run, lm_run, translation_run

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("explore_browser")
    return {
        "lm": lm_run(root / "lm"),
        "translation": translation_run(root / "translation", "transformer"),
        "vit": image_run(root / "vit", "vit"),
        "image": image_file(root / "digit.png", size=8, channels=1),
        "root": root,
    }


def test_lm_page_shows_the_models_weights_for_a_clicked_head_and_hovered_token(browser, runs):
    text = "the cat sat on the mat"
    page = file_page(
        browser, Explorer(runs["lm"]).explain(ExploreInput(text=text)), runs["root"] / "lm.html"
    )
    page.page.click('#modelview canvas[data-cell="1-2"]')
    page.page.hover('#headview text.tok.query[data-i="7"]')
    assert page.state() == {"view": 0, "layer": 1, "head": 2, "query": 7}
    model, tok = load(runs["lm"])
    with torch.no_grad(), capture_attention(model, scores=True) as maps:
        model(torch.tensor([tok.encode(text)]))
    assert_shown(page, maps["blocks.1.attn"][0, 2, 7], maps.scores("blocks.1.attn")[0, 2, 7])
    # the matrix and the rollout name every query (rows) and key (columns) and have a colour
    # bar from 0 to the largest value drawn; the chosen query's label stands out
    labels = [c.replace(" ", "␣") for c in text]
    for box in ("#matrix-box", "#rollout-box"):
        assert page.texts(f"{box} .ylabels .yl") == labels
        assert page.texts(f"{box} .xlabels .xl") == labels
        assert page.attr(f"{box} .ylabels .yl.active", "data-i") == ["7"]
    (top,) = page.attr("#matrix-box .colorbar", "data-max")
    assert float(top) == pytest.approx(float(maps["blocks.1.attn"][0, 2].max()), rel=1e-6)
    assert page.texts("#matrix-box .colorbar .tick")[-1] == "0"
    # head view: every query's lines are visible before any hover (its strongest at 1/2)
    lines = page.attr("#headview line", "stroke-opacity")
    rows = page.attr("#headview line", "data-i")
    strongest = {}
    for i, o in zip(rows, lines, strict=True):
        strongest[i] = max(strongest.get(i, 0.0), float(o))
    assert len(strongest) == len(text) and min(strongest.values()) >= 0.45
    # the head buttons: exactly the chosen one is pressed and filled ("mean" is not, now)
    pressed = 'e => [e.getAttribute("aria-pressed"), getComputedStyle(e).backgroundColor]'
    assert page.page.eval_on_selector('#heads [data-head="-1"]', pressed) == [
        "false",
        "rgb(255, 255, 255)",
    ]
    assert page.page.eval_on_selector('#heads [data-head="2"]', pressed) == [
        "true",
        "rgb(44, 160, 44)",  # head 2's colour
    ]
    # the head buttons and the entropy table select heads too; the mean of the heads is shown
    page.page.click('#heads button[data-head="-1"]')
    assert page.page.eval_on_selector('#heads [data-head="-1"]', pressed)[0] == "true"
    assert page.page.eval_on_selector('#heads [data-head="2"]', pressed) == [
        "false",
        "rgb(255, 255, 255)",
    ]
    w, _ = page.shown()
    torch.testing.assert_close(torch.tensor(w), maps["blocks.1.attn"][0, :, 7].mean(0))
    page.page.click('#matrix-box .yl[data-i="4"]')  # a row label chooses the query
    assert page.state()["query"] == 4
    page.page.click('#entropy td[data-cell="0-3"]')
    assert page.state()["layer"] == 0 and page.state()["head"] == 3
    page.check_clean()
    page.close()


def test_translation_page_shows_the_cross_attention_alignment(browser, runs):
    explorer = Explorer(runs["translation"])
    payload = explorer.explain(ExploreInput(text="three hundred and five"))
    assert [v["id"] for v in payload["views"]] == ["cross", "encoder", "decoder"]
    page = file_page(browser, payload, runs["root"] / "translation.html")
    cross = payload["views"][0]
    page.page.click('#modelview canvas[data-cell="1-3"]')
    last = len(cross["queries"]) - 1
    page.page.hover(f'#headview text.tok.query[data-i="{last}"]')
    assert page.state() == {"view": 0, "layer": 1, "head": 3, "query": last}
    model, vocabs = load(runs["translation"])
    src = torch.tensor([vocabs.encode_source("three hundred and five")])
    tgt_in = torch.tensor([[vocabs.tgt.stoi[t] for t in payload["views"][2]["keys"]]])
    with torch.no_grad(), capture_attention(model, scores=True) as maps:
        model(src, torch.ones_like(src, dtype=torch.bool), tgt_in)
    (name,) = [n for n in maps if n.endswith("cross_attn") and ".1." in n]
    assert_shown(page, maps[name][0, 3, last], maps.scores(name)[0, 3, last])
    page.page.click('#tabs button[data-view="encoder"]')
    page.page.hover('#headview text.tok.query[data-i="2"]')
    assert page.state()["view"] == 1 and page.state()["query"] == 2
    page.check_clean()
    page.close()


def test_vit_page_shows_patch_attention_over_the_image(browser, runs):
    data = runs["image"].read_bytes()
    payload = Explorer(runs["vit"]).explain(ExploreInput(image=data, image_name="digit.png"))
    page = file_page(browser, payload, runs["root"] / "vit.html")
    assert page.state()["query"] == 0  # the class token
    page.page.click('#modelview canvas[data-cell="0-1"]')
    canvas = page.page.locator("#image-attn")  # 4×4 patches: click patch (2, 3)
    box = canvas.bounding_box()
    canvas.click(position={"x": box["width"] * 3.5 / 4, "y": box["height"] * 2.5 / 4})
    query = 1 + 2 * 4 + 3  # after the class token
    assert page.state() == {"view": 0, "layer": 0, "head": 1, "query": query}
    model, settings = load(runs["vit"])

    image = decode_image(data, size=(8, 8), channels=1)
    x = ((image - 0.5) / 0.25)[None]
    with torch.no_grad(), capture_attention(model, scores=True) as maps:
        model(x)
    (name,) = [n for n in maps if n.endswith(".attn") and ".0." in n]
    assert_shown(page, maps[name][0, 1, query], maps.scores(name)[0, 1, query])
    page.check_clean()
    page.close()


def _snapshot(run: Path) -> dict:
    return {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(run.rglob("*"))}


def test_served_page_recomputes_for_typed_text(browser, runs):
    before = _snapshot(runs["lm"])
    explorer = Explorer(runs["lm"])
    server = make_server(explorer, port=0, first=ExploreInput(text="a dog"))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        origin = server.url.rstrip("/")
        page = Page(browser, server.url, lambda u: u.startswith(origin + "/"))
        queries = "#headview text.tok.query"
        assert page.page.locator(queries).count() == 5
        page.page.fill("#input-text", "the mat")
        page.page.click("#input-submit")
        page.page.wait_for_function("() => window.attnExplorer.payload().input === 'the mat'")
        assert page.page.locator(queries).all_text_contents() == list("the␣mat")
        assert page.page.is_hidden("#error")
        page.page.fill("#input-text", "a" * 40)  # longer than the context: the page says so
        page.page.click("#input-submit")
        page.page.wait_for_selector("#error:not([hidden])")
        assert "context is 32 tokens" in page.page.text_content("#error")
        assert page.page.locator(queries).count() == 7  # the last good view stays
        page.check_clean("status of 400 (Bad Request)")  # the browser's note of the refusal
        page.close()
    finally:
        server.shutdown()
        server.server_close()
    assert _snapshot(runs["lm"]) == before  # nothing written to the run directory
