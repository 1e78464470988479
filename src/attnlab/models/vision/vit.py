"""Vision Transformer (Dosovitskiy et al. 2020, "An Image is Worth 16×16 Words").

An image is cut into P×P patches; each patch is flattened and linearly projected to a token, so an
H×W image becomes N = HW/P² tokens (224×224 with P = 16 → 14·14 = 196). A class token may be
prepended, positions are added (learned, or fixed 2-D sin-cos), and the tokens go through the same
pre-norm Transformer encoder blocks as a language model — without any causal mask: every patch may
attend to every other patch. The class token's output (or the mean of the patch outputs) is
classified by one linear layer.

    x = [cls; patch_1 W_E; …; patch_N W_E] + E_pos
    x = LN_emb(x)                                    (CLIP only: embed_norm)
    x = x + MHA(LN(x));  x = x + MLP(LN(x))          (× n_layers)
    logits = W_head · pool(LN(x))

The blocks are the shared :class:`~attnlab.layers.block.TransformerBlock`, built from the config's block
fields, so GQA, QK-norm, SwiGLU, MoE and drop-path apply here too. Hugging Face ``ViTModel`` /
``ViTForImageClassification`` checkpoints convert through :mod:`attnlab.interop.hf.vision`.

Shape legend: B batch, Cin image channels, H/W image height/width, P patch size, Gh/Gw patch-grid
height/width, N = Gh·Gw patches, T tokens (N, or N + 1 with a class token), C d_model, L classes.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from attnlab.attention.capture import capture_attention
from attnlab.config.vision import ViTConfig
from attnlab.layers.block import make_norm
from attnlab.layers.drop_path import drop_path_rates
from attnlab.layers.patch_embed import PatchEmbedding
from attnlab.layers.position.grid import PatchGridPositions
from attnlab.models.registry import register_kind
from attnlab.models.vision.common import (
    build_vision_block,
    check_patch_images,
    init_vision_weights,
)

__all__ = ["VisionTransformer", "upgrade_vit_weights"]


class VisionTransformer(nn.Module):
    """ViT image classifier; see the module docstring.

    Args:
        config: a :class:`~attnlab.config.vision.ViTConfig`.

    Attributes:
        pos_embed: the :class:`~attnlab.layers.position.PatchGridPositions` of the patch grid
            (class-token row first when ``pooling == "cls"``).
        n_prefix: tokens before the patches (1 with a class token, else 0; a DeiT's 2).
    """

    kind: ClassVar[str] = "vit"
    #: learned tokens between the class token and the patches (DeiT's distillation token: 1)
    n_extra_tokens: ClassVar[int] = 0

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.config = c = config
        self.patch_embed = PatchEmbedding(c.in_channels, c.d_model, c.patch_size, bias=c.patch_bias)
        self.n_prefix = (1 if c.pooling == "cls" else 0) + self.n_extra_tokens
        if self.n_prefix:
            self.cls_token = nn.Parameter(torch.zeros(1, 1, c.d_model))
        grid = (c.grid_size, c.grid_size)
        self.pos_embed = PatchGridPositions(
            grid, c.d_model, kind=c.position, n_prefix=self.n_prefix, init_std=None
        )  # initialised by reset_parameters
        self.drop = nn.Dropout(c.dropout)
        self.embed_norm = (
            make_norm(c.norm, c.d_model, eps=c.norm_eps, bias=c.bias)
            if c.embed_norm
            else nn.Identity()
        )  # CLIP's pre_layrnorm
        self.blocks = nn.ModuleList(
            build_vision_block(c, qkv_bias=c.qkv_bias, drop_path=rate)
            for rate in drop_path_rates(c.drop_path, c.n_layers)
        )
        self.norm = make_norm(c.norm, c.d_model, eps=c.norm_eps, bias=c.bias)
        self.pooler = nn.Linear(c.d_model, c.d_model) if c.pooler else None
        self.head = nn.Linear(c.d_model, c.num_classes) if c.num_classes > 0 else nn.Identity()
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Truncated-normal init (std ``init_std``) for linear/patch weights, class token and
        learned positions."""
        tokens = [self.cls_token] if self.n_prefix else []
        init_vision_weights(self, self.config.init_std, tokens)

    def prefix_tokens(self, batch: int) -> Tensor:
        """The learned tokens put before the patches, ``(B, n_prefix, C)``: the class token."""
        return self.cls_token.expand(batch, -1, -1)

    @property
    def feature_dim(self) -> int:
        """Width C of :meth:`features` and :meth:`pooled_features`."""
        return self.config.d_model

    def encode(self, images: Tensor, *, interpolate_pos_encoding: bool = False) -> Tensor:
        """All output tokens after the final norm (HF ``last_hidden_state``).

        Args:
            images: ``(B, Cin, H, W)``; H = W = ``image_size`` unless ``interpolate_pos_encoding``,
                in which case H and W need only be multiples of the patch size.
            interpolate_pos_encoding: resample the positions to the image's patch grid.

        Returns:
            ``(B, T, C)``; token 0 is the class token when ``pooling == "cls"``.

        Raises:
            UserError: wrong rank, channel count or size (the message names the values).
        """
        c = self.config
        what = f"ViT (patch size {c.patch_size})"
        check_patch_images(images, c, what, any_size=interpolate_pos_encoding)
        B, _, H, W = images.shape
        x = self.patch_embed(images)  # (B, N, C)
        if self.n_prefix:
            x = torch.cat((self.prefix_tokens(B), x), dim=1)  # (B, n_prefix + N, C)
        x = self.drop(self.pos_embed.embed(x, grid=(H // c.patch_size, W // c.patch_size)))
        x = self.embed_norm(x)
        for blk in self.blocks:
            x = blk(x)  # bidirectional: no mask, is_causal=False
        return self.norm(x)

    def features(self, images: Tensor, **kw: Any) -> Tensor:
        """Patch tokens ``(B, N, C)`` after the final norm (class token dropped), row by row."""
        return self.encode(images, **kw)[:, self.n_prefix :]

    def pool(self, tokens: Tensor) -> Tensor:
        """``(B, T, C) -> (B, C)``: the class token, or the mean of the patch tokens."""
        if self.config.pooling == "cls":
            return tokens[:, 0]
        return tokens[:, self.n_prefix :].mean(dim=1)

    def pooled_features(self, images: Tensor, **kw: Any) -> Tensor:
        """One vector per image ``(B, C)``: the input of the classification head."""
        return self.pool(self.encode(images, **kw))

    def pooler_output(self, images: Tensor, **kw: Any) -> Tensor:
        """HF ``ViTModel``'s ``pooler_output``: ``tanh(W · cls + b)`` (needs ``pooler=True``)."""
        if self.pooler is None:
            raise ValueError("this ViT has no pooler (build with pooler=True)")
        return torch.tanh(self.pooler(self.encode(images, **kw)[:, 0]))

    def forward(
        self, images: Tensor, *, need_weights: bool = False, interpolate_pos_encoding: bool = False
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """Class scores ``(B, L)`` (pooled features ``(B, C)`` when ``num_classes == 0``).

        With ``need_weights=True`` returns ``(scores, weights)``: one ``(B, Hh, T, T)`` attention
        tensor per layer, first layer first (T includes the class token at index 0 when
        ``pooling == "cls"``), read through :func:`attnlab.attention.capture_attention`.
        """
        if need_weights:
            with capture_attention(self) as maps:
                out = self(images, interpolate_pos_encoding=interpolate_pos_encoding)
            return out, maps.select("attn")
        tokens = self.encode(images, interpolate_pos_encoding=interpolate_pos_encoding)
        return self.head(self.pool(tokens))


def upgrade_vit_weights(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """First-release weight names -> today's: the position table is ``pos_embed.weight`` of a
    :class:`~attnlab.layers.position.PatchGridPositions` (was the parameter ``pos_embed``)."""
    return {("pos_embed.weight" if k == "pos_embed" else k): v for k, v in state.items()}


register_kind("vit", ViTConfig, VisionTransformer, artifacts="labels", upgrade=upgrade_vit_weights)
