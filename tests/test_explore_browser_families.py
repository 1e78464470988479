"""The explorer's pages of an MLM encoder, Swin, a captioner and VQA in a real browser
(headless Chromium, Debian's package, driven by Playwright): each opens with no script error
and no request, shows its elements, and clicking a head, a token, a patch or a word shows
exactly the model's numbers. The served MLM page opens with an input and predicts new masks when
Enter is pressed. Marked ``browser``: skipped, with a line saying so, where Chromium is missing.
"""

from __future__ import annotations

import base64
import threading

import numpy as np
import pytest
import torch

from attnlab.attention import capture_attention
from attnlab.explore import ExploreInput, Explorer, make_server
from attnlab.explore.images import decode_image
from attnlab.runs import load
from attnlab.tasks.mlm import fill_mask
from explore_browser import Page, assert_shown, browser_fixture, file_page  # noqa: F401
from explore_runs import image_file, image_run, mlm_run, scene_run

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("explore_families")


def decode(arr: dict) -> torch.Tensor:
    data = np.frombuffer(base64.b64decode(arr["data"]), dtype="<f4")
    return torch.from_numpy(data.copy()).view(arr["shape"])


def shown_predictions(page: Page) -> list[list[tuple[str, float]]]:
    """The candidates each [MASK] card of the page shows, as ``(token, p)``."""
    return page.page.eval_on_selector_all(
        "#predictions .mask",
        "cs => cs.map(c => [...c.querySelectorAll('tr.cand')]"
        ".map(r => [r.dataset.token, Number(r.dataset.p)]))",
    )


def expected_predictions(run, text: str) -> list[list[tuple[str, float]]]:
    model, tok = load(run)
    return [[(t, p) for t, p in m.candidates] for m in fill_mask(model, tok, text, top_k=5)]


def assert_predictions(page: Page, run, text: str) -> None:
    got, want = shown_predictions(page), expected_predictions(run, text)
    assert [[t for t, _ in m] for m in got] == [[t for t, _ in m] for m in want]
    for g, w in zip(got, want, strict=True):
        assert [p for _, p in g] == pytest.approx([p for _, p in w], abs=1e-6)


def test_mlm_page_shows_both_sides_and_the_masks_predictions(browser, root):
    run = mlm_run(root / "mlm")
    text = "the [MASK]at sat on [MASK]he mat"
    page = file_page(browser, Explorer(run).explain(ExploreInput(text=text)), root / "mlm.html")
    assert page.page.is_visible("#predict-panel")
    assert page.attr("#predictions .mask", "data-query") == ["5", "16"]
    assert_predictions(page, run, text)  # the candidates and probabilities of fill-mask
    assert page.state()["query"] == 5  # the first [MASK]
    assert page.attr("#predictions .mask.active", "data-query") == ["5"]
    page.page.click('#predictions .mask[data-query="16"]')  # the second mask becomes the query
    page.page.click('#modelview canvas[data-cell="1-3"]')
    assert page.state() == {"view": 0, "layer": 1, "head": 3, "query": 16}
    assert page.attr("#predictions .mask.active", "data-query") == ["16"]
    model, tok = load(run)
    seq = [tok.cls_id, *tok.encode(text), tok.sep_id]
    with torch.no_grad(), capture_attention(model, scores=True) as maps:
        model(torch.tensor([seq]))
    assert_shown(page, maps["blocks.1.attn"][0, 3, 16], maps.scores("blocks.1.attn")[0, 3, 16])
    weights, _ = page.shown()
    assert len(weights) == len(seq) and min(weights[17:]) > 0  # keys after the query, too
    assert page.texts("#headview text.tok.query")[0] == "[CLS]"
    page.check_clean()
    page.close()


def test_served_mlm_page_opens_with_an_input_and_enter_fills_new_masks(browser, root):
    run = mlm_run(root / "served-mlm")
    server = make_server(Explorer(run), port=0)  # no first input: the page still shows one
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        origin = server.url.rstrip("/")
        page = Page(browser, server.url, lambda u: u.startswith(origin + "/"))
        first = page.page.input_value("#input-text")
        assert "[MASK]" in first and page.page.is_hidden("#empty-note")
        assert page.page.locator("#predictions .mask").count() == first.count("[MASK]")
        assert_predictions(page, run, first)
        text = "a [MASK]og ran"
        page.page.fill("#input-text", text)
        page.page.press("#input-text", "Enter")  # Enter explains, without a new line
        page.page.wait_for_function(f"() => window.attnExplorer.payload().input === {text!r}")
        assert page.page.input_value("#input-text") == text
        tokens = ["[CLS]", "a", "␣", "[MASK]", "o", "g", "␣", "r", "a", "n", "[SEP]"]
        assert page.texts("#headview text.tok.query") == tokens
        assert_predictions(page, run, text)
        assert page.state()["query"] == 3
        page.page.press("#input-text", "Shift+Enter")  # a new line, no request
        assert page.page.input_value("#input-text") == text + "\n"
        assert page.page.evaluate("() => window.attnExplorer.payload().input") == text
        page.check_clean()
        page.close()
    finally:
        server.shutdown()
        server.server_close()


