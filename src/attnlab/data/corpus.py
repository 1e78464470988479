"""Text corpora for language modelling, cached token ids, and the LM training task.

Nothing is downloaded. Built-in corpora:

- ``pydoc``: the English help topics that ship inside CPython (``pydoc_data.topics``), ~0.5 MB;
  the default.
- ``stdlib``: the standard library's own ``.py`` source, files in sorted path order, capped.
- any text file, or a folder of text files (read recursively in sorted order, binaries skipped).

The token ids of a corpus are cached on disk as a flat numpy array (read back as a memmap) under
``$ATTNLAB_CACHE`` (default ``~/.cache/attnlab``), keyed by a hash of the text and the exact
tokenizer, so a second run does not tokenise again. The last ``val_fraction`` of the ids is the
validation split (deterministic); training windows are drawn at random positions with a generator
seeded by ``(seed, split, step)``, so batch ``step`` is the same in every run, resumed or not.

Shape legend: B batch, T sequence length (``seq_len``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.data.tokenizers import ByteBPETokenizer, tokenizer_from_json, train_tokenizer
from attnlab.errors import UserError

__all__ = ["Corpus", "load_corpus", "cache_dir", "tokenize_cached", "LMTask", "BUILTIN_CORPORA"]

log = logging.getLogger(__name__)

BUILTIN_CORPORA = ("pydoc", "stdlib")
STDLIB_MAX_CHARS = 4_000_000
_SPLITS = {"train": 0, "val": 1}


@dataclass
class Corpus:
    """A named text. ``fingerprint`` hashes the text (cache keys)."""

    name: str
    text: str

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()[:16]


def _pydoc_text() -> str:
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k].strip("\n") for k in sorted(topics)) + "\n"


def _read_text_file(path: Path) -> str | None:
    """The file's text, or None for a binary / non-UTF-8 file."""
    data = path.read_bytes()
    if b"\x00" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _stdlib_text(max_chars: int) -> str:
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
    parts, size = [], 0
    for path in sorted(root.rglob("*.py"), key=lambda p: p.relative_to(root).as_posix()):
        if skip & set(path.relative_to(root).parts):
            continue
        text = _read_text_file(path)
        if not text:
            continue
        piece = f"# {path.relative_to(root).as_posix()}\n{text}\n"
        parts.append(piece)
        size += len(piece)
        if size >= max_chars:
            break
    return "".join(parts)[:max_chars]


def load_corpus(source: str, *, max_chars: int | None = None) -> Corpus:
    """Load ``pydoc``, ``stdlib``, a text file or a folder of text files.

    Args:
        source: a built-in corpus name or a path.
        max_chars: keep at most this many characters (``stdlib`` defaults to 4 million).

    Raises:
        UserError: unknown name / missing path, a corpus with no text, an unreadable file.
    """
    if max_chars is not None and max_chars < 1:
        raise UserError(f"max_chars must be positive, got {max_chars}")
    if source == "pydoc":
        text = _pydoc_text()
    elif source == "stdlib":
        text = _stdlib_text(max_chars or STDLIB_MAX_CHARS)
    else:
        path = Path(source).expanduser()
        if not path.exists():
            raise UserError(
                f"unknown corpus {source!r}: not a built-in corpus "
                f"({', '.join(BUILTIN_CORPORA)}) and no such file or folder"
            )
        if path.is_dir():
            texts = []
            for f in sorted(p for p in path.rglob("*") if p.is_file()):
                if any(part.startswith(".") for part in f.relative_to(path).parts):
                    continue
                try:
                    t = _read_text_file(f)
                except OSError as err:  # unreadable, or removed while we read the folder
                    log.warning("skipping %s: %s", f, err)
                    continue
                if t:
                    texts.append(t)
            text = "\n".join(texts)
        else:
            try:
                text = _read_text_file(path)
            except OSError as err:
                raise UserError(f"cannot read corpus file {str(path)!r}: {err}") from None
            if text is None:
                raise UserError(f"corpus file {str(path)!r} is not UTF-8 text")
        source = str(path.resolve())
    if max_chars is not None:
        text = text[:max_chars]
    if not text.strip():
        raise UserError(f"corpus {source!r} is empty (no text to train on)")
    return Corpus(source, text)


def cache_dir() -> Path:
    """``$ATTNLAB_CACHE`` or ``~/.cache/attnlab``."""
    return Path(os.environ.get("ATTNLAB_CACHE") or Path.home() / ".cache" / "attnlab")


def _encode(tokenizer, text: str) -> list[int]:
    if isinstance(tokenizer, ByteBPETokenizer):
        # batch-encode line groups (parallel in the Rust library). A whitespace run at a group
        # boundary may split differently from whole-text encoding; the result is deterministic
        lines = text.splitlines(keepends=True)
        chunks = ["".join(lines[i : i + 256]) for i in range(0, len(lines), 256)]
        return [i for ids in tokenizer.encode_batch(chunks) for i in ids]
    return tokenizer.encode(text)


