"""Universal Transformer encoder with adaptive computation time (Dehghani et al. 2019, with
Graves 2016's halting): one block applied again and again, each position stopping on its own.

    s⁰ = E[idx]
    sⁿ = Block(sⁿ⁻¹ + P_pos + P_step[n])           the same block at every step n = 1 … N
    y  = Σ_n p_n sⁿ                                 ACT's weights per position (layers/act.py)
    logits = W_cls norm_f(y)[first token]

With ``halting="fixed"`` every position takes all ``max_steps`` steps and y is the last state:
the fixed-depth model with the same shared block. The output reports the steps N each position
took, its remainder R and ponder cost N + R; the loss with labels is the cross-entropy plus
τ · (mean ponder cost over real positions).

Shape legend: B batch, T tokens, C d_model, N max_steps, K n_classes.
"""

from __future__ import annotations

from typing import ClassVar, NamedTuple

import torch
from torch import Tensor, nn

from attnlab.config.variants import UniversalConfig
from attnlab.errors import UserError
from attnlab.layers.act import AdaptiveComputation
from attnlab.layers.builders import build_block, build_final_norm
from attnlab.layers.hook import HookPoint
from attnlab.layers.losses import cross_entropy
from attnlab.layers.position import sinusoidal_table
from attnlab.models.registry import register_kind

__all__ = ["UniversalTransformer", "UniversalOutput"]


class UniversalOutput(NamedTuple):
    """What :meth:`UniversalTransformer.forward` returns.

    Attributes:
        logits: ``(B, K)``, read at the first token.
        steps: ``(B, T)`` steps per position (0 at padding).
        remainder: ``(B, T)`` R per position.
        ponder: ``(B, T)`` N + R per position (0 at padding).
        loss: cross-entropy + τ · mean ponder cost, when labels were given (else None).
    """

    logits: Tensor
    steps: Tensor
    remainder: Tensor
    ponder: Tensor
    loss: Tensor | None


class UniversalTransformer(nn.Module):
    """A Universal-Transformer encoder classifier built from
    :class:`~attnlab.config.variants.UniversalConfig`.

    Attributes:
        tok_emb: ``nn.Embedding(V, C)``.
        block: the one :class:`~attnlab.layers.block.TransformerBlock` every step applies.
        act: :class:`~attnlab.layers.act.AdaptiveComputation` with the halting unit ``act.halting``.
        norm_f, head: final norm and the classifier ``nn.Linear(C, K)``.
    """

    kind: ClassVar[str] = "universal_transformer"

    def __init__(self, config: UniversalConfig) -> None:
        super().__init__()
        c = self.config = config
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
        self.register_buffer(
            "pos_table", sinusoidal_table(c.max_seq_len, c.d_model), persistent=False
        )
        self.register_buffer(
            "step_table", sinusoidal_table(c.max_steps + 1, c.d_model), persistent=False
        )
        self.block = build_block(c)
        halting = nn.Linear(c.d_model, 1)
        self.act = AdaptiveComputation(halting, c.max_steps, epsilon=c.act_epsilon)
        self.norm_f = build_final_norm(c)
        self.head = nn.Linear(c.d_model, c.n_classes)
        self.hook_embed = HookPoint()
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=c.init_std)
        nn.init.constant_(halting.bias, c.halting_bias)

    def forward(
        self, idx: Tensor, *, attention_mask: Tensor | None = None, labels: Tensor | None = None
    ) -> UniversalOutput:
        """Classify ``idx (B, T)``.

        Args:
            attention_mask: ``(B, T)`` bool, True = real token (padding on the right or left).
            labels: ``(B,)`` class ids: also return the loss.

        Raises:
            UserError: bad shapes, a sequence longer than ``max_seq_len``.
        """
        c = self.config
        if idx.dim() != 2 or idx.shape[1] > c.max_seq_len:
            raise UserError(
                f"idx must be (B, T) with T <= max_seq_len={c.max_seq_len}, got {tuple(idx.shape)}"
            )
        B, T = idx.shape
        real = (
            torch.ones_like(idx, dtype=torch.bool)
            if attention_mask is None
            else attention_mask.bool()
        )
        key_mask = real[:, None, None, :]  # (B, 1, 1, T)
        pos = self.pos_table[:T]  # (T, C)

        def step(s: Tensor, n: int) -> Tensor:
            return self.block(s + pos + self.step_table[n], mask=key_mask)

        s = self.hook_embed(self.tok_emb(idx))  # (B, T, C)
        if c.halting == "act":
            r = self.act(s, step, real)
            y, steps, remainder, ponder = r.output, r.steps, r.remainder, r.ponder
        else:  # fixed depth: every position takes max_steps steps
            for n in range(1, c.max_steps + 1):
                s = step(s, n)
            y = s
            steps = torch.where(real, c.max_steps, 0)
            remainder = torch.zeros(B, T, device=idx.device)
            ponder = steps.float()
        logits = self.head(self.norm_f(y)[:, 0])  # (B, K)
        loss = None
        if labels is not None:
            mean_ponder = ponder.sum() / real.sum()
            task = cross_entropy(logits, labels)
            loss = task + (c.ponder_cost * mean_ponder if c.halting == "act" else 0.0)
        return UniversalOutput(logits, steps, remainder, ponder, loss)


register_kind(UniversalTransformer.kind, UniversalConfig, UniversalTransformer)
