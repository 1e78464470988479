"""T5's span corruption (Raffel et al. 2020, §3.1.4) as a training task on one corpus.

    window    x₁ … x_L                           (L = seq_len tokens of the corpus)
    noise     n = round(L · noise_density) tokens in k = round(n / mean_span_length) spans
    input     the window with span i replaced by <extra_id_i>, then </s>
    target    <extra_id_0> span₀ <extra_id_1> span₁ … </s>
    loss      mean over target tokens of −log p(y_t | input, y_<t)   (the decoder starts at <pad>)

Span boundaries are drawn as in T5's ``random_spans_noise_mask``: the n noise tokens and the
L − n others are each cut into k non-empty segments uniformly at random, and the segments
alternate, starting with kept tokens. Every window has the same n and k, so inputs and targets
have fixed lengths (L − n + k + 1 and n + k + 1) and batches need no padding. The corpus is
read, tokenised and split as for language modelling (:class:`attnlab.tasks.lm.LMTask`, the plain
tokenizer; the sentinels are added after its ids). Windows and spans of training batch ``step``
come from a generator seeded by ``(seed, split, step)``; the validation set is drawn once.

Shape legend: B batch, S input length, T target length, V vocabulary (specials included).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from attnlab.attention.capture import collect_aux_losses
from attnlab.config.t5 import SpanTaskConfig
from attnlab.data.tokenizers import TokenizerWithSpecials, t5_specials
from attnlab.data.translation import Batch
from attnlab.decoding import beam_search
from attnlab.errors import UserError
from attnlab.layers import evaluating
from attnlab.tasks.corpus_examples import CorpusExamplesTask
from attnlab.tasks.lm import LMTask
from attnlab.tasks.losses import cross_entropy

__all__ = ["SpanCorruptionTask", "random_segmentation", "corrupt_spans", "fill_spans"]


def random_segmentation(n_items: int, n_segments: int, rng: np.random.Generator) -> np.ndarray:
    """``n_items`` cut into ``n_segments`` non-empty parts, uniformly over all such cuts.

    Returns:
        ``(n_segments,)`` int64 lengths summing to ``n_items``.
    """
    firsts = np.zeros(n_items - 1, dtype=np.int64)
    firsts[: n_segments - 1] = 1  # a 1 before an item: it starts a new segment
    rng.shuffle(firsts)
    segment = np.concatenate([[0], np.cumsum(firsts)])  # (n_items,) segment of each item
    return np.bincount(segment, minlength=n_segments)


def corrupt_spans(
    tokens: np.ndarray,
    rng: np.random.Generator,
    *,
    n_noise: int,
    n_spans: int,
    sentinel_ids: list[int],
    eos_id: int,
) -> tuple[list[int], list[int]]:
    """One window's ``(input ids, target ids)`` (see the module docstring).

    Args:
        tokens: ``(L,)`` the window.
        n_noise, n_spans: corrupted tokens and spans (``n_spans <= n_noise``, ``n_spans <=
            L − n_noise``).
        sentinel_ids: at least ``n_spans`` ids, ``<extra_id_0>`` first.
        eos_id: ``</s>``.
    """
    L = len(tokens)
    noise = random_segmentation(n_noise, n_spans, rng)
    keep = random_segmentation(L - n_noise, n_spans, rng)
    inputs: list[int] = []
    target: list[int] = []
    pos = 0
    for i in range(n_spans):
        inputs.extend(tokens[pos : pos + keep[i]].tolist())
        pos += keep[i]
        inputs.append(sentinel_ids[i])
        target.append(sentinel_ids[i])
        target.extend(tokens[pos : pos + noise[i]].tolist())
        pos += noise[i]
    return inputs + [eos_id], target + [eos_id]


class SpanCorruptionTask(CorpusExamplesTask):
    """Span-corruption pre-training of an encoder–decoder: the trainer's Task.

    A batch is a translation :class:`~attnlab.data.translation.Batch` (``src``, ``src_mask``,
    ``tgt_in`` = ``<pad>`` + target without its last token, ``tgt_out`` = target), so the model
    is called as every seq2seq model is, ``model(src, src_mask, tgt_in)``.

    Args:
        corpus: the language-modelling task that holds the corpus's ids and splits.
        tokenizer: the plain tokenizer plus :func:`~attnlab.data.tokenizers.t5_specials`.
        config: the settings; ``seed`` None means 0.
    """

    TYPE = "t5-span"
    CONFIG = SpanTaskConfig
    DESCRIPTION = "a span-corruption task"

    def __init__(
        self, corpus: LMTask, tokenizer: TokenizerWithSpecials, config: SpanTaskConfig
    ) -> None:
        super().__init__(corpus, tokenizer, config)
        ids = tokenizer.special_ids
        self.pad_id, self.eos_id = ids["<pad>"], ids["</s>"]
        self.sentinel_ids = [ids[f"<extra_id_{i}>"] for i in range(config.n_sentinels)]

    @classmethod
    def build(
        cls, config: SpanTaskConfig | None = None, *, tokenizer: Any = None
    ) -> SpanCorruptionTask:
        """Load the corpus, train (or reuse) the tokenizer, add T5's specials and tokenise.

        Raises:
            UserError: an unknown or empty corpus, a bad tokenizer setting, too few tokens.
        """
        config = SpanTaskConfig() if config is None else config
        corpus, config = cls.load_corpus(config, tokenizer, config.seq_len)
        specials = t5_specials(config.n_sentinels)
        return cls(corpus, TokenizerWithSpecials(corpus.tokenizer, specials), config)

    @property
    def max_src_len(self) -> int:
        """Input length ``L − n + k + 1`` (the same for every window)."""
        c = self.config
        return c.seq_len - c.n_noise + c.n_spans + 1

    @property
    def max_tgt_len(self) -> int:
        """Target length ``n + k + 1``."""
        return self.config.n_noise + self.config.n_spans + 1

    # -- batches --------------------------------------------------------------------------------

    def _batch(self, split: str, starts: np.ndarray, rng: np.random.Generator) -> Batch:
        c = self.config
        windows = self.windows(split, starts, c.seq_len)  # (B, L)
        pairs = [
            corrupt_spans(
                w,
                rng,
                n_noise=c.n_noise,
                n_spans=c.n_spans,
                sentinel_ids=self.sentinel_ids,
                eos_id=self.eos_id,
            )
            for w in windows
        ]
        src = torch.tensor([p[0] for p in pairs], dtype=torch.long)  # (B, S)
        tgt = torch.tensor([p[1] for p in pairs], dtype=torch.long)  # (B, T)
        start = torch.full((len(pairs), 1), self.pad_id, dtype=torch.long)
        tgt_in = torch.cat([start, tgt[:, :-1]], dim=1)  # (B, T): the decoder starts at <pad>
        return Batch(src, torch.ones_like(src, dtype=torch.bool), tgt_in, tgt)

    def get_batch(
        self, split: str, step: int, batch_size: int, rank: int = 0, world: int = 1
    ) -> Batch:
        """This rank's share of global batch ``step`` (the whole batch is drawn, then sliced)."""
        rng, starts = self.batch_starts(split, step, batch_size, self.config.seq_len)
        b = self._batch(split, starts, rng)
        mine = self.rank_share(batch_size, rank, world)
        step_ = step if split == "train" else None
        return Batch(b.src[mine], b.src_mask[mine], b.tgt_in[mine], b.tgt_out[mine], step=step_)

    def eval_batches(self, batch_size: int, n_batches: int | None) -> Iterator[Batch]:
        """The fixed validation set: consecutive windows of the held-out split, corrupted once."""
        if self._val is None:
            rng, starts = self.val_starts(self.config.seq_len)
            self._val = self._batch("val", starts, rng)
        w = self._val
        for r in self.eval_slices(len(w.src), batch_size, n_batches):
            yield Batch(w.src[r], w.src_mask[r], w.tgt_in[r], w.tgt_out[r])

    # -- the trainer protocol -------------------------------------------------------------------

    def loss(self, model: nn.Module, batch: Batch, cfg: Any = None) -> tuple[Tensor, dict]:
        """Mean cross-entropy over the target tokens (+ ``moe_aux_coef`` × MoE losses).

        Returns:
            ``(loss, metrics)``: ``acc`` is the teacher-forced top-1 accuracy of the target
            tokens (sentinels and ``</s>`` included).
        """
        with collect_aux_losses() as aux:
            logits = model(batch.src, batch.src_mask, batch.tgt_in)  # (B, T, V)
        smoothing = getattr(cfg, "label_smoothing", 0.0) or 0.0
        ce = cross_entropy(logits, batch.tgt_out, label_smoothing=smoothing)
        acc = float((logits.detach().argmax(-1) == batch.tgt_out).float().mean())
        return self.with_moe_aux(model, ce, aux, {"acc": acc})

    @torch.no_grad()
    def val_metrics(
        self, model: nn.Module, *, batch_size: int = 32, n_batches: int | None = None
    ) -> dict[str, float]:
        """Loss and top-1 accuracy over every target token of the validation set."""
        device = next(model.parameters()).device
        total, hits, count = 0.0, 0, 0
        with evaluating(model):
            for b in self.eval_batches(batch_size, n_batches):
                b = b.to(device)
                logits = model(b.src, b.src_mask, b.tgt_in)
                n = b.tgt_out.numel()
                total += float(cross_entropy(logits, b.tgt_out)) * n
                hits += int((logits.argmax(-1) == b.tgt_out).sum())
                count += n
        return {"loss": total / max(count, 1), "acc": hits / max(count, 1), "predicted": count}

    def count(self, batch: Batch) -> int:
        return int(batch.src.numel() + batch.tgt_out.numel())


