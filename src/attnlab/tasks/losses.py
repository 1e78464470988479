"""Losses shared by the tasks: the cross-entropy (:mod:`attnlab.layers.losses`), its form fused
with the output projection (:mod:`attnlab.fast.loss`), which the LM task chooses, and DeiT's
distillation loss.

Shape legend: B batch, L classes.
"""

from typing import Literal

import torch.nn.functional as F
from torch import Tensor

from attnlab.fast.loss import linear_cross_entropy
from attnlab.layers.losses import cross_entropy

__all__ = ["cross_entropy", "linear_cross_entropy", "distillation_loss"]


def distillation_loss(
    z_cls: Tensor,
    z_dist: Tensor,
    labels: Tensor,
    z_teacher: Tensor,
    *,
    kind: Literal["hard", "soft"] = "hard",
    alpha: float = 0.5,
    temperature: float = 1.0,
    label_smoothing: float = 0.0,
) -> Tensor:
    """DeiT's loss (Touvron et al. 2021): the class head learns the labels, the distillation head
    the teacher.

        hard: (1 − α)·CE(z_cls, y) + α·CE(z_dist, argmax z_teacher)
        soft: (1 − α)·CE(z_cls, y) + α·τ²·KL(softmax(z_teacher/τ) ‖ softmax(z_dist/τ))

    The KL is averaged over the batch (summed over classes); the τ² keeps its gradient on the
    scale of the cross-entropy's (Hinton et al. 2015). Label smoothing applies to the class
    head only.

    Args:
        z_cls, z_dist: the student's class-head and distillation-head scores ``(B, L)``.
        labels: ``(B,)`` class ids.
        z_teacher: the teacher's scores ``(B, L)`` (no gradient flows into them).
        kind: ``hard`` or ``soft``.
        alpha: weight of the distillation term, in [0, 1].
        temperature: τ (soft only).
    """
    base = cross_entropy(z_cls.float(), labels, label_smoothing=label_smoothing)
    z_teacher = z_teacher.detach().float()
    if kind == "hard":
        distil = F.cross_entropy(z_dist.float(), z_teacher.argmax(-1))
    else:
        t = temperature
        log_p_student = F.log_softmax(z_dist.float() / t, dim=-1)  # (B, L)
        log_p_teacher = F.log_softmax(z_teacher / t, dim=-1)
        distil = F.kl_div(log_p_student, log_p_teacher, reduction="batchmean", log_target=True)
        distil = distil * t * t
    return (1 - alpha) * base + alpha * distil
