"""Language modelling as a training task: next-token prediction on windows of one corpus.

    loss = mean_t −log p(x_{t+1} | x_≤t)  (+ moe_aux_coef · Σ_layers MoE load-balancing loss)

The corpus is prepared once into memory-mapped shards of token ids (:mod:`attnlab.data.prepare`;
under ``torchrun`` rank 0 prepares while the others wait). The held-out split is the last
``val_fraction`` of every block of ``val_block`` tokens (:class:`attnlab.data.shards.BlockSplit`;
a corpus of one block holds out its tail). Training windows start at random positions drawn with a
generator seeded by ``(seed, split, step)``, so batch ``step`` is the same in every run, resumed or
not, and data-parallel ranks each take their share of the same global batch, reading only the ids
of their own windows. Validation uses consecutive non-overlapping windows of the held-out split.

Shape legend: B batch, T window length (``seq_len``), V vocab_size.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn

from attnlab.attention.capture import collect_aux_losses
from attnlab.config.base import Config
from attnlab.config.lm import LMTaskConfig
from attnlab.data.prepare import Prepared, prepare_cached
from attnlab.data.shards import MANIFEST, BlockSplit
from attnlab.data.textstream import BUILTIN_CORPORA
from attnlab.errors import UserError
from attnlab.fast import FusedLMLoss
from attnlab.layers import evaluating
from attnlab.tasks.losses import cross_entropy

__all__ = ["LMTask", "CorpusTask"]

_SPLITS = {"train": 0, "val": 1}


def _prepare_once(data: str, **kwargs: Any) -> Prepared:
    """:func:`prepare_cached`, by rank 0 first when a process group is up (the others then open
    what it prepared); without one, the cache's file lock keeps concurrent ranks from preparing
    twice."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        prepared = prepare_cached(data, **kwargs) if dist.get_rank() == 0 else None
        dist.barrier()
        return prepared or prepare_cached(data, **{**kwargs, "progress": False})
    return prepare_cached(data, **kwargs)


class CorpusTask:
    """What the tasks on one text corpus share (:class:`LMTask`, and the masked-LM task): the
    settings commands read, rebuilding from a run directory, and the MoE auxiliary loss.

    A subclass sets ``TYPE`` (config.json's ``task["type"]``), ``CONFIG`` (its settings class),
    ``DESCRIPTION`` (for the error naming a wrong task) and ``build(config, *, tokenizer)``.
    """

    TYPE: ClassVar[str]
    CONFIG: ClassVar[type[Config]]
    DESCRIPTION: ClassVar[str]
    config: Any
    tokenizer: Any

    @classmethod
    def from_config(cls, task: dict[str, Any], tokenizer: Any, **overrides: Any) -> CorpusTask:
        """Rebuild the task of a run directory (``config.json["task"]``) with its tokenizer.

        Raises:
            UserError: ``task`` is not this kind of task, or does not load.
        """
        if not isinstance(task, dict) or task.get("type") != cls.TYPE:
            raise UserError(f"the run's task is not {cls.DESCRIPTION}: {task!r}")
        return cls.build(cls.CONFIG.from_dict({**task, **overrides}), tokenizer=tokenizer)

    # -- properties read by commands ------------------------------------------------------------

    @property
    def seq_len(self) -> int:
        return self.config.seq_len

    @property
    def seed(self) -> int:
        return self.config.seed

    @property
    def data(self) -> str:
        return self.config.data

    @property
    def vocab_size(self) -> int:
        """V of the model."""
        return self.tokenizer.vocab_size

    # -- the trainer protocol -------------------------------------------------------------------

    @staticmethod
    def with_moe_aux(
        model: nn.Module, ce: Tensor, aux: Any, metrics: dict[str, float]
    ) -> tuple[Tensor, dict[str, float]]:
        """``ce`` plus ``moe_aux_coef`` × the MoE load-balancing losses ``aux`` collected
        (:func:`attnlab.attention.collect_aux_losses`); ``metrics`` gains ``ce`` and ``aux``
        when there are any."""
        inner = getattr(model, "module", model)  # DDP wraps the model
        coef = getattr(getattr(inner, "config", None), "moe_aux_coef", 0.0)
        if not aux.losses or not coef:
            return ce, metrics
        aux_loss = aux.total().to(ce.device)
        metrics = {**metrics, "ce": float(ce.detach()), "aux": float(aux_loss.detach())}
        return ce + coef * aux_loss, metrics

    def count(self, batch: Any) -> int:
        return int(batch[0].numel())

    def config_dict(self) -> dict[str, Any]:
        """config.json's ``"task"``: the settings and the token count of each split."""
        return {**self.config.to_dict(), "n_tokens": self.n_tokens}


