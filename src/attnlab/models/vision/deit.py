"""DeiT (Touvron et al. 2021, "Training data-efficient image transformers & distillation through
attention"): a ViT with a second learned token that learns from a teacher.

A ViT trained on little data loses to a CNN: it has to learn locality from the images. DeiT adds a
*distillation token* next to the class token; it goes through the same blocks (attending to the
patches and to the class token), and a second head reads it. During training the class head
learns the labels and the distillation head learns the teacher (a trained CNN, whose inductive
bias it passes on):

    x = [cls; dist; patch_1 W_E; …; patch_N W_E] + E_pos
    z_cls = W_cls · LN(x)_0,   z_dist = W_dist · LN(x)_1
    hard:  L = (1 − α) · CE(z_cls, y) + α · CE(z_dist, argmax z_teacher)
    soft:  L = (1 − α) · CE(z_cls, y) + α · τ² · KL(softmax(z_teacher/τ) ‖ softmax(z_dist/τ))

At inference the two heads are averaged, ``(z_cls + z_dist) / 2`` (HF
``DeiTForImageClassificationWithTeacher``'s ``logits``). The loss lives in
:func:`attnlab.tasks.losses.distillation_loss`; the teacher is attached to the image task
(:meth:`attnlab.tasks.image.ImageClassificationTask.use_teacher`).

Shape legend: B batch, Cin image channels, H/W image size, N patches, T = N + 2 tokens,
C d_model, L classes.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor, nn

from attnlab.attention.capture import capture_attention
from attnlab.config.vision import DeiTConfig
from attnlab.models.registry import register_kind
from attnlab.models.vision.vit import VisionTransformer, upgrade_vit_weights

__all__ = ["DeiT"]


class DeiT(VisionTransformer):
    """ViT plus a distillation token and head; see the module docstring.

    Args:
        config: a :class:`~attnlab.config.vision.DeiTConfig`.

    Attributes:
        dist_token: the distillation token ``(1, 1, C)``, token 1 (after the class token).
        head_dist: the distillation head (``head`` is the class head).
    """

    kind: ClassVar[str] = "deit"
    n_extra_tokens: ClassVar[int] = 1

    def __init__(self, config: DeiTConfig) -> None:
        super().__init__(config)
        c = config
        self.dist_token = nn.Parameter(torch.zeros(1, 1, c.d_model))
        self.head_dist = nn.Linear(c.d_model, c.num_classes) if c.num_classes > 0 else nn.Identity()
        self._init_distillation()

    def _init_distillation(self) -> None:
        std = self.config.init_std
        nn.init.trunc_normal_(self.dist_token, std=std)
        if isinstance(self.head_dist, nn.Linear):
            nn.init.trunc_normal_(self.head_dist.weight, std=std)
            nn.init.zeros_(self.head_dist.bias)

    def reset_parameters(self) -> None:
        """The ViT's initialisation, then the distillation token and head."""
        super().reset_parameters()
        if hasattr(self, "dist_token"):  # (the ViT's constructor calls this before they exist)
            self._init_distillation()

    def prefix_tokens(self, batch: int) -> Tensor:
        """``(B, 2, C)``: the class token, then the distillation token."""
        return torch.cat((self.cls_token, self.dist_token), dim=1).expand(batch, -1, -1)

    def forward(
        self,
        images: Tensor,
        *,
        need_weights: bool = False,
        interpolate_pos_encoding: bool = False,
        both_heads: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor] | tuple[Tensor, list[Tensor]]:
        """Class scores ``(B, L)``: the mean of the class head's and the distillation head's.

        Args:
            images: ``(B, Cin, H, W)``.
            need_weights: also return the per-layer attention weights ``(B, Hh, T, T)`` (token 0
                the class token, 1 the distillation token).
            interpolate_pos_encoding: as for :class:`VisionTransformer`.
            both_heads: return ``(class head, distillation head)`` scores instead of their mean
                (what the distillation loss needs).
        """
        if need_weights:
            with capture_attention(self) as maps:
                out = self(images, interpolate_pos_encoding=interpolate_pos_encoding)
            return out, maps.select("attn")
        tokens = self.encode(images, interpolate_pos_encoding=interpolate_pos_encoding)
        z_cls, z_dist = self.head(tokens[:, 0]), self.head_dist(tokens[:, 1])  # (B, L) each
        if both_heads:
            return z_cls, z_dist
        return (z_cls + z_dist) / 2


register_kind("deit", DeiTConfig, DeiT, artifacts="labels", upgrade=upgrade_vit_weights)
