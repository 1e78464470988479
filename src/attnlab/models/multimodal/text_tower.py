"""The text tower of a dual encoder: a Transformer encoder pooled at the end-of-text token, or a
bag of words.

Transformer (CLIP's text model):

    x = E[ids] + P[0..T)
    x = Block_l(x)  (causal: token t sees tokens ≤ t)      l = 1 … L
    feature = LN_f(x)[eos]                                  the output at the end-of-text token

With a causal mask the end-of-text token is the first that has read the whole text, which is why
CLIP pools there (the padding after it cannot reach it). Bag of words: the mean of the token
embeddings of the non-padding tokens, the same for every word order.

Shape legend: B batch, T tokens, C d_model, V vocab_size.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.config.clip import TextTowerConfig
from attnlab.errors import UserError
from attnlab.layers.builders import build_block, build_final_norm, build_positions
from attnlab.layers.hook import HookPoint

__all__ = ["TextTower", "check_token_ids", "eos_positions"]


def check_token_ids(ids: Tensor, config: TextTowerConfig) -> None:
    """Refuse anything but ``(B, T)`` integer ids below ``vocab_size`` within the context.

    Raises:
        UserError: an image (or any float tensor), the wrong rank, too many tokens, or ids out of
            range — named with the shape or value.
    """
    if ids.is_floating_point() or ids.dtype == torch.bool:
        what = "an image batch" if ids.dim() == 4 else f"a {ids.dtype} tensor"
        raise UserError(
            f"the text tower reads token ids (B, T) of integers, got {what} of shape "
            f"{tuple(ids.shape)}; images go to encode_image"
        )
    if ids.dim() != 2:
        raise UserError(f"the text tower reads token ids (B, T), got shape {tuple(ids.shape)}")
    if ids.shape[1] > config.max_seq_len:
        raise UserError(
            f"{ids.shape[1]} tokens exceed the text tower's context max_seq_len="
            f"{config.max_seq_len}"
        )
    if ids.numel() and not 0 <= int(ids.min()) <= int(ids.max()) < config.vocab_size:
        raise UserError(
            f"token ids must lie in [0, {config.vocab_size}), got {int(ids.min())}..{int(ids.max())}"
        )


def eos_positions(ids: Tensor, config: TextTowerConfig) -> Tensor:
    """``(B,)``: where each text's feature is read (see ``TextTowerConfig.eos_pooling``).

    Raises:
        UserError: ``first`` pooling and a text without its end-of-text token.
    """
    if config.eos_pooling == "argmax":
        return ids.argmax(dim=-1)
    hit = ids == config.eos_id  # (B, T)
    if not bool(hit.any(dim=-1).all()):
        raise UserError(
            f"every text needs its end-of-text token (id {config.eos_id}): the text tower reads "
            "its feature there"
        )
    return hit.int().argmax(dim=-1)  # the first occurrence


class TextTower(nn.Module):
    """One feature vector per text; see the module docstring.

    Args:
        config: a :class:`~attnlab.config.clip.TextTowerConfig`.

    Attributes:
        tok_emb: ``nn.Embedding(V, C)``; pos_emb: the position module (learned: ``weight``);
        blocks: the Transformer blocks (empty for ``bow``); norm_f: the final norm.
    """

    def __init__(self, config: TextTowerConfig) -> None:
        super().__init__()
        self.config = c = config
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
        self.hook_embed = HookPoint()  # token embeddings (B, T, C)
        transformer = c.arch == "transformer"
        self.pos_emb = build_positions(c, causal=c.causal) if transformer else None
        self.drop = nn.Dropout(c.dropout)
        n = c.n_layers if transformer else 0
        self.blocks = nn.ModuleList(build_block(c, shared_positions=True) for _ in range(n))
        self.norm_f = build_final_norm(c) if transformer else nn.Identity()
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Weights N(0, init_std), biases 0, norms as built (1 and 0)."""
        for name, p in self.named_parameters():
            owner = name.rsplit(".", 2)[-2] if "." in name else ""
            if "norm" in owner and p.dim() == 1:
                continue
            if name.endswith("bias"):
                nn.init.zeros_(p)
            else:
                nn.init.normal_(p, std=self.config.init_std)

    @property
    def feature_dim(self) -> int:
        return self.config.d_model

    def encode(self, ids: Tensor) -> Tensor:
        """Every token's output ``(B, T, C)`` after the final norm (the embeddings for ``bow``).

        Raises:
            UserError: see :func:`check_token_ids`.
        """
        c = self.config
        check_token_ids(ids, c)
        x = self.hook_embed(self.tok_emb(ids))  # (B, T, C)
        if c.arch == "bow":
            return x
        T = ids.shape[1]
        positions = torch.arange(T, device=ids.device)  # (T,)
        x = self.drop(self.pos_emb.embed(x, positions))
        mask = None
        if not c.causal:
            mask = (ids != c.pad_id)[:, None, None, :]  # (B, 1, 1, T): padding keys left out
        for block in self.blocks:
            x = block(x, mask=mask, is_causal=c.causal, positions=positions, pos_emb=self.pos_emb)
        return self.norm_f(x)

    def forward(self, ids: Tensor) -> Tensor:
        """``(B, T) -> (B, C)``: the output at the end-of-text token (``bow``: the mean of the
        non-padding embeddings)."""
        x = self.encode(ids)
        if self.config.arch == "bow":
            real = (ids != self.config.pad_id).unsqueeze(-1).to(x.dtype)  # (B, T, 1)
            return (x * real).sum(1) / real.sum(1).clamp_min(1.0)
        at = eos_positions(ids, self.config)  # (B,)
        return x[torch.arange(x.shape[0], device=x.device), at]  # (B, C)
