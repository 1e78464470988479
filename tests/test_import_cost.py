"""What importing attnlab costs: no torch._dynamo (about 1.6 s) for a plain import, the CLI
module, or the models, so every CLI process (and every test that starts one) is spared it; the
two compiler marks that used to import it at import time keep their effect under torch.compile."""

from __future__ import annotations

import json
import subprocess
import sys

import torch
from torch._dynamo.testing import CompileCounter

from attnlab.fast import loss as fast_loss
from attnlab.fast import matvec as fast_matvec

_PROBE = """
import json, sys
seen = {}
import attnlab
seen["attnlab"] = "torch._dynamo" in sys.modules
import attnlab.cli
seen["attnlab.cli"] = "torch._dynamo" in sys.modules
import attnlab.fast, attnlab.models.lm, attnlab.runs
seen["models"] = "torch._dynamo" in sys.modules
print(json.dumps(seen))
"""


def test_importing_attnlab_and_its_cli_does_not_import_dynamo():
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True, timeout=120
    )
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == {"attnlab": False, "attnlab.cli": False, "models": False}


def test_matvec_available_carries_exactly_what_assume_constant_result_sets():
    def probe() -> bool:
        return True

    before = set(vars(probe))
    marked = torch.compiler.assume_constant_result(probe)
    assert marked is probe  # the decorator only marks the function
    added = {k: v for k, v in vars(probe).items() if k not in before}
    assert added  # the mark exists in this torch
    for name, value in added.items():
        assert getattr(fast_matvec.matvec_available, name, None) == value


def test_linear_cross_entropy_runs_eagerly_inside_a_compiled_function():
    # the graph break torch.compiler.disable gave as a decorator: the loss runs as written (not
    # traced) and the compiled result equals the eager one
    h = torch.randn(6, 8, requires_grad=True)
    w = torch.randn(11, 8, requires_grad=True)
    y = torch.randint(0, 11, (6,))
    compiling_inside = []
    orig = fast_loss._linear_cross_entropy

    def spy(*args):
        compiling_inside.append(torch.compiler.is_compiling())
        return orig(*args)

    def f(h, w, y):
        return fast_loss.linear_cross_entropy(h * 2, w, y, label_smoothing=0.1) * 3

    counter = CompileCounter()
    fast_loss._linear_cross_entropy = spy
    try:
        got = torch.compile(f, backend=counter)(h, w, y)
    finally:
        fast_loss._linear_cross_entropy = orig
        torch._dynamo.reset()
    ref = torch.nn.functional.cross_entropy((h * 2) @ w.T, y, label_smoothing=0.1) * 3
    torch.testing.assert_close(got, ref)
    assert compiling_inside == [False]  # called once, not traced
    assert counter.frame_count >= 2  # the graph was broken around it
