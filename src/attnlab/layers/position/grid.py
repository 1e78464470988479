"""Positions of image patch grids: fixed 2-D sin-cos tables and resampling of learned ones.

- 2-D sin-cos: half the channels encode the patch row, half the column (ViT/MAE patch grids).
- Resampling: learned patch positions trained on one grid, bicubically resized to another.
- :class:`PatchGridPositions`: the :class:`Positions` module of a ViT (or of Swin's optional
  absolute positions): a learned or sin-cos table for the class token(s) and the patch grid,
  resampled when the image gives another grid.

Shapes: Gh/Gw grid height/width, N = Gh·Gw patches, C width.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.layers.hook import HookPoint
from attnlab.layers.position.base import Positions, sinusoidal_table

__all__ = ["sincos_2d", "interpolate_positions", "PatchGridPositions"]


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


class PatchGridPositions(Positions):
    """Absolute positions of a patch grid, with rows for the class token(s) first.

    ``weight`` is the ``(1, n_prefix + Gh·Gw, C)`` table of the grid the model was built for:
    trained (``learned``, HF ViT's ``position_embeddings``) or fixed 2-D sin-cos (``sincos``, a
    non-persistent buffer; the class token gets the zero vector, MAE's convention). Another grid
    resamples the learned table bicubically (:func:`interpolate_positions`) or recomputes the
    sin-cos one.

    Args:
        grid: ``(Gh, Gw)`` patch grid the table is built for.
        dim: width C.
        kind: ``learned`` or ``sincos``.
        n_prefix: tokens before the patches (1 = a class token, 0 = none).
        init_std: a learned table starts truncated-normal with this std; None leaves it zero for
            the owning model to initialise (with its other weights, in its own order).

    Raises:
        ValueError: an unknown ``kind``, or a sin-cos width not divisible by 4.
    """

    absolute = True

    def __init__(
        self,
        grid: tuple[int, int],
        dim: int,
        *,
        kind: Literal["learned", "sincos"] = "learned",
        n_prefix: int = 1,
        init_std: float | None = 0.02,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        self.hook_pos_embed = HookPoint()  # the added positions (B, T, C)
        self.grid, self.dim, self.kind, self.n_prefix = (
            (int(grid[0]), int(grid[1])),
            dim,
            kind,
            n_prefix,
        )
        n_tokens = n_prefix + self.grid[0] * self.grid[1]
        if kind == "learned":
            self.weight = nn.Parameter(torch.zeros(1, n_tokens, dim, device=device, dtype=dtype))
            if init_std is not None:
                nn.init.trunc_normal_(self.weight, std=init_std)
        elif kind == "sincos":
            table = self._sincos(self.grid).to(device=device, dtype=dtype)
            self.register_buffer("weight", table, persistent=False)
        else:
            raise ValueError(f"unknown patch-grid positions {kind!r}; choose 'learned' or 'sincos'")

    def _sincos(self, grid: tuple[int, int]) -> Tensor:
        pos = sincos_2d(grid[0], grid[1], self.dim)  # (N, C)
        prefix = torch.zeros(self.n_prefix, self.dim)  # the class token gets no position
        return torch.cat((prefix, pos), dim=0)[None]  # (1, T, C)

    def table(self, grid: tuple[int, int] | None = None) -> Tensor:
        """The ``(1, n_prefix + Gh·Gw, C)`` table for ``grid`` (default: the built one, ``weight``
        itself)."""
        grid = self.grid if grid is None else (int(grid[0]), int(grid[1]))
        if grid == self.grid:
            return self.weight
        if self.kind == "sincos":
            return self._sincos(grid).to(self.weight)
        return interpolate_positions(self.weight, self.grid, grid, self.n_prefix)

    def embed(
        self, x: Tensor, positions: Tensor | None = None, *, grid: tuple[int, int] | None = None
    ) -> Tensor:
        """``x (B, n_prefix + Gh·Gw, C)`` plus the table of its patch ``grid`` (``positions`` is
        unused: a grid's tokens are numbered row by row)."""
        return x + self.hook_pos_embed(self.table(grid).expand_as(x))

    def extra_repr(self) -> str:
        return f"grid={self.grid}, dim={self.dim}, kind={self.kind!r}, n_prefix={self.n_prefix}"
