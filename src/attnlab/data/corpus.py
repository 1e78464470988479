"""Text corpora read whole into memory: the first release's path, kept as the reference.

Training prepares corpora by streaming (:mod:`attnlab.data.prepare`: bounded memory, shards on
disk). This module is what the first release did, kept because the streaming path is tested
against it (the same ids) and measured against it (``benchmarks/prepare.py``):
:func:`load_corpus` reads the whole text, :func:`corpus_tokenizer` trains on all of it,
:func:`tokenize_cached` encodes it into a Python list and caches the ids as one flat array under
``$ATTNLAB_CACHE/tokens``, keyed by a hash of the text and the exact tokenizer.

Built-in corpora (nothing is downloaded): ``pydoc``, the English help topics that ship inside
CPython (``pydoc_data.topics``, ~0.5 MB); ``stdlib``, the standard library's own ``.py`` source,
files in sorted path order, capped; and any text file, or folder of text files (read recursively
in sorted order, binaries skipped).
"""

from __future__ import annotations

import hashlib
import logging
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnlab.data.prepare import cache_dir
from attnlab.data.textstream import BUILTIN_CORPORA, STDLIB_MAX_CHARS, pydoc_text, stdlib_files
from attnlab.data.tokenizers import (
    ByteBPETokenizer,
    CharTokenizer,
    tokenizer_from_json,
    train_tokenizer,
)
from attnlab.errors import UserError
from attnlab.fileio import atomic_write_bytes, atomic_write_text

__all__ = [
    "Corpus",
    "load_corpus",
    "cache_dir",
    "tokenize_cached",
    "corpus_tokenizer",
    "BUILTIN_CORPORA",
]

log = logging.getLogger(__name__)


@dataclass
class Corpus:
    """A named text. ``fingerprint`` hashes the text (cache keys)."""

    name: str
    text: str

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()[:16]


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
    parts, size = [], 0
    for path in stdlib_files():
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
        text = pydoc_text()
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
        atomic_write_bytes(path, ids.tobytes())
    except OSError as err:
        log.warning("could not cache token ids in %s: %s", path.parent, err)
        return ids
    return np.memmap(path, dtype=dtype, mode="r")


def corpus_tokenizer(
    corpus: Corpus, kind: str = "char", vocab_size: int = 512
) -> CharTokenizer | ByteBPETokenizer:
    """A ``char`` or ``bpe`` tokenizer trained on ``corpus`` (BPE merges cached on disk).

    Raises:
        UserError: unknown kind, or a BPE vocabulary below 256.
    """
    if kind == "bpe":
        return _cached_bpe(corpus, vocab_size)
    return train_tokenizer(kind, corpus.text, vocab_size)


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
        atomic_write_text(path, tok.to_json())
    except OSError as err:
        log.warning("could not cache the tokenizer in %s: %s", path.parent, err)
    return tok
