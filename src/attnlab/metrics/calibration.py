"""Calibration: does a model's confidence match how often it is right?

For each prediction take its confidence c = max_v p_v and whether the argmax is correct. Split
[0, 1] into M equal-width bins B_1 … B_M by confidence; in each, compare the mean confidence with
the accuracy. The expected calibration error (Naeini et al. 2015; Guo et al. 2017) weighs the gaps
by how many predictions fall in each bin:

    ECE = Σ_m |B_m|/n · |acc(B_m) − conf(B_m)|

A reliability diagram draws acc(B_m) against conf(B_m): a calibrated model lies on the diagonal,
an overconfident one below it. (The plot is :func:`attnlab.viz.calibration.plot_reliability`.)

Shape legend: N predictions, V classes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import Tensor

__all__ = ["ReliabilityBin", "confidences", "reliability_bins", "expected_calibration_error"]


@dataclass
class ReliabilityBin:
    """One confidence bin: its range, how many predictions fell in it, their mean confidence and
    accuracy (None when empty)."""

    lo: float
    hi: float
    count: int
    confidence: float | None
    accuracy: float | None

    def to_dict(self) -> dict:
        return asdict(self)


def confidences(logits: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    """Confidence ``max_v softmax(logits)`` and correctness of the argmax, per prediction.

    Args:
        logits: ``(N, V)``.
        targets: ``(N,)`` class indices.

    Returns:
        ``(confidence (N,) float, correct (N,) bool)``.
    """
    probs = torch.softmax(logits.float(), dim=-1)  # (N, V)
    conf, pred = probs.max(dim=-1)  # (N,), (N,)
    return conf, pred == targets


def _check(conf: Tensor, correct: Tensor, n_bins: int) -> None:
    if conf.shape != correct.shape or conf.dim() != 1:
        raise ValueError(
            f"need confidences and correctness of the same shape (N,), got "
            f"{tuple(conf.shape)} and {tuple(correct.shape)}"
        )
    if n_bins < 1:
        raise ValueError(f"n_bins must be at least 1, got {n_bins}")
    if conf.numel() and (conf.min() < 0 or conf.max() > 1):
        raise ValueError("confidences must lie in [0, 1]")


def reliability_bins(conf: Tensor, correct: Tensor, n_bins: int = 15) -> list[ReliabilityBin]:
    """The reliability diagram's data: ``n_bins`` equal-width confidence bins.

    Bin m holds confidences in ``(m/M, (m+1)/M]`` (the first bin also holds 0).

    Args:
        conf: ``(N,)`` confidences in [0, 1].
        correct: ``(N,)`` bool, whether each prediction was right.
        n_bins: M.

    Raises:
        ValueError: shapes differ, confidences outside [0, 1], or ``n_bins < 1``.
    """
    _check(conf, correct, n_bins)
    conf = conf.double()
    right = correct.double()
    # ceil(c·M) - 1 puts c in (m/M, (m+1)/M]; clamp sends c = 0 to the first bin
    idx = (torch.ceil(conf * n_bins) - 1).clamp(0, n_bins - 1).long()  # (N,)
    count = torch.bincount(idx, minlength=n_bins)
    conf_sum = torch.bincount(idx, weights=conf, minlength=n_bins)
    right_sum = torch.bincount(idx, weights=right, minlength=n_bins)
    bins = []
    for m in range(n_bins):
        n = int(count[m])
        bins.append(
            ReliabilityBin(
                lo=m / n_bins,
                hi=(m + 1) / n_bins,
                count=n,
                confidence=float(conf_sum[m] / n) if n else None,
                accuracy=float(right_sum[m] / n) if n else None,
            )
        )
    return bins


def expected_calibration_error(conf: Tensor, correct: Tensor, n_bins: int = 15) -> float:
    """ECE = Σ_m |B_m|/n · |acc(B_m) − conf(B_m)| over ``n_bins`` equal-width bins (0 when empty).

    Args:
        conf: ``(N,)`` confidences in [0, 1].
        correct: ``(N,)`` bool.
        n_bins: M (15 is Guo et al.'s choice).
    """
    bins = reliability_bins(conf, correct, n_bins)
    n = sum(b.count for b in bins)
    if n == 0:
        return 0.0
    return sum(b.count / n * abs(b.accuracy - b.confidence) for b in bins if b.count)
