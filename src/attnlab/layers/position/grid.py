"""Positions of image patch grids: fixed 2-D sin-cos tables and resampling of learned ones.

- 2-D sin-cos: half the channels encode the patch row, half the column (ViT/MAE patch grids).
- Resampling: learned patch positions trained on one grid, bicubically resized to another.

Shapes: Gh/Gw grid height/width, N = Gh·Gw patches, C width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.layers.position.absolute import sinusoidal_table

__all__ = ["sincos_2d", "interpolate_positions"]


def sincos_2d(grid_h: int, grid_w: int, dim: int, *, base: float = 10000.0) -> Tensor:
    """Fixed 2-D positions for a ``grid_h × grid_w`` patch grid, ``(grid_h·grid_w, dim)``.

    Channels ``[:dim/2]`` encode the row, ``[dim/2:]`` the column, each as a 1-D sin-cos table;
    patches are numbered row by row.
    """
    if dim % 4 != 0:
        raise ValueError(f"2-D sin-cos positions need a width divisible by 4, got dim={dim}")
    rows = sinusoidal_table(grid_h, dim // 2, base=base)  # (Gh, D/2)
    cols = sinusoidal_table(grid_w, dim // 2, base=base)  # (Gw, D/2)
    return torch.cat(
        (rows[:, None, :].expand(grid_h, grid_w, -1), cols[None, :, :].expand(grid_h, grid_w, -1)),
        dim=-1,
    ).reshape(grid_h * grid_w, dim)


def interpolate_positions(
    pos: Tensor, old_grid: tuple[int, int], new_grid: tuple[int, int], n_prefix: int = 1
) -> Tensor:
    """Resample learned patch positions to another patch grid (bicubic, as HF ViT does).

    The ``n_prefix`` leading rows (the class token's) are kept; the ``old_grid`` rows are reshaped
    into a grid, resized with bicubic interpolation (align_corners=False, no antialias) and
    flattened back. The same grid returns ``pos`` itself.

    Args:
        pos: ``(1, n_prefix + Gh·Gw, C)``.
        old_grid, new_grid: ``(Gh, Gw)`` before and after.
        n_prefix: rows that are not patch positions.

    Returns:
        ``(1, n_prefix + Gh'·Gw', C)``.
    """
    if tuple(old_grid) == tuple(new_grid):
        return pos
    prefix, grid = pos[:, :n_prefix], pos[:, n_prefix:]
    C = pos.shape[-1]
    grid = grid.reshape(1, old_grid[0], old_grid[1], C).permute(0, 3, 1, 2)  # (1, C, Gh, Gw)
    grid = F.interpolate(grid, size=tuple(new_grid), mode="bicubic", align_corners=False)
    grid = grid.permute(0, 2, 3, 1).reshape(1, new_grid[0] * new_grid[1], C)  # (1, N', C)
    return torch.cat((prefix, grid), dim=1)
