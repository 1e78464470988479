"""Transformer-XL language model (Dai et al. 2019): segment-level recurrence with relative
positions.

    h⁰ = E[idx]                                                   token embeddings, no positions
    h̃ˡ⁻¹ = [SG(mˡ⁻¹); hˡ⁻¹]                                        memory of the previous segment
    hˡ = Block_l(hˡ⁻¹, keys and values from h̃ˡ⁻¹)                  XLAttention, relative positions
    logits = norm_f(hᴸ) W_outᵀ

A long text is read segment by segment; each layer keeps the last ``mem_len`` of its inputs as
the next segment's memory, without gradient (SG, stop-gradient). A segment therefore sees up to
``mem_len`` earlier tokens per layer, and the reach grows with depth (L · mem_len tokens back),
while each segment costs one forward over T queries and M + T keys. Positions are relative
(:class:`~attnlab.attention.relative_xl.XLAttention`), so the same state means the same thing in
whichever segment it was computed.

The blocks are the ordinary :class:`~attnlab.layers.block.TransformerBlock` with an
``XLAttention`` part; the memory travels through the block's ``cache`` argument. In a pre-norm
block the attention reads the normalised layer input, and that is what the memory keeps (the
norm is per token, so this equals keeping the layer input and normalising it again).

Shape legend: B batch, T segment, M memory, C d_model, V vocab_size, L layers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, NamedTuple

import torch
from torch import Tensor, nn

from attnlab.attention.cache import DecodeState
from attnlab.attention.relative_xl import SegmentMemory, XLAttention
from attnlab.config.variants import TransformerXLConfig
from attnlab.errors import UserError
from attnlab.layers.block import TransformerBlock, make_norm, run_blocks
from attnlab.layers.builders import build_ffn, build_final_norm
from attnlab.layers.hook import HookPoint
from attnlab.layers.losses import cross_entropy
from attnlab.layers.position.xl import XLRelativePositions
from attnlab.models.registry import register_kind

__all__ = ["TransformerXL", "XLOutput", "XLDecodeState", "build_xl_block"]


class XLOutput(NamedTuple):
    """What :meth:`TransformerXL.forward` returns.

    Attributes:
        out: logits ``(B, T, V)``, or the mean loss when targets were given.
        memory: the next segment's memory, one ``(B, min(M + T, mem_len), C)`` tensor per layer.
    """

    out: Tensor
    memory: list[Tensor]


@dataclass
class XLDecodeState(DecodeState):
    """The decoding state of a :class:`TransformerXL`: its memory, one ``(B, M, C)`` tensor per
    layer (beam search reorders the rows)."""

    memory: list[Tensor] = field(default_factory=list)


def build_xl_block(config: TransformerXLConfig) -> TransformerBlock:
    """A pre-norm :class:`TransformerBlock` whose attention is an :class:`XLAttention`."""
    c = config
    width = c.n_heads * c.head_dim
    attn = XLAttention(
        c.n_heads,
        nn.Linear(c.d_model, 3 * width, bias=c.bias),
        nn.Linear(c.d_model, width, bias=False),
        nn.Linear(width, c.d_model, bias=c.bias),
        dropout=c.attn_dropout,
    )
    norm = lambda: make_norm(c.norm, c.d_model, eps=c.norm_eps, bias=c.bias)  # noqa: E731
    return TransformerBlock(
        attn,
        build_ffn(c),
        norm(),
        norm(),
        norm_position="pre",
        residual=c.residual,
        dropout=c.dropout,
    )


class TransformerXL(nn.Module):
    """A Transformer-XL LM built from :class:`~attnlab.config.variants.TransformerXLConfig`.

    Attributes:
        tok_emb: ``nn.Embedding(V, C)``.
        pos_emb: the shared :class:`XLRelativePositions` (no weights).
        blocks: pre-norm blocks with :class:`XLAttention`.
        norm_f, lm_head: final norm and output projection (tied to ``tok_emb`` when configured).
    """

    kind: ClassVar[str] = "transformer_xl"

    def __init__(self, config: TransformerXLConfig) -> None:
        super().__init__()
        c = self.config = config
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
        self.pos_emb = XLRelativePositions(c.d_model)
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(build_xl_block(c) for _ in range(c.n_layers))
        self.norm_f = build_final_norm(c)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.hook_embed = HookPoint()
        self.reset_parameters()
        if c.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight

    def reset_parameters(self) -> None:
        """N(0, init_std) weights, residual projections scaled by 1/√(2L); u, v start at 0."""
        std = self.config.init_std
        for name, p in self.named_parameters():
            if ("norm" in name and p.dim() == 1) or name.endswith((".u", ".v")):
                continue
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif name.endswith(("out_proj.weight", "fc2.weight", "down.weight")):
                nn.init.normal_(p, std=std / (2 * self.config.n_layers) ** 0.5)
            else:
                nn.init.normal_(p, std=std)

    def empty_memory(self, batch_size: int, *, device=None) -> list[Tensor]:
        """A memory of length 0 for every layer (the first segment's)."""
        device = device or self.tok_emb.weight.device
        C = self.config.d_model
        return [torch.zeros(batch_size, 0, C, device=device) for _ in self.blocks]

    def forward(
        self,
        idx: Tensor,
        *,
        memory: list[Tensor] | None = None,
        mask: Tensor | None = None,
        targets: Tensor | None = None,
    ) -> XLOutput:
        """Read one segment ``idx (B, T)`` after ``memory``.

        Args:
            idx: token ids.
            memory: one ``(B, M, C)`` tensor per layer from the previous call (None: none).
            mask: extra boolean mask broadcastable to ``(B, H, T, M + T)``, True = may attend
                (combined with the causal one).
            targets: ``(B, T)`` next-token ids: ``out`` is the mean cross-entropy.

        Returns:
            :class:`XLOutput` ``(logits or loss, next memory)``.

        Raises:
            UserError: a memory longer than ``mem_len``, or memory + segment beyond
                ``max_seq_len``, or memory of the wrong shape.
        """
        c = self.config
        if idx.dim() != 2:
            raise UserError(f"idx must be (B, T) token ids, got shape {tuple(idx.shape)}")
        B, T = idx.shape
        memory = self.empty_memory(B, device=idx.device) if memory is None else memory
        self._check_memory(memory, B, T)
        mems = [SegmentMemory(m) for m in memory]
        x = self.drop(self.hook_embed(self.tok_emb(idx)))  # (B, T, C)
        x = run_blocks(
            self.blocks,
            x,
            caches=mems,
            mask=mask,
            is_causal=True,
            pos_emb=self.pos_emb,
        )
        new_memory = [m.next(c.mem_len) for m in mems]
        h = self.norm_f(x)
        if targets is not None:
            return XLOutput(cross_entropy(self.lm_head(h), targets), new_memory)
        return XLOutput(self.lm_head(h), new_memory)

    def start_decoding(self, batch_size: int, max_len: int | None = None) -> XLDecodeState:
        """An empty memory for ``batch_size`` rows (``max_len`` is not needed: the memory keeps
        only the last ``mem_len`` states)."""
        return XLDecodeState(self.empty_memory(batch_size))

    @torch.no_grad()
    def decode_step(
        self, tokens: Tensor, state: XLDecodeState, *, attention_mask: Tensor | None = None
    ) -> tuple[Tensor, XLDecodeState]:
        """Read ``tokens (B, T)`` after the state's memory, in segments of at most
        ``max_seq_len − mem_len`` tokens (a prompt fills the memory segment by segment; then one
        token per step); the logits ``(B, V)`` of the next token.

        Raises:
            UserError: an attention mask (padded prompts are not supported here).
        """
        if attention_mask is not None:
            raise UserError("Transformer-XL decodes unpadded prompts only: give one prompt")
        step = self.config.max_seq_len - self.config.mem_len
        memory = state.memory
        for begin in range(0, tokens.shape[1], step):
            logits, memory = self(tokens[:, begin : begin + step], memory=memory)
        state.memory = memory
        return logits[:, -1], state

    def _check_memory(self, memory: list[Tensor], B: int, T: int) -> None:
        c = self.config
        if len(memory) != len(self.blocks):
            raise UserError(
                f"memory must hold one tensor per layer ({len(self.blocks)}), got {len(memory)}"
            )
        M = memory[0].shape[1] if memory else 0
        for m in memory:
            if m.dim() != 3 or m.shape[0] != B or m.shape[2] != c.d_model or m.shape[1] != M:
                raise UserError(
                    f"each layer's memory must be (B={B}, M, d_model={c.d_model}) with one M, "
                    f"got {tuple(m.shape)}"
                )
        if M > c.mem_len:
            raise UserError(
                f"a memory of {M} states is longer than the model allows (mem_len={c.mem_len})"
            )
        if M + T > c.max_seq_len:
            raise UserError(
                f"memory {M} + segment {T} = {M + T} keys exceed max_seq_len={c.max_seq_len}: "
                f"use segments of at most {c.max_seq_len - M} tokens"
            )

    def num_parameters(self) -> int:
        """Number of distinct parameters (tied weights counted once)."""
        return sum(p.numel() for p in {id(p): p for p in self.parameters()}.values())


register_kind(TransformerXL.kind, TransformerXLConfig, TransformerXL, artifacts="tokenizer")
