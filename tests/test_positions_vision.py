"""The vision position modules: patch-grid tables (ViT) and Swin's window table, behind the one
Positions interface."""

from __future__ import annotations

import pytest
import torch

from attnlab.layers.position import Positions
from attnlab.layers.position.grid import PatchGridPositions, interpolate_positions, sincos_2d
from attnlab.layers.position.relative import RelativePositionBias, window_relative_index


def test_learned_grid_table_is_added_and_resampled_for_other_grids():
    pos = PatchGridPositions((3, 3), 8, kind="learned", n_prefix=1)
    assert isinstance(pos, Positions) and pos.absolute and not pos.relative
    assert pos.weight.shape == (1, 10, 8) and pos.weight.requires_grad
    x = torch.randn(2, 10, 8)
    torch.testing.assert_close(pos.embed(x), x + pos.weight)
    assert pos.table() is pos.weight and pos.table((3, 3)) is pos.weight
    torch.testing.assert_close(
        pos.table((4, 5)), interpolate_positions(pos.weight, (3, 3), (4, 5), n_prefix=1)
    )
    assert pos.embed(torch.zeros(1, 21, 8), grid=(4, 5)).shape == (1, 21, 8)


def test_sincos_grid_table_is_fixed_and_recomputed_for_other_grids():
    pos = PatchGridPositions((2, 3), 8, kind="sincos", n_prefix=1)
    assert list(pos.parameters()) == [] and "weight" not in pos.state_dict()
    assert torch.equal(pos.weight[0, 0], torch.zeros(8))  # the class token gets no position
    assert torch.equal(pos.weight[0, 1:], sincos_2d(2, 3, 8))
    assert torch.equal(pos.table((4, 4))[0, 1:], sincos_2d(4, 4, 8))
    no_prefix = PatchGridPositions((2, 2), 8, kind="sincos", n_prefix=0)
    assert no_prefix.weight.shape == (1, 4, 8)


def test_grid_init_and_bad_kind():
    assert torch.equal(
        PatchGridPositions((2, 2), 4, init_std=None).weight, torch.zeros(1, 5, 4)
    )  # left to the owning model
    assert PatchGridPositions((8, 8), 16).weight.std() > 0
    with pytest.raises(ValueError, match="choose 'learned' or 'sincos'"):
        PatchGridPositions((2, 2), 4, kind="rope")


def test_window_table_bias_reads_one_score_per_offset_and_head():
    w, H = 3, 2
    rpb = RelativePositionBias(w, H)
    assert isinstance(rpb, Positions) and rpb.relative
    assert rpb.table.shape == ((2 * w - 1) ** 2, H)
    assert torch.equal(rpb.index, window_relative_index(w))
    bias = rpb.bias()
    assert bias.shape == (H, w * w, w * w)
    coords = [(r, c) for r in range(w) for c in range(w)]
    for i, (ri, ci) in enumerate(coords):
        for j, (rj, cj) in enumerate(coords):
            row = (ri - rj + w - 1) * (2 * w - 1) + (ci - cj + w - 1)
            assert torch.equal(bias[:, i, j], rpb.table[row])
