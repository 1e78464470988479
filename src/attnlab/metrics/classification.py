"""Classification scores: accuracy of logits, and accuracy and cross-entropy of a classifier over a
whole dataset.

Shape legend: N examples, B batch, L classes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.layers import evaluating

__all__ = ["accuracy", "per_class_accuracy", "evaluate_classifier"]


def accuracy(logits: Tensor, labels: Tensor) -> float:
    """Share of rows of ``logits (N, L)`` whose arg-max is the label ``(N,)``."""
    return float((logits.argmax(-1) == labels).float().mean())


def per_class_accuracy(pred: Tensor, labels: Tensor, n_classes: int) -> list[float | None]:
    """Accuracy of the predictions ``(N,)`` among the examples of each class (None: no example)."""
    out: list[float | None] = []
    for k in range(n_classes):
        m = labels == k
        out.append(float((pred[m] == k).float().mean()) if m.any() else None)
    return out


@torch.no_grad()
def evaluate_classifier(
    model: nn.Module,
    images: Tensor,
    labels: Tensor,
    *,
    batch_size: int = 256,
    device: str | torch.device = "cpu",
) -> tuple[float, float]:
    """``(accuracy, mean cross-entropy)`` of ``model`` on already normalised ``images``.

    The model runs in eval mode, ``batch_size`` images at a time; its mode is restored after.
    """
    correct, loss_sum = 0, 0.0
    with evaluating(model):
        for i in range(0, len(labels), batch_size):
            x, y = images[i : i + batch_size].to(device), labels[i : i + batch_size].to(device)
            logits = model(x).float()  # (B, L)
            loss_sum += float(F.cross_entropy(logits, y, reduction="sum"))
            correct += int((logits.argmax(-1) == y).sum())
    n = max(len(labels), 1)
    return correct / n, loss_sum / n