def test_swin_page_draws_each_stage_over_the_image(browser, root):
    run = image_run(root / "swin", "swin")
    data = image_file(root / "swin.png", size=8, channels=1).read_bytes()
    payload = Explorer(run).explain(ExploreInput(image=data, image_name="swin.png"))
    page = file_page(browser, payload, root / "swin.html")
    assert page.attr("#tabs button", "data-view") == ["stage0", "stage1"]
    assert page.page.is_visible("#image-attn") and page.page.is_visible("#image-rollout")
    grid = payload["views"][0]["grid"]
    rows, cols = grid["rows"], grid["cols"]
    page.page.click('#heads button[data-head="1"]')
    canvas = page.page.locator("#image-attn")
    box = canvas.bounding_box()  # click patch (1, 2)
    canvas.click(position={"x": box["width"] * 2.5 / cols, "y": box["height"] * 1.5 / rows})
    query = 1 * cols + 2
    assert page.state() == {"view": 0, "layer": 0, "head": 1, "query": query}
    w, s = page.shown()
    torch.testing.assert_close(torch.tensor(w), decode(payload["views"][0]["weights"])[0, 1, query])
    cfg = load(run).model.config
    window = min(cfg.window_size, rows)
    # an unshifted block: the query attends to the window² tokens of its own window only
    assert sum(x > 0 for x in w) == window**2 and sum(x != float("-inf") for x in s) == window**2
    assert sum(w) == pytest.approx(1.0, abs=1e-5)
    page.page.click('#tabs button[data-view="stage1"]')  # the next stage: its own, coarser grid
    r1 = payload["views"][1]["grid"]["rows"]
    assert page.state()["view"] == 1 and r1 < rows
    assert page.page.locator("#headview text.tok.query").count() == r1 * r1
    page.check_clean()
    page.close()


def test_caption_page_puts_each_word_over_the_image_and_its_rows_can_be_clicked(browser, root):
    run = scene_run(root / "cap", "caption_transformer")
    data = image_file(root / "scene.png", size=32, channels=3).read_bytes()
    payload = Explorer(run).explain(ExploreInput(image=data, image_name="scene.png"))
    cross = payload["views"][0]
    words, (_, _, T, N) = cross["queries"], cross["weights"]["shape"]
    page = file_page(browser, payload, root / "cap.html")
    assert page.texts("#image-strip figcaption") == [w.replace(" ", "␣") for w in words]
    page.page.click(f'#image-strip figure[data-i="{T - 1}"]')  # a word's small map
    assert page.state()["query"] == T - 1
    assert page.attr("#image-strip figure.active", "data-i") == [str(T - 1)]
    # the T × N matrix (N image tokens ≫ T words) keeps rows tall enough to click
    matrix = page.page.locator("#matrix")
    box = matrix.bounding_box()
    assert box["height"] / T >= 16 and box["width"] / N >= 3
    matrix.click(position={"x": box["width"] / 2, "y": box["height"] * 0.5 / T})
    assert page.state()["query"] == 0
    page.page.click('#heads button[data-head="1"]')
    model, vocab = load(run)
    tokens = [vocab.START] + [vocab.stoi[w] for w in words[:-1]]
    x = decode_image(data, size=(32, 32), channels=3)[None]
    with torch.no_grad(), capture_attention(model, scores=True) as maps:
        model(x, torch.tensor([tokens]))
    (name, *_) = [n for n in maps if n.endswith("cross_attn")]
    assert_shown(page, maps[name][0, 1, 0], maps.scores(name)[0, 1, 0])
    page.page.click('#tabs button[data-view="words"]')
    assert page.state()["view"] == 1 and page.page.is_hidden("#image-panel")
    page.check_clean()
    page.close()


def test_vqa_page_shows_where_each_question_word_looked(browser, root):
    run = scene_run(root / "vqa", "vqa_transformer")
    data = image_file(root / "vqa.png", size=32, channels=3, seed=1).read_bytes()
    question = "what colour is the circle ?"
    inp = ExploreInput(image=data, image_name="vqa.png", question=question)
    page = file_page(browser, Explorer(run).explain(inp), root / "vqa.html")
    assert question in page.page.text_content("#meta")
    assert page.texts("#image-strip figcaption") == question.split()
    page.page.click('#heads button[data-head="1"]')
    page.page.hover('#headview text.tok.query[data-i="4"]')  # "circle"
    assert page.state() == {"view": 0, "layer": 0, "head": 1, "query": 4}
    assert page.attr("#image-strip figure.active", "data-i") == ["4"]
    model, vocab = load(run)
    ids = [vocab.stoi[w] for w in question.split()]
    x = decode_image(data, size=(32, 32), channels=3)[None]
    with torch.no_grad(), capture_attention(model, scores=True) as maps:
        model(x, torch.tensor([ids]), torch.tensor([len(ids)]))
    (name, *_) = [n for n in maps if n.endswith("cross_attn")]
    assert_shown(page, maps[name][0, 1, 4], maps.scores(name)[0, 1, 4])
    page.page.click('#tabs button[data-view="question"]')
    assert page.state()["view"] == 1
    assert page.texts("#matrix-box .ylabels .yl") == question.split()
    page.check_clean()
    page.close()


def test_served_vqa_page_opens_with_a_scene_and_enter_asks_a_new_question(browser, root):
    run = scene_run(root / "served-vqa", "vqa_transformer")
    server = make_server(Explorer(run), port=0)  # no input: a generated scene and its question
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        origin = server.url.rstrip("/")
        page = Page(browser, server.url, lambda u: u.startswith(origin + "/"))
        first = page.page.input_value("#input-question")
        assert first and page.page.is_visible("#image-attn")
        assert page.texts("#image-strip figcaption") == first.split()
        assert page.page.is_hidden("#form-hint")  # no text box: nothing about Shift+Enter
        question = "is the circle left of the square ?"
        page.page.fill("#input-question", question)
        page.page.press("#input-question", "Enter")  # asks about the image shown
        page.page.wait_for_function(
            f"() => window.attnExplorer.payload().question === {question!r}"
        )
        assert page.texts("#image-strip figcaption") == question.split()
        assert page.page.evaluate("() => window.attnExplorer.payload().input") == "scene_0.png"
        page.check_clean()
        page.close()
    finally:
        server.shutdown()
        server.server_close()
