"""The random state of a training process: captured into state.pt, restored on resume.

A resumed run reproduces an uninterrupted one only if dropout masks and any sampling draw the same
numbers: the torch, CUDA, Python and NumPy generators are saved with every checkpoint
(:func:`capture_rng`, as tensors and plain values that ``torch.load(weights_only=True)`` reads)
and validation runs inside :func:`rng_preserved`, so it never shifts the training streams.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator

import numpy as np
import torch

__all__ = ["capture_rng", "restore_rng", "seed_all", "rng_preserved"]


def capture_rng() -> dict:
    """The torch, Python, NumPy (and CUDA) random states, as tensors and plain values."""
    np_state = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": {
            "name": np_state[0],
            "keys": torch.from_numpy(np_state[1].astype(np.int64)),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
        },
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict) -> None:
    """Set every random generator back to a :func:`capture_rng` state."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    n = state["numpy"]
    np.random.set_state(
        (
            n["name"],
            n["keys"].numpy().astype(np.uint32),
            n["pos"],
            n["has_gauss"],
            n["cached_gaussian"],
        )
    )
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


def seed_all(seed: int) -> None:
    """Seed torch, Python and NumPy."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)


@contextlib.contextmanager
def rng_preserved() -> Iterator[None]:
    """Run a block (validation, sampling) without disturbing the training random streams."""
    saved = capture_rng()
    try:
        yield
    finally:
        restore_rng(saved)
