"""No public constructor or function of the core packages (attention/, layers/, models/) takes more
than 12 parameters: modules receive ready parts, and options travel in configs (the builders of
attnlab.layers.builders read them)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

MAX_PARAMETERS = 12
PACKAGES = ("attnlab.attention", "attnlab.layers", "attnlab.models")


def _public_callables():
    for pkg in PACKAGES:
        root = importlib.import_module(pkg)
        names = [pkg, *(m.name for m in pkgutil.walk_packages(root.__path__, pkg + "."))]
        for name in names:
            module = importlib.import_module(name)
            for attr, obj in vars(module).items():
                if attr.startswith("_") or getattr(obj, "__module__", None) != name:
                    continue
                if inspect.isclass(obj) and "__init__" in vars(obj):
                    params = inspect.signature(obj.__init__).parameters
                    yield f"{name}.{attr}", [p for p in params if p != "self"]
                elif inspect.isfunction(obj):
                    yield f"{name}.{attr}", list(inspect.signature(obj).parameters)


CALLABLES = dict(_public_callables())


def test_the_core_packages_were_inspected():
    # the walk found the classes it is about (an empty walk would pass the test below)
    for name in (
        "attnlab.attention.multihead.MultiHeadAttention",
        "attnlab.layers.block.TransformerBlock",
        "attnlab.models.lm.DecoderLM",
        "attnlab.layers.builders.build_block",
    ):
        assert name in CALLABLES
    assert len(CALLABLES) > 100


@pytest.mark.parametrize("name", sorted(CALLABLES))
def test_no_public_signature_is_wider_than_twelve(name):
    params = CALLABLES[name]
    assert len(params) <= MAX_PARAMETERS, f"{name} takes {len(params)} parameters: {params}"
