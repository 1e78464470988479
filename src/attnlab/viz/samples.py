"""Test images of an image run's data as PNG files (``attnlab samples``): one of each class
first, named by its class, so a newcomer's first ``attnlab classify`` has an input like the
training images (digits are 8×8, white on black; drawing one by hand rarely is)."""

from __future__ import annotations

from pathlib import Path

from PIL import Image
from torch import Tensor

__all__ = ["write_samples"]


def write_samples(
    images: Tensor, labels: Tensor, classes: list[str], out: Path, n: int, scale: int
) -> list[Path]:
    """Write ``n`` of ``images`` (``(N, C, H, W)`` in [0, 1]) as PNGs: one per class first
    (``CLASS.png``), then the rest in order (``CLASS_INDEX.png``), ``scale`` × enlarged.

    Returns:
        The files written, in order.
    """
    order: list[int] = []
    for c in range(len(classes)):  # one of each class first, then the rest in order
        hits = (labels == c).nonzero().flatten().tolist()
        order += hits[:1]
    order += [i for i in range(len(labels)) if i not in set(order)]
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for i in order[:n]:
        arr = (images[i].clamp(0, 1) * 255).round().byte().permute(1, 2, 0).numpy()
        mode = "L" if arr.shape[2] == 1 else "RGB"
        im = Image.fromarray(arr[:, :, 0] if mode == "L" else arr, mode)
        if scale > 1:  # (classify resizes back to the model's size)
            im = im.resize((im.width * scale, im.height * scale), Image.NEAREST)
        name = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in classes[labels[i]])
        first = not any(p.name.startswith(f"{name}.") for p in written)
        path = out / (f"{name}.png" if first else f"{name}_{i:04d}.png")
        im.save(path)
        written.append(path)
    return written
