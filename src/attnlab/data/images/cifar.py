"""CIFAR-10 from its "python version" batches, read without trusting the pickles.

The batches (``data_batch_1`` … ``data_batch_5``, ``test_batch``, ``batches.meta``) are pickled
dicts, and ``pickle.load`` runs whatever a pickle asks for: a crafted ``data_batch_1`` could
execute code when it is read (issue 17). :func:`safe_unpickle` admits only what a batch holds —
dicts, lists, strings, bytes, numbers and numpy arrays, rebuilt by numpy's own array
reconstruction functions — and refuses every other global by name, before anything runs.

Shape legend: N images.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from attnlab.data.images.splits import ImageSplits, hold_out_val
from attnlab.errors import UserError

__all__ = ["load_cifar10", "safe_unpickle"]

try:  # numpy >= 2
    from numpy._core import multiarray as _multiarray
    from numpy._core import numeric as _numeric
except ImportError:  # numpy 1.x
    from numpy.core import multiarray as _multiarray
    from numpy.core import numeric as _numeric


def _latin1(text: str, encoding: str = "latin1") -> bytes:
    """``_codecs.encode`` as Python 3 pickles bytes at protocol ≤ 2 (latin-1 only)."""
    if encoding not in ("latin1", "latin-1") or not isinstance(text, str):
        raise pickle.UnpicklingError(f"refusing _codecs.encode with encoding {encoding!r}")
    return text.encode("latin1")


#: the only globals a batch may name: numpy's array and dtype reconstruction (both the numpy 1
#: ``numpy.core`` and the numpy 2 ``numpy._core`` paths; ``_frombuffer`` for pickle protocol 5)
#: and the latin-1 bytes of protocol-2 pickles written by Python 3
_ALLOWED: dict[tuple[str, str], Any] = {
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("numpy.core.multiarray", "_reconstruct"): _multiarray._reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _multiarray._reconstruct,
    ("numpy.core.numeric", "_frombuffer"): _numeric._frombuffer,
    ("numpy._core.numeric", "_frombuffer"): _numeric._frombuffer,
    ("_codecs", "encode"): _latin1,
}


class _BatchUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(
                f"it names {module}.{name}, which a CIFAR-10 batch never holds (refused: "
                "unpickling it could run code)"
            ) from None

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("it uses persistent ids, which a CIFAR-10 batch never holds")


def safe_unpickle(path: str | Path) -> Any:
    """Unpickle a CIFAR-10 batch file, admitting only containers, strings, numbers and numpy arrays.

    Python 2 strings come back as bytes (``encoding="bytes"``, as the batches' keys are).

    Raises:
        UserError: the file cannot be read, is not a pickle, or names anything else (the
            message names the file and the refused global).
    """
    path = Path(path)
    try:
        with open(path, "rb") as f:
            obj = _BatchUnpickler(f, encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, OSError, ValueError, TypeError) as err:
        raise UserError(f"cannot read CIFAR-10 batch {str(path)!r}: {err}") from None
    except Exception as err:  # any other malformed-pickle error (IndexError, KeyError ...)
        raise UserError(
            f"cannot read CIFAR-10 batch {str(path)!r}: not a valid pickle ({err!r})"
        ) from None
    return obj


def _read_batch(f: Path) -> tuple[Tensor, Tensor]:
    """One batch: ``(images (N, 3, 32, 32) in [0, 1], labels (N,))``."""
    d = safe_unpickle(f)
    if not isinstance(d, dict):
        raise UserError(f"{str(f)!r} is not a CIFAR-10 batch (a pickled {type(d).__name__})")
    data, labels = d.get(b"data"), d.get(b"labels", d.get(b"fine_labels"))
    if data is None or labels is None:
        raise UserError(f"{str(f)!r} is not a CIFAR-10 batch (needs b'data' and b'labels')")
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8:
        raise UserError(f"{str(f)!r}: CIFAR-10 data must be a uint8 array")
    if isinstance(labels, np.ndarray) and labels.ndim == 1 and labels.dtype.kind in "iu":
        labels = labels.tolist()
    if not isinstance(labels, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in labels
    ):
        raise UserError(f"{str(f)!r}: CIFAR-10 labels must be a list of integers")
    if data.ndim != 2 or data.shape[1] != 3072 or len(labels) != len(data):
        raise UserError(
            f"{str(f)!r}: CIFAR-10 data must be (N, 3072) with N labels, got "
            f"{data.shape} and {len(labels)} labels"
        )
    y = torch.tensor(labels, dtype=torch.long)
    if len(y) and int(y.min()) < 0:
        raise UserError(f"{str(f)!r}: negative class label {int(y.min())}")
    x = torch.from_numpy(data.reshape(-1, 3, 32, 32).astype(np.float32) / 255.0)
    return x, y


def load_cifar10(path: str | Path, *, seed: int = 0) -> ImageSplits:
    """CIFAR-10 from its "python version" files (``data_batch_1..5``, ``test_batch``).

    ``path`` is the ``cifar-10-batches-py`` directory or its parent. Each batch is a pickled dict
    with ``b"data"`` (N, 3072) uint8 rows (1024 red, 1024 green, 1024 blue, row-major 32×32) and
    ``b"labels"``; ``batches.meta`` holds ``b"label_names"``. The files are read with
    :func:`safe_unpickle`. 10 % of the training images are held out for validation;
    ``test_batch`` is the test split.

    Raises:
        FileNotFoundError: no batches found under ``path``.
        UserError: a batch that is not in this format, or a pickle that names anything a batch
            does not hold (the message names the file).
    """
    root = Path(path)
    if (root / "cifar-10-batches-py").is_dir():
        root = root / "cifar-10-batches-py"
    train_files = sorted(root.glob("data_batch_*"))
    test_file = root / "test_batch"
    if not root.is_dir() or not train_files or not test_file.exists():
        raise FileNotFoundError(
            f"no CIFAR-10 python batches (data_batch_1…5, test_batch) in {str(path)!r}"
        )
    parts = [_read_batch(f) for f in train_files]
    x, y = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    test = _read_batch(test_file)
    meta = root / "batches.meta"
    classes: list[str] = []
    if meta.exists():
        info = safe_unpickle(meta)
        names = info.get(b"label_names", []) if isinstance(info, dict) else []
        classes = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
    n_cls = int(max(int(y.max()), int(test[1].max()))) + 1
    if len(classes) < n_cls:
        classes = [str(i) for i in range(n_cls)]
    train, val = hold_out_val(x, y, seed)
    return ImageSplits(train, val, test, classes, "cifar10")