# ----------------------------------------------------------------------------------------------
# filling spans


@torch.no_grad()
def fill_spans(
    model: nn.Module, tokenizer: Any, text: str, *, beam: int = 4, max_len: int = 64
) -> str:
    """What a span-corruption model writes for the sentinels of ``text``, by beam search.

    ``text`` holds sentinels where spans are missing (``"def <extra_id_0>(x):"``); the output
    is T5's target form, ``<extra_id_0> span₀ <extra_id_1> …`` (``</s>`` dropped), decoded
    through :func:`attnlab.decoding.beam_search` from ``<pad>``.

    Raises:
        UserError: a tokenizer without sentinels, a text without one, characters outside a
            character vocabulary, ``beam`` or ``max_len`` below 1.
    """
    ids = getattr(tokenizer, "special_ids", {})
    if "<extra_id_0>" not in ids:
        raise UserError(
            "this run's tokenizer has no sentinels (filling spans needs a run of "
            "'attnlab train t5-span')"
        )
    if "<extra_id_0>" not in text:
        raise UserError(
            "the text has no sentinel: write <extra_id_0> (then <extra_id_1>, ...) where a span "
            'is missing, e.g. "def <extra_id_0>(x):"'
        )
    if beam < 1 or max_len < 1:
        raise UserError(f"--beam and --max-len must be at least 1, got {beam} and {max_len}")
    device = next(model.parameters()).device
    src = torch.tensor([[*tokenizer.encode(text), ids["</s>"]]], device=device)  # (1, S)
    mask = torch.ones_like(src, dtype=torch.bool)
    start = torch.full((1, 1), ids["<pad>"], device=device)
    state = model.start_decoding(src, mask, max_len + 1)
    pad = ids["<pad>"]  # the decoder's start, never written
    (best,) = beam_search(
        model,
        state,
        start,
        beam=beam,
        max_len=max_len,
        end_id=ids["</s>"],
        pad_id=pad,
        banned=[pad],
    )
    out = [i for i in best.ids if i != ids["</s>"]]
    return tokenizer.decode(out)
