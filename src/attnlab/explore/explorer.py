"""One run, ready to explain inputs: load it once, check an input, hand it to its family.

    explorer = Explorer("runs/lm")
    payload = explorer.explain(ExploreInput(text="The cat sat"))   # JSON-able, see payload.py

Each family is a small module with ``KINDS`` (the run kinds it shows), ``INPUT`` (``text`` or
``image``), ``QUESTION`` (whether it reads a question too) and ``explain(run, input) -> payload``;
the page (:mod:`attnlab.explore.page`) and the server (:mod:`attnlab.explore.server`) never look at
the family.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from types import ModuleType

import torch

from attnlab.errors import UserError
from attnlab.explore import act, caption, clip, mlm, spans, text, translation, vision, vqa
from attnlab.explore.heads import ablated, add_head_rows
from attnlab.explore.payload import check_size
from attnlab.runs import load, read_config

__all__ = [
    "ExploreInput",
    "Explorer",
    "FAMILIES",
    "NO_ATTENTION",
    "family_for",
    "MAX_QUESTION_CHARS",
]

FAMILIES: tuple[ModuleType, ...] = (text, mlm, translation, spans, vision, caption, vqa, act, clip)

#: kinds with nothing to show, and what to train instead
NO_ATTENTION = {
    "lstm_lm": "an LSTM language model has no attention (train one with 'attnlab train lm')",
    "bigram_lm": "a bigram model has no attention (train one with 'attnlab train lm')",
    "conv_lm": "a convolutional language model has no attention (train one with 'attnlab train lm')",
    "rnn": "the plain RNN translator has no attention "
    "(train one with 'attnlab train translate --model rnn-attn' or '--model transformer')",
    "cnn": "a CNN has no attention (train one with 'attnlab train image --model vit' or swin)",
    "caption_lstm": "the LSTM captioner has no attention over the image "
    "(train one with 'attnlab train caption --model transformer')",
    "vqa_lstm": "the LSTM VQA models have no attention "
    "(train one with 'attnlab train vqa --model transformer')",
}

MAX_QUESTION_CHARS = 500


@dataclass
class ExploreInput:
    """What to explain: ``text`` (language models, translation) or ``image`` bytes (vision,
    captioning, VQA), and a ``question`` for VQA."""

    text: str | None = None
    image: bytes | None = None
    image_name: str = "image"
    question: str | None = None


def family_for(kind: str) -> ModuleType:
    """The family module that shows runs of ``kind``.

    Raises:
        UserError: a kind without attention, or one the explorer does not know.
    """
    if kind in NO_ATTENTION:
        raise UserError(f"the explorer cannot show a {kind!r} run: {NO_ATTENTION[kind]}")
    for family in FAMILIES:
        if kind in family.KINDS:
            return family
    known = sorted(k for f in FAMILIES for k in f.KINDS)
    raise UserError(f"the explorer cannot show a {kind!r} run; it shows {', '.join(known)}")


class Explorer:
    """A loaded run that explains one input at a time (thread-safe: one forward at a time).

    Args:
        run_dir: a run directory (``attnlab train ...``); nothing is written to it.
        weights: ``best`` (default, as in every command) or ``last``.

    Raises:
        UserError: a missing run, or a kind the explorer cannot show (checked before loading).
    """

    def __init__(self, run_dir: str | os.PathLike, *, weights: str = "best") -> None:
        kind = read_config(run_dir)["kind"]
        self.family = family_for(kind)
        self.run = load(run_dir, weights=weights)
        self._lock = threading.Lock()

    @property
    def kind(self) -> str:
        return self.run.kind

    @property
    def input_kind(self) -> str:
        """``text`` or ``image``: what the family reads."""
        return self.family.INPUT

    @property
    def takes_question(self) -> bool:
        return bool(self.family.QUESTION)

    @property
    def placeholder(self) -> str:
        """What the served page's text box says before anything is typed."""
        return str(getattr(self.family, "PLACEHOLDER", ""))

    def default_input(self, question: str | None = None) -> ExploreInput | None:
        """An input to show before the user gives one (the served page opens with it): a
        sentence the vocabulary can read, a bundled or generated image; ``question`` replaces
        the default question. None when the family has none (data on disk).

        Raises:
            UserError: a question for a run that takes none.
        """
        if question is not None and not self.takes_question:
            raise UserError(f"this {self.kind} run takes no question (questions are for VQA runs)")
        make = getattr(self.family, "default_input", None)
        fields = make(self.run) if make is not None else None
        if fields is None:
            return None
        if question is not None:
            fields = {**fields, "question": question}
        return ExploreInput(**fields)

    def check(self, inp: ExploreInput) -> None:
        """Refuse an input this run cannot read, with one clear message.

        Raises:
            UserError: an image for a text model, text for an image model, a missing, needless or
                too long question.
        """
        what = f"this {self.kind} run"
        if self.input_kind == "text":
            if inp.image is not None:
                raise UserError(f"{what} reads text, not an image ({inp.image_name})")
            if not inp.text or not inp.text.strip():
                raise UserError(f"{what} reads text: give some")
        else:
            if inp.image is None:
                shown = (inp.text or "")[:60]
                raise UserError(f"{what} reads an image file; {shown!r} is not one")
        if self.takes_question:
            if not inp.question or not inp.question.strip():
                raise UserError(f"{what} answers a question about the image: give --question")
            if len(inp.question) > MAX_QUESTION_CHARS:
                raise UserError(f"the question is longer than {MAX_QUESTION_CHARS} characters")
        elif inp.question:
            raise UserError(f"{what} takes no question (questions are for VQA runs)")

    def explain(self, inp: ExploreInput, *, ablate: dict[str, list[int]] | None = None) -> dict:
        """The payload for ``inp`` (see :mod:`attnlab.explore.payload`), with per-head
        diagnostics (``heads``, :mod:`attnlab.explore.heads`).

        Args:
            ablate: heads to zero-ablate for this input, ``{layer name: [head, ...]}``.

        Raises:
            UserError: a bad input (see :meth:`check` and the family's own checks) or a page too
                large to hold.
        """
        self.check(inp)
        with self._lock, torch.no_grad(), ablated(self.run.model, ablate):
            payload = add_head_rows(self.family.explain(self.run, inp), self.run.model)
        check_size(payload["views"])
        return {
            "version": 1,
            "kind": self.kind,
            "run": str(self.run.run_dir),
            "question": inp.question,
            "ablated": ablate or None,
            **payload,
        }
