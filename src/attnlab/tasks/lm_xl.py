"""Language modelling with Transformer-XL's memory: the corpus read as contiguous streams.

The training split is cut into ``B`` streams (the rows of every batch, as in
:mod:`attnlab.experiments.long_context`); batch ``s`` holds segment ``s mod n_seg`` of each
stream, so every row continues the same row of batch ``s − 1`` and the memory the model returned
for it carries over, detached (no gradient through it), to the next step. At the streams' end the
reading starts again from their beginning with an empty memory.

The task keeps the memory between calls of :meth:`XLTask.loss`, one per reading (training, and
validation); a batch's memory is used only when the batch is the one right after the batch that
produced it, so it is empty

- at the start of the streams (and after each wrap-around),
- at the start of every validation (the held-out split is read from its beginning, segment by
  segment with memory),
- when a batch does not follow the one that left the memory (a validation sharded over ranks).

A checkpoint saves the training memory in ``state.pt`` (:meth:`XLTask.state_dict`) and a resume
restores it, so ``--resume`` continues exactly as the uninterrupted run would (one process; under
``torchrun`` each rank's memory is not saved and a resumed run starts its first step without).

Shape legend: B batch (streams), T segment (``seq_len``), M memory (``mem_len``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from attnlab.errors import UserError
from attnlab.layers import evaluating
from attnlab.tasks.lm import LMTask
from attnlab.tasks.losses import cross_entropy

__all__ = ["XLTask", "streams", "read_with_memory"]


def streams(ids: Any, batch_size: int) -> np.ndarray:
    """A split as ``batch_size`` contiguous streams ``(B, n)`` (the tail that does not divide is
    dropped)."""
    n = len(ids) // batch_size
    return np.asarray(ids[: n * batch_size], dtype=np.int64).reshape(batch_size, n)


def _inner(model: nn.Module) -> nn.Module:
    while isinstance(
        getattr(model, "_orig_mod", None) or getattr(model, "module", None), nn.Module
    ):
        model = getattr(model, "_orig_mod", None) or model.module
    return model


@torch.no_grad()
def read_with_memory(model: nn.Module, ids: Tensor, segment: int) -> tuple[float, int]:
    """Summed next-token loss and token count of ``ids (B, n + 1)`` read in segments of
    ``segment`` tokens, each after the previous ones' memory."""
    memory, total, count = None, 0.0, 0
    n = ids.shape[1] - 1
    for begin in range(0, n, segment):
        end = min(begin + segment, n)
        logits, memory = model(ids[:, begin:end], memory=memory)
        tgt = ids[:, begin + 1 : end + 1]
        total += float(cross_entropy(logits, tgt)) * tgt.numel()
        count += tgt.numel()
    return total, count


