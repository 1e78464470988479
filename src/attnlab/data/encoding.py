"""Fast, exact encoding of text pieces into token-id arrays, in this process or in worker processes.

- Character tokenizer: a lookup table indexed by code point (numpy), hundreds of MB/s.
- Byte-level BPE: a piece is split where GPT-2's pre-tokenizer always splits (a non-space ASCII
  character followed by a space, tab or line break: no pre-token contains both), each part is
  looked up in a bounded cache of earlier parts and only the parts not seen yet go through the
  ``tokenizers`` library. The ids equal ``tokenizer.encode(piece)`` (the library does the BPE; the
  split is only ever at its own boundaries). Text repeats at the level of words and lines, so most
  parts are found in the cache.

:class:`Encoder` hands batches of pieces to a pool of worker processes (each with its own cache),
keeping at most a few batches in flight so that memory does not grow with the corpus, and gives
the results back in order.
"""

from __future__ import annotations

import collections
import multiprocessing
import os
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from attnlab.data.tokenizers import ByteBPETokenizer, CharTokenizer, tokenizer_from_json
from attnlab.errors import UserError

__all__ = ["token_dtype", "PieceEncoder", "Encoder"]

#: entries of each of a BPE encoder's two caches before it is emptied (bounds its memory)
CACHE_ENTRIES = 1 << 19
# A word: whitespace, then non-whitespace, ending before whitespace (GPT-2's pre-tokenizer always
# splits there); or the text's trailing whitespace. Looked up first (most words repeat).
_WORDS = re.compile(r"\s*\S+|\s+")
# A part of a new word: leading whitespace, then a run of ASCII letters, of digits or of ASCII
# punctuation (the pre-tokenizer also splits between two such runs), with any other character
# (non-ASCII, the apostrophe of "it's") glued to its neighbours. New words mostly consist of
# parts seen before: only new parts go to the tokenizers library.
_PUNCT = r"[!-&(-/:-@\[-`{-~]"
_GLUE = r"(?:[^\s!-~]|')"
_RUN = rf"(?:[A-Za-z]+|[0-9]+|{_PUNCT}+)"
_PARTS = re.compile(rf"\s*(?:{_RUN}|{_GLUE}+{_RUN}?)(?:{_GLUE}+{_RUN}?)*|\s+")
# Whitespace other than space, tab, \n, \r, where \s of Python and of the library may differ:
# in a text that has any, a word ends only at a non-space character followed by a space, tab or
# line break, and words are not split further.
_ODD_SPACE = re.compile(r"[^\S \t\n\r]")
_WORDS_SAFE = re.compile(r"[\s\S]*?\S(?=[ \t\n\r]|\Z)|[\s\S]+")


def _joinable(part: str) -> bool:
    return not part[-1].isspace() and (part[0] in " \t\n\r" or not part[0].isspace())


def token_dtype(vocab_size: int) -> np.dtype:
    """``uint16`` when every id fits, else ``uint32``."""
    return np.dtype(np.uint16 if vocab_size <= 2**16 else np.uint32)


