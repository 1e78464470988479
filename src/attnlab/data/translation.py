"""Parallel data for translation: generated numbers and dates, TSV files, vocabularies, the Task.

Three sources of ``(source, target)`` sentence pairs, all reproducible from a seed:

- ``numbers``: English number words -> Italian / French / German (any ``num2words`` language)
  words. The range of numbers controls the source length ("seven" vs "nine hundred and ninety
  nine thousand ..."), which is what the bottleneck experiment varies. German puts units before
  tens ("einundzwanzig" = one-and-twenty), so its alignments are not monotone.
- ``dates``: a date written in one of many human formats ("tuesday, 3 march 2021", "03.03.21",
  "march 3rd, 2021") -> ISO ``2021-03-03``, built with the standard library.
- ``tsv``: any ``source<TAB>target[<TAB>...]`` file (the Tatoeba/Anki layout), normalised and
  length-filtered; malformed lines are reported with file and line number.

Tokens come from a :class:`Vocab` at word, character or BPE level, always with the four specials
``<pad>`` (0), ``<start>`` (1), ``<end>`` (2), ``<unk>`` (3).

:class:`TranslationTask` implements the shared trainer's Task protocol with teacher forcing: the
decoder reads ``<start> y_1 … y_n`` and is trained to predict ``y_1 … y_n <end>``; padding is
ignored in the loss.

Shape legend: B batch, S source length, T target length, V target vocabulary.
"""

from __future__ import annotations

import calendar
import datetime as dt
import json
import logging
import random
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.errors import UserError

__all__ = [
    "PAD",
    "START",
    "END",
    "UNK",
    "SPECIALS",
    "Vocab",
    "Normalizer",
    "DataConfig",
    "TranslationData",
    "TranslationTask",
    "Batch",
    "number_languages",
    "make_numbers",
    "make_dates",
    "read_tsv",
    "build_data",
    "collate",
    "load_vocabs",
]

log = logging.getLogger(__name__)

PAD, START, END, UNK = "<pad>", "<start>", "<end>", "<unk>"
SPECIALS = (PAD, START, END, UNK)
PAD_ID, START_ID, END_ID, UNK_ID = 0, 1, 2, 3
LEVELS = ("word", "char", "bpe")
TASKS = ("numbers", "dates", "tsv")

# ----------------------------------------------------------------------------------------------
# normalisation


@dataclass
class Normalizer:
    """Unicode NFKC, optional lower-casing, hyphens/commas as spaces, collapsed whitespace.

    Args:
        lowercase: lower-case everything.
        strip_hyphens: turn "twenty-one" into "twenty one" and drop thousands commas (numbers).
    """

    lowercase: bool = True
    strip_hyphens: bool = False

    def __call__(self, text: str) -> str:
        text = unicodedata.normalize("NFKC", text)
        if self.lowercase:
            text = text.lower()
        if self.strip_hyphens:
            text = text.replace("-", " ").replace(",", " ")
        return " ".join(text.split())


# ----------------------------------------------------------------------------------------------
# vocabularies

_WORD_RE = re.compile(r"\w+|[^\w\s]")
_NO_SPACE_BEFORE = re.compile(r" (?=[.,!?;:%)\]}»'’])")
_NO_SPACE_AFTER = re.compile(r"([(\[{«¿¡'’]) ")