class XLTask(LMTask):
    """:class:`LMTask` for a :class:`~attnlab.models.transformer_xl.TransformerXL`: batches
    ``(idx, targets, step, first)`` from contiguous streams, the memory kept by the task.

    Raises:
        UserError: a split too short for one segment per stream.
    """

    def __init__(self, ids: np.ndarray, tokenizer: Any, config: Any) -> None:
        super().__init__(ids, tokenizer, config)
        self._streams: dict[tuple[str, int], Tensor] = {}
        #: per reading: (the step of the batch that produced the memory, the memory)
        self._memory: dict[str, tuple[int, list[Tensor]]] = {}

    @classmethod
    def from_lm(cls, task: LMTask) -> XLTask:
        """The same corpus and settings as ``task``, read as streams."""
        xl = cls(task.ids, task.tokenizer, task.config)
        xl.prepared = task.prepared
        return xl

    def stream_rows(self, split: str, batch_size: int) -> Tensor:
        """``(B, n)``: ``split`` cut into ``batch_size`` streams."""
        key = (split, batch_size)
        if key not in self._streams:
            rows = streams(self.splits[split], batch_size)
            if rows.shape[1] < self.seq_len + 1:
                raise UserError(
                    f"the {split} split ({len(self.splits[split])} tokens) cut into "
                    f"{batch_size} streams leaves {rows.shape[1]} tokens each, fewer than "
                    f"seq_len + 1 = {self.seq_len + 1}: use a smaller --batch-size or "
                    "--seq-len, or more text"
                )
            self._streams[key] = torch.from_numpy(rows)
        return self._streams[key]

    def segments(self, split: str, batch_size: int) -> int:
        """How many segments of ``seq_len`` each stream holds before the reading wraps."""
        return (self.stream_rows(split, batch_size).shape[1] - 1) // self.seq_len

    def get_batch(
        self, split: str, step: int, batch_size: int, rank: int = 0, world: int = 1
    ) -> tuple[Tensor, Tensor, int, bool]:
        """Segment ``step mod n_seg`` of the ``batch_size`` streams (this rank's rows):
        ``(idx, targets, step, first)``, row ``r`` continuing row ``r`` of batch ``step − 1``
        unless ``first`` (the streams' start)."""
        if split not in self.splits:
            raise ValueError(f"split must be 'train' or 'val', got {split!r}")
        rows = self.stream_rows(split, batch_size)
        pos = (step % self.segments(split, batch_size)) * self.seq_len
        per = batch_size // world
        seg = rows[rank * per : (rank + 1) * per, pos : pos + self.seq_len + 1]
        return seg[:, :-1], seg[:, 1:], step, pos == 0

    def loss(self, model: nn.Module, batch: Any, cfg: Any = None) -> tuple[Tensor, dict]:
        """Mean next-token loss of the segment after the carried memory (none when the batch
        starts the streams or does not follow the batch that left it); the new memory, detached,
        is kept for the next batch."""
        idx, targets, step, first = batch
        reading = "train" if model.training else "val"
        held = self._memory.get(reading)
        memory = None
        if not first and held is not None and held[0] == step - 1:
            memory = [m.to(idx.device) for m in held[1]]
        out, new_memory = model(idx, memory=memory)
        self._memory[reading] = (step, [m.detach() for m in new_memory])
        smoothing = getattr(cfg, "label_smoothing", 0.0) or 0.0
        return cross_entropy(out, targets, label_smoothing=smoothing), {}

    def state_dict(self) -> dict[str, Any]:
        """The training memory and the step that left it (saved in a checkpoint's state.pt)."""
        held = self._memory.get("train")
        return {} if held is None else {"step": held[0], "memory": [m.cpu() for m in held[1]]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Carry the saved training memory into the next step (a resume)."""
        if state:
            self._memory["train"] = (int(state["step"]), list(state["memory"]))

    def reset_memory(self) -> None:
        """Forget every carried memory."""
        self._memory.clear()

    def eval_batches(self, batch_size: int, n_batches: int | None) -> Iterator[Any]:
        """The held-out split as ``batch_size`` streams read from the start, segment by segment
        (the memory starts empty)."""
        self._memory.pop("val", None)
        n = self.segments("val", batch_size)
        for step in range(n if n_batches is None else min(n, n_batches)):
            yield self.get_batch("val", step, batch_size)

    @torch.no_grad()
    def val_loss(
        self, model: nn.Module, *, batch_size: int = 32, n_batches: int | None = None
    ) -> dict[str, float]:
        """Token-weighted mean loss of the held-out split read as streams with memory.

        Returns:
            ``{"loss", "perplexity", "tokens"}``.
        """
        device = next(model.parameters()).device
        rows = self.stream_rows("val", batch_size).to(device)
        n_seg = self.segments("val", batch_size)
        if n_batches is not None:
            n_seg = min(n_seg, n_batches)
        with evaluating(model):
            total, count = read_with_memory(
                _inner(model), rows[:, : n_seg * self.seq_len + 1], self.seq_len
            )
        loss = total / max(count, 1)
        return {"loss": loss, "perplexity": float(np.exp(min(loss, 50.0))), "tokens": count}
