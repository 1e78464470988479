"""The translation task of the shared trainer: batches of sentence pairs and the teacher-forced loss.

The decoder reads ``<start> y_1 … y_n`` and is trained to predict ``y_1 … y_n <end>`` with token
cross-entropy (label smoothing from the training config); padding is ignored. With the task's
``scheduled_sampling`` set, training batches feed the decoder its own greedy predictions instead of
some gold tokens (:mod:`attnlab.tasks.scheduled_sampling`); validation stays teacher-forced. Every model kind
(``rnn``, ``rnn-attn``, ``transformer``, ``t5``) takes ``model(src (B,S), src_mask (B,S), tgt_in (B,T))
-> logits (B,T,V)``. At each validation, :meth:`TranslationTask.evaluate` also decodes some
validation sentences greedily and scores them (exact match, BLEU, chrF).

Shape legend: B batch, S source length, T target length, V target vocabulary.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.attention.capture import collect_aux_losses
from attnlab.config.translation import ScheduledSamplingConfig
from attnlab.data.translation import (
    PAD_ID,
    Batch,
    TranslationData,
    collate,
    read_tsv,
    write_tsv,
)
from attnlab.errors import UserError
from attnlab.metrics.translation import evaluate_pairs
from attnlab.tasks.losses import cross_entropy
from attnlab.tasks.scheduled_sampling import decoder_inputs, draw_gold_mask

__all__ = ["TranslationTask", "train_defaults", "evaluate_heldout", "HELDOUT_FILE"]

#: the test split of a run, ``source<TAB>target`` (what ``attnlab eval`` scores)
HELDOUT_FILE = "heldout.tsv"


def train_defaults(kind: str) -> dict[str, Any]:
    """Training settings that differ by family (applied where the user gave none).

    Transformer: label smoothing 0.1, the paper's warm-up + inverse-square-root schedule and Adam
    betas (0.9, 0.98). T5: the same schedule and betas without smoothing (Raffel et al. train
    with none). RNNs: no smoothing, cosine schedule.
    """
    if kind == "transformer":
        return {"label_smoothing": 0.1, "schedule": "inverse_sqrt", "betas": (0.9, 0.98)}
    if kind == "t5":
        return {"label_smoothing": 0.0, "schedule": "inverse_sqrt", "betas": (0.9, 0.98)}
    return {"label_smoothing": 0.0, "schedule": "cosine"}


def _unwrap(model: nn.Module) -> nn.Module:
    model = getattr(model, "_orig_mod", model)  # torch.compile wrapper
    return getattr(model, "module", model)  # DistributedDataParallel wrapper


class TranslationTask:
    """The shared trainer's Task for every translation model kind.

    Args:
        data: the pairs and vocabularies (:func:`attnlab.data.translation.build_data`).
        eval_examples: how many validation sentences :meth:`evaluate` greedily decodes
            (0 = loss only; default: the task config's ``eval_examples``).
    """

    def __init__(self, data: TranslationData, *, eval_examples: int | None = None) -> None:
        self.data = data
        self.eval_examples = data.config.eval_examples if eval_examples is None else eval_examples
        self._enc = {k: data.encoded(k) for k in data.splits}

    @property
    def max_tgt_len(self) -> int:
        return self.data.max_tgt_len

    def get_batch(
        self, split: str, step: int, batch_size: int, rank: int = 0, world: int = 1
    ) -> Batch:
        """This rank's share of global batch ``step``: ``batch_size // world`` random examples
        of ``split``, the ``rank``-th slice of the ``batch_size`` drawn for the step.

        Deterministic in (seed, split, step): any number of ranks sees the same global batch.
        """
        src, tgt = self._enc[split]
        if not src:
            raise UserError(f"the {split!r} split is empty")
        n = max(1, batch_size // world)
        split_code = {"train": 0, "val": 1, "test": 2}.get(split, 3)
        g = torch.Generator().manual_seed(
            ((self.data.config.seed * 4 + split_code) * 1_000_003 + step) * 64
        )
        idx = torch.randint(len(src), (max(batch_size, n * world),), generator=g).tolist()
        idx = idx[rank * n : (rank + 1) * n]
        batch = collate([src[i] for i in idx], [tgt[i] for i in idx])
        batch.step = step if split == "train" else None
        return batch

    def gold_probability(self, batch: Batch, cfg: Any) -> float:
        """ε of scheduled sampling for a training ``batch`` (1.0: teacher forcing).

        The schedule counts optimizer steps: batch number // ``cfg.grad_accum``.
        """
        ss = self.data.config.scheduled_sampling
        if not ss.active or batch.step is None:
            return 1.0
        return ss.gold_probability(batch.step // max(1, int(getattr(cfg, "grad_accum", 1))))

    def loss(self, model: nn.Module, batch: Batch, cfg: Any) -> tuple[Tensor, dict[str, float]]:
        """Token cross-entropy with label smoothing ``cfg.label_smoothing``; padding ignored.

        In training mode with scheduled sampling, the decoder reads its own greedy predictions
        where a coin with the schedule's gold probability says so (metric ``gold_prob``). A
        mixture-of-experts Transformer adds ``moe_aux_coef`` times its load-balancing losses.
        """
        tgt_in, kwargs, extra = batch.tgt_in, {}, {}
        gold = self.gold_probability(batch, cfg) if model.training else 1.0
        if gold < 1.0:
            seed = self.data.config.seed * 1_000_003 + batch.step
            mask = draw_gold_mask(tuple(tgt_in.shape), gold, seed=seed).to(tgt_in.device)
            ss = self.data.config.scheduled_sampling
            core = _unwrap(model)
            tgt_in, kwargs = decoder_inputs(
                model, core, batch.src, batch.src_mask, tgt_in, mask, ss
            )
        if self.data.config.scheduled_sampling.active and batch.step is not None:
            extra["gold_prob"] = gold
        with collect_aux_losses() as aux:
            logits = model(batch.src, batch.src_mask, tgt_in, **kwargs)  # (B, T, V)
        target = batch.tgt_out.masked_fill(batch.tgt_out == PAD_ID, -100)  # (B, T)
        loss = cross_entropy(
            logits, target, label_smoothing=float(getattr(cfg, "label_smoothing", 0.0))
        )
        if aux.losses:
            coef = getattr(_unwrap(model).config, "moe_aux_coef", 0.0)
            loss = loss + coef * aux.total().to(loss.device)
        with torch.no_grad():
            real = target != -100
            acc = ((logits.argmax(-1) == target) & real).sum() / real.sum().clamp(min=1)
        return loss, {"acc": float(acc), **extra}

    def eval_batches(self, batch_size: int, n_batches: int) -> Iterable[Batch]:
        """The validation split in order (at most ``n_batches`` batches)."""
        src, tgt = self._enc["val"]
        for b in range(min(n_batches, (len(src) + batch_size - 1) // batch_size)):
            sl = slice(b * batch_size, (b + 1) * batch_size)
            yield collate(src[sl], tgt[sl])

    def count(self, batch: Batch) -> int:
        return int((batch.tgt_out != PAD_ID).sum())

    def config_dict(self) -> dict:
        """config.json's ``task``: the task config, its ``name`` and the data's ``stats``.

        ``scheduled_sampling`` is left out when it is the default (teacher forcing), so a
        teacher-forced run writes the same ``task`` as runs made before the setting existed.
        """
        task = self.data.config.to_dict()
        if self.data.config.scheduled_sampling == ScheduledSamplingConfig():
            del task["scheduled_sampling"]
        return {"name": "translate", **task, "stats": self.data.stats}

    def save_artifacts(self, run_dir: str | Path) -> None:
        """Write ``vocab.json`` (vocabularies, normalisation) and ``heldout.tsv`` (test split)."""
        self.data.vocabs().save(run_dir)
        write_tsv(self.data.splits["test"], Path(run_dir) / HELDOUT_FILE)

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        """Greedy exact match, chrF and BLEU on the first ``eval_examples`` validation sentences."""
        if self.eval_examples <= 0 or not self.data.splits["val"]:
            return {}
        res = evaluate_pairs(
            _unwrap(model),
            self.data.vocabs(),
            self.data.splits["val"][: self.eval_examples],
            beam=1,
            batch_size=128,
        )
        out = {"val_exact": res["exact_match"], "val_chrf": res["chrf"]}
        if res["bleu"] is not None:
            out["val_bleu"] = res["bleu"]
        return out


def evaluate_heldout(
    model: nn.Module,
    vocabs: Any,
    run_dir: str | Path,
    *,
    batch_size: int = 32,
    max_batches: int | None = None,
) -> dict[str, Any]:
    """``attnlab eval``: greedy exact match, BLEU and chrF on a run's held-out split
    (:data:`HELDOUT_FILE`, the first ``max_batches * batch_size`` pairs when given).

    Returns:
        :func:`attnlab.metrics.translation.evaluate_pairs`'s result (``n``, ``exact_match``,
        ``bleu`` (None for targets shorter than 4 tokens), ``chrf``).
    """
    pairs = read_tsv(Path(run_dir) / HELDOUT_FILE)
    if max_batches is not None:
        pairs = pairs[: max_batches * batch_size]
    return evaluate_pairs(model, vocabs, pairs, batch_size=batch_size)
