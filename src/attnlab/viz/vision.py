"""Where a ViT looks: class-token attention and attention rollout, overlaid on the image.

- **Class-token attention**: row 0 of a layer's attention matrix (the class token as query),
  averaged over heads, restricted to the patch keys and laid out on the Gh×Gw patch grid.
- **Attention rollout** (Abnar & Zuidema 2020): attention mixes tokens layer after layer and the
  residual stream carries each token forward, so a layer is modelled as ``Â = ½(A + I)`` (heads
  averaged, rows renormalised) and the flow from the input to the output is the product
  ``R = Â_L ⋯ Â_1``. Row 0 of R says how much each input patch contributes to the class token.
  Models without a class token (mean pooling) use the mean of R's patch rows.

Shape legend: L layers, B batch, Hh heads, T tokens, N = Gh·Gw patches, C channels, H/W pixels.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

from attnlab.fileio import atomic_save
from attnlab.layers import evaluating
from attnlab.plotting import pyplot

__all__ = ["cls_attention", "attention_rollout", "overlay_attention", "plot_vit_attention"]


def _check(weights: list[Tensor]) -> None:
    if not weights:
        raise ValueError("no attention weights: take them from model(images, need_weights=True)")
    for w in weights:
        if w is None or w.dim() != 4 or w.shape[-1] != w.shape[-2]:
            raise ValueError(
                "attention weights must be (B, Hh, T, T) per layer, got "
                f"{None if w is None else tuple(w.shape)}"
            )


def cls_attention(weights: list[Tensor], *, n_prefix: int = 1, layer: int = -1) -> Tensor:
    """Class-token attention to the patches of one layer, heads averaged: ``(B, N)``.

    Args:
        weights: per-layer ``(B, Hh, T, T)`` (``_, weights = vit(images, need_weights=True)``).
        n_prefix: tokens before the patches (1 = class token; 0 = none, then the mean query row).
        layer: which layer (default the last).
    """
    _check(weights)
    w = weights[layer].float().mean(1)  # (B, T, T)
    rows = w[:, 0] if n_prefix else w.mean(1)  # (B, T)
    return rows[:, n_prefix:]


def attention_rollout(weights: list[Tensor], *, n_prefix: int = 1, residual: float = 0.5) -> Tensor:
    """Attention rollout from the input patches to the pooled output: ``(B, N)``.

    Args:
        weights: per-layer ``(B, Hh, T, T)``, first layer first.
        n_prefix: 1 with a class token (read its row), 0 for mean pooling (mean of the rows).
        residual: weight of the identity (the skip connection) in ``Â = (1−r)·A + r·I``.

    Returns:
        Non-negative scores over the patches (rows of a stochastic matrix, so each row sums to 1
        over all T tokens).
    """
    _check(weights)
    B, _, T, _ = weights[0].shape
    eye = torch.eye(T, device=weights[0].device)
    rollout = eye.expand(B, T, T).clone()
    for w in weights:
        a = (1 - residual) * w.float().mean(1) + residual * eye  # (B, T, T)
        a = a / a.sum(-1, keepdim=True)
        rollout = a @ rollout  # flow from the inputs to this layer's outputs
    rows = rollout[:, 0] if n_prefix else rollout[:, n_prefix:].mean(1)  # (B, T)
    return rows[:, n_prefix:]


#: one hue from dark (no attention) to bright (the most): what the colour bar shows is what the
#: panels show
ATTENTION_CMAP = "magma"


def overlay_attention(
    image: Tensor, maps: dict[str, Tensor], path: str | os.PathLike, *, title: str | None = None
) -> None:
    """Write a PNG: the image, then each ``(Gh, Gw)`` map beside it on the same pixel grid, one
    block per patch (not smoothed), in one single-hue colour scale (each map scaled to 0..1)
    whose colour bar reads the panels exactly.

    Args:
        image: ``(C, H, W)`` in [0, 1] (1 or 3 channels).
        maps: panel title -> ``(Gh, Gw)`` non-negative scores.
        path: output PNG.
        title: figure title.
    """
    plt = pyplot()

    if image.dim() != 3 or image.shape[0] not in (1, 3):
        raise ValueError(f"image must be (1 or 3, H, W), got {tuple(image.shape)}")
    img = image.detach().float().cpu().clamp(0, 1)
    H, W = img.shape[1:]
    shown = img[0].numpy() if img.shape[0] == 1 else img.permute(1, 2, 0).numpy()
    n = 1 + len(maps)
    fig, axes = plt.subplots(1, n, figsize=(3 * n + 0.8, 3.4), squeeze=False, layout="constrained")
    axes[0][0].imshow(shown, cmap="gray" if img.shape[0] == 1 else None, interpolation="nearest")
    axes[0][0].set_title("image", fontsize=9)
    for ax, (name, m) in zip(axes[0][1:], maps.items()):
        m = m.detach().float().cpu()
        m = (m - m.min()) / (m.max() - m.min() + 1e-12)
        # beside the image, not blended over it: a blend of colours over grey shows neither,
        # and its colours no longer match the bar
        im = ax.imshow(  # one block per patch, not smoothed, on the image's grid
            m.numpy(),
            cmap=ATTENTION_CMAP,
            interpolation="nearest",
            extent=(-0.5, W - 0.5, H - 0.5, -0.5),
            vmin=0.0,
            vmax=1.0,
        )
        ax.set_title(f"{name} (per patch)", fontsize=9)
    for ax in axes[0]:
        ax.set_xticks([])
        ax.set_yticks([])
    if len(maps):
        fig.colorbar(
            im, ax=list(axes[0]), fraction=0.02, pad=0.01, label="scaled to 0 (min) … 1 (max)"
        )
    if title:
        fig.suptitle(title, fontsize=10)
    atomic_save(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)


@torch.no_grad()
def plot_vit_attention(
    model,
    image: Tensor,
    path: str | os.PathLike,
    *,
    normalized: Tensor | None = None,
    title: str | None = None,
) -> dict:
    """Run a :class:`~attnlab.models.vision.VisionTransformer` on one image and write the overlay PNG.

    The weights come back from ``model(x, need_weights=True)`` (an attention capture); the model
    keeps none.

    Args:
        model: the ViT.
        image: ``(C, H, W)`` in [0, 1], shown in the figure.
        path: output PNG.
        normalized: the model's input for ``image`` (normalised); default ``image`` itself.
        title: figure title.

    Returns:
        ``{"cls_attention": (Gh, Gw), "rollout": (Gh, Gw)}``.
    """
    x = (image if normalized is None else normalized)[None]
    x = x.to(next(model.parameters()).device)
    with evaluating(model):
        _, weights = model(x, need_weights=True)
    p = model.config.patch_size
    grid = (x.shape[-2] // p, x.shape[-1] // p)
    n_prefix = getattr(model, "n_prefix", 1)
    first = "last-layer class-token attention" if n_prefix else "last-layer mean attention"
    maps = {
        first: cls_attention(weights, n_prefix=n_prefix)[0].view(grid),
        "attention rollout": attention_rollout(weights, n_prefix=n_prefix)[0].view(grid),
    }
    overlay_attention(image, maps, path, title=title)
    return dict(zip(("cls_attention", "rollout"), maps.values(), strict=True))
