"""The pydoc split and its score, shared by ``lm_vs_nanogpt.py`` and ``budget_sweep.py``.

Split and scoring as in issue 12: CPython's pydoc topics, character level; training on the first
90 %, scoring on the last 10 % in non-overlapping windows of 64 characters, each window's 64 next
characters predicted from the window alone:

    nats/char = mean over windows w and positions t of −log p(x_{w,t+1} | x_{w,≤t})

Any model that maps ``(B, 64)`` ids to ``(B, 64, V)`` logits is scored the same way. Run
directories of ``attnlab train lm`` on pydoc are scored from the command line (their last
weights)::

    python benchmarks/pydoc_score.py runs/a runs/b
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

import attnlab
from attnlab.config import LMTaskConfig
from attnlab.tasks.lm import LMTask

__all__ = ["WINDOW", "pydoc_task", "windows", "score", "score_run"]

WINDOW = 64


def pydoc_task(seq_len: int = WINDOW, max_chars: int | None = None):
    """attnlab's character-level pydoc task (last 10 % held out), with a window of ``seq_len``
    (``max_chars``: only the corpus's first characters, for smoke tests)."""
    config = LMTaskConfig(
        data="pydoc", tokenizer="char", seq_len=seq_len, seed=0, max_chars=max_chars
    )
    return LMTask.build(config)


def windows(val_ids: np.ndarray, window: int = WINDOW) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets ``(N, window)`` of the non-overlapping windows of the held-out ids."""
    ids = torch.as_tensor(np.asarray(val_ids, dtype=np.int64))
    n = (len(ids) - 1) // window
    x = ids[: n * window].view(n, window)  # (N, 64)
    y = ids[1 : n * window + 1].view(n, window)  # (N, 64): the next character of each
    return x, y


@torch.no_grad()
def score(
    logits_fn: Callable[[torch.Tensor], torch.Tensor],
    val_ids: np.ndarray,
    *,
    window: int = WINDOW,
    batch_size: int = 64,
    device: str = "cpu",
) -> float:
    """Mean next-character cross-entropy (nats/char) over the held-out windows."""
    x, y = windows(val_ids, window)
    total, count = 0.0, 0
    for i in range(0, len(x), batch_size):
        xb, yb = x[i : i + batch_size].to(device), y[i : i + batch_size].to(device)
        logits = logits_fn(xb).float()  # (B, 64, V)
        total += float(F.cross_entropy(logits.flatten(0, 1), yb.flatten(), reduction="sum"))
        count += yb.numel()
    return total / count


def score_run(run: str, device: str = "cpu") -> float:
    """nats/char of a pydoc run directory's last weights (``attnlab.load``)."""
    loaded = attnlab.load(run, weights="last", map_location=device)
    config = loaded.config.get("task", {})
    if config.get("data") != "pydoc" or config.get("tokenizer") != "char":
        raise SystemExit(f"{run}: not a character-level pydoc run (task {config})")
    if config.get("val_fraction", 0.1) != 0.1:
        raise SystemExit(f"{run}: held out {config['val_fraction']} of pydoc, not the last 10 %")
    vocab_size, val_ids = _held_out(config.get("max_chars"))
    if vocab_size != loaded.model.config.vocab_size:
        raise SystemExit(f"{run}: a vocabulary of {loaded.model.config.vocab_size}, not pydoc's "
                         f"{vocab_size} characters")  # fmt: skip
    return score(loaded.model.eval(), val_ids, device=device)


@functools.cache
def _held_out(max_chars: int | None) -> tuple[int, np.ndarray]:
    """pydoc's vocabulary size and held-out ids (built once for every run scored)."""
    task = pydoc_task(max_chars=max_chars)
    return task.vocab_size, task.splits["val"]


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="nats/char of pydoc runs' last weights")
    ap.add_argument("runs", nargs="+", metavar="RUN", help="attnlab train lm run directories")
    for run in ap.parse_args().runs:
        print(f"{run}\t{score_run(run):.4f}")
