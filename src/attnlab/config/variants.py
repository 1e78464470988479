"""Configs of the lecture's "other variants": Transformer-XL (segment-level recurrence with
relative positions) and the Universal Transformer with adaptive computation time (ACT).

    TransformerXLConfig.preset("tiny", mem_len=32)      # a CPU-sized Transformer-XL LM
    UniversalConfig.preset("tiny", max_steps=8)         # one shared block, up to 8 steps
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from attnlab.config.base import ConfigError, TextStackConfig

__all__ = ["TransformerXLConfig", "UniversalConfig"]

_SMALL = dict(vocab_size=256, d_model=64, n_heads=4)


@dataclass
class TransformerXLConfig(TextStackConfig):
    """A Transformer-XL language model (Dai et al. 2019): the block and stack fields plus the
    memory.

    Positions are Transformer-XL's own (sinusoidal relative embeddings R and the learned biases
    u, v inside every attention layer), so ``position`` must stay ``none``.

    Attributes:
        max_seq_len: the longest key span one attention call may see, memory included
            (memory M + segment T ≤ max_seq_len); nothing in the model has this many rows, it is
            the length the model is declared for.
        mem_len: M, how many hidden states of earlier segments each layer keeps (0: no memory;
            at most ``max_seq_len - 1``, leaving room for one new token).
    """

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = {
        "tiny": dict(_SMALL, max_seq_len=128, n_layers=2, mem_len=32),
        "mini": dict(_SMALL, d_model=128, max_seq_len=512, n_layers=4, mem_len=128),
    }

    position: Literal["none"] = "none"
    mem_len: int = 32

    def validate(self) -> None:
        super().validate()
        self.positive("mem_len", allow_zero=True)
        if self.mem_len >= self.max_seq_len:
            raise ConfigError(
                f"mem_len={self.mem_len} is longer than the model allows: memory and at least one "
                f"new token must fit in max_seq_len={self.max_seq_len} (use mem_len <= "
                f"{self.max_seq_len - 1} or raise max_seq_len)"
            )
        if self.norm_position != "pre":
            raise ConfigError("Transformer-XL here is pre-norm: norm_position must be 'pre'")


@dataclass
class UniversalConfig(TextStackConfig):
    """A Universal-Transformer encoder (Dehghani et al. 2019): one block applied up to
    ``max_steps`` times, with a position and a step embedding added before every step, halted
    per position by adaptive computation time (Graves 2016), and a classifier on the first
    token.

    Attributes:
        n_layers: unused (one shared block); kept at 1.
        n_classes: the classifier's outputs.
        max_steps: the ponder budget N_max, the most steps any position may take (at least 1).
        halting: ``act`` (each position stops once its halting probabilities reach 1 − ε) or
            ``fixed`` (every position takes ``max_steps`` steps: the fixed-depth baseline with
            the same shared block).
        act_epsilon: ε of the threshold 1 − ε (Graves: 0.01).
        ponder_cost: τ, the weight of the ponder cost N + R in the loss.
        halting_bias: initial bias of the halting unit (Graves starts it positive, so that
            early training halts after few steps).
    """

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = {
        "tiny": dict(_SMALL, max_seq_len=64, max_steps=8),
        "mini": dict(_SMALL, d_model=128, max_seq_len=128, max_steps=12),
    }

    position: Literal["sinusoidal"] = "sinusoidal"
    n_layers: int = 1
    tie_embeddings: bool = False
    n_classes: int = 2
    max_steps: int = 8
    halting: Literal["act", "fixed"] = "act"
    act_epsilon: float = 0.01
    ponder_cost: float = 0.01
    halting_bias: float = 1.0

    def validate(self) -> None:
        super().validate()
        if self.max_steps < 1:
            raise ConfigError(
                f"the ponder budget max_steps={self.max_steps} is below one step: every position "
                "takes at least one step (use max_steps >= 1)"
            )
        if self.n_layers != 1:
            raise ConfigError(
                f"a Universal Transformer has one shared block: n_layers must be 1, got {self.n_layers}"
            )
        self.positive("n_classes")
        self.positive("ponder_cost", allow_zero=True)
        for name in ("ponder_cost", "halting_bias"):
            value = getattr(self, name)
            if not math.isfinite(value) or abs(value) > 100:
                raise ConfigError(
                    f"{name} must be a finite number of at most 100 in size, got {value!r}"
                )
        if not 0.0 < self.act_epsilon < 1.0:
            raise ConfigError(f"act_epsilon must be in (0, 1), got {self.act_epsilon!r}")
