"""The known word alignment of the synthetic ``dates`` translation data.

A human-written date ("the 3rd of march 2021", "03.03.21") and its ISO form ("2021-03-03") share
three fields: year, month, day. Every target character belongs to one (the hyphens to none), and
the source's fields are found from the values the target gives (the data's numeric formats are
day-first, except ``YYYY/MM/DD``). A target token is aligned to the source tokens of its field.

Shape legend: T target tokens, S source tokens.
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["date_fields", "date_alignment", "token_fields"]

_MONTHS = [calendar.month_name[i].lower() for i in range(1, 13)]


def date_fields(source: str, iso: str) -> tuple[list[str | None], list[str | None]]:
    """Per character of ``source`` and of ``iso``: ``"year"``, ``"month"``, ``"day"`` or None.

    Raises:
        ValueError: ``iso`` is not ``YYYY-MM-DD``.
    """
    m = re.fullmatch(r"(\d{4})-(\d{2})-(\d{2})", iso.strip())
    if m is None:
        raise ValueError(f"not an ISO date: {iso!r}")
    month = int(m.group(2))
    tgt: list[str | None] = [None] * len(iso)
    for field, (a, b) in (("year", (0, 4)), ("month", (5, 7)), ("day", (8, 10))):
        for i in range(a, b):
            tgt[i] = field
    src: list[str | None] = [None] * len(source)

    def mark(a: int, b: int, field: str) -> None:
        for i in range(a, b):
            src[i] = field

    name = re.search(rf"\b{_MONTHS[month - 1][:3]}[a-z]*", source)
    if name is not None:
        mark(name.start(), name.end(), "month")
    groups = list(re.finditer(r"\d+", source))
    if name is not None:  # a written month: the numbers are the day and the year
        for g in groups:
            is_year = len(g.group()) == 4 or (g is groups[-1] and len(groups) > 1)
            end = g.end()
            if not is_year:  # an ordinal's suffix belongs to the day
                suffix = re.match(r"(st|nd|rd|th)\b", source[end:])
                end += suffix.end() if suffix else 0
            mark(g.start(), end, "year" if is_year else "day")
    elif len(groups) == 3:
        order = (
            ("year", "month", "day") if len(groups[0].group()) == 4 else ("day", "month", "year")
        )
        for g, field in zip(groups, order):
            mark(g.start(), g.end(), field)
    return src, tgt


def token_fields(
    text: str, tokens: Sequence[str], fields: Sequence[str | None]
) -> list[str | None]:
    """The field of each token: that of the first labelled character of its span in ``text``
    (tokens are found left to right; BPE's ``▁`` marks a space)."""
    out: list[str | None] = []
    pos = 0
    for tok in tokens:
        piece = tok.replace("▁", "")
        at = text.find(piece, pos) if piece else -1
        if at < 0:
            out.append(None)
            continue
        span = [f for f in fields[at : at + len(piece)] if f is not None]
        out.append(span[0] if span else None)
        pos = at + len(piece)
    return out


def date_alignment(
    sources: Sequence[str],
    targets: Sequence[str],
    src_tokens: Sequence[Sequence[str]],
    tgt_tokens: Sequence[Sequence[str]],
    S: int,
    T: int,
) -> Tensor:
    """``(B, T, S)`` bool: target token t (the token predicted at decoder step t) is aligned to
    source token s when both belong to the same date field; padding rows/columns are False."""
    out = torch.zeros(len(sources), T, S, dtype=torch.bool)
    for b, (src, tgt, st, tt) in enumerate(zip(sources, targets, src_tokens, tgt_tokens)):
        sf, tf = date_fields(src, tgt)
        s_fields = token_fields(src, st, sf)
        t_fields = token_fields(tgt, tt, tf)
        for t, ft in enumerate(t_fields[:T]):
            for s, fs in enumerate(s_fields[:S]):
                out[b, t, s] = ft is not None and ft == fs
    return out
