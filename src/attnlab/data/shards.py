"""Token ids on disk: shard files, their manifest, memory-mapped reading and the held-out split.

A prepared directory holds::

    manifest.json        what was prepared, how far it got, the shards and the skipped files
    tokenizer.json       the tokenizer that made the ids
    tokens-00000.bin     flat token ids (uint16 when the vocabulary fits, else uint32), ...

A shard is written to a temporary file and renamed when complete, and the manifest (rewritten
atomically after each shard) lists only complete shards, so an interrupted preparation never
leaves a half shard behind: it resumes after the last shard listed.

The held-out split (:class:`BlockSplit`) is taken at read time, by position in the token stream:
the stream is cut into blocks of ``block`` tokens and the last ``val_fraction`` of every block is
validation. A corpus of at most one block is one block: its last ``val_fraction`` (at least
``min_val`` tokens) is validation, as in the first release. Nothing is read to take the split, and
one prepared directory serves any ``val_fraction``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from attnlab.errors import UserError
from attnlab.fileio import atomic_write_text

__all__ = [
    "MANIFEST",
    "FORMAT",
    "VERSION",
    "ShardWriter",
    "TokenIds",
    "BlockSplit",
    "read_manifest",
    "write_manifest",
    "open_tokens",
    "is_prepared",
]

MANIFEST = "manifest.json"
FORMAT = "attnlab-tokens"
VERSION = 1
SHARD_PATTERN = "tokens-{:05d}.bin"


def read_manifest(directory: str | os.PathLike) -> dict[str, Any] | None:
    """The manifest of a prepared directory, or None when there is none.

    Raises:
        UserError: a manifest that is not attnlab's or is damaged.
    """
    path = Path(directory) / MANIFEST
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise UserError(f"{path} is damaged: {err}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise UserError(f"{path} is not the manifest of an attnlab prepared corpus")
    if data.get("version") != VERSION:
        raise UserError(
            f"{path} was written by another attnlab version (format {data.get('version')}); "
            "prepare the corpus again"
        )
    return data


def write_manifest(directory: str | os.PathLike, manifest: dict[str, Any]) -> None:
    atomic_write_text(Path(directory) / MANIFEST, json.dumps(manifest, indent=1) + "\n")


def is_prepared(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a directory written by ``attnlab prepare`` (it has our manifest)."""
    p = Path(path)
    if not (p / MANIFEST).is_file():
        return False
    try:
        return json.loads((p / MANIFEST).read_text(encoding="utf-8")).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


class ShardWriter:
    """Append token ids to shard files; :meth:`commit` makes the current shard final.

    Args:
        directory: the prepared directory.
        dtype: the ids' dtype.
        index: the number of the next shard.
    """

    def __init__(self, directory: Path, dtype: np.dtype, index: int) -> None:
        self.directory, self.dtype, self.index = Path(directory), np.dtype(dtype), index
        self.tokens = 0
        self._file = None
        self._tmp = self.directory / f".{SHARD_PATTERN.format(index)}.tmp"
        for stale in self.directory.glob(".tokens-*.tmp"):  # a crash left these
            stale.unlink()

    def write(self, ids: np.ndarray) -> None:
        if self._file is None:
            self._file = open(self._tmp, "wb")
        self._file.write(np.ascontiguousarray(ids, dtype=self.dtype).tobytes())
        self.tokens += len(ids)

    def commit(self) -> dict[str, Any]:
        """Close the current shard under its final name; returns ``{"file", "tokens"}``."""
        name = SHARD_PATTERN.format(self.index)
        if self._file is None:
            self._file = open(self._tmp, "wb")
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self._tmp, self.directory / name)
        entry = {"file": name, "tokens": self.tokens}
        self.index += 1
        self.tokens, self._file = 0, None
        self._tmp = self.directory / f".{SHARD_PATTERN.format(self.index)}.tmp"
        return entry

    def close(self) -> None:
        """Drop the shard in progress (after an error)."""
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tmp.exists():
            self._tmp.unlink()


