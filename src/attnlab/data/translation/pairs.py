"""Sentence pairs for translation, all reproducible from a seed.

- ``numbers``: English number words -> Italian / French / German (any ``num2words`` language)
  words. The range of numbers controls the source length ("seven" vs "nine hundred and ninety
  nine thousand ..."), which is what the bottleneck experiment varies. German puts units before
  tens ("einundzwanzig" = one-and-twenty), so its alignments are not monotone.
- ``dates``: a date written in one of many human formats ("tuesday, 3 march 2021", "03.03.21",
  "march 3rd, 2021") -> ISO ``2021-03-03``, built with the standard library.
- ``tsv``: any ``source<TAB>target[<TAB>...]`` file (the Tatoeba/Anki layout); malformed lines are
  reported with file and line number.
"""

from __future__ import annotations

import calendar
import datetime as dt
import random
from collections.abc import Iterable
from pathlib import Path

from attnlab.config.translation import check_number_language, number_languages
from attnlab.errors import UserError
from attnlab.fileio import atomic_write_text

__all__ = ["number_languages", "make_numbers", "make_dates", "read_tsv", "write_tsv"]


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
    # lazy: num2words imports ~60 modules (~0.15 s); only the number-pair corpora need it
    from num2words import num2words

    check_number_language(lang)
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


def write_tsv(pairs: Iterable[tuple[str, str]], path: str | Path) -> None:
    """Write ``source<TAB>target`` lines (what :func:`read_tsv` reads), atomically."""
    atomic_write_text(Path(path), "".join(f"{s}\t{t}\n" for s, t in pairs))
