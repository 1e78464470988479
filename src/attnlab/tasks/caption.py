"""The captioning task (image -> caption with teacher forcing), and captioning with a model:
greedy and beam decoding through :mod:`attnlab.decoding`, and the caption metrics.

Shape legend: B batch (images), L caption length, V vocabulary, Gh/Gw image-token grid.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from attnlab.config.base import ConfigError
from attnlab.data.scenes import SceneSet, Vocab, images_to_tensor
from attnlab.decoding.search import Hypothesis, beam_search
from attnlab.errors import UserError
from attnlab.layers import evaluating
from attnlab.metrics.captions import score_captions
from attnlab.tasks.losses import cross_entropy
from attnlab.tasks.scenes import SceneTask, SceneTaskConfig, forward_with_aux, pad_ids, with_aux

__all__ = [
    "accuracy_by_position",
    "truncated_logits",
    "CaptionTaskConfig",
    "CaptionTask",
    "decode_captions",
    "caption_images",
    "caption_metrics",
]


@dataclass
class CaptionTaskConfig(SceneTaskConfig):
    """Settings of :class:`CaptionTask`.

    Attributes:
        eval_scenes: validation scenes captioned (greedy) at each evaluation for BLEU and object
            precision.
        pretrain_steps: ``attnlab train caption`` first trains the encoder as a majority-shape
            classifier for this many steps (0: no pre-training).
        bptt_window: LSTM captioner only: truncated backpropagation through time, the recurrent
            state detached every this many words (0: full backpropagation from ``<end>`` back
            to the image feature, the lecture's prescription).
    """

    eval_scenes: int = 64
    pretrain_steps: int = 0
    bptt_window: int = 0

    def validate(self) -> None:
        super().validate()
        self.positive("eval_scenes")
        self.positive("bptt_window", allow_zero=True)
        if self.pretrain_steps < 0:
            raise ConfigError(
                f"pretrain_steps (--pretrain-steps) must be >= 0, got {self.pretrain_steps}"
            )


class CaptionTask(SceneTask):
    """Image -> caption, teacher forcing with cross-entropy over ``<start> words <end>``.

    Each training example is a scene and one of its reference captions, drawn at random. The model
    is called as ``model(images (B, 3, H, W), tokens_in (B, L)) -> logits (B, L, V)``.
    """

    config_cls: ClassVar[type[SceneTaskConfig]] = CaptionTaskConfig
    config: CaptionTaskConfig

    def get_batch(
        self, split: str, step: int, batch_size: int, rank: int = 0, world: int = 1
    ) -> dict:
        sset = self.sets(split)
        rng = self.rng(split, step, rank)
        idx = rng.integers(len(sset), size=self.share(batch_size, world))
        return self.caption_batch(sset, idx, rng)

    def loss(self, model: nn.Module, batch: dict, cfg: Any) -> tuple[Tensor, dict[str, float]]:
        tokens = batch["tokens"]
        if self.config.bptt_window:
            logits, aux = (
                truncated_logits(model, batch["images"], tokens[:, :-1], self.config.bptt_window),
                None,
            )
        else:
            logits, aux = forward_with_aux(model, batch["images"], tokens[:, :-1])  # (B, L-1, V)
        target = tokens[:, 1:].masked_fill(tokens[:, 1:] == Vocab.PAD, -100)
        loss = cross_entropy(logits, target, label_smoothing=getattr(cfg, "label_smoothing", 0.0))
        with torch.no_grad():
            ok = target != -100
            acc = ((logits.argmax(-1) == target) & ok).sum() / ok.sum().clamp(min=1)
        return with_aux(loss, aux, {"acc": float(acc)})

    def eval_batches(self, batch_size: int, n_batches: int) -> Iterator[dict]:
        sset = self.sets("val")
        for idx, rng in self.val_indices(batch_size, n_batches):
            yield self.caption_batch(sset, idx, rng)

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        """Greedy captions of some validation scenes: BLEU and how often named objects exist."""
        sset = self.sets("val")
        n = min(self.config.eval_scenes, len(sset))
        m = caption_metrics(model, self.vocab, sset, range(n), beam_size=1)
        return {"bleu": m["bleu"], "object_precision": m["object_precision"]}

    def evaluate_splits(
        self, model: nn.Module, vocab: Vocab, n: int = 200
    ) -> dict[str, dict[str, float]]:
        """``attnlab eval``: :func:`caption_metrics` of greedy captions on the first ``n`` scenes
        of the validation and the unseen-combination splits, against the training captions.

        Returns:
            ``{"val": metrics, "unseen": metrics}``.
        """
        train_caps = self.sets("train").caption_set()
        out = {}
        for split in ("val", "unseen"):
            sset = self.sets(split)
            out[split] = caption_metrics(
                model, vocab, sset, range(min(n, len(sset))), train_captions=train_caps
            )
        return out


def truncated_logits(model: nn.Module, images: Tensor, tokens: Tensor, window: int) -> Tensor:
    """Teacher-forced logits ``(B, L, V)`` of an LSTM captioner with truncated backpropagation
    through time: the words run ``window`` at a time and the recurrent state is detached between
    windows, so the loss of a word reaches back at most ``window`` steps — and only the first
    window's words reach the image feature that set h₀, c₀.

    Raises:
        UserError: a model without a recurrent state (the Transformer captioners).
    """
    base = getattr(model, "module", model)
    if not hasattr(base, "run_words"):
        raise UserError(
            f"bptt_window (truncated backpropagation) is for the LSTM captioner, not "
            f"{getattr(base, 'kind', type(base).__name__)}"
        )
    state = base.initial_state(images)
    out = []
    for s in range(0, tokens.shape[1], window):
        logits, state = base.run_words(tokens[:, s : s + window], state)
        out.append(logits)
        state = type(state)(state.h.detach(), state.c.detach())  # the truncation
    return torch.cat(out, dim=1)


@torch.no_grad()
def accuracy_by_position(model: nn.Module, task: CaptionTask, n: int = 200) -> list[float]:
    """Teacher-forced next-word accuracy at each caption position on ``n`` validation scenes
    (every reference caption of each scene): entry t is the accuracy of predicting word t + 1
    from the image and the reference words before it (positions with fewer than 20 words left
    out at the end)."""
    sset = task.sets("val")
    idx = np.arange(min(n, len(sset)))
    device = next(model.parameters()).device
    hits: list[float] = []
    counts: list[float] = []
    with evaluating(model):
        for i in idx:
            caps = sset.captions[i]
            tokens = pad_ids([task.vocab.encode_caption(c) for c in caps]).to(device)
            images = images_to_tensor(sset.images[[i] * len(caps)]).to(device)
            logits = model(images, tokens[:, :-1])
            target = tokens[:, 1:]
            ok = target != Vocab.PAD
            right = ((logits.argmax(-1) == target) & ok).sum(0).tolist()
            seen = ok.sum(0).tolist()
            for t, (r, c) in enumerate(zip(right, seen, strict=True)):
                if t >= len(hits):
                    hits.append(0.0)
                    counts.append(0.0)
                hits[t] += r
                counts[t] += c
    return [h / c for h, c in zip(hits, counts, strict=True) if c >= 20]


@torch.no_grad()
def decode_captions(
    model: nn.Module,
    images: Tensor,
    *,
    beam_size: int = 1,
    alpha: float = 0.6,
    max_len: int | None = None,
    attention: bool = False,
) -> list[Hypothesis]:
    """Greedy (``beam_size == 1``) or beam-search captions of ``images (B, 3, H, W)``, all images
    at once, through :func:`attnlab.decoding.search.beam_search`.

    Args:
        model: a captioner (``start_decoding(images, max_len)`` / ``decode_step``).
        beam_size: beam width K.
        alpha: GNMT length-penalty exponent (0: rank by log-probability; the default 0.6 keeps
            beam search from preferring short captions merely for having fewer factors).
        max_len: longest caption in tokens, ``<start>`` and ``<end>`` included (default: the
            model's ``max_len``).
        attention: keep, per generated word, the last block's head-averaged cross-attention over
            the image grid (Transformer captioner only) as ``alignment (T, Gh, Gw)``.

    Returns:
        One :class:`~attnlab.decoding.search.Hypothesis` per image: word ids without ``<start>``
        (ending with ``<end>`` unless cut at ``max_len``).

    Raises:
        ValueError: ``attention`` for a model without cross-attention, a bad width or length.
    """
    max_len = model.config.max_len if max_len is None else max_len
    if attention and not hasattr(model, "step_attention"):
        raise ValueError(f"{type(model).__name__} has no attention over the image")
    with evaluating(model):
        state = model.start_decoding(images, max_len)
        first = torch.full((images.shape[0], 1), Vocab.START, device=images.device)
        hyps = beam_search(
            model,
            state,
            first,
            beam=beam_size,
            max_len=max_len - 1,  # the start token takes one of the max_len positions
            end_id=Vocab.END,
            pad_id=Vocab.PAD,
            alpha=alpha,
            banned=(Vocab.PAD, Vocab.START),
            step_attention=model.step_attention if attention else None,
        )
    if attention:
        grid = model.encoder.grid
        for h in hyps:
            h.alignment = h.alignment.reshape(-1, *grid)  # (T, Gh, Gw)
    return hyps


def _words(ids: list[int]) -> list[int]:
    return ids[:-1] if ids and ids[-1] == Vocab.END else ids


def caption_images(
    model: nn.Module, images: Tensor, vocab: Vocab, *, beam_size: int = 1
) -> list[str]:
    """Captions as text for ``images (B, 3, H, W)`` (greedy when ``beam_size == 1``)."""
    return [
        vocab.decode(_words(h.ids)) for h in decode_captions(model, images, beam_size=beam_size)
    ]


def caption_metrics(
    model: nn.Module,
    vocab: Vocab,
    sset: SceneSet,
    indices: Iterable[int],
    *,
    beam_size: int = 1,
    train_captions: set[str] | None = None,
    batch_size: int = 128,
) -> dict[str, Any]:
    """Caption scenes ``indices`` of ``sset`` and score the captions
    (:func:`attnlab.metrics.captions.score_captions`).

    Raises:
        ValueError: no scenes.
    """
    indices = list(indices)
    if not indices:
        raise ValueError("caption_metrics needs at least one scene")
    device = next(model.parameters()).device
    hyps: list[str] = []
    for b in range(0, len(indices), batch_size):
        imgs = images_to_tensor(sset.images[indices[b : b + batch_size]]).to(device)
        hyps += caption_images(model, imgs, vocab, beam_size=beam_size)
    return score_captions(hyps, sset, indices, train_captions=train_captions)