class PieceEncoder:
    """Encode text pieces to one array of ids (see the module docstring).

    Args:
        tokenizer: a :class:`CharTokenizer` or :class:`ByteBPETokenizer`.
    """

    def __init__(self, tokenizer: CharTokenizer | ByteBPETokenizer) -> None:
        self.tokenizer = tokenizer
        self.dtype = token_dtype(tokenizer.vocab_size)
        self.words: dict[str, bytes] = {}  # word -> its ids (as bytes)
        self.cache: dict[str, bytes] = {}  # part -> its ids
        self.lut: np.ndarray | None = None
        if isinstance(tokenizer, CharTokenizer):
            sentinel = np.iinfo(np.uint32).max
            self.lut = np.full(0x110000, sentinel, dtype=np.uint32)
            self.lut[[ord(c) for c in tokenizer.chars]] = np.arange(tokenizer.vocab_size)

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        """The ids of ``texts``, concatenated.

        Raises:
            UserError: (character level) a character outside the vocabulary.
        """
        if self.lut is not None:
            return self._chars("".join(texts))
        words: list[str] = []
        odd: set[str] = set()  # words of texts with odd whitespace: not split into parts
        for text in texts:
            if _ODD_SPACE.search(text):
                odd.update(found := _WORDS_SAFE.findall(text))
                words += found
            else:
                words += _WORDS.findall(text)
        found = list(map(self.words.get, words))
        if None in found:
            new = {w for w, ids in zip(words, found) if ids is None}
            split = {w: [w] if w in odd else _PARTS.findall(w) for w in new}
            parts = {p for ps in split.values() for p in ps}
            missing = {p for p in parts if p not in self.cache}
            if len(self.cache) + len(missing) > CACHE_ENTRIES:
                # emptied before this batch's parts are looked up: all of them are encoded anew
                self.cache.clear()
                missing = parts
            self._encode_parts(list(missing))
            fresh = {w: b"".join([self.cache[p] for p in ps]) for w, ps in split.items()}
            if len(self.words) + len(fresh) > CACHE_ENTRIES:
                self.words.clear()  # the batch's known words were looked up already (``found``)
            self.words.update(fresh)
            found = [fresh[w] if ids is None else ids for w, ids in zip(words, found)]
        return np.frombuffer(b"".join(found), dtype=self.dtype)

    def _encode_parts(self, parts: list[str]) -> None:
        """Encode new parts into the cache, joined into strings of ~64K characters (the library's
        cost per string dominates short ones) and cut back by the tokens' offsets.

        A part that ends with a non-space character and starts with a space, tab or line break
        can follow another without changing the ids of either; one that starts with a non-space
        character follows a line break put in between (its own token, dropped). Parts of
        whitespace only, or starting with other whitespace, are encoded one by one.
        """
        tok = self.tokenizer.tokenizer
        joinable = [p for p in parts if _joinable(p)]
        alone = [p for p in parts if not _joinable(p)]
        groups: list[list[str]] = [[]]
        size = 0
        for p in joinable:
            groups[-1].append(p)
            size += len(p)
            if size >= 1 << 16:
                groups.append([])
                size = 0
        texts = ["".join(p if p[0].isspace() else "\n" + p for p in g) for g in groups]
        for group, enc in zip(groups, tok.encode_batch(texts)):
            if not group:
                continue
            ids = np.asarray(enc.ids, dtype=self.dtype)
            first = np.asarray([o[0] for o in enc.offsets], dtype=np.int64)  # token starts
            sep = np.asarray([not p[0].isspace() for p in group])
            lengths = np.asarray([len(p) for p in group]) + sep  # (with the line break)
            starts = np.cumsum(lengths) - lengths + sep  # (n_parts,) where each part starts
            keep = ~np.isin(first, (starts - 1)[sep])  # drop the line breaks' tokens
            ids, first = ids[keep], first[keep]
            cuts = np.searchsorted(first, starts[1:], side="left")  # first token of each part
            for part, piece in zip(group, np.split(ids, cuts)):
                self.cache[part] = piece.tobytes()
        for part, enc in zip(alone, tok.encode_batch_fast(alone)):
            self.cache[part] = np.asarray(enc.ids, dtype=self.dtype).tobytes()

    def _chars(self, text: str) -> np.ndarray:
        ids = self.lut[np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)]
        if ids.size and int(ids.max()) >= self.tokenizer.vocab_size:
            self.tokenizer.encode(text)  # raises the usual error naming the characters
        return ids.astype(self.dtype)


# -- worker processes --------------------------------------------------------------------------

_WORKER: PieceEncoder | None = None


def _init_worker(tokenizer_json: str) -> None:
    global _WORKER
    os.environ["RAYON_NUM_THREADS"] = "1"  # one process per core already
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _WORKER = PieceEncoder(tokenizer_from_json(tokenizer_json))


def _encode_in_worker(texts: list[str]) -> bytes:
    assert _WORKER is not None
    return _WORKER(texts).tobytes()


class _Done:
    def __init__(self, value: np.ndarray) -> None:
        self.value = value

    def get(self) -> np.ndarray:
        return self.value


class Encoder:
    """Encode batches of pieces in ``workers`` processes (0 or 1: in this process), in order.

    ``submit(texts, tag)`` queues a batch; it returns the ``(tag, ids)`` of batches that are
    finished, oldest first, waiting when more than ``2 * workers`` are in flight. ``drain()``
    returns the rest. Use as a context manager (the pool is closed on exit).
    """

    def __init__(self, tokenizer: CharTokenizer | ByteBPETokenizer, workers: int = 0) -> None:
        self.dtype = token_dtype(tokenizer.vocab_size)
        self.local = PieceEncoder(tokenizer) if workers <= 1 else None
        self.pool: Any = None
        if workers > 1:
            ctx = multiprocessing.get_context("spawn")  # no fork of a process that holds threads
            self.pool = ctx.Pool(workers, _init_worker, (tokenizer.to_json(),))
        self.window = max(2, 2 * workers)
        self.queue: collections.deque = collections.deque()

    def __enter__(self) -> Encoder:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pool is None:
            return
        if exc[0] is not None:
            self.pool.terminate()  # an error or Ctrl-C: drop the batches in flight
        else:
            self.pool.close()
        self.pool.join()

    def _result(self, handle: Any) -> np.ndarray:
        out = handle.get()
        return out if isinstance(out, np.ndarray) else np.frombuffer(out, dtype=self.dtype)

    def submit(self, texts: list[str], tag: Any = None) -> list[tuple[Any, np.ndarray]]:
        if self.pool is None:
            assert self.local is not None
            handle: Any = _Done(self.local(texts))
        else:
            handle = self.pool.apply_async(_encode_in_worker, (texts,))
        self.queue.append((tag, handle))
        done = []
        while len(self.queue) > self.window or (self.queue and self.pool is None):
            t, h = self.queue.popleft()
            done.append((t, self._result(h)))
        return done

    def drain(self) -> list[tuple[Any, np.ndarray]]:
        done = [(t, self._result(h)) for t, h in self.queue]
        self.queue.clear()
        return done


def check_workers(workers: int) -> int:
    """``workers`` as given, or (negative) the number of CPU cores this process may use."""
    if workers < 0:
        try:
            return len(os.sched_getaffinity(0))
        except AttributeError:  # not Linux
            return os.cpu_count() or 1
    if workers > 256:
        raise UserError(f"--workers {workers} is more processes than makes sense")
    return workers
