"""The demo's equal-token reading of the validation curves (``attnlab.demo``); the demo itself
runs end to end in ``test_lm_cli.py``."""

from __future__ import annotations

import pytest

from attnlab.demo import loss_at_tokens, val_curve


def test_val_curve_keeps_the_validation_records_in_tokens():
    history = [
        {"step": 0, "val_loss": 4.0},
        {"step": 10, "loss": 3.5},  # a training record
        {"step": 20, "val_loss": 2.0},
        {"val_loss": 9.9},  # no step: not a point
    ]
    assert val_curve(history, 100) == [(0, 4.0), (2000, 2.0)]


@pytest.mark.parametrize(
    "tokens, want",
    [
        (0, 4.0),
        (500, 3.0),  # half-way along the first segment, 4.0 to 2.0
        (1000, 2.0),
        (1500, 1.5),  # half-way between 2.0 and 1.0
        (2000, 1.0),  # the last point itself
        (2001, None),  # past the curve
        (-1, None),
    ],
)
def test_loss_at_tokens_is_linear_between_the_points_around_it(tokens, want):
    curve = [(0, 4.0), (1000, 2.0), (2000, 1.0)]
    got = loss_at_tokens(curve, tokens)
    assert got == want if want is None else got == pytest.approx(want)
    assert loss_at_tokens([], 0) is None
