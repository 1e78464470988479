"""Prompt lookup: draft tokens copied from an earlier occurrence of the context's last n-gram.

Code, documentation and chat often repeat what is already in the context (an identifier, a
signature, a quoted line). Prompt lookup (Saxena 2023; ``prompt_lookup_num_tokens`` in Hugging
Face) proposes, as the next k tokens, the tokens that followed the most recent earlier occurrence
of the context's last n tokens, trying n = N, N−1, ..., 1; the target model checks them in one
forward exactly as it checks a draft model's (:mod:`attnlab.decoding.speculative`). The proposal
is deterministic, so under sampling its distribution ``q`` is a point mass and a proposed token is
accepted with probability ``p(token)``.

:class:`NgramIndex` keeps, for every n-gram size, the position after the latest occurrence of
each n-gram, updated as tokens arrive: a look-up costs N dictionary reads, not a scan of the
context.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["NgramIndex"]


class NgramIndex:
    """The continuations of the n-grams (n = 1 … ``max_ngram``) of a growing token list.

    Args:
        max_ngram: the longest n-gram matched (N).
        tokens: the initial context (the prompt).

    Raises:
        ValueError: ``max_ngram < 1``.
    """

    def __init__(self, max_ngram: int, tokens: Iterable[int] = ()) -> None:
        if max_ngram < 1:
            raise ValueError(f"the n-gram size must be at least 1, got {max_ngram}")
        self.max_ngram = max_ngram
        self.tokens: list[int] = []
        # tables[n - 1]: n-gram -> the index of the token that followed its latest occurrence
        self.tables: list[dict[tuple[int, ...], int]] = [{} for _ in range(max_ngram)]
        self.extend(tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        """Append tokens; every n-gram that now has a continuation is indexed."""
        toks = self.tokens
        for tok in tokens:
            j = len(toks)  # the new token's index: it continues the n-grams ending at j - 1
            for n in range(1, min(self.max_ngram, j) + 1):
                self.tables[n - 1][tuple(toks[j - n : j])] = j
            toks.append(int(tok))

    def propose(self, k: int) -> tuple[list[int], int]:
        """``k`` tokens that followed the latest earlier occurrence of the longest suffix n-gram
        that occurred before (where they run into the end of the context, the copy continues
        with the tokens it copied: the continuation of a periodic run).

        Returns:
            ``(tokens, n)``: the proposal (empty when no suffix n-gram occurred before, or
            ``k == 0``) and the size n of the n-gram matched (0 when none).
        """
        toks = self.tokens
        if k <= 0:
            return [], 0
        for n in range(min(self.max_ngram, len(toks)), 0, -1):
            j = self.tables[n - 1].get(tuple(toks[len(toks) - n :]))
            if j is not None:
                # a copy that reaches the end of the context goes on copying itself: in a run
                # of period p (a repeated line, "    "), the proposal continues the run
                L, out = len(toks), toks[j : j + k]
                while len(out) < k:
                    out.append(out[j + len(out) - L])
                return out, n
        return [], 0
