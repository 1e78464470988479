"""The inspection parts of the explorer: per-head diagnostics in the payload and the page,
ablating heads through the served page, and ``attnlab.explore.show`` inline in a notebook."""

from __future__ import annotations

import json
import os
import threading
import urllib.error
import urllib.request

import pytest
import torch

from attnlab.config.translation import Seq2SeqConfig
from attnlab.errors import UserError
from attnlab.explore import ExploreInput, Explorer, make_server, show
from attnlab.explore.heads import _decode
from attnlab.inspect import ablate_heads
from attnlab.models.seq2seq import Seq2SeqTransformer
from explore_runs import lm_run, translation_run

CHROMIUM = os.environ.get("ATTNLAB_CHROMIUM", "/usr/bin/chromium")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("inspect_explore")
    return {"lm": lm_run(root / "lm"), "tr": translation_run(root / "tr", "transformer")}


def test_payload_has_the_diagnostics_of_every_head(runs):
    explorer = Explorer(runs["lm"])
    payload = explorer.explain(ExploreInput(text="the dog"))
    view = payload["views"][0]
    rows = payload["heads"][view["id"]]
    w = _decode(view["weights"])  # (L, H, T, T)
    assert len(rows) == w.shape[0] * w.shape[1]
    for r in rows:
        layer, h = view["layers"].index(r["layer"]), r["head"]
        p = w[layer, h]  # (T, T)
        assert r["first_token"] == pytest.approx(float(p[1:, 0].mean()), abs=1e-4)
        assert r["previous_token"] == pytest.approx(float(p.diagonal(-1).mean()), abs=1e-4)
        assert r["causal_leak"] == 0.0 and r["ablatable"]
    tr = Explorer(runs["tr"]).explain(ExploreInput(text="two hundred and one"))
    by_view = {v["id"]: v for v in tr["views"]}
    for view_id, rows in tr["heads"].items():
        causal = [r for r in rows if "causal_leak" in r]
        # only the decoder's self-attention is causal
        layers = by_view[view_id]["layers"]
        decoder_self = all(n.startswith("decoder.") and n.endswith(".attn") for n in layers)
        assert bool(causal) == decoder_self


def test_ablating_a_head_in_the_explorer_is_ablating_it_in_the_model(runs):
    explorer = Explorer(runs["lm"])
    inp = ExploreInput(text="the dog")
    plain = explorer.explain(inp)
    ablated = explorer.explain(inp, ablate={"blocks.0.attn": [0, 1]})
    assert ablated["ablated"] == {"blocks.0.attn": [0, 1]}
    assert ablated["summary"] != plain["summary"]
    model = explorer.run.model
    with ablate_heads(model, {"blocks.0.attn": [0, 1]}):
        again = explorer.family.explain(explorer.run, inp)
    assert again["summary"] == ablated["summary"]
    assert explorer.explain(inp)["summary"] == plain["summary"]  # the hooks are gone
    with pytest.raises(UserError, match="cannot ablate"):
        explorer.explain(inp, ablate={"blocks.9.attn": [0]})


def _post(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(
        url + "api/explore", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_the_server_ablates_heads_on_request(runs):
    server = make_server(Explorer(runs["lm"]), port=0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        status, plain = _post(server.url, {"text": "the dog"})
        assert status == 200
        status, out = _post(server.url, {"text": "the dog", "ablate": {"blocks.1.attn": [2]}})
        assert status == 200 and out["summary"] != plain["summary"]
        status, out = _post(server.url, {"text": "the dog", "ablate": {"blocks.1.attn": "2"}})
        assert status == 400 and "ablate must map layer names" in out["error"]
        status, out = _post(server.url, {"text": "the dog", "ablate": {"blocks.1.attn": [99]}})
        assert status == 400 and "cannot ablate" in out["error"]
    finally:
        server.shutdown()
        server.server_close()


def test_show_renders_any_model_inline_without_a_run(runs):
    torch.manual_seed(0)
    model = Seq2SeqTransformer(Seq2SeqConfig.preset("tiny", src_vocab_size=20, tgt_vocab_size=20))
    src, tgt = torch.randint(4, 20, (2, 6)), torch.randint(4, 20, (2, 4))
    mask = torch.ones(2, 6, dtype=torch.bool)
    shown = show(model, (src, mask, tgt), tokens={"src": list("ABCDEF"), "tgt": list("wxyz")})
    views = {v["id"]: v for v in shown.payload["views"]}
    assert set(views) == {"encoder-attn", "decoder-attn", "decoder-cross-attention"}
    cross = views["decoder-cross-attention"]
    assert cross["queries"] == list("wxyz") and cross["keys"] == list("ABCDEF")
    _, weights = model(src[:1], mask[:1], tgt[:1], need_weights=True)
    torch.testing.assert_close(_decode(cross["weights"]), torch.stack(weights["cross"])[:, 0])
    frame = shown._repr_html_()
    assert frame.startswith("<iframe srcdoc=") and 'sandbox="allow-scripts"' in frame
    assert "http://" not in shown.html.replace("http://www.w3.org", "")  # nothing to fetch
    with pytest.raises(UserError, match="recorded no attention"):
        show(torch.nn.Linear(3, 3), torch.zeros(1, 3))


@pytest.mark.browser
def test_heads_table_and_ablation_in_the_browser(runs, tmp_path):
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM}")
    from playwright.sync_api import sync_playwright  # optional: only the browser tests need it

    model = Explorer(runs["lm"]).run.model
    notebook = tmp_path / "inline.html"
    notebook.write_text(f"<html><body>{show(model, torch.tensor([[3, 4, 5, 6]]))._repr_html_()}")
    server = make_server(Explorer(runs["lm"]), port=0, first=ExploreInput(text="the dog"))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    errors: list[str] = []
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True)
            page = browser.new_page()
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(server.url)
            rows = page.locator("#heads-panel table.heads-table tr")
            assert rows.count() == 1 + 2 * 4  # a header and one row per head
            before = page.locator("#meta .summary").all_text_contents()
            page.locator('#heads-panel input[data-layer="blocks.0.attn"][data-head="1"]').check()
            page.wait_for_selector("#ablation-result .summary")
            text = page.text_content("#ablation-result")
            assert "blocks.0.attn head 1 ablated" in text
            after = page.locator("#ablation-result .summary").all_text_contents()
            assert after != before
            inline = browser.new_page()
            inline.on("pageerror", lambda e: errors.append(str(e)))
            requests: list[str] = []
            inline.on("request", lambda r: requests.append(r.url))
            inline.goto(notebook.as_uri())
            frame = inline.frames[1]
            frame.wait_for_selector("#heads-panel table.heads-table")
            assert frame.locator("#heads-panel table.heads-table tr").count() == 1 + 2 * 4
            assert [u for u in requests if not u.startswith(("file:", "about:", "data:"))] == []
            browser.close()
    finally:
        server.shutdown()
        server.server_close()
    assert errors == []
