"""The explorer in a real browser: headless Chromium (Debian's package) driven by Playwright.

Each page opens with no script error and no request (every request but the page's own is
refused and recorded); clicking a head and hovering a token shows, in the page, exactly the
weights the model gives for that layer, head and token; the served page recomputes the view for
typed input. Marked ``browser``: skipped, with a line saying so, where Chromium is missing.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
import torch

from attnlab.attention import capture_attention
from attnlab.explore import ExploreInput, Explorer, make_server, write_page
from attnlab.runs import load
from explore_runs import image_file, image_run, lm_run, translation_run

pytestmark = pytest.mark.browser

CHROMIUM = os.environ.get("ATTNLAB_CHROMIUM", "/usr/bin/chromium")  # never Playwright's own


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        yield b
        b.close()


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


class Page:
    """A page opened with every request except ``allowed`` refused, and errors recorded."""

    def __init__(self, browser, url: str, allowed) -> None:
        self.context = browser.new_context(viewport={"width": 1280, "height": 900})
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.refused: list[str] = []

        def route(r):
            if allowed(r.request.url):
                r.continue_()
            else:
                self.refused.append(r.request.url)
                r.abort()

        self.context.route("**/*", route)
        self.page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))
        self.page.on(
            "console",
            lambda m: (
                self.errors.append(f"console {m.type}: {m.text}")
                if m.type in ("error", "warning")
                else None
            ),
        )
        self.page.goto(url)

    def check_clean(self, *expected: str) -> None:
        """No script error, no console error but the ``expected`` ones, no request refused."""
        errors = [e for e in self.errors if not any(x in e for x in expected)]
        assert errors == [], errors
        assert self.refused == [], self.refused

    def shown(self) -> tuple[list[float], list[float | None]]:
        """The weights and raw scores the page shows for the chosen layer, head and query."""
        rows = self.page.eval_on_selector_all(
            "#detail tbody tr",
            "rows => rows.map(r => [r.dataset.weight, r.dataset.score ?? null])",
        )
        score = [None if s is None else float(s.replace("Infinity", "inf")) for _, s in rows]
        return [float(w) for w, _ in rows], score

    def state(self) -> dict:
        return self.page.evaluate("() => ({...window.attnExplorer.state})")

    def close(self) -> None:
        self.context.close()


def file_page(browser, payload: dict, path: Path) -> Page:
    write_page(payload, path)
    url = path.resolve().as_uri()
    return Page(browser, url, lambda u: u == url)


def assert_shown(page: Page, weights: torch.Tensor, scores: torch.Tensor) -> None:
    w, s = page.shown()
    torch.testing.assert_close(torch.tensor(w), weights.float(), rtol=0, atol=0)
    torch.testing.assert_close(torch.tensor(s), scores.float(), rtol=0, atol=0)


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
    # the head buttons and the entropy table select heads too; the mean of the heads is shown
    page.page.click('#heads button[data-head="-1"]')
    w, _ = page.shown()
    torch.testing.assert_close(torch.tensor(w), maps["blocks.1.attn"][0, :, 7].mean(0))
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
    from attnlab.explore.images import decode_image

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
