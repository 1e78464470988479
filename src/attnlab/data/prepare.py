"""Streaming preparation of a corpus: tokenizer, then token ids appended to on-disk shards.

    prepare_corpus(["notes/", "book.txt"], "prepared/books", kind="bpe", vocab_size=8192)

Memory does not grow with the corpus: text is read a MiB at a time
(:mod:`attnlab.data.textstream`), encoded in batches by worker processes
(:mod:`attnlab.data.encoding`) and appended to shards (:mod:`attnlab.data.shards`).

- Character tokenizer: the alphabet is every character of the corpus (one streaming pass).
- Byte-level BPE: trained on a seeded sample of at most ``sample_chars`` characters (default
  :data:`BPE_SAMPLE_CHARS`, as SentencePiece's ``input_sentence_size``): the whole corpus when it
  is smaller, else blocks of 64 KiB at random offsets (``seed``), cut to whole lines; only the
  sampled blocks are read.

A preparation is resumable: the manifest lists the documents whose ids are in complete shards; run
again, it skips them. :func:`prepare_cached` prepares into the cache (``attnlab train lm --data
FILE``) under a file lock, so concurrent processes (ranks) prepare once.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from attnlab.data.encoding import Encoder, check_workers, token_dtype
from attnlab.data.shards import (
    FORMAT,
    MANIFEST,
    VERSION,
    ShardWriter,
    open_tokens,
    read_manifest,
    write_manifest,
)
from attnlab.data.textstream import (
    SKIP_REASONS,
    Document,
    Skip,
    corpus_text,
    document_texts,
    pieces,
    plan_corpus,
)
from attnlab.data.tokenizers import (
    TOKENIZER_FILE,
    ByteBPETokenizer,
    CharTokenizer,
    load_tokenizer,
    tokenizer_from_json,
)
from attnlab.errors import UserError
from attnlab.fileio import atomic_write_text

try:
    import fcntl  # POSIX only: without it the cache is not locked
except ImportError:
    fcntl = None

__all__ = [
    "BPE_SAMPLE_CHARS",
    "SHARD_TOKENS",
    "PrepareSummary",
    "Prepared",
    "prepare_corpus",
    "prepare_cached",
    "open_prepared",
    "train_corpus_tokenizer",
    "cache_dir",
]

log = logging.getLogger(__name__)

#: characters of the corpus a BPE tokenizer is trained on (at most)
BPE_SAMPLE_CHARS = 5_000_000
SAMPLE_BLOCK = 1 << 16
#: a shard is closed at the first document end after this many tokens
SHARD_TOKENS = 1 << 27
#: text per batch handed to a worker
BATCH_CHARS = 1 << 20
#: corpora smaller than this are encoded in this process (starting workers costs a second)
POOL_MIN_BYTES = 16 << 20


def cache_dir() -> Path:
    """``$ATTNLAB_CACHE`` or ``~/.cache/attnlab``."""
    return Path(os.environ.get("ATTNLAB_CACHE") or Path.home() / ".cache" / "attnlab")


@dataclass
class PrepareSummary:
    """What :func:`prepare_corpus` did.

    Attributes:
        directory: the prepared directory.
        manifest: its manifest (``n_tokens``, ``n_bytes``, ``skipped`` counts, ``shards`` ...).
        seconds: time spent by this call.
        resumed: documents found done by an earlier call.
        was_complete: the earlier call had finished (nothing was done now).
    """

    directory: Path
    manifest: dict[str, Any]
    seconds: float
    resumed: int = 0
    was_complete: bool = False

    @property
    def n_tokens(self) -> int:
        return int(self.manifest["n_tokens"])

    def describe(self) -> str:
        """One line: tokens, shards, documents, bytes, tokenizer, files skipped, time."""
        m = self.manifest
        tok = m["tokenizer"]
        done = sum(d["status"] == "done" for d in m["documents"])
        skipped = ", ".join(f"{n} {k.replace('_', '-')}" for k, n in m["skipped"].items() if n)
        return (
            f"{self.directory}: {m['n_tokens']:,} tokens ({m['dtype']}) in "
            f"{len(m['shards'])} shard(s) from {done} document(s), {m['n_bytes'] / 1e6:.1f} MB; "
            f"{tok['type']} tokenizer, vocab {tok['vocab_size']}; "
            f"skipped: {skipped or 'none'}; {self.seconds:.1f} s"
        )

    @property
    def skipped(self) -> dict[str, int]:
        return dict(self.manifest["skipped"])


# -- tokenizers --------------------------------------------------------------------------------


def _progress(progress: bool, total: int, desc: str, initial: int = 0) -> Any:
    return tqdm(
        total=total,
        initial=initial,
        desc=desc,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        disable=not progress,
        dynamic_ncols=True,
    )


def bpe_sample(
    docs: Sequence[Document], sample_chars: int, seed: int, max_chars: int | None = None
) -> Iterator[str]:
    """The text a BPE tokenizer is trained on (see the module docstring); deterministic."""
    total = sum(d.size for d in docs)
    if total <= sample_chars or (max_chars is not None and max_chars <= sample_chars):
        yield from corpus_text(docs, max_chars)
        return
    blocks = []  # (document, block) of the corpus's first max_chars bytes (approximately)
    budget = max_chars
    for i, d in enumerate(docs):
        size = d.size if budget is None else min(d.size, budget)
        blocks += [(i, j) for j in range(-(-size // SAMPLE_BLOCK))]
        if budget is not None:
            budget -= size
            if budget <= 0:
                break
    rng = np.random.default_rng(seed)
    n = min(len(blocks), -(-sample_chars // SAMPLE_BLOCK))
    builtin: dict[str, bytes] = {}  # built-in corpora are small: their text, read once
    for k in sorted(rng.choice(len(blocks), size=n, replace=False)):
        text = _read_block(docs[blocks[k][0]], blocks[k][1], builtin)
        if text:
            yield text


def _read_block(doc: Document, j: int, builtin: dict[str, bytes]) -> str | None:
    """Whole lines of block ``j`` of a document; None for binary or non-UTF-8 bytes."""
    if doc.path is None:
        if doc.name not in builtin:
            builtin[doc.name] = "".join(corpus_text([doc])).encode("utf-8")
        data = builtin[doc.name][j * SAMPLE_BLOCK : (j + 1) * SAMPLE_BLOCK]
    else:
        try:
            with open(doc.path, "rb") as f:
                f.seek(j * SAMPLE_BLOCK)
                data = f.read(SAMPLE_BLOCK)
        except OSError:
            return None
    if b"\x00" in data:
        return None
    if j > 0:
        data = data[data.find(b"\n") + 1 :] if b"\n" in data else b""
    if len(data) == SAMPLE_BLOCK or b"\n" in data:
        data = data[: data.rfind(b"\n") + 1]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def train_corpus_tokenizer(
    docs: Sequence[Document],
    kind: str,
    vocab_size: int = 512,
    *,
    max_chars: int | None = None,
    sample_chars: int = BPE_SAMPLE_CHARS,
    seed: int = 0,
    progress: bool = False,
) -> CharTokenizer | ByteBPETokenizer:
    """A ``char`` tokenizer (the corpus's alphabet) or a ``bpe`` one (trained on a sample).

    Raises:
        UserError: an unknown kind, a BPE vocabulary below 256, a corpus with no text.
    """
    if kind == "char":
        chars: set[str] = set()
        skipped = dict.fromkeys(SKIP_REASONS, 0)
        with _progress(progress, sum(d.size for d in docs), "reading characters") as bar:
            for _, _doc, text in document_texts(docs, max_chars):
                if isinstance(text, Skip):
                    skipped[text.reason] += 1
                    continue
                for chunk in text:
                    chars.update(chunk)
                    bar.update(len(chunk))
        if not chars:
            raise empty_corpus_error([d.name for d in docs], skipped)
        return CharTokenizer(sorted(chars))
    if kind == "bpe":
        if vocab_size < 256:  # before reading anything
            ByteBPETokenizer.train_from_iterator([], vocab_size)
        sample = bpe_sample(docs, sample_chars, seed, max_chars)
        return ByteBPETokenizer.train_from_iterator(sample, vocab_size)
    raise UserError(f"unknown tokenizer {kind!r}; choose 'char' or 'bpe'")


def empty_corpus_error(names: Sequence[str], skipped: dict[str, int]) -> UserError:
    """The one error for a corpus without text, with the skipped files counted."""
    why = ", ".join(f"{n} {k.replace('_', '-')}" for k, n in skipped.items() if n)
    shown = ", ".join(names[:3]) + (" ..." if len(names) > 3 else "")
    return UserError(
        f"corpus {shown} is empty: no text to train on"
        + (f" (files skipped: {why})" if why else "")
    )


# -- preparation -------------------------------------------------------------------------------


def _start(out: Path, settings: dict[str, Any], overwrite: bool) -> dict[str, Any] | None:
    """The manifest to resume from (None: start afresh). Checks and clears ``out``."""
    manifest = read_manifest(out)
    if manifest is not None and overwrite:
        for p in [out / MANIFEST, out / TOKENIZER_FILE, *out.glob("tokens-*.bin")]:
            p.unlink()
        manifest = None
    if manifest is not None:
        if manifest["settings"] != settings:
            changed = sorted(k for k in settings if manifest["settings"].get(k) != settings[k])
            raise UserError(
                f"{str(out)!r} holds a preparation with other settings ({', '.join(changed)}); "
                "use another --out, or --overwrite"
            )
        return manifest
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"{str(out)!r} exists and is not an empty directory; choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    return None


def prepare_corpus(
    sources: str | Sequence[str],
    out: str | os.PathLike,
    *,
    kind: str = "char",
    vocab_size: int = 512,
    tokenizer: CharTokenizer | ByteBPETokenizer | None = None,
    max_chars: int | None = None,
    sample_chars: int = BPE_SAMPLE_CHARS,
    seed: int = 0,
    workers: int = -1,
    shard_tokens: int = SHARD_TOKENS,
    progress: bool = False,
    overwrite: bool = False,
    on_commit: Callable[[dict[str, Any]], None] | None = None,
    docs: Sequence[Document] | None = None,
) -> PrepareSummary:
    """Tokenize a corpus into shards in ``out`` (resuming an interrupted preparation there).

    Args:
        sources: built-in corpus names, files and folders.
        out: the prepared directory (created; an existing one of other settings is an error).
        kind: ``char`` or ``bpe`` (when no ``tokenizer`` is given).
        vocab_size: the BPE vocabulary size.
        tokenizer: a ready tokenizer instead of one trained on the corpus.
        max_chars: use only the corpus's first this many characters.
        sample_chars: the BPE training sample, in characters.
        seed: seeds the BPE sample.
        workers: encoding processes for BPE (-1: one per CPU core; 0 or 1: this process).
        shard_tokens: close a shard at the first document end after this many tokens.
        progress: show progress bars (MB/s, ETA) on stderr.
        overwrite: discard an earlier preparation in ``out`` instead of resuming it.
        on_commit: called with the manifest after each shard is written.
        docs: the planned documents of ``sources`` (saves planning again).

    Returns:
        A :class:`PrepareSummary`.

    Raises:
        UserError: a bad source or setting, ``out`` in use, a corpus with no text.
    """
    t0 = time.perf_counter()
    out = Path(out)
    sources = [sources] if isinstance(sources, str) else list(sources)
    docs = list(docs) if docs is not None else plan_corpus(sources, max_chars)
    names = [
        s if s in ("pydoc", "stdlib") else str(Path(s).expanduser().resolve()) for s in sources
    ]
    request = None if tokenizer is not None else [kind, vocab_size, sample_chars, seed]
    settings = {
        "sources": names,
        "max_chars": max_chars,
        "shard_tokens": shard_tokens,
        "tokenizer": request or tokenizer.fingerprint,
    }
    manifest = _start(out, settings, overwrite)
    if manifest is None:
        if tokenizer is None:
            tokenizer = train_corpus_tokenizer(
                docs, kind, vocab_size, max_chars=max_chars, sample_chars=sample_chars,
                seed=seed, progress=progress,
            )  # fmt: skip
        tokenizer.save(out)
        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "settings": settings,
            "tokenizer": {"type": tokenizer.type, "vocab_size": tokenizer.vocab_size,
                          "fingerprint": tokenizer.fingerprint},
            "dtype": token_dtype(tokenizer.vocab_size).name,
            "complete": False, "n_tokens": 0, "n_chars": 0, "n_bytes": 0, "has_text": False,
            "skipped": dict.fromkeys(SKIP_REASONS, 0), "shards": [], "documents": [],
        }  # fmt: skip
        write_manifest(out, manifest)
    else:
        tokenizer = load_tokenizer(out)
    done = manifest["documents"]
    resumed = len(done)
    for d, doc in zip(done, docs):
        if d["identity"] != doc.identity:
            raise UserError(
                f"{doc.name} changed since the preparation in {str(out)!r} started; "
                "prepare again with --overwrite"
            )
    was_complete = manifest["complete"]
    if not was_complete:
        _encode_documents(docs, out, manifest, tokenizer, workers, progress, on_commit)
    if not manifest["has_text"]:
        raise empty_corpus_error(names, manifest["skipped"])
    return PrepareSummary(out, manifest, time.perf_counter() - t0, resumed, was_complete)


def _encode_documents(docs, out, manifest, tokenizer, workers, progress, on_commit) -> None:
    """The streaming loop: pieces -> batches -> workers -> shards, committing at document ends."""
    settings = manifest["settings"]
    done = manifest["documents"]
    start = len(done)
    writer = ShardWriter(out, np.dtype(manifest["dtype"]), len(manifest["shards"]))
    pending: list[dict[str, Any]] = []  # documents whose ids are in the shard being written
    total = sum(d.size for d in docs)
    workers = check_workers(workers)
    if not isinstance(tokenizer, ByteBPETokenizer) or total - manifest["n_bytes"] < POOL_MIN_BYTES:
        workers = 0  # character encoding is a table lookup: no workers needed
    stream = document_texts(
        docs, settings["max_chars"], start=start, used_chars=manifest["n_chars"],
        first=not any(d["status"] == "done" for d in done),
    )  # fmt: skip

    def finished(results: list[tuple[Any, np.ndarray]]) -> None:
        for entry, ids in results:
            writer.write(ids)
            if entry is None:
                continue
            entry["tokens"] = writer.tokens - sum(e["tokens"] for e in pending)
            pending.append(entry)
            if writer.tokens >= settings["shard_tokens"]:
                commit()

    def commit() -> None:
        manifest["shards"].append(writer.commit())
        for e in pending:
            done.append(e)
            manifest["n_tokens"] += e["tokens"]
            manifest["n_chars"] += e["chars"]
            manifest["n_bytes"] += e["bytes"]
            manifest["has_text"] = manifest["has_text"] or e["has_text"]
            if e["status"] != "done":
                manifest["skipped"][e["status"]] += 1
        pending.clear()
        write_manifest(out, manifest)
        if on_commit is not None:
            on_commit(manifest)

    bar = _progress(progress, total, "tokenizing", manifest["n_bytes"])
    try:
        with bar, Encoder(tokenizer, workers) as encoder:
            for _, doc, text in stream:
                entry = {"name": doc.name, "identity": doc.identity, "bytes": doc.size,
                         "chars": 0, "tokens": 0, "has_text": False}  # fmt: skip
                if isinstance(text, Skip):
                    log.info("skipping %s (%s)", doc.name, text)
                    finished(encoder.submit([], {**entry, "status": text.reason}))
                    bar.update(doc.size)
                    continue
                batch, size, shown = [], 0, 0
                for piece in pieces(text):
                    batch.append(piece)
                    size += len(piece)
                    entry["has_text"] = entry["has_text"] or not piece.isspace()
                    if size >= BATCH_CHARS:
                        entry["chars"] += size
                        finished(encoder.submit(batch))
                        bar.update(min(size, doc.size - shown))  # (chars ~ bytes)
                        shown += min(size, doc.size - shown)
                        batch, size = [], 0
                entry["chars"] += size
                finished(encoder.submit(batch, {**entry, "status": "done"}))
                bar.update(doc.size - shown)
            finished(encoder.drain())
        if writer.tokens or pending or not manifest["shards"]:
            commit()
    finally:
        writer.close()
    manifest["complete"] = True
    write_manifest(out, manifest)


# -- prepared directories and the cache ----------------------------------------------------------


@dataclass
class Prepared:
    """A complete prepared directory, opened: its tokenizer, ids (memory-mapped) and manifest."""

    directory: Path
    tokenizer: CharTokenizer | ByteBPETokenizer
    ids: Any
    manifest: dict[str, Any]


def open_prepared(directory: str | os.PathLike) -> Prepared:
    """Open a directory written by :func:`prepare_corpus`.

    Raises:
        UserError: not a prepared directory, or an interrupted (incomplete) one.
    """
    directory = Path(directory)
    manifest = read_manifest(directory)
    if manifest is None:
        raise UserError(f"{str(directory)!r} is not a prepared corpus (no {MANIFEST})")
    if not manifest["complete"]:
        raise UserError(
            f"the preparation in {str(directory)!r} was interrupted; run 'attnlab prepare' "
            "again with the same arguments to finish it"
        )
    return Prepared(
        directory, load_tokenizer(directory), open_tokens(directory, manifest), manifest
    )


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` (POSIX), so that only one process prepares an entry.

    The lock file (and its folder, once empty) is deleted on release, so that a preparation
    leaves only what it prepared in the cache, and a refused one (an empty corpus) nothing.
    A process that locked a file deleted meanwhile by the holder locks the new one instead.
    """
    if fcntl is None:  # not POSIX: no lock
        yield
        return
    while True:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            f = open(path, "a")
        except FileNotFoundError:  # the folder went away with the last holder's lock: again
            continue
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            current = os.stat(path).st_ino == os.fstat(f.fileno()).st_ino
        except FileNotFoundError:
            current = False
        if current:
            break
        f.close()  # the holder deleted this file on release: lock the one that is there now
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            path.unlink()
        with contextlib.suppress(OSError):
            path.parent.rmdir()  # only when empty
        fcntl.flock(f, fcntl.LOCK_UN)
        f.close()


def _cached_tokenizer(docs, identity, kind, vocab_size, max_chars, progress):
    path = cache_dir() / "tokenizers" / f"{kind}-{identity}-{vocab_size}-{BPE_SAMPLE_CHARS}.json"
    if path.exists():
        try:
            return tokenizer_from_json(path.read_text(encoding="utf-8"), str(path))
        except Exception:  # damaged: train again
            pass
    tok = train_corpus_tokenizer(docs, kind, vocab_size, max_chars=max_chars, progress=progress)
    atomic_write_text(path, tok.to_json())
    return tok


def prepare_cached(
    data: str,
    *,
    kind: str = "char",
    vocab_size: int = 512,
    tokenizer: CharTokenizer | ByteBPETokenizer | None = None,
    max_chars: int | None = None,
    progress: bool = False,
) -> Prepared:
    """The prepared ids of ``data`` (a corpus, or a directory written by ``attnlab prepare``),
    preparing them into the cache (``$ATTNLAB_CACHE/prepared``) on first use.

    The cache entry is keyed by the documents' identities (path, size, modification time) and the
    tokenizer; a tokenizer trained for ``kind``/``vocab_size`` is cached too. Preparation holds a
    file lock: a second process waits, then reads what the first prepared.

    Raises:
        UserError: a bad corpus or setting; an unwritable cache directory.
    """
    if Path(data).is_dir() and (Path(data) / MANIFEST).exists():
        prepared = open_prepared(data)
        if tokenizer is not None and tokenizer.fingerprint != prepared.tokenizer.fingerprint:
            raise UserError(
                f"{data!r} was prepared with another tokenizer than this run's (prepared again "
                "since?); prepare it with the run's tokenizer.json or train a new run"
            )
        return prepared
    docs = plan_corpus(data, max_chars)
    identity = hashlib.sha256(
        "\n".join([str(max_chars)] + [d.identity for d in docs]).encode()
    ).hexdigest()[:20]
    root = cache_dir()
    try:
        with _locked(root / "locks" / f"{identity}.lock"):
            if tokenizer is None:
                tokenizer = _cached_tokenizer(docs, identity, kind, vocab_size, max_chars, progress)
            out = root / "prepared" / f"{identity}-{tokenizer.fingerprint}"
            manifest = read_manifest(out) if out.exists() else None
            if manifest is None and out.exists():
                shutil.rmtree(out)  # a preparation that died before its manifest
            summary = prepare_corpus(
                data, out, tokenizer=tokenizer, max_chars=max_chars, progress=progress, docs=docs
            )
            if not summary.was_complete:
                log.info("prepared %s into %s in %.1f s", data, out, summary.seconds)
    except PermissionError as err:
        raise UserError(
            f"cannot write the token cache in {str(root)!r} ({err}); set ATTNLAB_CACHE to a "
            "writable folder"
        ) from None
    return open_prepared(out)
