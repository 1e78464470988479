"""The Transformer trunk of the Transformer captioner and the Transformer VQA model.

The image becomes a set of tokens — the encoder's grid, projected to d_model, plus fixed 2-D
sin-cos positions for that grid — and the words run through Transformer blocks whose
cross-attention reads those tokens:

    m = W_img · encoder(image) + P₂D                      image tokens (B, N, D)
    x = E[w] (+ P[positions]);  x = Block_l(x, context=m)  l = 1 … L

The word positions go through the one position interface (:mod:`attnlab.layers.position`): the
trunk owns one module (``pos_emb``) whose ``embed`` adds learned or sinusoidal positions and whose
``rotate``/``bias`` (RoPE, ALiBi) the blocks' self-attention applies. The blocks are
``build_block(config, cross_attention=True)``, so every block field of the config (GQA, QK-norm,
SwiGLU, MoE, backends) applies. The captioner adds causal masking, KV caches and a vocabulary
head; the VQA model a padding mask, mean pooling and a classifier.

Shape legend: B batch, L words, N image tokens, C encoder width, D d_model, Y blocks.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.attention.cache import KVCache
from attnlab.config.multimodal import SceneModelConfig
from attnlab.layers.block import run_blocks
from attnlab.layers.builders import build_block, build_final_norm, build_positions
from attnlab.layers.hook import HookPoint
from attnlab.layers.position.grid import sincos_2d
from attnlab.models.multimodal.encoders import ImageEncoder

__all__ = ["ImageTextTransformer"]


class ImageTextTransformer(nn.Module):
    """Image tokens + word embeddings + blocks with cross-attention (see the module docstring).

    Args:
        config: the model config.
        encoder: the image encoder (built by the subclass: what it reads decides what is frozen).

    Attributes:
        encoder, img_proj: image encoder and its projection to d_model.
        img_pos: ``(N, D)`` 2-D sin-cos positions of the encoder's grid (a buffer, not saved).
        tok_emb, pos_emb, drop, blocks, norm_f: the word side.
    """

    def __init__(self, config: SceneModelConfig, encoder: ImageEncoder) -> None:
        super().__init__()
        self.config = c = config
        self.encoder = encoder
        self.img_proj = nn.Linear(encoder.feature_dim, c.d_model)
        self.register_buffer("img_pos", sincos_2d(*encoder.grid, c.d_model), persistent=False)
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
        self.pos_emb = build_positions(c, max_seq_len=c.max_len)
        self.drop = nn.Dropout(c.dropout)
        self.hook_embed = HookPoint()  # text token embeddings (B, L, D); see attnlab.inspect
        self.blocks = nn.ModuleList(
            build_block(c, cross_attention=True, context_dim=c.d_model, shared_positions=True)
            for _ in range(c.n_layers)
        )
        self.norm_f = build_final_norm(c)

    def image_tokens(self, images: Tensor) -> Tensor:
        """Projected image tokens with their 2-D positions, ``(B, N, D)``."""
        feats = self.encoder.tokens(images)  # (B, N, C)
        return self.img_proj(feats) + self.img_pos.to(feats.dtype)

    def run_text(
        self,
        tokens: Tensor,
        memory: Tensor | None,
        *,
        mask: Tensor | None = None,
        is_causal: bool = False,
        caches: list[KVCache] | None = None,
        cross_caches: list[KVCache] | None = None,
    ) -> Tensor:
        """Hidden states ``(B, L, D)`` of ``tokens (B, L)`` reading the image tokens ``memory``.

        Args:
            memory: ``(B, N, D)`` from :meth:`image_tokens`; None once ``cross_caches`` hold its
                keys and values.
            mask: self-attention mask broadcastable to ``(B, H, L, S)``; True = may attend.
            is_causal: causal self-attention (bottom-right aligned with ``caches``).
            caches, cross_caches: one self-attention and one cross-attention KV cache per block
                (incremental decoding); positions continue after the cached tokens.
        """
        past = 0 if caches is None else caches[0].length
        positions = torch.arange(past, past + tokens.shape[1], device=tokens.device)  # (L,)
        x = self.drop(self.pos_emb.embed(self.hook_embed(self.tok_emb(tokens)), positions))
        x = run_blocks(
            self.blocks,
            x,
            caches=caches,
            cross_caches=cross_caches,
            mask=mask,
            is_causal=is_causal,
            positions=positions,
            context=memory,
            pos_emb=self.pos_emb,
        )
        return self.norm_f(x)
