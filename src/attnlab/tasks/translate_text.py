"""Translating text with a trained run (``attnlab translate``): the sentences read from the
command line or a file, the alignment request checked, unknown words explained.

    texts = read_sentences(["twenty one"], None)
    results = translate_sentences(model, vocabs, texts, beam=4)
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch import nn

from attnlab.data.translation.vocab import UnknownTokens
from attnlab.errors import UserError
from attnlab.metrics.translation import Translation, translate_texts

__all__ = ["read_sentences", "check_alignment_request", "translate_sentences", "unknown_hint"]


def read_sentences(texts: Sequence[str], file: str | None) -> list[str]:
    """``texts`` plus every non-empty line of ``file`` (``"-"``: standard input).

    Raises:
        UserError: a missing, non-file or non-UTF-8 ``file``, or nothing to translate.
    """
    texts = list(texts)
    if file:
        if file == "-":
            lines = sys.stdin.read().splitlines()
        else:
            path = Path(file)
            if not path.exists():
                raise UserError(f"{path}: no such file")
            if not path.is_file():
                raise UserError(f"{path}: not a file (expected one sentence per line)")
            try:
                lines = path.read_text(encoding="utf-8").splitlines()
            except UnicodeDecodeError:
                raise UserError(f"{path}: not valid UTF-8 text") from None
        texts += [line for line in lines if line.strip()]
    if not texts:
        raise UserError("nothing to translate: give a sentence or --file")
    return texts


def check_alignment_request(model: nn.Module, layer: int) -> None:
    """Refuse ``--attention`` for a model without attention, or a ``--layer`` it lacks.

    Raises:
        UserError: the fixed-context ``rnn``, or ``layer`` outside the decoder's layers.
    """
    if model.kind == "rnn":
        raise UserError(
            "model kind 'rnn' has no attention to draw (the fixed-context rnn sees only "
            "the final encoder state); use rnn-attn or transformer"
        )
    n = getattr(model.config, "n_dec_layers", 1)
    if not -n <= layer < n:
        raise UserError(f"--layer {layer} out of range for {n} decoder layer(s)")


def unknown_hint(err: UnknownTokens, vocab: Any) -> str:
    """The unknown-token message, plus what to do: digits for a model of number words, and
    ``--allow-unk``."""
    text = str(err)
    digits = [t for t in err.tokens if any(c.isdigit() for c in t)]
    if digits and not any(any(c.isdigit() for c in t) for t in vocab.itos):
        text += (
            "; this model reads numbers written as words ('twenty one', not '21'): it never "
            "saw a digit"
        )
    return text + "; to translate anyway, reading them as <unk>, add --allow-unk"


def translate_sentences(
    model: nn.Module, vocabs: Any, texts: Sequence[str], **options: Any
) -> list[Translation]:
    """:func:`attnlab.metrics.translation.translate_texts`, unknown words refused with
    :func:`unknown_hint`'s advice.

    Returns:
        One :class:`~attnlab.metrics.translation.Translation` per sentence.

    Raises:
        UserError: unknown words (with ``strict``), an empty or too long sentence.
    """
    try:
        return translate_texts(model, vocabs, texts, **options)
    except UnknownTokens as err:
        raise UserError(unknown_hint(err, vocabs.src)) from None
