"""Decoder-only Transformer language model: GPT-2, Llama and Mixtral styles from one config.

    h⁰ = s·E[idx] (+ P[positions])               token (+ absolute position) embeddings, s = embed_scale
    hˡ = Block_l(hˡ⁻¹), causal self-attention   l = 1 … L
    logits = norm_f(hᴸ) W_outᵀ                   W_out = E when embeddings are tied
                                                 (c·tanh(logits/c) with logit_softcap c)

Two options of modded-nanogpt change the stack's wiring (both off by default; blocks numbered
0 … L−1 here): value embeddings (``value_embeds = k``) add ``λ_l · Eᵛ_i[idx]`` to the attention
values of layers i and L−1−i for each table i < k; U-Net skips (``unet_skips``) add
``w_i · (output of block i)`` to the input of block L−1−i for i < ⌊L/2⌋. A token shift
(``token_shift``, RWKV's) adds ``μ ⊙ E[idx_{t−1}]`` to each token's embedding before the stack.

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

from attnlab.attention.cache import DecodeState, KVCache
from attnlab.attention.capture import capture_attention
from attnlab.config.lm import ModelConfig
from attnlab.layers.block import run_blocks
from attnlab.layers.builders import build_block, build_final_norm, build_positions
from attnlab.layers.hook import HookPoint
from attnlab.layers.losses import cross_entropy
from attnlab.models.registry import register_kind

__all__ = ["DecoderLM", "LMDecodeState", "HeadLoss"]

#: ``loss(hidden (B, T, C), lm_head, targets (B, T), *, ignore_index, label_smoothing)``
HeadLoss = Callable[..., Tensor]


def _head_cross_entropy(hidden: Tensor, head: nn.Module, targets: Tensor, **kw) -> Tensor:
    """The plain LM loss: the logits ``head(hidden)`` ``(B, T, V)``, then their cross-entropy
    (``kw``: ``ignore_index``, ``label_smoothing``)."""
    return cross_entropy(head(hidden), targets, **kw)


@dataclass
class LMDecodeState(DecodeState):
    """Incremental decoding of a :class:`DecoderLM`: one KV cache per block, and which of the
    tokens fed so far are real (left padding).

    With static caches ``mask`` is a ``(B, max_len)`` buffer written in place at each step's
    slots; ``step_forward`` (when set, e.g. a ``torch.compile`` of the model by
    :mod:`attnlab.fast.compiled`) runs the single-token steps instead of the eager forward.
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
        pos_emb: the position module (:func:`attnlab.layers.builders.build_positions`); only the learned
            one has weights (``pos_emb.weight``).
        blocks: ``nn.ModuleList`` of :class:`TransformerBlock`.
        norm_f: final norm (``nn.Identity`` for post-norm models, whose blocks end normalised).
        lm_head: ``nn.Linear(C, V, bias=False)``; the Parameter ``tok_emb.weight`` when tied.
        value_embeds: ``nn.ModuleList`` of ``config.value_embeds`` tables
            ``nn.Embedding(V, Hkv·D)`` (empty by default); ``value_embed_weights``: one learned
            λ per layer that reads a table (``value_embed_layers``, in order), initialised to
            0.5; None without tables.
        skip_weights: the U-Net skips' learned weights, one per pair (``⌊L/2⌋``), initialised to
            1; None without ``unet_skips``.
        shift_mix: the token shift's per-channel weights μ ``(C,)``, initialised to 0; None
            without ``token_shift``.

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
            build_block(c, shared_positions=True) for _ in range(c.n_layers)
        )
        self.norm_f = build_final_norm(c)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.hook_embed = HookPoint()  # token embeddings (B, T, C); see attnlab.inspect
        # modded-nanogpt's stack options, made after every other weight: turning them on leaves
        # the other weights' initialisation (the random draws) unchanged
        L = c.n_layers
        ve_shape = (c.vocab_size, c.n_kv_heads * c.head_dim)  # (_weight: no random draw here)
        self.value_embeds = nn.ModuleList(
            nn.Embedding(*ve_shape, _weight=torch.empty(ve_shape)) for _ in range(c.value_embeds)
        )
        #: the layers that read a value table: layer i reads table min(i, L-1-i)
        self.value_embed_layers = [i for i in range(L) if min(i, L - 1 - i) < c.value_embeds]
        self.value_embed_weights = (
            nn.Parameter(torch.empty(len(self.value_embed_layers))) if c.value_embeds else None
        )
        self.skip_weights = nn.Parameter(torch.empty(L // 2)) if c.unet_skips else None
        self.shift_mix = nn.Parameter(torch.empty(c.d_model)) if c.token_shift else None
        self.reset_parameters()
        if c.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight

    def reset_parameters(self) -> None:
        """GPT-2 initialisation: N(0, init_std), residual projections scaled by 1/√(2L); the
        value-embedding weights λ start at 0.5, the U-Net skip weights at 1, the token shift's
        μ at 0 (the plain model)."""
        std = self.config.init_std
        resid_std = std / math.sqrt(2 * self.config.n_layers)
        if self.value_embed_weights is not None:
            nn.init.constant_(self.value_embed_weights, 0.5)
        if self.skip_weights is not None:
            nn.init.ones_(self.skip_weights)
        if self.shift_mix is not None:
            nn.init.zeros_(self.shift_mix)
        for name, p in self.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if name in ("value_embed_weights", "skip_weights", "shift_mix"):
                continue  # set above
            if "norm" in name and p.dim() == 1:
                continue  # norm weights stay 1, their biases 0 (as built)
            if leaf == "bias":
                nn.init.zeros_(p)
            elif name.endswith(("out_proj.weight", "fc2.weight", "down.weight", "w_out")):
                nn.init.normal_(p, std=resid_std)  # drawn anyway: other weights stay the same
                if self.config.zero_init_proj:
                    nn.init.zeros_(p)  # each block starts as the identity (modded-nanogpt)
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
        """One empty KV cache per block, for ``batch_size`` rows and up to ``max_len`` tokens;
        with ``token_shift`` one more, last, that keeps each token's embedding ``(B, 1, max_len,
        C)`` for the token after it (cropped and reordered with the others).

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
        caches = [
            blk.attn.make_cache(batch_size, max_len, device=device, dtype=dtype, static=static)
            for blk in self.blocks
        ]
        if self.shift_mix is not None:  # the embeddings, as the "keys" of one head; no values
            C = self.config.d_model
            shift = KVCache(
                batch_size, 1, max_len, C, v_dim=0, device=device, dtype=dtype, static=static
            )
            caches.append(shift)
        return caches

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
        head_loss: HeadLoss | None = None,
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """Next-token logits for every position, or with ``targets`` the training loss.

        Args:
            idx: token ids ``(B, T)``.
            attention_mask: ``(B, S)`` bool, True = real token, covering the cached tokens and
                these ``T``; left padding is how batches of unequal prompts are formed.
            caches: KV caches from :meth:`make_caches` (one per block, then the token shift's);
                this call appends its T tokens. With static caches ``attention_mask`` is
                ``(B, max_len)`` over every cache slot.
            positions: absolute positions ``(T,)`` or ``(B, T)``; default: the count of earlier
                real tokens in the row (``past + arange(T)`` without a mask).
            need_weights: also return each block's attention weights (the math attention path).
            logits_to_keep: compute logits for the last this many positions only (generation
                needs just the last one; the output projection is the costliest matmul).
            targets: ``(B, T)`` next-token ids: return the mean cross-entropy of the logits
                instead of the logits.
            label_smoothing: ε for the loss with ``targets``.
            ignore_index: target id that does not count in the loss.
            head_loss: how the loss is computed from the final hidden states and ``lm_head``
                (default: the logits, then :func:`attnlab.layers.losses.cross_entropy`); the LM
                task passes :class:`attnlab.fast.FusedLMLoss`, which never keeps the logits.

        Returns:
            logits ``(B, T, V)`` (or ``(B, logits_to_keep, V)``); with ``need_weights``,
            ``(logits, weights)`` with one ``(B, H, T, S)`` tensor per block; with
            ``targets``, the scalar loss (mean over the targets that are not
            ``ignore_index``).

        Raises:
            ValueError: wrong shapes, a sequence longer than ``max_seq_len``, mismatched caches.
        """
        if need_weights:
            if targets is not None:
                raise ValueError("targets (the loss) cannot be combined with need_weights")
            with capture_attention(self) as maps:
                logits = self(
                    idx,
                    attention_mask=attention_mask,
                    caches=caches,
                    positions=positions,
                    logits_to_keep=logits_to_keep,
                )
            return logits, maps.select("attn")
        self._check_inputs(idx, caches, targets, logits_to_keep)
        mask, positions, attn_positions, is_causal = self._masks(
            idx, caches, attention_mask, positions
        )
        x = self.hook_embed(self.tok_emb(idx))  # (B, T, C)
        block_caches = caches
        if self.shift_mix is not None:
            shift_cache = None if caches is None else caches[-1]
            x = self._token_shift(x, shift_cache, attention_mask)
            block_caches = None if caches is None else caches[:-1]
        x = x * self.config.embed_scale  # √d for sinusoids
        x = self.drop(self.pos_emb.embed(x, positions))  # (B, T, C)
        x = self._run_stack(
            x,
            idx,
            block_caches,
            mask=mask,
            is_causal=is_causal,
            positions=attn_positions,
            pos_emb=self.pos_emb,
        )
        head = self.lm_head if self.config.logit_softcap is None else self._capped_head
        if targets is not None:
            # a soft cap needs the logits themselves: the plain loss, not a fused one
            loss = head_loss if head is self.lm_head and head_loss else _head_cross_entropy
            return loss(
                self.norm_f(x),
                head,
                targets,
                ignore_index=ignore_index,
                label_smoothing=label_smoothing,
            )
        if logits_to_keep is not None:
            x = x[:, -logits_to_keep:]  # (B, logits_to_keep, C)
        return head(self.norm_f(x))  # (B, T, V)

    def _run_stack(self, x: Tensor, idx: Tensor, caches: list[KVCache] | None, **kwargs) -> Tensor:
        """``x (B, T, C)`` through the blocks (``kwargs``: masks and positions for every block).

        With value embeddings, layer l's attention adds ``λ_l · Eᵛ_i[idx]`` to its values
        (table ``i = min(l, L-1-l)``); with U-Net skips, the input of block ``L-1-i`` gets
        ``w_i ·`` the output of block ``i`` for each ``i < L // 2``.
        """
        c = self.config
        checkpointing = c.activation_checkpointing
        if not c.value_embeds and not c.unet_skips:  # the plain stack
            return run_blocks(self.blocks, x, caches=caches, checkpointing=checkpointing, **kwargs)
        L = len(self.blocks)
        tables = [table(idx) for table in self.value_embeds]  # (B, T, Hkv·D) each
        lambdas = () if self.value_embed_weights is None else self.value_embed_weights
        weights = dict(zip(self.value_embed_layers, lambdas))  # layer -> its λ
        n_skips = L // 2 if c.unet_skips else 0
        skips: list[Tensor] = []  # the first half's outputs: the last one in is the first out
        for i, block in enumerate(self.blocks):
            if i >= L - n_skips:
                x = x + self.skip_weights[L - 1 - i] * skips.pop()
            if i in weights:
                kwargs["value_embed"] = weights[i] * tables[min(i, L - 1 - i)]
            else:
                kwargs.pop("value_embed", None)
            cache = None if caches is None else [caches[i]]
            x = run_blocks([block], x, caches=cache, checkpointing=checkpointing, **kwargs)
            if i < n_skips:
                skips.append(x)
        return x

    def _token_shift(
        self, e: Tensor, cache: KVCache | None, attention_mask: Tensor | None
    ) -> Tensor:
        """``e_t + μ ⊙ e_{t−1}`` for the new tokens' embeddings ``e (B, T, C)``; the embeddings of
        earlier tokens are read back from ``cache``. A token with no real predecessor (the
        first of a sequence, or the first after left padding) is left as it is."""
        T = e.shape[1]
        if cache is None and attention_mask is None:  # training: the whole sequence at once
            prev = nn.functional.pad(e[:, :-1], (0, 0, 1, 0))  # (B, T, C): zeros, then e_<T
            return e + self.shift_mix * prev
        past = 0 if cache is None else (cache.cursor if cache.static else cache.length)
        before = past + torch.arange(T, device=e.device) - 1  # (T,): the predecessors' slots
        seen = e if cache is None else cache.update(e[:, None], e[:, None, :, :0])[0][:, 0]
        has = (before >= 0)[None, :]  # (1, T)
        before = before.clamp(min=0)
        if attention_mask is not None:  # (B, S): a padded predecessor is none
            has = has & attention_mask.to(device=e.device, dtype=torch.bool).index_select(1, before)
        prev = seen.index_select(1, before)  # (B, T, C)
        return e + self.shift_mix * (prev * has[..., None])

    def _capped_head(self, h: Tensor) -> Tensor:
        """Soft-capped logits ``c · tanh(W_out h / c)`` (``config.logit_softcap = c``)."""
        cap = self.config.logit_softcap
        return cap * torch.tanh(self.lm_head(h) / cap)

    def _check_inputs(
        self,
        idx: Tensor,
        caches: list[KVCache] | None,
        targets: Tensor | None,
        logits_to_keep: int | None,
    ) -> None:
        if idx.dim() != 2:
            raise ValueError(f"idx must be (B, T) token ids, got shape {tuple(idx.shape)}")
        expected = len(self.blocks) + (self.shift_mix is not None)  # the token shift's: one more
        if caches is not None and len(caches) != expected:
            raise ValueError(f"expected {expected} caches (from make_caches), got {len(caches)}")
        if targets is not None and logits_to_keep is not None:
            raise ValueError("targets (the loss) cannot be combined with logits_to_keep")
        if targets is not None and targets.shape != idx.shape:
            raise ValueError(
                f"targets {tuple(targets.shape)} must have idx's shape {tuple(idx.shape)}"
            )

    def _masks(
        self,
        idx: Tensor,
        caches: list[KVCache] | None,
        attention_mask: Tensor | None,
        positions: Tensor | None,
    ) -> tuple[Tensor | None, Tensor, Tensor, bool]:
        """The key mask, the positions (embeddings), the attention's positions and ``is_causal``
        of ``T`` new tokens written after ``past`` cached ones: token t sits in cache slot
        ``past + t``, and the keys are ``S`` slots (dynamic caches or none: the ``past + T``
        written; static: all ``max_len``, of which those after each query's own are unwritten
        or stale, so the causal constraint becomes part of the mask)."""
        B, T = idx.shape
        static = bool(caches) and caches[0].static
        if static:
            past, S = caches[0].cursor, caches[0].max_seq_len  # a tensor: no sync, compiles once
        else:
            past = 0 if caches is None else caches[0].length
            S = past + T
            if S > self.config.max_seq_len:
                raise ValueError(
                    f"sequence of {S} tokens exceeds the context "
                    f"max_seq_len={self.config.max_seq_len}"
                )
        slots = past + torch.arange(T, device=idx.device)  # (T,)
        derived = positions is None
        mask = None
        if attention_mask is not None:
            if attention_mask.shape != (B, S):
                what = "every slot, (B, max_len)" if static else "(B, past + T)"
                raise ValueError(
                    f"attention_mask must cover {what} = {(B, S)}, got "
                    f"{tuple(attention_mask.shape)}"
                )
            real = attention_mask.to(device=idx.device, dtype=torch.bool)
            mask = real[:, None, None, :]  # (B, 1, 1, S): broadcast over heads and queries
            if derived:  # real-token positions: a left-padded row counts from its first real one
                positions = (real.long().cumsum(-1) - 1).clamp(min=0).index_select(1, slots)
        if derived and attention_mask is None:
            positions = slots
        is_causal = T > 1 or caches is None  # one new token may see every cached key
        if static:
            causal = torch.arange(S, device=idx.device) <= slots[:, None]  # (T, S)
            mask = causal[None, None] if mask is None else mask & causal  # (B or 1, 1, T, S)
            is_causal = False
        # ALiBi's bias depends only on the distance i − j, which padding does not change, and the
        # attention layer measures it in cache slots; give it slot positions unless told otherwise
        alibi_slots = self.config.position == "alibi" and derived
        return mask, positions, (slots if alibi_slots else positions), is_causal

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
        """Number of distinct parameters (tied weights counted once; ``exclude_embeddings``:
        without the token, position and value-embedding tables)."""
        seen = {id(p): p for p in self.parameters()}
        n = sum(p.numel() for p in seen.values())
        if exclude_embeddings:  # the token, position and value-embedding tables
            n -= self.tok_emb.weight.numel()
            n -= sum(p.numel() for p in self.pos_emb.parameters())
            n -= sum(p.numel() for p in self.value_embeds.parameters())
        return n


register_kind(DecoderLM.kind, ModelConfig, DecoderLM, artifacts="tokenizer")
