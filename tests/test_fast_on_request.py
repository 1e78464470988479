"""The fast paths are applied only on request: importing attnlab, training and generating without
fast-path flags never builds or loads the one-row C++ kernel (attnlab.fast.matvec), and the plain
models hold no fast-path layers.

The check runs in a fresh interpreter (the test process may have loaded the kernel for other
tests), with torch's extension builder replaced by a recorder, which is read after the plain
paths; the same interpreter then applies ``attnlab.fast.for_decoding`` and shows that the
recorder does see a build request (it refuses to build, so the kernel's documented fallback,
``F.linear``, is taken)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from torch import nn

from attnlab.config import ModelConfig
from attnlab.models.lm import DecoderLM

_SCRIPT = textwrap.dedent(
    """
    import json, tempfile
    import torch.utils.cpp_extension as ext

    builds = []

    def recorder(*args, **kwargs):
        builds.append(args[0] if args else kwargs.get("name"))
        raise RuntimeError("the test refuses to build")

    ext.load_inline = recorder
    ext.load = recorder

    import numpy as np
    import torch

    import attnlab
    from attnlab.cli import main
    from attnlab.config import LMTaskConfig
    from attnlab.data.tokenizers import CharTokenizer
    from attnlab.decoding import generate
    from attnlab.tasks.lm import LMTask
    from attnlab.train import TrainConfig, train

    text = "the quick brown fox jumps over the lazy dog; " * 40
    tok = CharTokenizer.train(text)
    ids = np.asarray(tok.encode(text), dtype=np.int64)
    task = LMTask(ids, tok, LMTaskConfig(data="toy", seq_len=16, seed=0, vocab_size=tok.vocab_size))
    cfg = attnlab.ModelConfig.preset(
        "tiny", vocab_size=tok.vocab_size, max_seq_len=32, d_model=32, n_heads=2, n_layers=1
    )
    model = attnlab.DecoderLM(cfg)
    out = tempfile.mkdtemp()
    train_cfg = TrainConfig(steps=2, batch_size=4, warmup_steps=1, eval_every=2, eval_batches=1,
                            progress=False, device="cpu")
    train(model, task, train_cfg, out)
    idx = torch.tensor([tok.encode("the ")])
    generate(model.eval(), idx, 4, temperature=0)
    generate(model.to(torch.bfloat16), idx, 4, temperature=0)
    assert main(["generate", out, "--prompt", "the ", "-n", "4", "--no-stream"]) == 0
    from attnlab.fast import matvec as mv

    def seen():
        return {"builds": list(builds), "asked": mv._extension.cache_info().currsize,
                "libraries": [str(p) for p in torch.ops.loaded_libraries]}

    plain = seen()
    fast = attnlab.fast.for_decoding(attnlab.load(out).model, dtype="bfloat16")
    generate(fast, idx, 4, temperature=0)
    print(json.dumps({"plain": plain, "fast": seen()}))
    """
)


def _run(tmp_path: Path) -> dict:
    env = {**os.environ, "ATTNLAB_CACHE": str(tmp_path / "cache"), "ATTNLAB_MATVEC": "1"}
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_training_and_generating_without_fast_flags_never_build_the_kernel(tmp_path):
    seen = _run(tmp_path)  # one interpreter: first the plain paths, then a fast one
    plain, fast = seen["plain"], seen["fast"]
    assert plain["builds"] == [] and plain["asked"] == 0
    assert not any("attnlab_matvec" in lib for lib in plain["libraries"])
    # the same spy sees the build that a fast path asks for (refused: F.linear is used)
    assert fast["asked"] == 1 and len(fast["builds"]) == 1
    assert fast["builds"][0].startswith("attnlab_matvec")


def test_the_plain_models_are_built_from_nn_linear():
    """No layer of a plain model is a fast-path subclass: every linear layer is ``nn.Linear``."""
    cfg = ModelConfig.preset("tiny", vocab_size=40, max_seq_len=16, n_kv_heads=2)
    linears = [m for m in DecoderLM(cfg).modules() if isinstance(m, nn.Linear)]
    assert linears and all(type(m) is nn.Linear for m in linears)
