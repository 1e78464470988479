"""The translation model kinds by name: ``rnn``, ``rnn-attn``, ``transformer`` and ``t5``, sized
for a pair of vocabularies from a preset.

    config = translation_config("transformer", 32, 181, preset="tiny", position="rope")
    model = build_translation_model("rnn-attn", 32, 181, preset="small", cell="lstm")

The kinds themselves are registered by :mod:`attnlab.models.rnn`, :mod:`attnlab.models.seq2seq`
and :mod:`attnlab.models.t5` (:mod:`attnlab.models.registry`).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from attnlab.config.base import Config, ConfigError
from attnlab.errors import UserError
from attnlab.models import rnn as _rnn  # noqa: F401  (registers rnn, rnn-attn)
from attnlab.models import seq2seq as _seq2seq  # noqa: F401  (registers transformer)
from attnlab.models import t5 as _t5  # noqa: F401  (registers t5)
from attnlab.models.registry import get_kind

__all__ = ["TRANSLATION_KINDS", "DEFAULT_PRESET", "translation_config", "build_translation_model"]

TRANSLATION_KINDS = ("rnn", "rnn-attn", "transformer", "t5")
#: the size preset when none is given (every kind has one of this name)
DEFAULT_PRESET = "small"


def translation_config(
    kind: str,
    src_vocab_size: int,
    tgt_vocab_size: int,
    /,
    *,
    preset: str | None = None,
    max_seq_len: int | None = None,
    **overrides: Any,
) -> Config:
    """The config of a translation model: a preset of its kind, sized for the vocabularies.

    Args:
        kind: ``rnn`` | ``rnn-attn`` | ``transformer`` | ``t5``.
        src_vocab_size, tgt_vocab_size: from the data's vocabularies.
        preset: size preset of the kind (default ``small``).
        max_seq_len: transformer, t5: position/cache capacity (ignored by the RNNs).
        **overrides: config fields (``cell="lstm"``, ``norm_position="pre"``...); vocabulary
            sizes given here are replaced by the two above.

    Returns:
        A ``Seq2SeqConfig``, ``T5Config`` or ``RNNSeq2SeqConfig``.

    Raises:
        UserError: unknown kind, preset, or a field the kind does not have.
    """
    if kind not in TRANSLATION_KINDS:
        raise UserError(
            f"unknown translation model {kind!r}; choose from {list(TRANSLATION_KINDS)}"
        )
    cfg_cls = get_kind(kind).config_cls
    fields = cfg_cls.field_names()
    bad = sorted(set(overrides) - set(fields))
    if bad:
        raise UserError(f"option(s) {bad} do not apply to model {kind!r}")
    if max_seq_len is not None and "max_seq_len" in fields:
        overrides.setdefault("max_seq_len", max_seq_len)
    try:
        sizes = {"src_vocab_size": src_vocab_size, "tgt_vocab_size": tgt_vocab_size}
        return cfg_cls.preset(preset or DEFAULT_PRESET, **{**overrides, **sizes})
    except ConfigError:
        raise
    except (TypeError, ValueError) as err:
        raise UserError(str(err)) from None


def build_translation_model(kind: str, *args: Any, **kwargs: Any) -> nn.Module:
    """A fresh ``rnn`` / ``rnn-attn`` / ``transformer`` / ``t5`` model: :func:`translation_config`'s
    arguments, then the kind's model class."""
    return get_kind(kind).build(translation_config(kind, *args, **kwargs))
