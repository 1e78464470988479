"""Image classifiers in the explorer: where the class token (or any patch) looks, per layer and
head, drawn over the image, and the attention rollout.

- ViT: one view over ``[CLS] + patches`` (every block's ``(H, T, T)`` self-attention).
- Swin: attention stays inside (shifted) windows, and patch merging halves the grid between
  stages, so each stage is one view over its own grid. A block reports its windows as a batch,
  ``(nW, H, w², w²)``; here they are put back on the grid, ``(H, N, N)``, zero (score −∞)
  between tokens of different windows. Shifted blocks partition the map rolled by −w/2, so the
  tokens of window slot k are read from the rolled index grid.

Shape legend: C channels, H/W pixels, Gh/Gw patch grid, N = Gh·Gw patches, T tokens, w window
side, nW windows.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.attention.capture import capture_attention
from attnlab.data.images import load_digits, make_shapes
from attnlab.errors import UserError
from attnlab.explore.images import decode_image, image_payload, png_bytes
from attnlab.explore.payload import (
    LayerAttention,
    group_layers,
    head_dim_of,
    make_view,
    top_guesses,
)
from attnlab.runs import LoadedRun

__all__ = [
    "KINDS",
    "INPUT",
    "QUESTION",
    "explain",
    "default_input",
    "patch_labels",
    "grid_spec",
    "window_tokens",
]

KINDS = ("vit", "swin")
INPUT = "image"
QUESTION = False


def patch_labels(rows: int, cols: int) -> list[str]:
    """``(row,col)`` names of the patches of a ``rows × cols`` grid, row by row."""
    return [f"({r},{c})" for r in range(rows) for c in range(cols)]


def grid_spec(
    rows: int, cols: int, *, key_offset: int = 0, query_offset: int | None = None
) -> dict:
    """A view's ``grid``: keys ``key_offset ...`` (and queries from ``query_offset``, when they are
    patches too) lie on a ``rows × cols`` grid over the image."""
    return {"rows": rows, "cols": cols, "key_offset": key_offset, "query_offset": query_offset}


def read_input_image(inp, channels: int, height: int, width: int) -> Tensor:
    """The input image at the model's size, ``(C, H, W)`` in [0, 1]."""
    return decode_image(inp.image, size=(height, width), channels=channels, name=inp.image_name)


