"""Losses shared by the tasks: the cross-entropy (:mod:`attnlab.layers.losses`), its form fused
with the output projection (:mod:`attnlab.fast.loss`), which the LM task chooses, DeiT's
distillation loss and the symmetric contrastive loss of dual encoders.

Shape legend: B batch, L classes.
"""

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.fast.loss import linear_cross_entropy
from attnlab.layers.losses import cross_entropy

__all__ = ["cross_entropy", "linear_cross_entropy", "distillation_loss", "contrastive_loss"]


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


def contrastive_loss(logits_per_image: Tensor) -> Tensor:
    """CLIP's symmetric InfoNCE loss of a batch of B matching pairs.

    With ``S = logits_per_image (B, B)`` (``S_ij`` the scaled cosine similarity of image i and
    text j; pair i is the match):

        L = ½ · (CE(S, [0..B)) + CE(Sᵀ, [0..B)))
          = −1/(2B) Σ_i [log softmax_j(S_ij)|_{j=i} + log softmax_j(S_ji)|_{j=i}]

    the image→text and the text→image classification of the matching partner among the batch.

    Raises:
        ValueError: a matrix that is not square.
    """
    s = logits_per_image
    if s.dim() != 2 or s.shape[0] != s.shape[1]:
        raise ValueError(f"contrastive_loss needs a square (B, B) matrix, got {tuple(s.shape)}")
    target = torch.arange(s.shape[0], device=s.device)
    return 0.5 * (cross_entropy(s, target) + cross_entropy(s.T, target))