class TokenIds:
    """Shards read as one flat array of ids (memory-mapped; nothing is read until indexed).

    Supports ``len()`` and indexing with integer arrays (gathers across shards).
    """

    def __init__(self, arrays: list[np.ndarray]) -> None:
        self.arrays = [a for a in arrays if len(a)]
        self.starts = np.cumsum([0] + [len(a) for a in self.arrays])
        self.dtype = self.arrays[0].dtype if self.arrays else np.dtype(np.uint16)

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, index: Any) -> np.ndarray:
        index = np.asarray(index, dtype=np.int64)
        shard = np.searchsorted(self.starts, index, side="right") - 1
        out = np.empty(index.shape, dtype=self.dtype)
        for s in np.unique(shard):
            mask = shard == s
            out[mask] = self.arrays[s][index[mask] - self.starts[s]]
        return out

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = np.concatenate(self.arrays) if self.arrays else np.empty(0, self.dtype)
        return out if dtype is None else out.astype(dtype)


def open_tokens(directory: str | os.PathLike, manifest: dict[str, Any]) -> np.ndarray | TokenIds:
    """The ids of a complete prepared directory: a read-only memmap (one shard) or a
    :class:`TokenIds` over several.

    Raises:
        UserError: a shard is missing or has the wrong size.
    """
    directory = Path(directory)
    dtype = np.dtype(manifest["dtype"])
    arrays = []
    for shard in manifest["shards"]:
        path = directory / shard["file"]
        size = path.stat().st_size if path.exists() else -1
        if size != shard["tokens"] * dtype.itemsize:
            raise UserError(
                f"{path} is missing or damaged ({size} bytes, expected "
                f"{shard['tokens'] * dtype.itemsize}); prepare the corpus again"
            )
        if shard["tokens"]:
            arrays.append(np.memmap(path, dtype=dtype, mode="r"))
    return arrays[0] if len(arrays) == 1 else TokenIds(arrays)


class BlockSplit:
    """The training or validation part of a token stream, by blocks (see the module docstring).

    Position ``p`` of the part maps to a position of the stream by arithmetic, so indexing reads
    only the ids asked for.

    Args:
        ids: the whole stream (memmap, array or :class:`TokenIds`).
        part: ``train`` or ``val``.
        val_fraction: the held-out fraction of each block.
        block: tokens per block (None: the whole stream is one block).
        min_val: the fewest held-out tokens of a one-block stream.
    """

    def __init__(
        self, ids: Any, part: str, val_fraction: float, block: int | None, min_val: int = 1
    ) -> None:
        n = len(ids)
        if block is None or block >= n:
            B, v = max(n, 1), min(n, max(int(n * val_fraction), min_val))
            q, r, v_last = 1, 0, 0
        else:
            B, v = block, max(int(block * val_fraction), 1)
            q, r = divmod(n, B)
            v_last = max(int(r * val_fraction), r - (B - v))  # (train part <= a full one's)
        self.ids, self.part = ids, part
        self.B, self.v, self.q, self.r, self.v_last = B, v, q, r, v_last
        if part == "train":
            self.n = q * (B - v) + (r - v_last)
        elif part == "val":
            self.n = q * v + v_last
        else:
            raise ValueError(f"part must be 'train' or 'val', got {part!r}")

    def __len__(self) -> int:
        return self.n

    def positions(self, index: Any) -> np.ndarray:
        """Stream positions of the part's positions ``index``."""
        p = np.asarray(index, dtype=np.int64)
        B, v, q, r, v_last = self.B, self.v, self.q, self.r, self.v_last
        if self.part == "train":
            k, off = np.divmod(p, B - v)
            return k * B + off  # (in the last, partial block too: its train part comes first)
        k, off = np.divmod(p, v)
        full = k * B + (B - v) + off
        last = q * B + (r - v_last) + (p - q * v)
        return np.where(k < q, full, last)

    def __getitem__(self, index: Any) -> np.ndarray:
        if isinstance(index, slice):
            index = np.arange(*index.indices(self.n))
        return np.asarray(self.ids[self.positions(index)])

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self[np.arange(self.n)]
        return out if dtype is None else out.astype(dtype)
