"""The VQA task: (image, question) -> answer class, with a fixed, type-balanced evaluation set,
accuracy per question type and the answer-frequency baselines a model must beat.

Shape legend: B batch, L question length, A answers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from attnlab.data.scenes import QA, QUESTION_TYPES, SceneSet, images_to_tensor
from attnlab.layers import evaluating
from attnlab.metrics.captions import accuracy_by_group
from attnlab.tasks.losses import cross_entropy
from attnlab.tasks.scenes import (
    SceneTask,
    SceneTaskConfig,
    batch_rng,
    forward_with_aux,
    pad_ids,
    with_aux,
)

__all__ = ["VQATaskConfig", "VQATask", "BASELINES"]

#: the answer-frequency baselines: ``(name, by)`` of :meth:`VQATask.answer_frequency_baseline`
BASELINES = (("answer", "answer"), ("per type", "type"), ("per question", "question"))

Pairs = list[tuple[int, QA]]  # (scene index, question)


@dataclass
class VQATaskConfig(SceneTaskConfig):
    """Settings of :class:`VQATask`.

    Attributes:
        eval_per_type: questions of each type in the fixed evaluation set.
    """

    eval_per_type: int = 100

    def validate(self) -> None:
        super().validate()
        self.positive("eval_per_type")


class VQATask(SceneTask):
    """(image, question) -> answer class, cross-entropy over the fixed answer list.

    A training example is a scene, a question type drawn uniformly among the types the scene
    supports, then one question of that type. The model is called as
    ``model(images (B, 3, H, W), questions (B, L), lengths (B,)) -> logits (B, A)``.
    """

    config_cls: ClassVar[type[SceneTaskConfig]] = VQATaskConfig
    config: VQATaskConfig

    def batch(self, sset: SceneSet, pairs: Pairs) -> dict[str, Tensor]:
        """The tensors of ``pairs``: images, padded questions, lengths, answers, type indices."""
        qids = [self.vocab.encode(qa.question)[0] for _, qa in pairs]
        return {
            "images": images_to_tensor(sset.images[[i for i, _ in pairs]]),
            "questions": pad_ids(qids),  # (B, L)
            "lengths": torch.tensor([len(q) for q in qids]),
            "answers": torch.tensor([self.vocab.answer_index[qa.answer] for _, qa in pairs]),
            "qtypes": torch.tensor([QUESTION_TYPES.index(qa.qtype) for _, qa in pairs]),
        }

    def _sample(
        self, sset: SceneSet, rng: np.random.Generator, n: int, qtype: str | None = None
    ) -> Pairs:
        out = []
        while len(out) < n:
            i = int(rng.integers(len(sset)))
            qs = sset.questions[i]
            types = sorted({q.qtype for q in qs}) if qtype is None else [qtype]
            t = types[int(rng.integers(len(types)))]
            pool = [q for q in qs if q.qtype == t]
            if pool:
                out.append((i, pool[int(rng.integers(len(pool)))]))
        return out

    def get_batch(
        self, split: str, step: int, batch_size: int, rank: int = 0, world: int = 1
    ) -> dict[str, Tensor]:
        sset = self.sets(split)
        rng = self.rng(split, step, rank)
        return self.batch(sset, self._sample(sset, rng, self.share(batch_size, world)))

    def loss(self, model: nn.Module, batch: dict, cfg: Any) -> tuple[Tensor, dict[str, float]]:
        logits, aux = forward_with_aux(
            model, batch["images"], batch["questions"], batch["lengths"]
        )  # (B, A)
        loss = cross_entropy(
            logits, batch["answers"], label_smoothing=getattr(cfg, "label_smoothing", 0.0)
        )
        acc = float((logits.argmax(-1) == batch["answers"]).float().mean())
        return with_aux(loss, aux, {"acc": acc})

    def eval_pairs(self, split: str = "val", per_type: int | None = None) -> Pairs:
        """A fixed, type-balanced evaluation set: ``per_type`` questions of each type the split
        has (a few scenes may not support every type)."""
        sset = self.sets(split)
        present = {q.qtype for qs in sset.questions for q in qs}
        rng = batch_rng(self.config.seed + 7919, split, 0)  # apart from the training batches
        pairs = []
        for t in QUESTION_TYPES:
            if t in present:
                pairs += self._sample(sset, rng, per_type or self.config.eval_per_type, qtype=t)
        return pairs

    def eval_batches(self, batch_size: int, n_batches: int) -> Iterator[dict[str, Tensor]]:
        sset = self.sets("val")
        pairs = self.eval_pairs()
        for b in range(n_batches):
            chunk = pairs[b * batch_size : (b + 1) * batch_size]
            if not chunk:
                break
            yield self.batch(sset, chunk)

    def answer_frequency_baseline(
        self,
        split: str = "val",
        *,
        by: str = "answer",
        per_type: int | None = None,
        n_samples: int = 4000,
    ) -> float:
        """Accuracy of answering from training answer frequencies alone, on the fixed,
        type-balanced evaluation set the models are scored on.

        Args:
            split: the evaluation split.
            by: ``"answer"``: always the single most frequent training answer; ``"type"``: the
                most frequent answer of the question's type; ``"question"``: the most frequent
                answer to the very same question text (falling back to the overall one) — about
                the best any image-blind answerer can do, so a model that beats it reads the image.
            per_type: size of the evaluation set, as in :meth:`eval_pairs` (pass the models').
            n_samples: training questions counted.

        Raises:
            ValueError: ``by`` is not one of the three.
        """
        keys = {
            "answer": lambda qa: None,
            "type": lambda qa: qa.qtype,
            "question": lambda qa: qa.question,
        }
        if by not in keys:
            raise ValueError(f"unknown baseline by={by!r}; choose from {list(keys)}")
        key = keys[by]
        sample = self._sample(
            self.sets("train"), batch_rng(self.config.seed + 1, "train", 0), n_samples
        )
        overall = Counter(qa.answer for _, qa in sample).most_common(1)[0][0]
        counts: dict[Any, Counter] = {}
        for _, qa in sample:
            counts.setdefault(key(qa), Counter())[qa.answer] += 1
        pairs = self.eval_pairs(split, per_type)
        hits = 0
        for _, qa in pairs:
            seen = counts.get(key(qa))
            hits += qa.answer == (seen.most_common(1)[0][0] if seen else overall)
        return hits / len(pairs)

    @torch.no_grad()
    def accuracy_by_type(
        self,
        model: nn.Module,
        split: str = "val",
        per_type: int | None = None,
        batch_size: int = 256,
    ) -> dict[str, float]:
        """Accuracy per question type (and ``"all"``) on the fixed evaluation set of ``split``."""
        sset = self.sets(split)
        pairs = self.eval_pairs(split, per_type)
        device = next(model.parameters()).device
        hits: list[bool] = []
        with evaluating(model):
            for b in range(0, len(pairs), batch_size):
                batch = self.batch(sset, pairs[b : b + batch_size])
                logits = model(
                    batch["images"].to(device),
                    batch["questions"].to(device),
                    batch["lengths"].to(device),
                )
                hits += (logits.argmax(-1).cpu() == batch["answers"]).tolist()
        return accuracy_by_group([qa.qtype for _, qa in pairs], hits, QUESTION_TYPES)

    def evaluate_splits(self, model: nn.Module, per_type: int = 100) -> dict[str, Any]:
        """``attnlab eval``: accuracy by question type on the validation and unseen-combination
        splits (``per_type`` questions of each type), and the validation answer-frequency
        baselines.

        Returns:
            ``{"val": by_type, "unseen": by_type, "baselines": {name: accuracy}}``.
        """
        out: dict[str, Any] = {
            split: self.accuracy_by_type(model, split, per_type=per_type)
            for split in ("val", "unseen")
        }
        out["baselines"] = {
            name: self.answer_frequency_baseline(by=by, per_type=per_type) for name, by in BASELINES
        }
        return out

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        """Accuracy on (up to 50 per type of) the fixed validation questions."""
        acc = self.accuracy_by_type(model, per_type=min(self.config.eval_per_type, 50))
        return {"val_acc": acc["all"]}
