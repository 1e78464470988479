"""The batch a run is diagnosed on, per family, and the loss that ablation changes.

- language models (decoder and MLM): rows of random tokens repeated twice (the induction
  probe); the loss is next-token cross-entropy (decoder) or reconstruction of the tokens (MLM);
- translation: fresh pairs of the run's synthetic task (a seed the training never used), with
  the teacher-forced cross-entropy; ``dates`` pairs also give the known word alignment;
- vision, captioning, VQA: random inputs of the run's shapes; the loss is cross-entropy against
  the model's own predictions on them (how much a head's ablation changes its decisions).

Shape legend: B batch, T time, S source length.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.config.translation import TranslationTaskConfig
from attnlab.data.translation.dataset import collate
from attnlab.data.translation.pairs import make_dates, make_numbers
from attnlab.inspect.alignment import date_alignment
from attnlab.inspect.diagnostics import repeated_tokens
from attnlab.inspect.hooks import run_model

__all__ = ["Probe", "probe_for"]


@dataclass
class Probe:
    """What :func:`attnlab.inspect.diagnose` runs on: inputs, loss, repeated tokens, alignment,
    and a sentence saying what they are."""

    inputs: Any
    loss_fn: Callable[[Any], Tensor] | None
    repeated: Tensor | None
    alignment: Tensor | None
    description: str


def _self_prediction(model: nn.Module, inputs: Any) -> Callable[[Any], Tensor]:
    with torch.no_grad():
        own = run_model(model, inputs).argmax(-1)

    def loss(out: Tensor) -> Tensor:
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), own.reshape(-1))

    return loss


def probe_for(run: Any, *, batch: int = 4, length: int = 16, seed: int = 1234) -> Probe:
    """The probe of a loaded run (:func:`attnlab.load`'s result).

    Args:
        batch: rows of the probe batch.
        length: n, the repeated half's length (language models), at most half the context.
        seed: the random inputs' seed.
    """
    model, kind = run.model, run.kind
    g = torch.Generator().manual_seed(seed)
    cfg = getattr(model, "config", None)
    if kind in ("decoder_lm", "encoder_mlm"):
        n = max(2, min(length, (cfg.max_seq_len - 1) // 2))
        ids = repeated_tokens(cfg.vocab_size, n, batch, seed=seed)
        if kind == "decoder_lm":

            def loss(out: Tensor) -> Tensor:
                return F.cross_entropy(
                    out[:, :-1].reshape(-1, out.shape[-1]), ids[:, 1:].reshape(-1)
                )

            what = "next-token cross-entropy"
        else:

            def loss(out: Tensor) -> Tensor:
                return F.cross_entropy(out.reshape(-1, out.shape[-1]), ids.reshape(-1))

            what = "cross-entropy of reconstructing the tokens"
        desc = f"{batch} rows of {n} random tokens repeated twice; loss: {what}"
        return Probe(ids, loss, ids, None, desc)
    if kind in ("transformer", "t5", "rnn", "rnn-attn"):
        return _translation_probe(run, batch, seed)
    if kind in ("vit", "swin"):
        c = cfg
        images = torch.randn(batch, c.in_channels, c.image_size, c.image_size, generator=g)
        desc = f"{batch} random images; loss: cross-entropy against the model's own classes"
        return Probe(images, _self_prediction(model, images), None, None, desc)
    if kind in ("caption_transformer", "vqa_transformer"):
        c = cfg
        images = torch.randn(batch, 3, c.image_size, c.image_size, generator=g)
        L = min(8, c.max_len)
        words = torch.randint(4, c.vocab_size, (batch, L), generator=g)
        if kind == "caption_transformer":
            words[:, 0] = 2  # <start> of the scene vocabulary
            inputs: Any = (images, words)
        else:
            inputs = (images, words, torch.full((batch,), L))
        desc = (
            f"{batch} random images and {L}-word random texts; loss: cross-entropy against "
            "the model's own predictions"
        )
        return Probe(inputs, _self_prediction(model, inputs), None, None, desc)
    raise ValueError(f"attnlab inspect has no probe for {kind!r} models (no attention heads?)")


def _translation_probe(run: Any, batch: int, seed: int) -> Probe:
    task = TranslationTaskConfig.from_dict(run.task) if run.task else None
    vocabs = run.tokenizer
    if task is not None and task.task == "dates":
        pairs = make_dates(batch, seed=seed)
    elif task is not None and task.task == "numbers":
        pairs = make_numbers(task.lang, batch, low=task.low, high=task.high, seed=seed)
    else:
        raise ValueError(
            "attnlab inspect needs a synthetic translation task (numbers or dates) to draw "
            "pairs from; this run was trained on a TSV file"
        )
    norm = vocabs.normalizer
    pairs = [(norm(s), norm(t)) for s, t in pairs]
    b = collate([vocabs.src.encode(s) for s, _ in pairs], [vocabs.tgt.encode(t) for _, t in pairs])
    inputs = (b.src, b.src_mask, b.tgt_in)

    def loss(out: Tensor) -> Tensor:
        return F.cross_entropy(
            out.reshape(-1, out.shape[-1]), b.tgt_out.reshape(-1), ignore_index=0
        )

    alignment = None
    note = "no known word alignment for the numbers task"
    if task.task == "dates":
        alignment = date_alignment(
            [s for s, _ in pairs],
            [t for _, t in pairs],
            [vocabs.src.tokenize(s) for s, _ in pairs],
            [vocabs.tgt.tokenize(t) for _, t in pairs],
            b.src.shape[1],
            b.tgt_in.shape[1],
        )
        note = "alignment: the date fields (year, month, day) of source and target"
    desc = f"{batch} fresh {task.task} pairs; loss: teacher-forced cross-entropy; {note}"
    return Probe(inputs, loss, None, alignment, desc)
