"""Using trained scene runs on image files: captioning them (``attnlab caption``) and answering
a question about one (``attnlab ask``).

    for c in caption_files(model, vocab, ["scene_0.png"], beam=3): print(c.text)
    answer = answer_question(model, vocab, "scene_0.png", "what colour is the circle?")
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from attnlab.data.scenes import Vocab, read_scene_image
from attnlab.errors import UserError
from attnlab.tasks.caption import decode_captions

__all__ = ["Caption", "caption_files", "Answer", "answer_question"]


@dataclass
class Caption:
    """One image's caption: its ``text``, the ``words`` the attention maps belong to (``<end>``
    included when the caption ended), and per word the cross-attention ``alignment`` over the
    image grid with the ``image`` as ``(H, W, 3)`` uint8 (with ``attention`` only)."""

    text: str
    words: list[str]
    alignment: Tensor | None = None
    image: np.ndarray | None = None


def caption_files(
    model: nn.Module,
    vocab: Vocab,
    paths: Sequence[str | Path],
    *,
    beam: int = 1,
    attention: bool = False,
    resize: bool = True,
) -> list[Caption]:
    """Caption every image file as one batch (all read first), greedy or with ``beam`` beams.

    Args:
        attention: keep the first image's per-word cross-attention maps (Transformer only).
        resize: resize other sizes to the model's; off: refuse them.

    Raises:
        UserError: ``attention`` for the LSTM captioner, an unreadable image.
    """
    if attention and model.kind != "caption_transformer":
        raise UserError(
            "--attention needs the Transformer captioner (the LSTM one has no attention over "
            "the image)"
        )
    size = model.config.image_size
    images = torch.cat([read_scene_image(path, size, resize=resize) for path in paths])
    out = []
    for k, h in enumerate(decode_captions(model, images, beam_size=beam, attention=attention)):
        ended = bool(h.ids) and h.ids[-1] == Vocab.END
        text = vocab.decode(h.ids)
        cap = Caption(text, text.split() + (["<end>"] if ended else []))
        if attention and k == 0:
            cap.alignment = h.alignment
            cap.image = (images[0].permute(1, 2, 0).numpy() * 255).round().astype("uint8")
        out.append(cap)
    return out


@dataclass
class Answer:
    """The answer to a question, the ``top`` ``(answer, probability)`` pairs (best first) and
    the question's words outside the model's vocabulary (read as ``<unk>``)."""

    text: str
    top: list[tuple[str, float]]
    unknown: list[str]

    def notice(self) -> str | None:
        """A line about the words read as ``<unk>`` (None: there were none)."""
        if not self.unknown:
            return None
        return (
            f"notice: unknown word(s) {', '.join(map(repr, self.unknown))} not in the model's "
            "vocabulary; read as <unk>, so the answer may not mean much"
        )


@torch.no_grad()
def answer_question(
    model: nn.Module, vocab: Vocab, path: str | Path, question: str, *, top: int = 1,
    resize: bool = True,
) -> Answer:  # fmt: skip
    """Answer ``question`` about the image file at ``path`` with a VQA model.

    Raises:
        UserError: an empty question, one longer than the model reads, an
            unreadable image (or, with ``resize`` off, one of another size).
    """
    x = read_scene_image(path, model.config.image_size, resize=resize)
    ids, unknown = vocab.encode(question)
    if not ids:
        raise UserError("the question is empty")
    if len(ids) > model.config.max_len:
        raise UserError(
            f"the question has {len(ids)} tokens; this model reads at most {model.config.max_len}"
        )
    probs = model(x, torch.tensor([ids]), torch.tensor([len(ids)]))[0].softmax(-1)
    best = probs.topk(max(1, min(top, len(vocab.answers))))
    pairs = [(vocab.answers[int(i)], float(p)) for p, i in zip(best.values, best.indices)]
    return Answer(pairs[0][0], pairs, list(dict.fromkeys(unknown)))
