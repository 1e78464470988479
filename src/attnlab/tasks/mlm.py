"""Masked language modelling (BERT) as a training task, and ``fill_mask`` for trained encoders.

    chosen ⊂ text positions, |chosen| = round(mask_prob · #text positions)   (15 %)
    input at a chosen position: [MASK] (80 %), a random token (10 %), itself (10 %)
    loss = mean over chosen positions of −log p(x_i | the corrupted sequence)

Specials (``[CLS]``, ``[SEP]``, ``[PAD]``...) are never chosen, and nothing outside the chosen
positions enters the loss. The corpus is read, tokenised and split exactly as for language
modelling (:class:`attnlab.tasks.lm.LMTask`, with the plain tokenizer, so the token-id cache is
shared with LM runs); an example is ``[CLS] w₁ … w_{T−2} [SEP]``. Window positions and masks of
training batch ``step`` come from a generator seeded by ``(seed, split, step)``, so a resumed run
sees exactly the batches an uninterrupted one would and data-parallel ranks each take their share
of the same global batch; the validation set (consecutive windows of the held-out split) is
masked once, the same way every time.

Shape legend: B batch, T tokens per example (``seq_len``), V vocab_size (specials included).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from attnlab.attention.capture import collect_aux_losses
from attnlab.config.encoder import MLMTaskConfig
from attnlab.data.tokenizers import TokenizerWithSpecials
from attnlab.errors import UserError
from attnlab.layers import evaluating
from attnlab.tasks.corpus_examples import CorpusExamplesTask
from attnlab.tasks.losses import cross_entropy

__all__ = ["MLMTask", "mask_tokens", "fill_mask", "check_masked_text", "MaskPrediction", "IGNORE"]

#: target of positions that are not predicted (``cross_entropy``'s ignore_index)
IGNORE = -100


def mask_tokens(
    ids: np.ndarray,
    rng: np.random.Generator,
    *,
    n_normal: int,
    mask_id: int,
    mask_prob: float = 0.15,
    mask_token: float = 0.8,
    random_token: float = 0.1,
) -> tuple[np.ndarray, np.ndarray]:
    """BERT's corruption of a batch of sequences.

    In each row, ``round(mask_prob · n)`` of its ``n`` normal tokens (ids below ``n_normal``;
    at least one when ``n > 0``) are chosen uniformly without replacement; a chosen token becomes
    ``mask_id`` with probability ``mask_token``, a uniformly random normal token with probability
    ``random_token``, and stays otherwise. Ids from ``n_normal`` up (specials, padding) are never
    chosen.

    Args:
        ids: ``(B, T)`` token ids.
        rng: the generator (draws in a fixed order: selection, corruption kind, random tokens).

    Returns:
        ``(inputs, targets)``, both ``(B, T)`` int64: the corrupted ids, and the original id at
        chosen positions with :data:`IGNORE` elsewhere.
    """
    ids = np.asarray(ids, dtype=np.int64)
    B, T = ids.shape
    normal = ids < n_normal  # (B, T)
    counts = np.rint(mask_prob * normal.sum(1)).astype(np.int64)  # (B,)
    counts = np.where(normal.any(1), np.maximum(counts, 1), 0)
    scores = rng.random((B, T))
    scores[~normal] = np.inf  # specials sort last: never among the first `counts`
    ranks = np.argsort(np.argsort(scores, axis=1, kind="stable"), axis=1, kind="stable")
    chosen = ranks < counts[:, None]  # (B, T)
    u = rng.random((B, T))
    replace = rng.integers(0, n_normal, size=(B, T))
    inputs = ids.copy()
    to_mask = chosen & (u < mask_token)
    to_random = chosen & (u >= mask_token) & (u < mask_token + random_token)
    inputs[to_mask] = mask_id
    inputs[to_random] = replace[to_random]
    targets = np.where(chosen, ids, IGNORE)
    return inputs, targets


class MLMTask(CorpusExamplesTask):
    """Masked-LM training on one corpus: the trainer's :class:`~attnlab.tasks.Task`.

    A batch is ``(inputs, targets)``, both ``(B, T)`` long tensors (``targets`` is
    :data:`IGNORE` outside the chosen positions). Build one with :meth:`build` (reads and
    tokenises the corpus) or :meth:`from_config` (the task of a run directory).

    Args:
        corpus: the language-modelling task that holds the corpus's ids and splits.
        tokenizer: the tokenizer with specials (ids as the corpus's, specials after them).
        config: the settings; ``seed`` None means 0.
    """

    TYPE = "mlm"
    CONFIG = MLMTaskConfig
    DESCRIPTION = "a masked-LM task"

    @classmethod
    def build(cls, config: MLMTaskConfig | None = None, *, tokenizer: Any = None) -> MLMTask:
        """Load the corpus, train (or reuse) the tokenizer, add the specials and tokenise.

        Args:
            config: the settings (default: ``MLMTaskConfig()``, character-level pydoc).
            tokenizer: a run's tokenizer (with or without specials) instead of a new one.

        Returns:
            The task; its ``config`` records the corpus as found (absolute path) and the plain
            tokenizer's vocabulary size.

        Raises:
            UserError: an unknown or empty corpus, a bad tokenizer setting, too few tokens.
        """
        config = MLMTaskConfig() if config is None else config
        # [CLS] and [SEP] take two places
        corpus, config = cls.load_corpus(config, tokenizer, config.seq_len - 2)
        return cls(corpus, TokenizerWithSpecials(corpus.tokenizer), config)

    # -- batches --------------------------------------------------------------------------------

    def _examples(self, split: str, starts: np.ndarray) -> np.ndarray:
        """``[CLS] text [SEP]`` for windows of ``seq_len − 2`` tokens starting at ``starts``."""
        text = self.windows(split, starts, self.seq_len - 2)  # (B, L)
        tok = self.tokenizer
        cls_col = np.full((len(starts), 1), tok.cls_id, dtype=np.int64)
        sep_col = np.full((len(starts), 1), tok.sep_id, dtype=np.int64)
        return np.concatenate([cls_col, text, sep_col], axis=1)  # (B, T)

    def _mask(self, seqs: np.ndarray, rng: np.random.Generator) -> tuple[Tensor, Tensor]:
        c = self.config
        inputs, targets = mask_tokens(
            seqs,
            rng,
            n_normal=self.tokenizer.base.vocab_size,
            mask_id=self.tokenizer.mask_id,
            mask_prob=c.mask_prob,
            mask_token=c.mask_token,
            random_token=c.random_token,
        )
        return torch.from_numpy(inputs), torch.from_numpy(targets)

    def get_batch(
        self, split: str, step: int, batch_size: int, rank: int = 0, world: int = 1
    ) -> tuple[Tensor, Tensor]:
        """This rank's share of global batch ``step``: ``(inputs, targets)``, each ``(B/world, T)``.

        The whole global batch is drawn and masked, then sliced, so it does not depend on
        ``world``.
        """
        rng, starts = self.batch_starts(split, step, batch_size, self.seq_len - 2)
        inputs, targets = self._mask(self._examples(split, starts), rng)
        mine = self.rank_share(batch_size, rank, world)
        return inputs[mine], targets[mine]

    def eval_batches(
        self, batch_size: int, n_batches: int | None
    ) -> Iterator[tuple[Tensor, Tensor]]:
        """The fixed validation set: consecutive windows of the held-out split, masked once."""
        if self._val is None:
            rng, starts = self.val_starts(self.seq_len - 2)
            self._val = self._mask(self._examples("val", starts), rng)
        inputs, targets = self._val
        for rows in self.eval_slices(len(inputs), batch_size, n_batches):
            yield inputs[rows], targets[rows]

    # -- the trainer protocol -------------------------------------------------------------------

    def loss(
        self, model: nn.Module, batch: Any, cfg: Any = None
    ) -> tuple[Tensor, dict[str, float]]:
        """Mean cross-entropy over the chosen positions (+ ``moe_aux_coef`` × MoE losses).

        Returns:
            ``(loss, metrics)``: ``acc`` is the top-1 accuracy at the chosen positions; with MoE
            layers ``ce`` and ``aux`` too.
        """
        inputs, targets = batch
        with collect_aux_losses() as aux:
            logits = model(inputs)  # (B, T, V)
        smoothing = getattr(cfg, "label_smoothing", 0.0) or 0.0
        ce = cross_entropy(logits, targets, ignore_index=IGNORE, label_smoothing=smoothing)
        chosen = targets != IGNORE
        hits = (logits.detach().argmax(-1) == targets) & chosen
        metrics = {"acc": float(hits.sum()) / max(int(chosen.sum()), 1)}
        return self.with_moe_aux(model, ce, aux, metrics)

    @torch.no_grad()
    def val_metrics(
        self, model: nn.Module, *, batch_size: int = 32, n_batches: int | None = None
    ) -> dict[str, float]:
        """Loss and top-1 accuracy over every predicted token of the validation set.

        Returns:
            ``{"loss", "acc", "predicted"}`` (``predicted``: the number of chosen tokens).
        """
        device = next(model.parameters()).device
        total, hits, count = 0.0, 0, 0
        with evaluating(model):
            for inputs, targets in self.eval_batches(batch_size, n_batches):
                logits = model(inputs.to(device))  # (B, T, V)
                targets = targets.to(device)
                n = int((targets != IGNORE).sum())
                total += float(cross_entropy(logits, targets, ignore_index=IGNORE)) * n
                hits += int((logits.argmax(-1) == targets).sum())  # IGNORE never equals an id
                count += n
        return {"loss": total / max(count, 1), "acc": hits / max(count, 1), "predicted": count}


# ----------------------------------------------------------------------------------------------
# fill-mask


@dataclass
class MaskPrediction:
    """The candidates for one ``[MASK]`` of a text.

    Attributes:
        index: which ``[MASK]`` of the text (0 = the first).
        position: its token position in the text (``[CLS]`` not counted).
        candidates: ``(token text, probability)``, most probable first.
    """

    index: int
    position: int
    candidates: list[tuple[str, float]]


def check_masked_text(text: str) -> None:
    """Raise :class:`UserError` unless ``text`` holds at least one ``[MASK]``."""
    if "[MASK]" not in text:
        raise UserError(
            "the text has no [MASK]: write [MASK] where a token is to be predicted, e.g. "
            '"def f[MASK]nction(x):"'
        )


@torch.no_grad()
def fill_mask(
    model: nn.Module, tokenizer: Any, text: str, *, top_k: int = 5
) -> list[MaskPrediction]:
    """The ``top_k`` most probable tokens at every ``[MASK]`` of ``text``.

    The text is read as ``[CLS] text [SEP]`` (special tokens written in it are read as such);
    every mask is predicted from the same input, as BERT does. Candidates are plain tokens (the
    specials are never proposed); probabilities are the model's softmax over its vocabulary.

    Raises:
        UserError: a tokenizer without ``[MASK]``, a text without ``[MASK]``, characters outside a
            character vocabulary, a text longer than the model's context, ``top_k`` < 1.
    """
    if not isinstance(tokenizer, TokenizerWithSpecials):
        raise UserError(
            "this run's tokenizer has no [MASK] token (fill-mask needs a run of "
            "'attnlab train mlm')"
        )
    if top_k < 1:
        raise UserError(f"--top-k must be at least 1, got {top_k}")
    check_masked_text(text)
    ids = tokenizer.encode(text)
    seq = [tokenizer.cls_id, *ids, tokenizer.sep_id]
    ctx = model.config.max_seq_len
    if len(seq) > ctx:
        raise UserError(
            f"the text is {len(ids)} tokens long; with [CLS] and [SEP] that is {len(seq)}, more "
            f"than the model's context of {ctx} tokens: shorten it"
        )
    device = next(model.parameters()).device
    logits = model(torch.tensor([seq], device=device))[0]  # (T, V)
    probs = logits.float().softmax(-1)[:, : tokenizer.base.vocab_size]  # plain tokens only
    k = min(top_k, probs.shape[-1])
    out = []
    positions = [i for i, t in enumerate(seq) if t == tokenizer.mask_id]
    for n, pos in enumerate(positions):
        p, idx = probs[pos].topk(k)
        cands = [(tokenizer.decode([int(i)]), float(q)) for q, i in zip(p, idx)]
        out.append(MaskPrediction(n, pos - 1, cands))
    return out