class LMTask(CorpusTask):
    """Next-token prediction on one corpus: the trainer's :class:`~attnlab.tasks.Task`.

    A batch is ``(idx, targets)``, both ``(B, T)`` long tensors, ``targets`` shifted by one.
    Build one with :meth:`build` (prepares the corpus, or opens a prepared directory) or
    :meth:`from_config` (the task of a run directory).

    Args:
        ids: the whole corpus as token ids (an array, a memmap or shards).
        tokenizer: the tokenizer that produced ``ids``.
        config: the task settings; ``seed`` None means 0.

    Raises:
        UserError: a corpus too short for two windows of ``seq_len + 1`` tokens.
    """

    TYPE = "lm"
    CONFIG = LMTaskConfig
    DESCRIPTION = "a language-modelling task"

    def __init__(self, ids: np.ndarray, tokenizer: Any, config: LMTaskConfig) -> None:
        if config.seed is None:
            config = config.replace(seed=0)
        T = config.seq_len
        split = (config.val_fraction, config.val_block, T + 1)
        self.splits = {part: BlockSplit(ids, part, *split) for part in _SPLITS}
        if min(len(s) for s in self.splits.values()) < T + 1:
            raise UserError(
                f"corpus {config.data!r} has {len(ids)} tokens: too few for a training and a "
                f"validation window of seq_len={T} (+1); use a shorter --seq-len or a larger "
                "corpus"
            )
        self.ids, self.tokenizer, self.config = ids, tokenizer, config
        self.prepared: Prepared | None = None
        #: the loss from the final hidden states and the output head, for models whose forward
        #: takes one (:class:`attnlab.DecoderLM`): fused, never keeping the ``(B, T, V)`` logits
        self.head_loss = FusedLMLoss()

    @classmethod
    def build(
        cls, config: LMTaskConfig | None = None, *, tokenizer: Any = None, progress: bool = False
    ) -> LMTask:
        """Prepare the corpus (streaming, into the on-disk cache, once) or open a directory
        written by ``attnlab prepare``, and memory-map its token ids.

        Args:
            config: the task settings (default: ``LMTaskConfig()``, character-level pydoc).
            tokenizer: a ready tokenizer (a run's) instead of one trained on the corpus.
            progress: progress bars while preparing (rank 0 only).

        Returns:
            The task; its ``config`` records the corpus as found (a path made absolute, so the
            run resumes from anywhere) and the tokenizer's actual vocabulary size.

        Raises:
            UserError: an unknown or empty corpus, a bad tokenizer setting, too few tokens.
        """
        config = LMTaskConfig() if config is None else config
        data = config.data
        if Path(data).expanduser().is_dir() and (Path(data).expanduser() / MANIFEST).exists():
            data = str(Path(data).expanduser().resolve())
            if config.max_chars is not None:
                raise UserError(
                    f"{config.data!r} is a prepared corpus: --max-chars applies when a corpus "
                    "is prepared ('attnlab prepare --max-chars N')"
                )
        elif data not in BUILTIN_CORPORA and Path(data).expanduser().exists():
            data = str(Path(data).expanduser().resolve())
        prepared = _prepare_once(
            data,
            kind=config.tokenizer,
            vocab_size=config.vocab_size,
            tokenizer=tokenizer,
            max_chars=config.max_chars,
            progress=progress and int(os.environ.get("RANK", "0")) == 0,
        )
        tok = prepared.tokenizer
        config = config.replace(data=data, tokenizer=tok.type, vocab_size=tok.vocab_size)
        task = cls(prepared.ids, tokenizer if tokenizer is not None else tok, config)
        task.prepared = prepared
        return task

    @property
    def n_tokens(self) -> dict[str, int]:
        """Tokens in each split."""
        return {k: len(v) for k, v in self.splits.items()}

    # -- the trainer protocol -------------------------------------------------------------------

    def _windows(self, split: str, starts: np.ndarray) -> tuple[Tensor, Tensor]:
        ids = self.splits[split]
        index = starts[:, None] + np.arange(self.seq_len + 1)[None, :]  # (B, T+1)
        chunk = torch.from_numpy(np.asarray(ids[index], dtype=np.int64))  # (B, T+1)
        return chunk[:, :-1], chunk[:, 1:]

    def get_batch(
        self, split: str, step: int, batch_size: int, rank: int = 0, world: int = 1
    ) -> tuple[Tensor, Tensor]:
        """This rank's share of global batch ``step``: ``(idx, targets)``, each ``(B/world, T)``."""
        if split not in _SPLITS:
            raise ValueError(f"split must be 'train' or 'val', got {split!r}")
        n = len(self.splits[split])
        rng = np.random.default_rng([self.seed, _SPLITS[split], step])
        starts = rng.integers(0, n - self.seq_len, size=batch_size)  # a window needs T+1 ids
        per = batch_size // world
        return self._windows(split, starts[rank * per : (rank + 1) * per])

    def loss(
        self, model: nn.Module, batch: Any, cfg: Any = None
    ) -> tuple[Tensor, dict[str, float]]:
        """Mean next-token cross-entropy, plus ``moe_aux_coef`` × the MoE load-balancing losses
        the forward reported (:func:`attnlab.attention.collect_aux_losses`).

        Returns:
            ``(loss, metrics)``; with MoE layers, ``metrics`` holds ``ce`` and ``aux``.
        """
        idx, targets = batch
        smoothing = getattr(cfg, "label_smoothing", 0.0) or 0.0
        with collect_aux_losses() as aux:
            if takes_targets(model):  # the output projection and the loss fused
                ce = model(
                    idx, targets=targets, label_smoothing=smoothing, head_loss=self.head_loss
                )
            else:
                ce = cross_entropy(model(idx), targets, label_smoothing=smoothing)  # (B, T, V)
        return self.with_moe_aux(model, ce, aux, {})

    def eval_batches(
        self, batch_size: int, n_batches: int | None
    ) -> Iterator[tuple[Tensor, Tensor]]:
        """The fixed validation set: consecutive non-overlapping windows from the start."""
        n = len(self.splits["val"])
        starts = np.arange(0, n - self.seq_len, self.seq_len)
        if n_batches is not None:
            starts = starts[: batch_size * n_batches]
        for i in range(0, len(starts), batch_size):
            yield self._windows("val", starts[i : i + batch_size])

    def save_artifacts(self, run_dir: str | Path) -> None:
        self.tokenizer.save(run_dir)

    @torch.no_grad()
    def val_loss(
        self, model: nn.Module, *, batch_size: int = 32, n_batches: int | None = None
    ) -> dict[str, float]:
        """Token-weighted mean cross-entropy on the validation split, and its perplexity.

        Returns:
            ``{"loss", "perplexity", "tokens"}``.
        """
        device = next(model.parameters()).device
        total, count = 0.0, 0
        with evaluating(model):
            fused = takes_targets(model)
            for idx, targets in self.eval_batches(batch_size, n_batches):
                idx, targets = idx.to(device), targets.to(device)
                if fused:
                    loss = model(idx, targets=targets, head_loss=self.head_loss)
                else:
                    loss = cross_entropy(model(idx), targets)  # (B, T, V) logits
                total += float(loss) * targets.numel()
                count += targets.numel()
        loss = total / max(count, 1)
        return {"loss": loss, "perplexity": float(np.exp(min(loss, 50.0))), "tokens": count}


def takes_targets(model: nn.Module) -> bool:
    """True when ``model(idx, targets=..., head_loss=...)`` returns the loss (a
    :class:`attnlab.DecoderLM`, possibly inside DDP, FSDP or ``torch.compile``), so that the
    task's :class:`~attnlab.fast.FusedLMLoss` fuses the output projection with the
    cross-entropy."""
    base = model
    while True:
        inner = getattr(base, "_orig_mod", None) or getattr(base, "module", None)
        if not isinstance(inner, nn.Module):
            break
        base = inner
    return _forward_takes_targets(type(base))


@functools.cache
def _forward_takes_targets(cls: type) -> bool:  # once per model class, not per step
    return {"targets", "head_loss"} <= set(inspect.signature(cls.forward).parameters)
