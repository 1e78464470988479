"""``attnlab train lm --arch transformer-xl``: the lengths of a Transformer-XL run and its task.

The task's ``seq_len`` is the segment T read per step; the model's ``max_seq_len`` is the key
span one attention call sees, memory included, so it is derived as ``seq_len + mem_len`` unless
set by hand, and then memory and segment must fit in it.
"""

from __future__ import annotations

from typing import Any

from attnlab.errors import UserError
from attnlab.tasks.lm import LMTask
from attnlab.tasks.lm_xl import XLTask

__all__ = ["XL_KIND", "xl_lengths", "xl_task"]

XL_KIND = "transformer_xl"


def xl_lengths(model: dict[str, Any], task: dict[str, Any], given_len: int | None, cls) -> None:
    """Set ``task["seq_len"]`` (default: the preset's span less the memory) and
    ``model["max_seq_len"]`` (default: segment + memory) in place.

    Raises:
        UserError: a memory that, with the segment, does not fit a ``max_seq_len`` set by hand.
    """
    mem = model.get("mem_len", cls().mem_len)
    if not isinstance(mem, int) or mem < 0:
        raise UserError(f"mem_len must be an integer >= 0, got {mem!r}")
    if "seq_len" not in task:
        task["seq_len"] = max(1, model.get("max_seq_len", cls().max_seq_len) - mem)
    span = task["seq_len"] + mem
    if given_len is not None and span > given_len:
        raise UserError(
            f"mem_len={mem} is too long: memory {mem} + segment seq_len={task['seq_len']} = "
            f"{span} keys exceed max_seq_len={given_len}; use mem_len <= "
            f"{max(0, given_len - task['seq_len'])}, a shorter --seq-len, or drop max_seq_len "
            "(it is derived as seq_len + mem_len)"
        )
    model["max_seq_len"] = given_len if given_len is not None else span


def xl_task(kind: str, task: Any) -> Any:
    """``task`` read as contiguous streams when ``kind`` is Transformer-XL."""
    return XLTask.from_lm(task) if kind == XL_KIND and type(task) is LMTask else task
