"""The dual encoder in the explorer: zero-shot classification of an image by prompts, with the
attention of both towers.

One forward ``model(image, prompts)`` under :func:`attnlab.attention.capture_attention` gives
the image tower's self-attention over ``[CLS] + patches`` (drawn over the image) and the text
tower's causal self-attention of every prompt; the view shows the best-matching prompt's. The
prompts are one per colour–shape combination of the run's scenes ("a red circle", ...).

Shape legend: K prompts, L prompt tokens, N = Gh·Gw patches, T = 1 + N image tokens.
"""

from __future__ import annotations

import torch

from attnlab.attention.capture import capture_attention
from attnlab.errors import UserError
from attnlab.explore.caption import default_input as scene_input
from attnlab.explore.caption import read_scene_input
from attnlab.explore.images import image_payload
from attnlab.explore.payload import LayerAttention, group_layers, head_dim_of, make_view
from attnlab.explore.vision import grid_spec, patch_labels
from attnlab.runs import LoadedRun
from attnlab.tasks.clip import ClipTaskConfig, check_prompts, class_prompts

__all__ = ["KINDS", "INPUT", "QUESTION", "explain", "default_input"]

KINDS = ("clip",)
INPUT = "image"
QUESTION = False


def _classify(stack: str, attn: str, name: str) -> str | None:
    if stack.startswith("vision"):
        return "image"
    if stack.startswith("text"):
        return "text"
    return None


def explain(run: LoadedRun, inp) -> dict:
    """The payload of one image: the top prompts and both towers' attention."""
    model, vocab = run.model, run.tokenizer
    image = read_scene_input(run, inp)
    prompts = class_prompts(ClipTaskConfig.from_dict(run.task).scene)
    ids = check_prompts(vocab, prompts)  # (K, L)
    with torch.no_grad(), capture_attention(model, scores=True) as maps:
        logits = model(image[None], ids)[0]  # (K,)
    groups = group_layers(maps, _classify)
    if "image" not in groups:
        raise UserError("the image tower recorded no attention")
    best = int(logits.argmax())
    c = model.config.vision
    g = c.image_size // c.patch_size
    labels = ["[CLS]", *patch_labels(g, g)]
    views = [
        make_view(
            "image",
            "image tower: self-attention over [CLS] + patches",
            groups["image"],
            queries=labels,
            keys=labels,
            note="The class token's output is projected into the joint space; the image shows "
            "where the chosen query looks (click a patch to make it the query).",
            rollout=True,
            grid=grid_spec(g, g, key_offset=1, query_offset=1),
            head_dim=head_dim_of(model, groups["image"][0].name),
        )
    ]
    if "text" in groups:  # a bag-of-words text tower has no attention
        length = int((ids[best] != vocab.PAD).sum())
        words = [vocab.itos[int(i)] for i in ids[best, :length]]
        layers = []
        for la in groups["text"]:  # the text tower ran every prompt: keep the best one's rows
            w, sc = maps.calls(la.name)[-1], maps.scores(la.name)  # (K, H, L, L)
            cut = (best, slice(None), slice(0, length), slice(0, length))
            layers.append(
                LayerAttention(la.name, w[cut].float(), None if sc is None else sc[cut].float())
            )
        views.append(
            make_view(
                "text",
                f"text tower: causal self-attention of {prompts[best]!r}",
                layers,
                queries=words,
                keys=words,
                note="Each token sees itself and the tokens before it; the text's feature is "
                "read at <end>, the one token that has seen them all.",
                head_dim=head_dim_of(model, layers[0].name),
                query=length - 1,
            )
        )
    probs = logits.float().softmax(-1)
    top = probs.topk(min(3, len(prompts)))
    guesses = ", ".join(f"{prompts[int(i)]} {float(p):.2f}" for p, i in zip(*top, strict=True))
    return {
        "family": "clip",
        "input": inp.image_name,
        "summary": [f"zero-shot: {guesses}", f"over {len(prompts)} prompts 'a <colour> <shape>'"],
        "image": image_payload(image),
        "views": views,
    }


def default_input(run: LoadedRun) -> dict | None:
    """What the served page shows first: a generated scene."""
    return scene_input(run)
