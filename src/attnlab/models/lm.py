"""Decoder-only Transformer language model: GPT-2, Llama and Mixtral styles from one config.

    h⁰ = s·E[idx] (+ P[positions])               token (+ absolute position) embeddings, s = embed_scale
    hˡ = Block_l(hˡ⁻¹), causal self-attention   l = 1 … L
    logits = norm_f(hᴸ) W_outᵀ                   W_out = E when embeddings are tied

The causal mask is always on. Positions go through the one interface of
:mod:`attnlab.layers.position`: the model owns one position module (``pos_emb``) whose ``embed``
adds absolute positions and whose ``rotate``/``bias`` (RoPE, ALiBi) every block's attention
applies. Left-padded batches are supported through ``attention_mask`` (True = real token): padded
keys are masked out and each row's positions count only its real tokens, so a padded prompt
behaves exactly like the prompt alone. Incremental decoding (:meth:`DecoderLM.start_decoding`,
:meth:`DecoderLM.decode_step`) keeps one KV cache per block, dynamic (the keys grow by one per
step) or static (``static=True``: preallocated buffers written at a cursor, every key slot read
with a mask that hides the slots not written yet, so every step has the same shapes and compiles
once; see :mod:`attnlab.attention.cache`).

Shape legend: B batch, T new tokens, S = past + T keys, C d_model, V vocab_size, H heads.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import Tensor, nn
from torch.nn.modules import module as _module

from attnlab.attention.cache import DecodeState, KVCache
from attnlab.attention.capture import capture_attention
from attnlab.config.lm import ModelConfig
from attnlab.layers.block import build_block, build_final_norm, run_blocks
from attnlab.layers.hook import HookPoint
from attnlab.layers.losses import LinearCEBuffer, cross_entropy, linear_cross_entropy
from attnlab.layers.matvec import Linear
from attnlab.layers.position import build_positions
from attnlab.models.registry import register_kind

__all__ = ["DecoderLM", "LMDecodeState"]


@dataclass
class LMDecodeState(DecodeState):
    """Incremental decoding of a :class:`DecoderLM`: one KV cache per block, and which of the
    tokens fed so far are real (left padding).

    With static caches ``mask`` is a ``(B, max_len)`` buffer written in place at each step's
    slots; ``step_forward`` (when set, e.g. a ``torch.compile`` of the model by
    :mod:`attnlab.decoding.compiled`) runs the single-token steps instead of the eager forward.
    """

    caches: list[KVCache]
    mask: Tensor  # (B, S) bool: True = real token, for the S tokens fed so far (static: S=max_len)
    padded: bool = field(default=False)  # some row has padding: pass the mask to the model
    step_forward: Callable[..., Tensor] | None = field(default=None, repr=False)

    @property
    def static(self) -> bool:
        """True when the caches are static (fixed shapes)."""
        return bool(self.caches) and self.caches[0].static


class DecoderLM(nn.Module):
    """A decoder-only language model built from :class:`attnlab.ModelConfig`.

    Args:
        config: the model configuration (see :class:`attnlab.config.ModelConfig`).

    Attributes (a stable layout that :mod:`attnlab.interop` maps to Hugging Face names):
        tok_emb: ``nn.Embedding(V, C)``.
        pos_emb: the position module (:func:`attnlab.layers.build_positions`); only the learned
            one has weights (``pos_emb.weight``).
        blocks: ``nn.ModuleList`` of :class:`TransformerBlock`.
        norm_f: final norm (``nn.Identity`` for post-norm models, whose blocks end normalised).
        lm_head: ``nn.Linear(C, V, bias=False)``; the Parameter ``tok_emb.weight`` when tied.

    MoE load-balancing losses are reported to :func:`attnlab.attention.collect_aux_losses`.
    """

    kind: ClassVar[str] = "decoder_lm"

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
        self.pos_emb = build_positions(c, causal=True)  # T5: buckets for earlier keys only
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(
            build_block(c, positions=self.pos_emb) for _ in range(c.n_layers)
        )
        self.norm_f = build_final_norm(c)
        self.lm_head = Linear(c.d_model, c.vocab_size, bias=False)  # an nn.Linear
        self.hook_embed = HookPoint()  # token embeddings (B, T, C); see attnlab.inspect
        self.reset_parameters()
        if c.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight

    def reset_parameters(self) -> None:
        """GPT-2 initialisation: N(0, init_std), residual projections scaled by 1/√(2L)."""
        std = self.config.init_std
        resid_std = std / math.sqrt(2 * self.config.n_layers)
        for name, p in self.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if "norm" in name and p.dim() == 1:
                continue  # norm weights stay 1, their biases 0 (as built)
            if leaf == "bias":
                nn.init.zeros_(p)
            elif name.endswith(("out_proj.weight", "fc2.weight", "down.weight", "w_out")):
                nn.init.normal_(p, std=resid_std)
            else:
                nn.init.normal_(p, std=std)

    def make_caches(
        self,
        batch_size: int,
        max_len: int | None = None,
        *,
        device=None,
        dtype=None,
        static: bool = False,
    ) -> list[KVCache]:
        """One empty KV cache per block, for ``batch_size`` rows and up to ``max_len`` tokens.

        Args:
            dtype: the caches' dtype (default: the embeddings', which stay floating point when
                the linear layers are quantised).
            static: fixed-shape caches (see :mod:`attnlab.attention.cache`).

        Raises:
            ValueError: ``max_len`` beyond the context ``max_seq_len``.
        """
        max_len = self.config.max_seq_len if max_len is None else max_len
        if max_len > self.config.max_seq_len:
            raise ValueError(f"max_len={max_len} exceeds max_seq_len={self.config.max_seq_len}")
        device = device or self.tok_emb.weight.device
        dtype = dtype or self.tok_emb.weight.dtype
        return [
            blk.attn.make_cache(batch_size, max_len, device=device, dtype=dtype, static=static)
            for blk in self.blocks
        ]

    def forward(
        self,
        idx: Tensor,
        *,
        attention_mask: Tensor | None = None,
        caches: list[KVCache] | None = None,
        positions: Tensor | None = None,
        need_weights: bool = False,
        logits_to_keep: int | None = None,
        targets: Tensor | None = None,
        label_smoothing: float = 0.0,
        ignore_index: int = -100,
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """Next-token logits for every position, or with ``targets`` the training loss.

        Args:
            idx: token ids ``(B, T)``.
            attention_mask: ``(B, S)`` bool, True = real token, covering the cached tokens and
                these ``T``; left padding is how batches of unequal prompts are formed.
            caches: KV caches from :meth:`make_caches`; this call appends its T tokens. With
                static caches ``attention_mask`` is ``(B, max_len)`` over every cache slot.
            positions: absolute positions ``(T,)`` or ``(B, T)``; default: the count of earlier
                real tokens in the row (``past + arange(T)`` without a mask).
            need_weights: also return each block's attention weights (the math attention path).
            logits_to_keep: compute logits for the last this many positions only (generation
                needs just the last one; the output projection is the costliest matmul).
            targets: ``(B, T)`` next-token ids: return the mean cross-entropy instead of the
                logits, with the output projection and the loss fused
                (:func:`attnlab.layers.losses.linear_cross_entropy`: the ``(B, T, V)``
                logits are written once, into a buffer the model keeps between steps, and
                overwritten with their gradient; a graph break under ``torch.compile``).
                Under autocast, or with a replaced or hooked ``lm_head``, the logits are
                computed and :func:`attnlab.layers.losses.cross_entropy` applied, which gives
                the same value.
            label_smoothing: ε for the loss with ``targets``.
            ignore_index: target id that does not count in the loss.

        Returns:
            logits ``(B, T, V)`` (or ``(B, logits_to_keep, V)``); with ``need_weights``,
            ``(logits, weights)`` with one ``(B, H, T, S)`` tensor per block; with
            ``targets``, the scalar loss (mean over the targets that are not
            ``ignore_index``).

        Raises:
            ValueError: wrong shapes, a sequence longer than ``max_seq_len``, mismatched caches.
        """
        if targets is not None and (need_weights or logits_to_keep is not None):
            raise ValueError(
                "targets (the loss) cannot be combined with need_weights or logits_to_keep"
            )
        if targets is not None and targets.shape != idx.shape:
            raise ValueError(
                f"targets {tuple(targets.shape)} must have idx's shape {tuple(idx.shape)}"
            )
        if need_weights:
            with capture_attention(self) as maps:
                logits = self(
                    idx,
                    attention_mask=attention_mask,
                    caches=caches,
                    positions=positions,
                    logits_to_keep=logits_to_keep,
                )
            return logits, maps.select("attn")
        if idx.dim() != 2:
            raise ValueError(f"idx must be (B, T) token ids, got shape {tuple(idx.shape)}")
        if caches is not None and len(caches) != len(self.blocks):
            raise ValueError(f"expected {len(self.blocks)} caches, got {len(caches)}")
        if caches and caches[0].static:
            mask, positions, attn_positions = self._static_masks(
                idx, caches, attention_mask, positions
            )
            is_causal = False  # the mask holds the causal constraint, by cache slot
        else:
            mask, positions, attn_positions, is_causal = self._dynamic_masks(
                idx, caches, attention_mask, positions
            )
        x = self._blocks(idx, positions, mask, is_causal, attn_positions, caches)
        if targets is not None:
            return self._loss(x, targets, label_smoothing, ignore_index)
        return self._head(x, logits_to_keep)

    def _dynamic_masks(
        self,
        idx: Tensor,
        caches: list[KVCache] | None,
        attention_mask: Tensor | None,
        positions: Tensor | None,
    ) -> tuple[Tensor | None, Tensor, Tensor | None, bool]:
        """Key mask ``(B, 1, 1, S)`` or None, positions, attention positions and ``is_causal`` of
        a forward without a cache or over dynamic caches (``S`` = cached + new tokens)."""
        c = self.config
        B, T = idx.shape
        past = 0 if caches is None else caches[0].length
        S = past + T
        if S > c.max_seq_len:
            raise ValueError(
                f"sequence of {S} tokens exceeds the context max_seq_len={c.max_seq_len}"
            )
        mask = None
        derived_positions = positions is None
        if attention_mask is not None:
            if attention_mask.shape != (B, S):
                raise ValueError(
                    f"attention_mask must be (B, past + T) = {(B, S)}, got "
                    f"{tuple(attention_mask.shape)}"
                )
            attention_mask = attention_mask.to(device=idx.device, dtype=torch.bool)
            if positions is None:
                # real-token positions: a left-padded row counts from its first real token
                positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, past:]  # (B, T)
            mask = attention_mask[:, None, None, :]  # (B, 1, 1, S): broadcast over heads, queries
        elif positions is None:
            positions = torch.arange(past, S, device=idx.device)  # (T,)
        # ALiBi's bias depends only on the distance i − j, which padding does not change, and the
        # attention layer measures it in cache slots; give it slot positions unless told otherwise
        attn_positions = None if (c.position == "alibi" and derived_positions) else positions
        # the causal constraint is vacuous for a single new token (it may see every cached key)
        is_causal = T > 1 or caches is None
        return mask, positions, attn_positions, is_causal

    def _static_masks(
        self,
        idx: Tensor,
        caches: list[KVCache],
        attention_mask: Tensor | None,
        positions: Tensor | None,
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """Mask ``(B or 1, 1, T, max_len)``, positions and attention positions of a step over
        static caches: query t sits in slot ``cursor + t`` and sees the slots up to its own
        (every later slot is unwritten or stale) that hold real tokens."""
        B, T = idx.shape
        capacity = caches[0].max_seq_len
        slots = caches[0].cursor + torch.arange(T, device=idx.device)  # (T,)
        allowed = torch.arange(capacity, device=idx.device) <= slots[:, None]  # (T, max_len)
        derived = positions is None
        if attention_mask is None:
            mask = allowed[None, None]  # (1, 1, T, max_len)
            if derived:
                positions = slots
        else:
            if attention_mask.shape != (B, capacity):
                raise ValueError(
                    f"with static caches attention_mask must cover every slot, (B, max_len) = "
                    f"{(B, capacity)}, got {tuple(attention_mask.shape)}"
                )
            real = attention_mask.to(device=idx.device, dtype=torch.bool)
            mask = allowed[None, None] & real[:, None, None, :]  # (B, 1, T, max_len)
            if derived:  # real-token positions, as in the dynamic path
                positions = (real.long().cumsum(-1) - 1).clamp(min=0).index_select(1, slots)
        alibi_slots = self.config.position == "alibi" and derived
        return mask, positions, (slots if alibi_slots else positions)

    def _blocks(
        self,
        idx: Tensor,
        positions: Tensor,
        mask: Tensor | None,
        is_causal: bool,
        attn_positions: Tensor | None,
        caches: list[KVCache] | None,
    ) -> Tensor:
        """Embeddings and the blocks: ``(B, T)`` ids -> ``(B, T, C)``."""
        c = self.config
        x = self.hook_embed(self.tok_emb(idx)) * c.embed_scale  # (B, T, C); √d for sinusoids
        x = self.drop(self.pos_emb.embed(x, positions))  # (B, T, C)
        return run_blocks(
            self.blocks,
            x,
            caches=caches,
            checkpointing=c.activation_checkpointing,
            mask=mask,
            is_causal=is_causal,
            positions=attn_positions,
        )

    def _head(self, x: Tensor, logits_to_keep: int | None) -> Tensor:
        if logits_to_keep is not None:
            x = x[:, -logits_to_keep:]  # (B, logits_to_keep, C)
        return self.lm_head(self.norm_f(x))  # (B, T, V)

    def _loss(
        self, x: Tensor, targets: Tensor, label_smoothing: float, ignore_index: int
    ) -> Tensor:
        head = self.lm_head
        h = self.norm_f(x)  # (B, T, C)
        fusable = (
            type(head) in (nn.Linear, Linear)
            and not (head._forward_hooks or head._forward_pre_hooks)
            and not (_module._global_forward_hooks or _module._global_forward_pre_hooks)
            and not torch.is_autocast_enabled(h.device.type)
            and h.dtype == head.weight.dtype
        )
        if fusable:
            if getattr(self, "_ce_buffer", None) is None:
                self._ce_buffer = LinearCEBuffer()  # not a buffer in torch's sense: not saved
            return linear_cross_entropy(
                h,
                head.weight,
                targets,
                bias=head.bias,
                ignore_index=ignore_index,
                label_smoothing=label_smoothing,
                buffer=self._ce_buffer,
            )
        return cross_entropy(
            head(h), targets, ignore_index=ignore_index, label_smoothing=label_smoothing
        )

    # -- incremental decoding (the interface of attnlab.decoding) -------------------------------

    def start_decoding(
        self, batch_size: int, max_len: int | None = None, *, device=None, static: bool = False
    ) -> LMDecodeState:
        """An empty state for ``batch_size`` rows and up to ``max_len`` tokens (prompt included).

        Args:
            static: preallocated fixed-shape caches and mask (what a compiled step needs).
        """
        device = device or self.tok_emb.weight.device
        caches = self.make_caches(batch_size, max_len, device=device, static=static)
        width = caches[0].max_seq_len if static and caches else 0
        return LMDecodeState(
            caches=caches, mask=torch.zeros(batch_size, width, dtype=torch.bool, device=device)
        )

    def decode_step(
        self, tokens: Tensor, state: LMDecodeState, *, attention_mask: Tensor | None = None
    ) -> tuple[Tensor, LMDecodeState]:
        """Feed ``tokens (B, T)`` (a left-padded prompt, then one token at a time).

        Args:
            attention_mask: ``(B, T)``, True = real token (default: all real).

        Returns:
            ``(logits (B, V) of the next token, state)``.
        """
        new = (
            torch.ones_like(tokens, dtype=torch.bool)
            if attention_mask is None
            else attention_mask.to(device=tokens.device, dtype=torch.bool)
        )
        if attention_mask is not None:  # (a token fed without a mask is real)
            state.padded = state.padded or not bool(new.all())
        forward = self
        if state.static:
            slots = state.caches[0].cursor + torch.arange(tokens.shape[1], device=tokens.device)
            state.mask.index_copy_(1, slots, new)  # in place: the buffer keeps its address
            if tokens.shape[1] == 1 and state.step_forward is not None:
                forward = state.step_forward
        else:
            state.mask = torch.cat([state.mask, new], dim=1)
        logits = forward(
            tokens,
            caches=state.caches,
            attention_mask=state.mask if state.padded else None,
            logits_to_keep=1,
        )
        return logits[:, -1], state

    def num_parameters(self, *, exclude_embeddings: bool = False) -> int:
        """Number of distinct parameters (tied weights counted once)."""
        seen = {id(p): p for p in self.parameters()}
        n = sum(p.numel() for p in seen.values())
        if exclude_embeddings:
            n -= self.tok_emb.weight.numel()
            n -= sum(p.numel() for p in self.pos_emb.parameters())
        return n


register_kind(DecoderLM.kind, ModelConfig, DecoderLM, artifacts="tokenizer")
