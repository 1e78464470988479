"""Captioning in the explorer: for every generated word, where in the image it looked.

The caption is generated greedily through :mod:`attnlab.decoding`
(``model.start_decoding(images, max_len)``), then read once more with teacher forcing,
``model(images, tokens)``, under :func:`attnlab.attention.capture_attention`: each decoder block's
cross-attention ``(H, L, N)`` from the words to the N image tokens (a grid over the image), and
the words' own causal self-attention. Row t is the position that produced word t.

The prefix (LLaVA-style) captioner has no cross-attention: its blocks' self-attention runs over
``[N image tokens; L words]``, and the same two views are its word rows read against the image
columns (text → image tokens) and against the word columns.

Shape legend: L caption tokens, N = Gh·Gw image tokens.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from attnlab.attention.capture import capture_attention
from attnlab.data.scenes import SceneConfig, SceneSet
from attnlab.decoding import greedy_search
from attnlab.errors import UserError
from attnlab.explore.images import image_payload, png_bytes
from attnlab.explore.payload import LayerAttention, group_layers, head_dim_of, make_view
from attnlab.explore.vision import grid_spec, patch_labels, read_input_image
from attnlab.runs import LoadedRun

__all__ = [
    "KINDS",
    "INPUT",
    "QUESTION",
    "explain",
    "default_input",
    "default_scene",
    "image_grid",
    "image_view",
    "read_scene_input",
]

KINDS = ("caption_transformer", "caption_prefix")
INPUT = "image"
QUESTION = False


def image_grid(model: nn.Module, n: int) -> tuple[int, int]:
    """The ``(Gh, Gw)`` grid of the model's N image tokens (the encoder's, or the nearest square).

    Raises:
        UserError: N tokens that do not form the grid.
    """
    grid = getattr(getattr(model, "encoder", None), "grid", None)
    if grid is not None and int(grid[0]) * int(grid[1]) == n:
        return int(grid[0]), int(grid[1])
    g = math.isqrt(n)
    if g * g != n:
        raise UserError(f"{n} image tokens do not form a square grid over the image")
    return g, g


def image_view(
    run: LoadedRun,
    groups: dict[str, list[LayerAttention]],
    queries: list[str],
    *,
    title: str,
    note: str,
) -> dict:
    """The view of the text's cross-attention over the image grid (captioner and VQA).

    Args:
        groups: the layers grouped by :func:`group_layers`; the view reads ``groups["cross"]``.
        queries: the text tokens.

    Raises:
        UserError: the model recorded no cross-attention.
    """
    if "cross" not in groups:
        raise UserError(f"the {run.kind} model recorded no attention over the image")
    layers = groups["cross"]
    gh, gw = image_grid(run.model, layers[0].weights.shape[-1])
    return make_view(
        "cross",
        title,
        layers,
        queries=queries,
        keys=patch_labels(gh, gw),
        note=note,
        grid=grid_spec(gh, gw),
        head_dim=head_dim_of(run.model, layers[0].name),
    )


def read_scene_input(run: LoadedRun, inp) -> Tensor:
    """The input image at the model's size ``(3, S, S)`` in [0, 1] (scene models take no
    normalisation)."""
    s = int(run.model.config.image_size)
    return read_input_image(inp, 3, s, s)


def _classify(stack: str, attn: str, name: str) -> str | None:
    if "cross" in attn:
        return "cross"
    if "enc" in stack.lower():  # the image encoder's own attention: the ViT explorer's business
        return None
    return "words"


def _split_prefix(groups: dict[str, list[LayerAttention]], n: int) -> dict:
    """The prefix captioner's self-attention ``(H, N + L, N + L)`` as the two views' layers:
    ``cross`` (words → image tokens, ``(H, L, N)``) and ``words`` (``(H, L, L)``)."""

    def cut(la: LayerAttention, cols: slice) -> LayerAttention:
        s = None if la.scores is None else la.scores[:, n:, cols]
        return LayerAttention(la.name, la.weights[:, n:, cols], s)

    layers = groups.get("words", [])
    return {"cross": [cut(la, slice(0, n)) for la in layers],
            "words": [cut(la, slice(n, None)) for la in layers]}  # fmt: skip


def explain(run: LoadedRun, inp) -> dict:
    """The payload of one image: the caption, its per-word image attention and word attention."""
    model, vocab = run.model, run.tokenizer
    image = read_scene_input(run, inp)
    x = image[None]  # (1, 3, S, S)
    max_len = int(model.config.max_len)
    hyp = greedy_search(
        model,
        model.start_decoding(x, max_len),
        torch.tensor([[vocab.START]]),
        max_len=max_len - 1,
        end_id=vocab.END,
        pad_id=vocab.PAD,
        banned=[vocab.PAD, vocab.START],
    )[0]
    out = list(hyp.ids)
    if not out:
        raise UserError("the model produced no caption for this image")
    tokens = [vocab.START, *out[:-1]]  # what each position reads
    with torch.no_grad(), capture_attention(model, scores=True) as maps:
        model(x, torch.tensor([tokens]))
    groups = group_layers(maps, _classify)
    if run.kind == "caption_prefix":
        groups = _split_prefix(groups, int(model.n_image))
    produced = [vocab.itos[i] for i in out]
    read = [vocab.itos[i] for i in tokens]
    views = [
        image_view(
            run,
            groups,
            produced,
            title="word → image tokens (self-attention over the image prefix)"
            if run.kind == "caption_prefix"
            else "word → image (cross-attention)",
            note="Choose a word: the image shows where the decoder looked while producing it.",
        )
    ]
    if "words" in groups:
        views.append(
            make_view(
                "words",
                "word self-attention",
                groups["words"],
                queries=produced,
                keys=read,
                note="Row t: the position that produced word t; columns: the words so far.",
                rollout=False,
                head_dim=head_dim_of(model, groups["words"][0].name),
            )
        )
    return {
        "family": "caption",
        "input": inp.image_name,
        "summary": [f"caption: {vocab.decode(out)}"],
        "image": image_payload(image),
        "views": views,
    }


def default_scene(run: LoadedRun):
    """The first ``val`` scene of seed 0 at the model's size (what ``attnlab scene`` writes as
    ``scene_0.png``): ``(PNG bytes, its questions)``."""
    sset = SceneSet(SceneConfig(image_size=int(run.model.config.image_size)), "val", 1, 0)
    image = torch.from_numpy(sset.images[0]).permute(2, 0, 1).float() / 255.0  # (3, S, S)
    return png_bytes(image), sset.questions[0]


def default_input(run: LoadedRun) -> dict | None:
    """What the served page shows first: a generated scene (see :func:`default_scene`)."""
    data, _ = default_scene(run)
    return {"image": data, "image_name": "scene_0.png"}