def window_tokens(resolution: int, window: int, shift: int) -> Tensor:
    """``(nW, w²)``: the grid index of the token in each slot of each window (row-major windows,
    row-major slots), after rolling the map by ``−shift`` as shifted blocks do."""
    r, w = resolution, window
    idx = torch.arange(r * r).view(r, r)
    if shift:
        idx = torch.roll(idx, shifts=(-shift, -shift), dims=(0, 1))
    idx = idx.view(r // w, w, r // w, w).permute(0, 2, 1, 3)  # (r/w, r/w, w, w)
    return idx.reshape(-1, w * w)  # (nW, w²)


def _unwindow(t: Tensor, tokens: Tensor, n: int, fill: float) -> Tensor:
    """``(nW, H, w², w²)`` windows -> ``(H, N, N)`` on the grid, ``fill`` between windows."""
    nW, H = t.shape[:2]
    full = torch.full((H, n, n), fill, dtype=t.dtype)
    rows = tokens[:, :, None].expand(-1, -1, tokens.shape[1])  # (nW, w², w²)
    cols = tokens[:, None, :].expand(-1, tokens.shape[1], -1)  # (nW, w², w²)
    full[:, rows, cols] = t.permute(1, 0, 2, 3)  # (H, nW, w², w²)
    return full


def _window_block(model: nn.Module, name: str) -> nn.Module | None:
    """The closest module above attention layer ``name`` that knows its window layout."""
    parts = name.split(".")
    for k in range(len(parts) - 1, 0, -1):
        m = model.get_submodule(".".join(parts[:k]))
        if all(hasattr(m, a) for a in ("resolution", "window_size", "shift")):
            return m
    return None


def _swin_views(model: nn.Module, maps) -> list[dict]:
    stages: dict[int, list[LayerAttention]] = {}
    for name in maps:
        block = _window_block(model, name)
        if block is None:
            continue
        r, w, s = int(block.resolution), int(block.window_size), int(block.shift)
        tokens = window_tokens(r, w, s)
        weights = maps.calls(name)[-1]  # (B·nW, H, w², w²), B = 1
        if weights.shape[0] != tokens.shape[0] or weights.shape[-1] != w * w:
            raise UserError(
                f"{name}: window attention {tuple(weights.shape)} does not fit a {r}² grid"
            )
        scores = maps.scores(name)
        stages.setdefault(r, []).append(
            LayerAttention(
                name,
                _unwindow(weights.float(), tokens, r * r, 0.0),
                None if scores is None else _unwindow(scores.float(), tokens, r * r, float("-inf")),
            )
        )
    views = []
    for s, (r, layers) in enumerate(sorted(stages.items(), reverse=True)):
        labels = patch_labels(r, r)
        views.append(
            make_view(
                f"stage{s}",
                f"stage {s + 1} windows ({r}×{r} tokens)",
                layers,
                queries=labels,
                keys=labels,
                note="A token attends only inside its window; shifted blocks move the windows "
                "by half a window. Click a patch on the image to choose the query.",
                rollout=True,
                grid=grid_spec(r, r, query_offset=0),
                head_dim=head_dim_of(model, layers[0].name),
                scores_have_bias=True,
                query=(r // 2) * r + r // 2,
            )
        )
    return views


def _vit_view(model: nn.Module, maps, gh: int, gw: int) -> dict:
    groups = group_layers(maps, lambda stack, attn, name: "self" if attn == "attn" else None)
    if "self" not in groups:
        raise UserError("the ViT recorded no attention")
    layers = groups["self"]
    T = layers[0].weights.shape[-1]
    n_prefix = T - gh * gw
    if n_prefix < 0:
        raise UserError(f"the ViT attends over {T} tokens, fewer than its {gh}×{gw} patches")
    prefix = ["[CLS]"] if n_prefix == 1 else [f"[T{k}]" for k in range(n_prefix)]
    labels = prefix + patch_labels(gh, gw)
    return make_view(
        "self",
        "self-attention over [CLS] + patches" if n_prefix else "self-attention over the patches",
        layers,
        queries=labels,
        keys=labels,
        note="The image shows the chosen query's attention over the patches "
        "(the class token by default); click a patch to make it the query.",
        rollout=True,
        grid=grid_spec(gh, gw, key_offset=n_prefix, query_offset=n_prefix),
        head_dim=head_dim_of(model, layers[0].name),
        query=0 if n_prefix else (gh // 2) * gw + gw // 2,
    )


def explain(run: LoadedRun, inp) -> dict:
    """The payload of one image: the attention views and the top classes."""
    model, settings = run.model, run.tokenizer
    c, h, w = (int(v) for v in settings.image_shape)
    image = read_input_image(inp, c, h, w)  # (C, H, W)
    mean = torch.tensor(settings.mean, dtype=torch.float32).view(-1, 1, 1)
    std = torch.tensor(settings.std, dtype=torch.float32).view(-1, 1, 1)
    x = ((image - mean) / std)[None]  # (1, C, H, W)
    with torch.no_grad(), capture_attention(model, scores=True) as maps:
        logits = model(x)  # (1, classes)
    if run.kind == "swin":
        views = _swin_views(model, maps)
    else:
        patch = int(model.config.patch_size)
        views = [_vit_view(model, maps, h // patch, w // patch)]
    if not views:
        raise UserError(f"the {run.kind} model recorded no attention")
    classes = list(settings.classes)
    guesses = top_guesses(logits[0], 3, lambda i: classes[i] if i < len(classes) else str(i))
    return {
        "family": "image",
        "input": inp.image_name,
        "summary": [f"prediction: {guesses}", f"image {w}×{h} as the model reads it"],
        "image": image_payload(image),
        "views": views,
    }


def default_input(run: LoadedRun) -> dict | None:
    """What the served page shows first: the first test image of a run trained on a bundled or
    generated source (``digits``, ``shapes``); None for data on disk (the page asks for a file)."""
    task = run.task
    source, seed = task.get("data"), int(task.get("seed") or 0)
    if source == "digits":
        images = load_digits(seed=seed).test[0]
    elif source == "shapes":
        size = int(task.get("image_size") or run.tokenizer.image_shape[-1])
        label = task.get("shapes_label") or "shape"
        images = make_shapes(20, size, label=label, seed=seed).test[0]
    else:
        return None
    return {"image": png_bytes(images[0]), "image_name": f"{source} test image 0"}
