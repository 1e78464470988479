"""The cross-entropy over logits (:func:`cross_entropy`), mean over the targets that count.

The fused form (output projection and cross-entropy in one step, never keeping the logits) is a
fast path: :func:`attnlab.fast.linear_cross_entropy`, chosen by the LM task.

Shape legend: ``...`` leading dimensions, V classes (vocabulary).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

__all__ = ["cross_entropy"]


def cross_entropy(
    logits: Tensor, targets: Tensor, *, ignore_index: int = -100, label_smoothing: float = 0.0
) -> Tensor:
    """Mean cross-entropy over the targets that are not ``ignore_index``.

    With label smoothing ε (Szegedy et al. 2016) the target distribution is
    ``(1 - ε)·onehot + ε/V``, so per position the loss is
    ``(1 - ε)·(-log p_y) + ε·mean_v(-log p_v)``; this is what
    ``torch.nn.functional.cross_entropy(label_smoothing=ε)`` computes, and is used here (fused,
    and computed in float32 even when the logits are bfloat16).

    Args:
        logits: ``(..., V)`` unnormalised scores.
        targets: ``(...)`` class indices (int64); ``ignore_index`` marks padding.
        ignore_index: target value that contributes nothing.
        label_smoothing: ε in [0, 1).

    Returns:
        A scalar: the mean over non-ignored positions (0.0, still differentiable, if every
        position is ignored).

    Raises:
        ValueError: if the shapes do not fit.
    """
    if logits.shape[:-1] != targets.shape:
        raise ValueError(
            f"cross_entropy: logits {tuple(logits.shape)} need targets of shape "
            f"{tuple(logits.shape[:-1])}, got {tuple(targets.shape)}"
        )
    flat_logits = logits.reshape(-1, logits.shape[-1]).float()  # (N, V)
    flat_targets = targets.reshape(-1)  # (N,)
    # sum / count instead of reduction="mean": no NaN when every target is ignored, and no
    # host-device synchronisation to check for that case
    total = F.cross_entropy(
        flat_logits,
        flat_targets,
        ignore_index=ignore_index,
        label_smoothing=label_smoothing,
        reduction="sum",
    )
    count = (flat_targets != ignore_index).sum().clamp_min(1)
    return total / count
