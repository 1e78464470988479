"""One row's tokens in a model's KV cache, as speculative decoding feeds, rolls back and slides
them (:mod:`attnlab.decoding.speculative`): the window ``tokens[start:cached]``.

A stream appends tokens (:meth:`RowStream.feed`, keeping the logits of the last few positions),
crops its caches back to a prefix (:meth:`RowStream.crop`, the rejected drafts), and opens a new
window when the context is full (:meth:`RowStream.open`). Over static caches (``compile``) the
feeds of the ``compiled_widths`` run a compiled forward, and greedy drafts run several compiled
steps per call (:meth:`RowStream.greedy_drafts`).

Shape legend: V vocab.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from attnlab.fast.compiled import capacity_bucket, compiled_greedy_draft, start_static

__all__ = ["RowStream"]


class RowStream:
    """The window ``tokens[start:cached]`` of one row in a model's KV cache; ``compile``: static
    caches, feeds of the ``compiled_widths`` compiled (any other length runs eagerly over the
    same caches)."""

    def __init__(self, model: nn.Module, *, compile: bool, compiled_widths: set[int]) -> None:
        self.model = model
        self.ctx = model.config.max_seq_len
        self.compile = compile
        self.compiled_widths = compiled_widths
        self.device = model.tok_emb.weight.device
        self.state = None
        self.start = self.cached = self.capacity = 0
        self._greedy_steps = None  # compiled_greedy_draft(model), made on first use

    def open(self, start: int, needed: int) -> None:
        """Start a new window at ``start`` with room for ``needed`` tokens."""
        cap = min(self.ctx, needed)
        if self.compile:
            cap = capacity_bucket(cap, self.ctx)
            self.state = start_static(self.model, 1, cap, compile=True)
        else:
            self.state = self.model.start_decoding(1, cap)
        self.start = self.cached = start
        self.capacity = cap

    @property
    def room(self) -> int:
        """Slots left in the cache."""
        return self.start + self.capacity - self.cached

    def feed(self, ids: Sequence[int], keep: int = 1) -> Tensor:
        """Append ``ids`` after the cached tokens; the logits ``(keep, V)`` of the last ``keep``
        positions."""
        if self.compile and 1 < len(ids) <= 4 and keep == 1:
            for i in ids[:-1]:  # a short catch-up: single compiled steps, not a new graph
                self._forward([i], 1)
            ids = ids[-1:]
        return self._forward(ids, keep)

    def _forward(self, ids: Sequence[int], keep: int) -> Tensor:
        # LMDecodeState.decode_step, keeping the logits of several positions
        state = self.state
        x = torch.tensor([list(ids)], dtype=torch.long, device=self.device)  # (1, T)
        T = x.shape[1]
        new = torch.ones(1, T, dtype=torch.bool, device=self.device)
        forward = self.model
        if state.static:
            slots = state.caches[0].cursor + torch.arange(T, device=self.device)
            state.mask.index_copy_(1, slots, new)
            if state.step_forward is not None and T in self.compiled_widths:
                forward = state.step_forward
        else:
            state.mask = torch.cat([state.mask, new], dim=1)
        logits = forward(x, caches=state.caches, attention_mask=None, logits_to_keep=keep)
        self.cached += T
        return logits[0]  # (keep, V)

    def greedy_drafts(self, ids: Sequence[int], k: int) -> list[int]:
        """Append ``ids``, then greedily decode ``k`` tokens (feeding the first k - 1): the
        compiled steps of :func:`~attnlab.fast.compiled.compiled_greedy_draft`, several per call
        and no sync between them (static caches on a CPU)."""
        if len(ids) > 1:
            self.feed(ids[:-1])
        if self._greedy_steps is None:
            self._greedy_steps = compiled_greedy_draft(self.model)
        n = self.cached - self.start  # the cursor
        self.state.mask[:, n : n + k] = True
        x = torch.tensor([[ids[-1]]], dtype=torch.long, device=self.device)
        out = self._greedy_steps(x, self.state.caches, k)  # (1, k)
        self.cached += k
        return out[0].tolist()

    def crop(self, upto: int) -> None:
        """Keep ``tokens[start:upto]`` in the caches (roll back the rest)."""
        if upto == self.cached:
            return  # nothing to roll back (a round of k = 0, every draft kept and no padding)
        n = upto - self.start
        for cache in self.state.caches:
            cache.crop(n)
        if self.state.static:
            self.state.mask[:, n:] = False
        else:
            self.state.mask = self.state.mask[:, :n]
        self.cached = upto