def tokenize_cached(corpus: Corpus, tokenizer) -> np.ndarray:
    """The corpus's token ids, from the on-disk cache when present (a read-only memmap).

    The cache key hashes the text and the tokenizer's saved form. An unwritable cache directory
    only costs the caching (the ids are returned from memory).
    """
    dtype = np.uint16 if tokenizer.vocab_size <= 2**16 else np.uint32
    key = hashlib.sha256(f"{corpus.fingerprint}:{tokenizer.fingerprint}".encode()).hexdigest()[:24]
    path = cache_dir() / "tokens" / f"{key}.{np.dtype(dtype).name}.bin"
    if path.exists() and path.stat().st_size > 0:
        return np.memmap(path, dtype=dtype, mode="r")
    ids = np.asarray(_encode(tokenizer, corpus.text), dtype=dtype)
    try:
        from attnlab.fileio import atomic_write_bytes

        atomic_write_bytes(path, ids.tobytes())
    except OSError as err:
        log.warning("could not cache token ids in %s: %s", path.parent, err)
        return ids
    return np.memmap(path, dtype=dtype, mode="r")


def _cached_bpe(corpus: Corpus, vocab_size: int) -> ByteBPETokenizer:
    # BPE training is deterministic but not free: keep the learned merges per (corpus, vocab)
    path = cache_dir() / "tokenizers" / f"bpe-{corpus.fingerprint}-{vocab_size}.json"
    if path.exists():
        try:
            tok = tokenizer_from_json(path.read_text(encoding="utf-8"), str(path))
            if isinstance(tok, ByteBPETokenizer):
                return tok
        except UserError:
            pass
    tok = ByteBPETokenizer.train(corpus.text, vocab_size)
    try:
        from attnlab.fileio import atomic_write_text

        atomic_write_text(path, tok.to_json())
    except OSError as err:
        log.warning("could not cache the tokenizer in %s: %s", path.parent, err)
    return tok


