"""Visual question answering in the explorer: which parts of the image each question word
attended to, and the answer.

One forward pass ``model(images, questions, lengths)`` under
:func:`attnlab.attention.capture_attention` gives each block's question-to-image cross-attention
``(H, L, N)`` (N image tokens on a grid over the image) and the question's self-attention.

Shape legend: L question tokens, N = Gh·Gw image tokens, A answers.
"""

from __future__ import annotations

import torch

from attnlab.attention.capture import capture_attention
from attnlab.errors import UserError
from attnlab.explore.caption import default_scene, image_view, read_scene_input
from attnlab.explore.images import image_payload
from attnlab.explore.payload import group_layers, head_dim_of, make_view, top_guesses
from attnlab.runs import LoadedRun

__all__ = ["KINDS", "INPUT", "QUESTION", "explain", "default_input"]

KINDS = ("vqa_transformer",)
INPUT = "image"
QUESTION = True


def _classify(stack: str, attn: str, name: str) -> str | None:
    if "cross" in attn:
        return "cross"
    if "enc" in stack.lower():  # the image encoder's own attention
        return None
    return "question"


def explain(run: LoadedRun, inp) -> dict:
    """The payload of one image and question."""
    model, vocab = run.model, run.tokenizer
    image = read_scene_input(run, inp)
    ids, unknown = vocab.encode(inp.question)
    if not ids:
        raise UserError("the question is empty")
    limit = int(model.config.max_len)
    if len(ids) > limit:
        raise UserError(f"the question is {len(ids)} tokens; this model reads at most {limit}")
    with torch.no_grad(), capture_attention(model, scores=True) as maps:
        logits = model(image[None], torch.tensor([ids]), torch.tensor([len(ids)]))  # (1, A)
    groups = group_layers(maps, _classify)
    words = [vocab.itos[i] for i in ids]
    views = [
        image_view(
            run,
            groups,
            words,
            title="question → image (cross-attention)",
            note="Choose a question word: the image shows where it looked.",
        )
    ]
    if "question" in groups:
        views.append(
            make_view(
                "question",
                "question self-attention",
                groups["question"],
                queries=words,
                keys=words,
                rollout=True,
                head_dim=head_dim_of(model, groups["question"][0].name),
            )
        )
    summary = [f"answer: {top_guesses(logits[0], 3, lambda i: vocab.answers[i])}"]
    if unknown:
        summary.append(
            f"not in the vocabulary (read as <unk>): {', '.join(dict.fromkeys(unknown))}"
        )
    return {
        "family": "vqa",
        "input": inp.image_name,
        "summary": summary,
        "image": image_payload(image),
        "views": views,
    }


def default_input(run: LoadedRun) -> dict | None:
    """What the served page shows first: a generated scene and its first question."""
    data, questions = default_scene(run)
    question = questions[0].question if questions else "what colour is the circle ?"
    return {"image": data, "image_name": "scene_0.png", "question": question}