class Vocab:
    """Token <-> id mapping at ``word``, ``char`` or ``bpe`` level, with the four specials first.

    Word level splits into words and punctuation marks; char level keeps spaces as tokens; BPE
    level uses a byte-pair-encoding model trained on the training side (``tokenizers`` library,
    SentencePiece-style ``▁`` word boundaries so decoding restores the spaces).

    Build with :meth:`build`; save/restore with :meth:`to_dict` / :meth:`from_dict`.
    """

    def __init__(self, level: str, tokens: Sequence[str], bpe_json: str | None = None) -> None:
        if level not in LEVELS:
            raise UserError(f"unknown vocabulary level {level!r}; choose from {list(LEVELS)}")
        if tuple(tokens[:4]) != SPECIALS:
            raise ValueError(f"a vocabulary must start with {SPECIALS}, got {tuple(tokens[:4])}")
        self.level = level
        self.itos = list(tokens)
        self.stoi = {t: i for i, t in enumerate(self.itos)}
        self.bpe_json = bpe_json
        self._bpe = None
        if level == "bpe":
            from tokenizers import Tokenizer

            if bpe_json is None:
                raise ValueError("a BPE vocabulary needs its tokenizer (bpe_json)")
            self._bpe = Tokenizer.from_str(bpe_json)

    # -- construction
    @classmethod
    def build(
        cls,
        texts: Iterable[str],
        level: str = "word",
        *,
        min_freq: int = 1,
        bpe_vocab_size: int = 200,
    ) -> Vocab:
        """Collect a vocabulary from (already normalised) training texts.

        Args:
            texts: training sentences of one language side.
            level: ``word`` | ``char`` | ``bpe``.
            min_freq: word/char level: rarer tokens become ``<unk>``.
            bpe_vocab_size: BPE level: target vocabulary size (specials and characters included).
        """
        texts = list(texts)
        if level == "bpe":
            from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

            tok = Tokenizer(models.BPE(unk_token=UNK))
            tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
            tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
            trainer = trainers.BpeTrainer(
                vocab_size=bpe_vocab_size, special_tokens=list(SPECIALS), show_progress=False
            )
            tok.train_from_iterator(texts, trainer)
            vocab = tok.get_vocab()
            itos = sorted(vocab, key=vocab.get)
            return cls(level, itos, tok.to_str())
        if level not in LEVELS:
            raise UserError(f"unknown vocabulary level {level!r}; choose from {list(LEVELS)}")
        counts: Counter[str] = Counter()
        for t in texts:
            counts.update(_split(t, level))
        kept = sorted(
            (t for t, c in counts.items() if c >= min_freq and t not in SPECIALS),
            key=lambda t: (-counts[t], t),
        )
        return cls(level, [*SPECIALS, *kept])

    def to_dict(self) -> dict:
        return {"level": self.level, "tokens": self.itos, "bpe": self.bpe_json}

    @classmethod
    def from_dict(cls, d: dict) -> Vocab:
        return cls(d["level"], d["tokens"], d.get("bpe"))

    def __len__(self) -> int:
        return len(self.itos)

    # -- text <-> tokens <-> ids
    def tokenize(self, text: str) -> list[str]:
        """Split a normalised sentence into this vocabulary's token strings."""
        if self._bpe is not None:
            return self._bpe.encode(text).tokens
        return _split(text, self.level)

    def encode(self, text: str, *, strict: bool = False) -> list[int]:
        """Ids of ``text`` (no ``<start>``/``<end>``).

        Raises:
            UserError: ``strict`` and some tokens are not in the vocabulary (listed in the
                message).
        """
        toks = self.tokenize(text)
        ids = [self.stoi.get(t, UNK_ID) for t in toks]
        if strict:
            unknown = [t for t, i in zip(toks, ids) if i == UNK_ID]
            if self._bpe is not None and unknown:  # BPE marks unknown characters as <unk> itself
                unknown = (
                    sorted(
                        {
                            c
                            for c in text
                            if c != " "
                            and self._bpe.token_to_id(c) is None
                            and self._bpe.token_to_id("▁" + c) is None
                        }
                    )
                    or unknown
                )
            if unknown:
                shown = ", ".join(repr(u) for u in list(dict.fromkeys(unknown))[:10])
                raise UserError(
                    f"unknown {self.level} token(s) in {text!r}: {shown} "
                    f"(not in the {len(self)}-token training vocabulary)"
                )
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids``, stopping at ``<end>`` and skipping ``<pad>``/``<start>``."""
        return self.join(self.id_tokens(ids))

    def id_tokens(self, ids: Iterable[int]) -> list[str]:
        """Token strings of ``ids`` up to (excluding) ``<end>``, without ``<pad>``/``<start>``."""
        out = []
        for i in ids:
            i = int(i)
            if i == END_ID:
                break
            if i in (PAD_ID, START_ID):
                continue
            out.append(self.itos[i] if 0 <= i < len(self.itos) else UNK)
        return out

    def join(self, tokens: Sequence[str]) -> str:
        """Inverse of :meth:`tokenize` (up to normalisation)."""
        if self.level == "char":
            return "".join(tokens)
        if self.level == "bpe":
            return "".join(tokens).replace("▁", " ").strip()
        # word level: spaces between words, none before closing punctuation, after opening
        # brackets or around apostrophes ("buongiorno, anna!", "dov'è"); a heuristic, since
        # the tokens do not record the original spacing
        text = " ".join(tokens)
        text = _NO_SPACE_BEFORE.sub("", text)
        text = _NO_SPACE_AFTER.sub(r"\1", text)
        return text


def _split(text: str, level: str) -> list[str]:
    if level == "char":
        return list(text)
    return _WORD_RE.findall(text)


# ----------------------------------------------------------------------------------------------
# generators


def number_languages() -> list[str]:
    """Target languages ``num2words`` can write (English is the source)."""
    from num2words import CONVERTER_CLASSES

    return sorted(k for k in CONVERTER_CLASSES if k != "en")


def _check_lang(lang: str) -> None:
    langs = number_languages()
    if lang not in langs:
        raise UserError(
            f"unknown language {lang!r} for the numbers task; choose from "
            f"{', '.join(langs)} (e.g. it, fr, de)"
        )


def _sample_numbers(rng: random.Random, low: int, high: int, n: int) -> list[int]:
    """``n`` distinct integers in ``[low, high]``, log-uniform over digit counts (so short and long
    numbers are both common); all of them, shuffled, when the range has at most ``n`` values."""
    if high - low + 1 <= n:
        values = list(range(low, high + 1))
        rng.shuffle(values)
        return values
    digit_lo, digit_hi = len(str(max(low, 0))), len(str(high))
    seen: set[int] = set()
    out: list[int] = []
    tries = 0
    while len(out) < n and tries < 50 * n:
        tries += 1
        d = rng.randint(digit_lo, digit_hi)
        lo, hi = max(low, 10 ** (d - 1) if d > 1 else 0), min(high, 10**d - 1)
        if lo > hi:
            continue
        x = rng.randint(lo, hi)
        if x not in seen:
            seen.add(x)
            out.append(x)
    return out


def make_numbers(
    lang: str, n: int, *, low: int = 0, high: int = 999_999, seed: int = 0
) -> list[tuple[str, str]]:
    """``n`` distinct ``(english words, <lang> words)`` pairs for numbers in ``[low, high]``.

    Raises:
        UserError: unknown language or an empty/negative range.
    """
    from num2words import num2words

    _check_lang(lang)
    if low < 0 or high < low:
        raise UserError(f"number range must satisfy 0 <= low <= high, got low={low}, high={high}")
    rng = random.Random(f"numbers-{lang}-{seed}")
    return [
        (num2words(x, lang="en"), num2words(x, lang=lang))
        for x in _sample_numbers(rng, low, high, n)
    ]


_MONTHS = [calendar.month_name[i].lower() for i in range(1, 13)]  # C locale: English names
_DAYS = ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"]


def _ordinal(d: int) -> str:
    suffix = "th" if 11 <= d % 100 <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(d % 10, "th")
    return f"{d}{suffix}"


# Day-first numeric formats only: a human "03/04/2021" is ambiguous, so the data never mixes
# day-first and month-first numerals.
_DATE_FORMATS = [
    lambda d: f"{d.day} {_MONTHS[d.month - 1]} {d.year}",
    lambda d: f"{_MONTHS[d.month - 1]} {d.day}, {d.year}",
    lambda d: f"{_MONTHS[d.month - 1][:3]} {d.day} {d.year}",
    lambda d: f"{d.day:02d}/{d.month:02d}/{d.year}",
    lambda d: f"{d.day}.{d.month}.{d.year}",
    lambda d: f"{d.day:02d}.{d.month:02d}.{d.year % 100:02d}",
    lambda d: f"{_DAYS[d.weekday()]}, {d.day} {_MONTHS[d.month - 1]} {d.year}",
    lambda d: f"{_DAYS[d.weekday()][:3]} {_MONTHS[d.month - 1][:3]} {d.day} {d.year}",
    lambda d: f"the {_ordinal(d.day)} of {_MONTHS[d.month - 1]} {d.year}",
    lambda d: f"{_MONTHS[d.month - 1]} {_ordinal(d.day)}, {d.year}",
    lambda d: f"{d.day} {_MONTHS[d.month - 1][:3]} {d.year % 100:02d}",
    lambda d: f"{d.year}/{d.month:02d}/{d.day:02d}",
]


def make_dates(
    n: int, *, start: str = "1950-01-01", end: str = "2049-12-31", seed: int = 0
) -> list[tuple[str, str]]:
    """``n`` ``(human-written date, ISO YYYY-MM-DD)`` pairs with dates in ``[start, end]``.

    Two-digit years are only produced for dates in 1950-2049, where they are unambiguous.
    """
    try:
        d0, d1 = dt.date.fromisoformat(start), dt.date.fromisoformat(end)
    except ValueError as err:
        raise UserError(f"date range needs ISO dates YYYY-MM-DD: {err}") from None
    if d1 < d0:
        raise UserError(f"date range is empty: start={start} > end={end}")
    rng = random.Random(f"dates-{seed}")
    span = (d1 - d0).days
    pairs = []
    for _ in range(n):
        d = d0 + dt.timedelta(days=rng.randint(0, span))
        fmts = (
            _DATE_FORMATS
            if 1950 <= d.year <= 2049
            else [f for i, f in enumerate(_DATE_FORMATS) if i not in (5, 10)]
        )
        pairs.append((rng.choice(fmts)(d), d.isoformat()))
    return pairs


def read_tsv(path: str | Path, *, src_col: int = 0, tgt_col: int = 1) -> list[tuple[str, str]]:
    """Read ``source<TAB>target[<TAB>...]`` lines (extra columns, e.g. Tatoeba credits, ignored).

    Blank lines are skipped. Lines are not normalised here (see :class:`TranslationData`).

    Raises:
        UserError: a missing/unreadable file, a line that is not UTF-8, has too few columns or an
            empty source/target field; the message gives ``file:line``.
    """
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: no such file")
    if path.is_dir():
        raise UserError(f"{path}: is a directory, expected a tab-separated text file")
    need = max(src_col, tgt_col) + 1
    pairs = []
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8").rstrip("\r\n")
            except UnicodeDecodeError:
                raise UserError(f"{path}:{lineno}: not valid UTF-8 text") from None
            if not line.strip():
                continue
            cols = line.split("\t")
            if len(cols) < need:
                raise UserError(
                    f"{path}:{lineno}: expected at least {need} tab-separated columns "
                    f"(source<TAB>target), found {len(cols)}: {line[:60]!r}"
                )
            src, tgt = cols[src_col].strip(), cols[tgt_col].strip()
            if not src or not tgt:
                side = "source" if not src else "target"
                raise UserError(f"{path}:{lineno}: empty {side} field")
            pairs.append((src, tgt))
    if not pairs:
        raise UserError(f"{path}: no sentence pairs found (empty file?)")
    return pairs


# ----------------------------------------------------------------------------------------------
# data set


@dataclass
class DataConfig:
    """Which pairs to generate or read, how to tokenise them, how to split them.

    Args:
        task: ``numbers`` | ``dates`` | ``tsv``.
        lang: numbers: target language (``it``, ``fr``, ``de``...).
        low, high: numbers: the range (controls source length).
        n_examples: numbers/dates: how many pairs to generate (numbers: at most the range size).
        path, src_col, tgt_col: tsv: the file and its columns.
        src_level, tgt_level: ``word`` | ``char`` | ``bpe``; ``None`` = the task's default
            (numbers word->bpe, dates char->char, tsv word->word).
        bpe_vocab_size: size of BPE vocabularies.
        min_freq: word/char vocabularies: rarer tokens become ``<unk>``.
        lowercase: lower-case both sides.
        max_len: drop pairs with more than this many tokens on either side.
        min_len: drop pairs with fewer tokens on either side.
        val_frac, test_frac: held-out fractions (disjoint from training).
        seed: generation and split seed.
    """

    task: str = "numbers"
    lang: str = "it"
    low: int = 0
    high: int = 999_999
    n_examples: int = 20_000
    path: str | None = None
    src_col: int = 0
    tgt_col: int = 1
    src_level: str | None = None
    tgt_level: str | None = None
    bpe_vocab_size: int = 200
    min_freq: int = 1
    lowercase: bool = True
    max_len: int = 64
    min_len: int = 1
    val_frac: float = 0.05
    test_frac: float = 0.05
    seed: int = 0

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise UserError(f"unknown translation task {self.task!r}; choose from {list(TASKS)}")
        if self.task == "numbers":
            _check_lang(self.lang)
        if self.task == "tsv" and not self.path:
            raise UserError("the tsv task needs a file: --data PATH")
        defaults = {"numbers": ("word", "bpe"), "dates": ("char", "char"), "tsv": ("word", "word")}
        src_d, tgt_d = defaults[self.task]
        self.src_level = self.src_level or src_d
        self.tgt_level = self.tgt_level or tgt_d
        for lvl in (self.src_level, self.tgt_level):
            if lvl not in LEVELS:
                raise UserError(f"unknown vocabulary level {lvl!r}; choose from {list(LEVELS)}")
        if not (
            0 <= self.val_frac < 1
            and 0 <= self.test_frac < 1
            and self.val_frac + self.test_frac < 1
        ):
            raise UserError(
                f"val_frac={self.val_frac}, test_frac={self.test_frac} must be in "
                "[0, 1) with a sum below 1"
            )
        if self.n_examples < 3:
            raise UserError(f"n_examples must be at least 3, got {self.n_examples}")
        if self.min_len < 1 or self.max_len < self.min_len:
            raise UserError(f"need 1 <= min_len <= max_len, got {self.min_len}, {self.max_len}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> DataConfig:
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})

    def normalizer(self) -> Normalizer:
        return Normalizer(lowercase=self.lowercase, strip_hyphens=self.task == "numbers")


@dataclass
class TranslationData:
    """Normalised, filtered, split pairs and the two vocabularies built on the training split."""

    config: DataConfig
    splits: dict[str, list[tuple[str, str]]]
    src_vocab: Vocab
    tgt_vocab: Vocab
    n_filtered: int = 0
    stats: dict[str, Any] = field(default_factory=dict)

    def encoded(self, split: str) -> tuple[list[list[int]], list[list[int]]]:
        """Source and target id lists of a split (targets without ``<start>``/``<end>``)."""
        pairs = self.splits[split]
        return (
            [self.src_vocab.encode(s) for s, _ in pairs],
            [self.tgt_vocab.encode(t) for _, t in pairs],
        )


def build_data(config: DataConfig) -> TranslationData:
    """Generate or read the pairs, normalise, filter by length, split, and build vocabularies.

    The held-out splits never share a source sentence with the training split.

    Raises:
        UserError: bad task options, unreadable TSV, or nothing left after filtering.
    """
    c = config
    if c.task == "numbers":
        raw = make_numbers(c.lang, c.n_examples, low=c.low, high=c.high, seed=c.seed)
    elif c.task == "dates":
        raw = make_dates(c.n_examples, seed=c.seed)
    else:
        raw = read_tsv(c.path, src_col=c.src_col, tgt_col=c.tgt_col)
    norm = c.normalizer()
    # one sentence pair per source (the first one): a source in two splits would leak
    pairs: dict[str, str] = {}
    for s, t in raw:
        s, t = norm(s), norm(t)
        if s and t and s not in pairs:
            pairs[s] = t
    kept, n_filtered = [], 0
    for s, t in pairs.items():
        ls, lt = len(_split(s, c.src_level)), len(_split(t, c.tgt_level))
        if c.min_len <= ls <= c.max_len and c.min_len <= lt <= c.max_len:
            kept.append((s, t))
        else:
            n_filtered += 1
    if len(kept) < 3:
        why = (
            f"after length filtering (min_len={c.min_len}, max_len={c.max_len})"
            if n_filtered
            else f"in the {c.task} data (distinct sources)"
        )
        raise UserError(f"only {len(kept)} sentence pairs {why}; need at least 3")
    random.Random(f"split-{c.seed}").shuffle(kept)
    n_val = max(1, round(c.val_frac * len(kept))) if c.val_frac > 0 else 0
    n_test = max(1, round(c.test_frac * len(kept))) if c.test_frac > 0 else 0
    splits = {
        "val": kept[:n_val],
        "test": kept[n_val : n_val + n_test],
        "train": kept[n_val + n_test :],
    }
    if not splits["train"]:
        raise UserError(
            f"no training pairs left ({len(kept)} pairs, val_frac={c.val_frac}, "
            f"test_frac={c.test_frac})"
        )
    src_vocab = Vocab.build(
        (s for s, _ in splits["train"]),
        c.src_level,
        min_freq=c.min_freq,
        bpe_vocab_size=c.bpe_vocab_size,
    )
    tgt_vocab = Vocab.build(
        (t for _, t in splits["train"]),
        c.tgt_level,
        min_freq=c.min_freq,
        bpe_vocab_size=c.bpe_vocab_size,
    )
    data = TranslationData(c, splits, src_vocab, tgt_vocab, n_filtered)
    src_lens = [len(src_vocab.tokenize(s)) for s, _ in kept]
    tgt_lens = [len(tgt_vocab.tokenize(t)) for _, t in kept]
    data.stats = {
        "pairs": len(kept),
        "filtered": n_filtered,
        "max_src_len": max(src_lens),
        "max_tgt_len": max(tgt_lens),
        **{f"n_{k}": len(v) for k, v in splits.items()},
    }
    if n_filtered:
        log.info("dropped %d pairs outside the length limits", n_filtered)
    return data


# ----------------------------------------------------------------------------------------------
# batches and the trainer Task


@dataclass
class Batch:
    """A padded batch. ``tgt_in = <start> y``, ``tgt_out = y <end>`` (teacher forcing)."""

    src: Tensor  # (B, S) long, <pad>-padded on the right
    src_mask: Tensor  # (B, S) bool, True = real token
    tgt_in: Tensor  # (B, T) long
    tgt_out: Tensor  # (B, T) long, <pad> where there is no target

    def to(self, device) -> Batch:
        return Batch(*(t.to(device) for t in (self.src, self.src_mask, self.tgt_in, self.tgt_out)))


def collate(
    src_ids: Sequence[Sequence[int]], tgt_ids: Sequence[Sequence[int]] | None = None
) -> Batch:
    """Pad id lists into a :class:`Batch` (without targets ``tgt_in``/``tgt_out`` are empty)."""
    B = len(src_ids)
    S = max(1, max(len(s) for s in src_ids))
    src = torch.full((B, S), PAD_ID, dtype=torch.long)
    for i, s in enumerate(src_ids):
        src[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    src_mask = src != PAD_ID
    if tgt_ids is None:
        empty = torch.zeros(B, 0, dtype=torch.long)
        return Batch(src, src_mask, empty, empty)
    T = max(len(t) for t in tgt_ids) + 1
    tgt_in = torch.full((B, T), PAD_ID, dtype=torch.long)
    tgt_out = torch.full((B, T), PAD_ID, dtype=torch.long)
    for i, t in enumerate(tgt_ids):
        tgt_in[i, : len(t) + 1] = torch.tensor([START_ID, *t], dtype=torch.long)
        tgt_out[i, : len(t) + 1] = torch.tensor([*t, END_ID], dtype=torch.long)
    return Batch(src, src_mask, tgt_in, tgt_out)


class TranslationTask:
    """The shared trainer's Task for every translation model kind.

    Models take ``model(src (B,S), src_mask (B,S), tgt_in (B,T)) -> logits (B,T,V)``.

    Args:
        data: the pairs and vocabularies.
        eval_examples: how many validation sentences :meth:`evaluate` greedily decodes
            (exact match / BLEU at each validation; 0 = loss only).
    """

    def __init__(self, data: TranslationData, *, eval_examples: int = 200) -> None:
        self.data = data
        self.eval_examples = eval_examples
        self._enc = {k: data.encoded(k) for k in data.splits}

    @property
    def max_tgt_len(self) -> int:
        return int(self.data.stats["max_tgt_len"])

    def get_batch(
        self, split: str, step: int, batch_size: int, rank: int = 0, world: int = 1
    ) -> Batch:
        """``batch_size // world`` random examples of ``split``.

        Deterministic in (seed, split, step, rank).
        """
        src, tgt = self._enc[split]
        if not src:
            raise UserError(f"the {split!r} split is empty")
        n = max(1, batch_size // world)
        split_code = {"train": 0, "val": 1, "test": 2}.get(split, 3)
        g = torch.Generator().manual_seed(
            ((self.data.config.seed * 4 + split_code) * 1_000_003 + step) * 64 + rank
        )
        idx = torch.randint(len(src), (n,), generator=g).tolist()
        return collate([src[i] for i in idx], [tgt[i] for i in idx])

    def loss(self, model, batch: Batch, cfg) -> tuple[Tensor, dict[str, float]]:
        """Token cross-entropy with label smoothing ``cfg.label_smoothing``; padding ignored."""
        logits = model(batch.src, batch.src_mask, batch.tgt_in)  # (B, T, V)
        target = batch.tgt_out.masked_fill(batch.tgt_out == PAD_ID, -100)
        loss = F.cross_entropy(
            logits.flatten(0, 1).float(),
            target.flatten(),
            ignore_index=-100,
            label_smoothing=float(getattr(cfg, "label_smoothing", 0.0)),
        )
        with torch.no_grad():
            real = target != -100
            acc = ((logits.argmax(-1) == target) & real).sum() / real.sum().clamp(min=1)
        return loss, {"acc": float(acc)}

    def eval_batches(self, batch_size: int, n_batches: int) -> Iterable[Batch]:
        """The validation split in order (at most ``n_batches`` batches)."""
        src, tgt = self._enc["val"]
        for b in range(min(n_batches, (len(src) + batch_size - 1) // batch_size)):
            sl = slice(b * batch_size, (b + 1) * batch_size)
            yield collate(src[sl], tgt[sl])

    def count(self, batch: Batch) -> int:
        return int((batch.tgt_out != PAD_ID).sum())

    def config_dict(self) -> dict:
        return {"name": "translate", **self.data.config.to_dict(), "stats": self.data.stats}

    def save_artifacts(self, run_dir: str | Path) -> None:
        """Write ``vocab.json`` (vocabularies, normalisation) and ``heldout.tsv`` (test split)."""
        from attnlab.fileio import atomic_write_text

        run_dir = Path(run_dir)
        atomic_write_text(
            run_dir / "vocab.json",
            json.dumps(
                {
                    "src": self.data.src_vocab.to_dict(),
                    "tgt": self.data.tgt_vocab.to_dict(),
                    "normalizer": asdict(self.data.config.normalizer()),
                    "max_tgt_len": self.max_tgt_len,
                }
            ),
        )
        atomic_write_text(
            run_dir / "heldout.tsv", "".join(f"{s}\t{t}\n" for s, t in self.data.splits["test"])
        )

    def evaluate(self, model) -> dict[str, float]:
        """Greedy exact match, chrF and BLEU on the first ``eval_examples`` validation sentences."""
        if self.eval_examples <= 0 or not self.data.splits["val"]:
            return {}
        from attnlab.translate import evaluate_pairs

        model = getattr(model, "_orig_mod", model)  # torch.compile wrapper
        model = getattr(model, "module", model)  # DistributedDataParallel wrapper

        vocabs = TranslationVocabs(
            self.data.src_vocab,
            self.data.tgt_vocab,
            self.data.config.normalizer(),
            self.max_tgt_len,
        )
        res = evaluate_pairs(
            model, vocabs, self.data.splits["val"][: self.eval_examples], beam=1, batch_size=128
        )
        out = {"val_exact": res["exact_match"], "val_chrf": res["chrf"]}
        if res["bleu"] is not None:
            out["val_bleu"] = res["bleu"]
        return out


@dataclass
class TranslationVocabs:
    """What a run directory needs to turn text into ids and back (the "tokenizer" of a run)."""

    src: Vocab
    tgt: Vocab
    normalizer: Normalizer
    max_tgt_len: int = 64

    def encode_source(self, text: str, *, strict: bool = True) -> list[int]:
        """Normalise and encode one input sentence.

        Raises:
            UserError: an empty sentence, or (``strict``) tokens outside the source vocabulary.
        """
        norm = self.normalizer(text)
        if not norm:
            raise UserError("empty input sentence: nothing to translate")
        return self.src.encode(norm, strict=strict)


def load_vocabs(run_dir: str | Path) -> TranslationVocabs:
    """Read ``vocab.json`` of a translation run.

    Raises:
        UserError: the file is missing or corrupted.
    """
    path = Path(run_dir) / "vocab.json"
    if not path.exists():
        raise UserError(f"{run_dir} has no vocab.json (not a translation run?)")
    try:
        d = json.loads(path.read_text())
        return TranslationVocabs(
            Vocab.from_dict(d["src"]),
            Vocab.from_dict(d["tgt"]),
            Normalizer(**d["normalizer"]),
            int(d.get("max_tgt_len", 64)),
        )
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise UserError(f"{path} is corrupted: {err}") from None