class LMTask:
    """Next-token prediction on one corpus: the trainer's :class:`~attnlab.train.Task`.

    A batch is ``(idx, targets)``, both ``(B, T)`` long tensors, ``targets`` shifted by one.

    Args:
        ids: the whole corpus as token ids.
        tokenizer: the tokenizer that produced ``ids``.
        seq_len: window length T.
        seed: seeds the window positions together with the split and step.
        val_fraction: the last fraction of ``ids`` held out for validation.
        data: the corpus name or path (stored in config.json).
        max_chars: the corpus cap used (stored in config.json).

    Raises:
        UserError: a corpus too short for two windows of ``seq_len + 1`` tokens.
    """

    def __init__(
        self,
        ids: np.ndarray,
        tokenizer,
        *,
        seq_len: int,
        seed: int = 0,
        val_fraction: float = 0.1,
        data: str = "pydoc",
        max_chars: int | None = None,
    ) -> None:
        if seq_len < 1:
            raise UserError(f"seq_len must be positive, got {seq_len}")
        if not 0.0 < val_fraction < 1.0:
            raise UserError(f"val_fraction must be in (0, 1), got {val_fraction}")
        n = len(ids)
        n_val = max(int(n * val_fraction), seq_len + 1)
        if n - n_val < seq_len + 1:
            raise UserError(
                f"corpus {data!r} has {n} tokens: too few for a training and a "
                f"validation window of seq_len={seq_len} (+1); use a shorter "
                f"--seq-len or a larger corpus"
            )
        self.ids, self.tokenizer = ids, tokenizer
        self.seq_len, self.seed, self.val_fraction = seq_len, seed, val_fraction
        self.data, self.max_chars = data, max_chars
        self.splits = {"train": ids[: n - n_val], "val": ids[n - n_val :]}

    @classmethod
    def build(
        cls,
        data: str = "pydoc",
        *,
        tokenizer: str = "char",
        vocab_size: int = 512,
        seq_len: int = 128,
        seed: int = 0,
        val_fraction: float = 0.1,
        max_chars: int | None = None,
        tokenizer_obj=None,
    ) -> LMTask:
        """Load the corpus, train (or reuse) the tokenizer, tokenise with the cache."""
        corpus = load_corpus(data, max_chars=max_chars)
        if tokenizer_obj is None:
            if tokenizer == "bpe":
                tokenizer_obj = _cached_bpe(corpus, vocab_size)
            else:
                tokenizer_obj = train_tokenizer(tokenizer, corpus.text, vocab_size)
        ids = tokenize_cached(corpus, tokenizer_obj)
        return cls(
            ids,
            tokenizer_obj,
            seq_len=seq_len,
            seed=seed,
            val_fraction=val_fraction,
            data=corpus.name,  # a file or folder as an absolute path: resumable from anywhere
            max_chars=max_chars,
        )

    @classmethod
    def from_config(cls, task: dict[str, Any], tokenizer, **overrides: Any) -> LMTask:
        """Rebuild the task of a run directory (``config.json["task"]``) with its tokenizer."""
        if not isinstance(task, dict) or task.get("type") != "lm":
            raise UserError(f"the run's task is not a language-modelling task: {task!r}")
        kw = dict(
            data=task["data"],
            seq_len=task["seq_len"],
            seed=task.get("seed", 0),
            val_fraction=task.get("val_fraction", 0.1),
            max_chars=task.get("max_chars"),
        )
        kw.update(overrides)
        return cls.build(tokenizer_obj=tokenizer, **kw)

    # -- the trainer protocol ----------------------------------------------------------------

    def _windows(self, split: str, starts: np.ndarray) -> tuple[Tensor, Tensor]:
        ids = self.splits[split]
        index = starts[:, None] + np.arange(self.seq_len + 1)[None, :]  # (B, T+1)
        chunk = torch.from_numpy(np.asarray(ids[index], dtype=np.int64))  # (B, T+1)
        return chunk[:, :-1], chunk[:, 1:]

    def get_batch(
        self, split: str, step: int, batch_size: int, rank: int = 0, world: int = 1
    ) -> tuple[Tensor, Tensor]:
        """This rank's share of global batch ``step``: ``(idx, targets)``, each ``(B/world, T)``."""
        if split not in _SPLITS:
            raise ValueError(f"split must be 'train' or 'val', got {split!r}")
        n = len(self.splits[split])
        rng = np.random.default_rng([self.seed, _SPLITS[split], step])
        starts = rng.integers(0, n - self.seq_len, size=batch_size)  # window needs T+1 ids
        per = batch_size // world
        return self._windows(split, starts[rank * per : (rank + 1) * per])

    def loss(self, model, batch, cfg=None) -> tuple[Tensor, dict[str, float]]:
        """Mean next-token cross-entropy (+ ``moe_aux_coef`` × MoE load-balancing loss)."""
        idx, targets = batch
        logits = model(idx)  # (B, T, V)
        smoothing = getattr(cfg, "label_smoothing", 0.0) or 0.0
        ce = F.cross_entropy(
            logits.flatten(0, 1).float(), targets.flatten(), label_smoothing=smoothing
        )
        inner = getattr(model, "module", model)  # DDP wraps the model
        coef = getattr(getattr(inner, "config", None), "moe_aux_coef", 0.0)
        aux = getattr(inner, "aux_loss", None)
        metrics: dict[str, float] = {}
        loss = ce
        if aux is not None and torch.is_tensor(aux) and aux.requires_grad and coef:
            loss = ce + coef * aux
            metrics = {"ce": float(ce.detach()), "aux": float(aux.detach())}
        return loss, metrics

    def eval_batches(
        self, batch_size: int, n_batches: int | None
    ) -> Iterator[tuple[Tensor, Tensor]]:
        """The fixed validation set: consecutive non-overlapping windows from the start."""
        n = len(self.splits["val"])
        starts = np.arange(0, n - self.seq_len, self.seq_len)
        if n_batches is not None:
            starts = starts[: batch_size * n_batches]
        for i in range(0, len(starts), batch_size):
            yield self._windows("val", starts[i : i + batch_size])

    def count(self, batch) -> int:
        return int(batch[0].numel())

    def config_dict(self) -> dict[str, Any]:
        return {
            "type": "lm",
            "data": self.data,
            "tokenizer": self.tokenizer.type,
            "vocab_size": self.tokenizer.vocab_size,
            "seq_len": self.seq_len,
            "seed": self.seed,
            "val_fraction": self.val_fraction,
            "max_chars": self.max_chars,
            "n_tokens": {k: len(v) for k, v in self.splits.items()},
        }

    def save_artifacts(self, run_dir) -> None:
        self.tokenizer.save(run_dir)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    @torch.no_grad()
    def val_loss(
        self, model, *, batch_size: int = 32, n_batches: int | None = None
    ) -> dict[str, float]:
        """Token-weighted mean cross-entropy on the validation split, and its perplexity.

        Returns:
            ``{"loss", "perplexity", "tokens"}``.
        """
        device = next(model.parameters()).device
        was_training = model.training
        model.eval()
        total, count = 0.0, 0
        try:
            for idx, targets in self.eval_batches(batch_size, n_batches):
                logits = model(idx.to(device))  # (B, T, V)
                total += float(
                    F.cross_entropy(
                        logits.flatten(0, 1).float(), targets.to(device).flatten(), reduction="sum"
                    )
                )
                count += targets.numel()
        finally:
            model.train(was_training)
        loss = total / max(count, 1)
        return {"loss": loss, "perplexity": float(np.exp(min(loss, 50.0))), "tokens": count}
