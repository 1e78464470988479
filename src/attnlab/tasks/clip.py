"""Contrastive image–text training on generated scenes (a CLIP-style dual encoder), and what the
joint space is good for: zero-shot classification by prompts, image↔text retrieval.

A training batch is B scenes and one reference caption of each (drawn at random); the loss is the
symmetric contrastive loss of :func:`attnlab.tasks.losses.contrastive_loss` over the B × B logits.

- Zero-shot classification: single-object scenes, the classes given only as texts
  ("a red circle", ...): each image takes the prompt with the highest similarity. On the ``unseen``
  split every object is a colour–shape combination never seen in training.
- Retrieval: held-out scenes and their full listing captions ("a red circle and two blue
  squares"); recall@k image→text (is a matching caption among the image's k nearest texts?) and
  text→image, against the exact chance of a random ranking (captions repeat across scenes).

Shape legend: B batch, L token length, N scenes, K prompts, P projection width.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from torch import Tensor, nn

from attnlab.data.scenes import (
    COLOURS,
    SHAPES,
    SceneConfig,
    SceneSet,
    Vocab,
    images_to_tensor,
    mentioned_objects,
)
from attnlab.errors import UserError
from attnlab.layers import evaluating
from attnlab.tasks.losses import contrastive_loss
from attnlab.tasks.scenes import SceneTask, SceneTaskConfig, forward_with_aux, pad_ids, with_aux

__all__ = [
    "ClipTaskConfig",
    "ClipTask",
    "class_prompts",
    "encode_texts",
    "check_prompts",
    "zero_shot_predict",
    "zero_shot_accuracy",
    "retrieval_recall",
    "recall_chance",
    "single_object_scenes",
]

PROMPT_TEMPLATE = "a {colour} {shape}"


@dataclass
class ClipTaskConfig(SceneTaskConfig):
    """Settings of :class:`ClipTask` (config.json's ``task``).

    Attributes:
        scene: how scenes are drawn; by default 1 to 3 objects, so that single-object scenes
            (the zero-shot test) are part of the training distribution.
        caption: which reference caption of a scene a training pair uses: ``random`` (any of
            them, drawn per batch) or ``listing`` (the left-to-right listing of every object).
        eval_scenes: scenes of each validation measurement (zero-shot, retrieval).
    """

    scene: SceneConfig = field(default_factory=lambda: SceneConfig(min_objects=1, max_objects=3))
    caption: Literal["random", "listing"] = "random"
    eval_scenes: int = 200

    def validate(self) -> None:
        super().validate()
        self.positive("eval_scenes")


def encode_texts(vocab: Vocab, texts: Sequence[str]) -> Tensor:
    """``<start> words <end>`` of each text, right-padded: ``(N, L)``.

    Raises:
        UserError: no texts, or words the vocabulary does not have (named).
    """
    if not texts:
        raise UserError("no texts to encode")
    seqs = []
    for t in texts:
        ids, unknown = vocab.encode(t)
        if unknown:
            raise UserError(f"{t!r} has words outside the model's vocabulary: {', '.join(unknown)}")
        seqs.append([Vocab.START, *ids, Vocab.END])
    return pad_ids(seqs)


def check_prompts(vocab: Vocab, prompts: Sequence[str]) -> Tensor:
    """The token ids of zero-shot prompts, each of which must name a class.

    A prompt names a class when it holds a colour or a shape word ("a red circle", "a square").

    Raises:
        UserError: an empty list, a prompt that names no class, or unknown words (named).
    """
    if not prompts:
        raise UserError(
            "zero-shot classification needs prompts, one per class (e.g. 'a red circle')"
        )
    names = set(COLOURS) | set(SHAPES)
    empty = [p for p in prompts if not names & set(p.lower().split())]
    if empty:
        raise UserError(
            f"zero-shot prompt(s) {', '.join(repr(p) for p in empty)} name no class: a prompt "
            f"needs a colour ({', '.join(COLOURS)}) or a shape ({', '.join(SHAPES)}), e.g. "
            "'a red circle'"
        )
    return encode_texts(vocab, prompts)


def class_prompts(scene: SceneConfig, template: str = PROMPT_TEMPLATE) -> list[str]:
    """One prompt per colour–shape combination of ``scene`` (held-out ones included)."""
    return [template.format(colour=c, shape=s) for c, s in scene.combos()]


def single_object_scenes(scene: SceneConfig, split: str, n: int, seed: int) -> SceneSet:
    """``n`` scenes of one object each from ``split`` (``unseen``: a held-out combination)."""
    return SceneSet(scene.replace(min_objects=1, max_objects=1), split, n, seed)


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


@torch.no_grad()
def _embed_images(model: nn.Module, images: np.ndarray, batch_size: int = 256) -> Tensor:
    device = _device(model)
    out = [
        model.encode_image(images_to_tensor(images[b : b + batch_size]).to(device))
        for b in range(0, len(images), batch_size)
    ]
    return torch.cat(out)  # (N, P)


@torch.no_grad()
def zero_shot_predict(model: nn.Module, images: Tensor, prompt_ids: Tensor) -> Tensor:
    """The index of the most similar prompt for each image: ``(B, 3, H, W), (K, L) -> (B,)``."""
    with evaluating(model):
        return model(images, prompt_ids).argmax(dim=-1)


@torch.no_grad()
def zero_shot_accuracy(
    model: nn.Module, sset: SceneSet, prompts: Sequence[str], vocab: Vocab
) -> dict[str, float]:
    """Zero-shot accuracy on single-object scenes, the classes given as ``prompts``.

    A scene's label is the prompt naming its object's colour and shape; scenes whose object no
    prompt names are left out.

    Returns:
        ``accuracy``, ``chance`` (1 / number of prompts) and ``n`` (scenes scored).

    Raises:
        UserError: bad prompts (:func:`check_prompts`), or no scene any prompt names.
    """
    ids = check_prompts(vocab, prompts).to(_device(model))
    index: dict[tuple[str, str], int] = {}
    for k, p in enumerate(prompts):
        for combo in mentioned_objects(p):
            index.setdefault(combo, k)
    keep, labels = [], []
    for i, scene in enumerate(sset.scenes):
        obj = scene.objects[0]
        if len(scene.objects) == 1 and (obj.colour, obj.shape) in index:
            keep.append(i)
            labels.append(index[(obj.colour, obj.shape)])
    if not keep:
        raise UserError(
            "none of the scenes holds an object the prompts name (a colour and a shape, "
            "e.g. 'a red circle')"
        )
    with evaluating(model):
        img = _embed_images(model, sset.images[keep])
        logits = model.similarity(img, model.encode_text(ids))  # (N, K)
    hits = (logits.argmax(-1).cpu() == torch.tensor(labels)).float()
    return {"accuracy": float(hits.mean()), "chance": 1.0 / len(prompts), "n": len(keep)}


def recall_chance(matches: Sequence[int], n: int, k: int) -> float:
    """Mean probability that a random ranking of ``n`` candidates puts one of ``m`` matches in
    the top ``k``: ``1 − C(n − m, k) / C(n, k)``, averaged over the queries' ``matches``."""
    k = min(k, n)
    return float(np.mean([1.0 - math.comb(n - m, k) / math.comb(n, k) for m in matches]))


@torch.no_grad()
def retrieval_recall(
    model: nn.Module,
    sset: SceneSet,
    vocab: Vocab,
    ks: Sequence[int] = (1, 5),
    n: int | None = None,
) -> dict[str, float]:
    """Recall@k both ways on the first ``n`` scenes of ``sset`` (default all) and their listing
    captions.

    Image→text: the N captions ranked for each image; a hit when a caption equal to the image's
    own is among the top k (scenes with the same objects share a caption). Text→image likewise.

    Returns:
        ``i2t@k``, ``t2i@k`` and ``chance@k`` (the same both ways: a random ranking) per k.
    """
    n = len(sset) if n is None else min(n, len(sset))
    texts = [caps[0] for caps in sset.captions[:n]]  # the listing caption
    same = torch.tensor([[a == b for b in texts] for a in texts])  # (N, N) matching pairs
    with evaluating(model):
        img = _embed_images(model, sset.images[:n])
        ids = encode_texts(vocab, texts).to(_device(model))
        txt = torch.cat([model.encode_text(ids[b : b + 256]) for b in range(0, n, 256)])
        s = model.similarity(img, txt).cpu()  # (N images, N texts)
    matches = same.sum(1).tolist()
    out: dict[str, float] = {}
    for k in ks:
        kk = min(k, n)
        top_t = s.topk(kk, dim=1).indices  # (N, k) texts per image
        top_i = s.T.topk(kk, dim=1).indices  # (N, k) images per text
        out[f"i2t@{k}"] = float(same.gather(1, top_t).any(1).float().mean())
        out[f"t2i@{k}"] = float(same.gather(1, top_i).any(1).float().mean())
        out[f"chance@{k}"] = recall_chance(matches, n, kk)
    return out


class ClipTask(SceneTask):
    """Scenes and their captions as matching pairs for a dual encoder (see the module docstring).

    The model is called as ``model(images (B, 3, H, W), tokens (B, L)) -> logits (B, B)``.
    """

    config_cls: ClassVar[type[SceneTaskConfig]] = ClipTaskConfig
    config: ClipTaskConfig

    def _batch(self, sset: SceneSet, idx: np.ndarray, rng: np.random.Generator) -> dict:
        return self.caption_batch(sset, idx, rng, listing=self.config.caption == "listing")

    def get_batch(
        self, split: str, step: int, batch_size: int, rank: int = 0, world: int = 1
    ) -> dict:
        sset = self.sets(split)
        rng = self.rng(split, step, rank)
        share = self.share(batch_size, world)
        if share > len(sset):
            raise UserError(
                f"a batch of {share} distinct scenes needs at least that many {split} scenes, "
                f"got {len(sset)}: lower --batch-size or raise the scene count"
            )
        idx = rng.choice(len(sset), size=share, replace=False)  # distinct scenes: no twin pairs
        return self._batch(sset, idx, rng)

    def loss(self, model: nn.Module, batch: dict, cfg: Any) -> tuple[Tensor, dict[str, float]]:
        logits, aux = forward_with_aux(model, batch["images"], batch["tokens"])  # (B, B)
        loss = contrastive_loss(logits)
        with torch.no_grad():
            target = torch.arange(logits.shape[0], device=logits.device)
            acc = (logits.argmax(-1) == target).float().mean()
        return with_aux(loss, aux, {"acc": float(acc)})

    def eval_batches(self, batch_size: int, n_batches: int) -> Iterator[dict]:
        sset = self.sets("val")
        for idx, rng in self.val_indices(min(batch_size, len(sset)), n_batches):
            yield self._batch(sset, idx, rng)

    def zero_shot_set(self, split: str) -> SceneSet:
        """The single-object scenes of ``split`` the zero-shot accuracy is measured on."""
        key = f"zero-shot-{split}"
        if key not in self._sets:
            c = self.config
            self._sets[key] = single_object_scenes(c.scene, split, c.eval_scenes, c.seed)
        return self._sets[key]

    def prompts(self) -> list[str]:
        """One prompt per colour–shape combination of the scenes."""
        return class_prompts(self.config.scene)

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        """Zero-shot accuracy on validation scenes and retrieval recall@1 (both ways)."""
        zs = zero_shot_accuracy(model, self.zero_shot_set("val"), self.prompts(), self.vocab)
        n = self.config.eval_scenes
        r = retrieval_recall(model, self.sets("val"), self.vocab, ks=(1,), n=n)
        return {"zero_shot": zs["accuracy"], "i2t@1": r["i2t@1"], "t2i@1": r["t2i@1"]}

    def evaluate_splits(self, model: nn.Module) -> dict[str, dict[str, float]]:
        """``attnlab eval``: zero-shot accuracy on the val and unseen splits, recall@1/5 both
        ways on the val scenes, with their chance levels."""
        out: dict[str, dict[str, float]] = {}
        for split in ("val", "unseen"):
            out[f"zero-shot {split}"] = zero_shot_accuracy(
                model, self.zero_shot_set(split), self.prompts(), self.vocab
            )
        out["retrieval val"] = retrieval_recall(
            model, self.sets("val"), self.vocab, n=self.config.eval_scenes
        )
        return out
