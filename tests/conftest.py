"""Shared test settings: one thread per test worker (make test runs two workers on two cores)."""

import importlib.util
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


@pytest.fixture
def one_thread():
    """Torch on one thread for the test (its seeded numbers repeat exactly), restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# -- browser tests (marked `browser`): headless Chromium from Debian's package, via Playwright ---

CHROMIUM = os.environ.get("ATTNLAB_CHROMIUM", "/usr/bin/chromium")  # Debian's package
_BROWSER_SKIP = "browser test: needs Chromium and playwright"


def _browser_missing() -> str | None:
    """Why the browser tests cannot run here (None when they can)."""
    if shutil.which(CHROMIUM) is None:
        return f"Chromium not found at {CHROMIUM} (apt-get install chromium)"
    # found, not imported: importing playwright.sync_api costs ~0.2 s in every worker at
    # collection, also in runs that deselect or skip the browser tests
    find = importlib.util.find_spec  # (the package first: a submodule's lookup imports it)
    if find("playwright") is None or find("playwright.sync_api") is None:
        return "playwright is not installed (pip install -e '.[test]')"
    return None


def _heavy_modules_first(items) -> None:
    """Reorder whole test files (each keeps its own order): those with the most ``slow`` or
    ``browser`` tests first. ``make test`` hands files to its two workers in this order
    (``--dist loadfile --no-loadscope-reorder``): the long files start first and the many short
    ones fill in at the end, instead of xdist's default (most tests first), which left the long
    runs (the torchrun launches, the timed experiments) for the end, one after the other."""
    weight: dict[str, int] = {}
    for item in items:
        heavy = item.get_closest_marker("slow") or item.get_closest_marker("browser")
        weight[item.module.__name__] = weight.get(item.module.__name__, 0) + bool(heavy)
    order = {name: i for i, name in enumerate(weight)}  # first appearance
    items.sort(key=lambda it: (-weight[it.module.__name__], order[it.module.__name__]))


def pytest_collection_modifyitems(config, items):
    _heavy_modules_first(items)
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
