"""Shared test settings: one thread per test worker (make test runs two workers on two cores)."""

import os
import shutil

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


# -- browser tests (marked `browser`): headless Chromium from Debian's package, via Playwright ---

CHROMIUM = os.environ.get("ATTNLAB_CHROMIUM", "/usr/bin/chromium")  # Debian's package
_BROWSER_SKIP = "browser test: needs Chromium and playwright"


def _browser_missing() -> str | None:
    """Why the browser tests cannot run here (None when they can)."""
    if shutil.which(CHROMIUM) is None:
        return f"Chromium not found at {CHROMIUM} (apt-get install chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install -e '.[test]')"
    return None


def pytest_collection_modifyitems(config, items):
    why = _browser_missing()
    if why is None:
        return
    skip = pytest.mark.skip(reason=f"{_BROWSER_SKIP}: {why}")
    for item in items:
        if "browser" in item.keywords:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter):
    skipped = [
        r
        for r in terminalreporter.stats.get("skipped", [])
        if _BROWSER_SKIP in str(getattr(r, "longrepr", ""))
    ]
    if skipped:
        terminalreporter.write_line(
            f"SKIPPED {len(skipped)} browser tests: {_browser_missing()}",
            yellow=True,
            bold=True,
        )
