"""Checks shared by the CPU kernels' tests (tests/test_matvec.py, tests/test_int8_bf16.py)."""

from __future__ import annotations

import torch
from torch import nn


def ops_called(fn) -> set[str]:
    """The names of the operators ``fn()`` runs (torch's profiler)."""
    with torch.profiler.profile() as prof:
        fn()
    return {e.name for e in prof.events()}


def assert_compiled_calls(model: nn.Module, x: torch.Tensor, op: str) -> None:
    """``model`` compiles without a graph break, the compiled forward equals the eager one on
    ``x``, and it calls the operator ``op``."""
    with torch.no_grad():
        assert torch._dynamo.explain(model)(x).graph_break_count == 0
        compiled = torch.compile(model, dynamic=False)
        torch.testing.assert_close(compiled(x), model(x))
        assert op in ops_called(lambda: compiled(x))
