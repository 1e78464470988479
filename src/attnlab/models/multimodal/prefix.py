"""LLaVA-style captioning: projected image tokens prepended to the words of a decoder-only LM.

No cross-attention: the image enters the language model as tokens (Liu et al. 2023, "Visual
Instruction Tuning", at toy scale). The ViT's patch features go through a projection into the
LM's width (LLaVA's projector), get 2-D sin-cos positions, and form a prefix of N tokens; the
words follow with their own positions. One stack of plain self-attention blocks reads both:

    x = [W_p · ViT(image) + P₂D ;  E[w] + P]                       (B, N + L, D)
    x = Block_l(x, mask = M)                                       l = 1 … Y
    p(w_{t+1} | image, w_≤t) = softmax(W_o · LN(x)[N + t])

The mask M (:func:`prefix_mask`) lets every word see all N image tokens and only the words up to
itself; the image tokens see one another and no word. Decoding puts the image tokens into the
KV caches once (:meth:`PrefixCaptioner.start_decoding`), then one word per step, as any
decoder-only LM: greedy and beam search are :func:`attnlab.decoding.search.beam_search`.

Shape legend: B batch, N image tokens, L words, D d_model, V vocabulary, C encoder width.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from attnlab.attention.cache import DecodeState, KVCache
from attnlab.attention.capture import capture_attention
from attnlab.config.multimodal import CaptionConfig
from attnlab.layers.block import run_blocks
from attnlab.layers.builders import build_block, build_final_norm, build_positions
from attnlab.layers.hook import HookPoint
from attnlab.layers.position.grid import sincos_2d
from attnlab.models.multimodal.encoders import ImageEncoder, upgrade_weights
from attnlab.models.registry import register_kind

__all__ = ["PrefixCaptioner", "PrefixCaptionState", "prefix_mask"]


def prefix_mask(n_image: int, n_text: int, device=None) -> Tensor:
    """``(N + L, N + L)`` bool, True = may attend: text sees every image token and the text up to
    itself; image tokens see the image tokens only."""
    T = n_image + n_text
    i = torch.arange(T, device=device)[:, None]  # queries
    j = torch.arange(T, device=device)[None, :]  # keys
    return (j < n_image) | ((i >= n_image) & (j <= i))


@dataclass
class PrefixCaptionState(DecodeState):
    """Incremental decoding of a :class:`PrefixCaptioner`: one KV cache per block, the image
    tokens first."""

    caches: list[KVCache]
    n_image: int


class PrefixCaptioner(nn.Module):
    """Image tokens + words through one decoder-only stack (see the module docstring).

    Attributes:
        encoder: the image encoder (:class:`ImageEncoder`, the ViT's or CNN's token grid);
        img_proj: the projector ``C -> D``; img_pos: 2-D sin-cos positions of the grid (buffer);
        tok_emb, pos_emb: the words' embeddings and positions; blocks, norm_f, head: the LM.
    """

    kind: ClassVar[str] = "caption_prefix"

    def __init__(self, config: CaptionConfig) -> None:
        super().__init__()
        self.config = c = config
        self.encoder = ImageEncoder(
            c, num_classes=c.num_classes, reads="tokens", frozen=c.freeze_encoder
        )
        self.img_proj = nn.Linear(self.encoder.feature_dim, c.d_model)
        grid = self.encoder.grid
        self.register_buffer("img_pos", sincos_2d(*grid, c.d_model), persistent=False)
        self.n_image = grid[0] * grid[1]
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
        self.pos_emb = build_positions(c, max_seq_len=c.max_len)
        self.drop = nn.Dropout(c.dropout)
        self.hook_embed = HookPoint()  # word embeddings (B, L, D); see attnlab.inspect
        self.blocks = nn.ModuleList(
            build_block(c, shared_positions=True) for _ in range(c.n_layers)
        )
        self.norm_f = build_final_norm(c)
        self.head = nn.Linear(c.d_model, c.vocab_size)

    def image_tokens(self, images: Tensor) -> Tensor:
        """The projected image prefix with its 2-D positions, ``(B, N, D)``."""
        feats = self.encoder.tokens(images)  # (B, N, C)
        return self.drop(self.img_proj(feats) + self.img_pos.to(feats.dtype))

    def word_tokens(self, tokens: Tensor, past: int = 0) -> Tensor:
        """Embedded words ``(B, L, D)`` at text positions ``past …``."""
        if tokens.dim() != 2:
            raise ValueError(f"tokens must be (B, L), got {tuple(tokens.shape)}")
        if past + tokens.shape[1] > self.config.max_len:
            raise ValueError(
                f"caption of {past + tokens.shape[1]} tokens is longer than "
                f"max_len={self.config.max_len}"
            )
        positions = torch.arange(past, past + tokens.shape[1], device=tokens.device)  # (L,)
        return self.drop(self.pos_emb.embed(self.hook_embed(self.tok_emb(tokens)), positions))

    def forward(
        self, images: Tensor, tokens: Tensor, *, need_weights: bool = False
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """Teacher-forced logits ``(B, L, V)`` for ``tokens (B, L)`` starting with ``<start>``.

        Args:
            need_weights: also return each block's self-attention ``(B, H, N + L, N + L)``
                (image tokens first; rows ``N:`` and columns ``:N`` are the words' attention to
                the image).
        """
        if need_weights:
            with capture_attention(self) as maps:
                logits = self(images, tokens)
            return logits, [maps[n] for n in maps if n.startswith("blocks.")]
        img = self.image_tokens(images)  # (B, N, D)
        x = torch.cat((img, self.word_tokens(tokens)), dim=1)  # (B, N + L, D)
        mask = prefix_mask(img.shape[1], tokens.shape[1], device=x.device)  # (N + L, N + L)
        x = run_blocks(self.blocks, x, mask=mask)
        return self.head(self.norm_f(x[:, img.shape[1] :]))  # the words' positions only

    # -- incremental decoding (the interface of attnlab.decoding) -------------------------------

    def start_decoding(self, images: Tensor, max_len: int | None = None) -> PrefixCaptionState:
        """Put the image tokens of ``images (B, 3, H, W)`` into the caches (they attend to one
        another only), with room for ``max_len`` words."""
        max_len = self.config.max_len if max_len is None else max_len
        if not 1 <= max_len <= self.config.max_len:
            raise ValueError(f"max_len must be in [1, {self.config.max_len}], got {max_len}")
        img = self.image_tokens(images)  # (B, N, D)
        B, N = img.shape[:2]
        caches = [blk.attn.make_cache(B, N + max_len) for blk in self.blocks]
        run_blocks(self.blocks, img, caches=caches)  # fills the caches; no word yet
        return PrefixCaptionState(caches=caches, n_image=N)

    def decode_step(
        self, tokens: Tensor, state: PrefixCaptionState
    ) -> tuple[Tensor, PrefixCaptionState]:
        """Feed ``tokens (B, T)`` (``<start>`` first, then one word per step): they see every
        cached token (the image, earlier words) and, causally, each other. Returns the next
        word's logits ``(B, V)``."""
        past = state.caches[0].length - state.n_image
        x = self.word_tokens(tokens, past)
        x = run_blocks(self.blocks, x, caches=state.caches, is_causal=tokens.shape[1] > 1)
        return self.head(self.norm_f(x[:, -1])), state


register_kind(
    PrefixCaptioner.kind, CaptionConfig, PrefixCaptioner, artifacts="scene_vocab",
    upgrade=upgrade_weights,
)  # fmt: skip
