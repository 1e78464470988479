"""A CLIP-style dual encoder (Radford et al. 2021): two towers whose embeddings meet in one space.

    u = W_I · ViT(image)[cls]              (B, P)   image embedding (bias-free projection)
    v = W_T · TextTower(ids)[eos]          (B', P)  text embedding
    logits_per_image = exp(s) · û v̂ᵀ       (B, B')  û, v̂ = u/‖u‖, v/‖v‖; s learned (temperature)

Trained with the symmetric contrastive loss over a batch of B matching pairs
(:func:`attnlab.tasks.clip.contrastive_loss`): image i must pick text i among the batch's texts
and text i image i. Nothing else joins the towers — no cross-attention — so a zoo of texts
("a red circle", "a blue square", ...) can be embedded once and compared with any image: that is
zero-shot classification.

:meth:`DualEncoder.encode_image` / :meth:`DualEncoder.encode_text` give the projected,
unnormalised embeddings (HF ``CLIPModel.get_image_features`` / ``get_text_features``), and
``model(images, ids)`` the logits per image (HF ``logits_per_image``). Hugging Face ``CLIPModel``
checkpoints convert through :mod:`attnlab.interop.hf.clip`.

Shape legend: B images, B' texts, T tokens, P projection_dim.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.attention.capture import capture_attention
from attnlab.config.clip import ClipConfig
from attnlab.errors import UserError
from attnlab.models.multimodal.text_tower import TextTower
from attnlab.models.registry import register_kind
from attnlab.models.vision.vit import VisionTransformer

__all__ = ["DualEncoder"]


class DualEncoder(nn.Module):
    """Image tower + text tower + projections + learned temperature; see the module docstring.

    Args:
        config: a :class:`~attnlab.config.clip.ClipConfig`.

    Attributes:
        vision: the image tower, a :class:`~attnlab.models.vision.VisionTransformer` without a
            head; text: the :class:`~attnlab.models.multimodal.text_tower.TextTower`;
        image_proj, text_proj: ``nn.Linear(C, P, bias=False)``;
        logit_scale: the scalar s, ``exp(s)`` multiplies the cosine similarities.
    """

    kind: ClassVar[str] = "clip"

    def __init__(self, config: ClipConfig) -> None:
        super().__init__()
        self.config = c = config
        self.vision = VisionTransformer(c.vision)
        self.text = TextTower(c.text)
        self.image_proj = nn.Linear(c.vision.d_model, c.projection_dim, bias=False)
        self.text_proj = nn.Linear(c.text.d_model, c.projection_dim, bias=False)
        self.logit_scale = nn.Parameter(torch.tensor(float(c.logit_scale_init)))
        for proj in (self.image_proj, self.text_proj):
            nn.init.normal_(proj.weight, std=proj.in_features**-0.5)

    def encode_image(self, images: Tensor) -> Tensor:
        """Projected, unnormalised image embeddings ``(B, 3, H, W) -> (B, P)``.

        Raises:
            UserError: not an image batch of the tower's size (token ids, the wrong shape).
        """
        if not images.is_floating_point():
            raise UserError(
                f"the image tower reads images (B, 3, H, W) of floats, got a {images.dtype} "
                f"tensor of shape {tuple(images.shape)}; token ids go to encode_text"
            )
        return self.image_proj(self.vision.pooled_features(images))

    def encode_text(self, ids: Tensor) -> Tensor:
        """Projected, unnormalised text embeddings ``(B', T) -> (B', P)``.

        Raises:
            UserError: not token ids (an image batch, floats), too long, ids out of range.
        """
        return self.text_proj(self.text(ids))

    def scale(self) -> Tensor:
        """exp(s), clamped to ``max_logit_scale``."""
        return self.logit_scale.exp().clamp(max=self.config.max_logit_scale)

    def similarity(self, image_emb: Tensor, text_emb: Tensor) -> Tensor:
        """``exp(s) · û v̂ᵀ`` of embeddings ``(B, P)`` and ``(B', P)``: ``(B, B')``."""
        return self.scale() * F.normalize(image_emb, dim=-1) @ F.normalize(text_emb, dim=-1).T

    def forward(
        self, images: Tensor, ids: Tensor, *, need_weights: bool = False
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """Logits per image ``(B, B')`` (HF ``logits_per_image``; ``.T`` is per text).

        With ``need_weights=True`` returns ``(logits, weights)``: every attention layer's
        ``(B, H, T, T)`` weights, the image tower's first (named ``vision.blocks.i.attn`` and
        ``text.blocks.i.attn`` in :func:`attnlab.attention.capture_attention`).
        """
        if need_weights:
            with capture_attention(self) as maps:
                logits = self(images, ids)
            return logits, maps.select("attn")
        return self.similarity(self.encode_image(images), self.encode_text(ids))


register_kind(DualEncoder.kind, ClipConfig, DualEncoder, artifacts="scene_vocab")
