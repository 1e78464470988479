"""What the explorer's browser tests share: headless Chromium (Debian's package, never
Playwright's own download) and a page whose requests, script errors and console errors are
recorded."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from attnlab.explore import write_page

CHROMIUM = os.environ.get("ATTNLAB_CHROMIUM", "/usr/bin/chromium")  # never Playwright's own


@pytest.fixture(scope="module", name="browser")
def browser_fixture():
    """One headless Chromium per test module (import this into a module to use ``browser``)."""
    from playwright.sync_api import sync_playwright  # optional: only the browser tests need it

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        yield b
        b.close()


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

    def texts(self, selector: str) -> list[str]:
        return self.page.locator(selector).all_text_contents()

    def attr(self, selector: str, name: str) -> list[str | None]:
        return self.page.eval_on_selector_all(
            selector, f"es => es.map(e => e.getAttribute({name!r}))"
        )

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
