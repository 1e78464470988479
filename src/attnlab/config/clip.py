"""Config of the CLIP-style dual encoder: a vision config and a text config, nested.

    ClipConfig.preset("tiny", text={"arch": "bow"})
    ClipConfig(vision=ViTConfig(...), text=TextTowerConfig(...), projection_dim=32)

The image tower is the vision family's ViT (:class:`~attnlab.config.ViTConfig`, with CLIP's
``embed_norm`` — HF's ``pre_layrnorm`` — and a bias-free patch projection); the text tower is a
Transformer encoder over token ids (:class:`TextTowerConfig`, causal as in CLIP, pooled at the
end-of-text token) or, as a baseline, a bag of words. ``from_dict`` and :func:`merge_nested`
merge nested mappings key by key, so ``text={"arch": "bow"}`` on top of a preset changes one
field of the text tower and keeps the rest.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from attnlab.config.base import Activation, BlockConfig, Config, ConfigError
from attnlab.config.vision import ViTConfig

__all__ = ["TextTowerConfig", "ClipConfig", "CLIP_PRESETS", "merge_nested"]

#: CLIP's choices for both towers (Radford et al. 2021; HF ``CLIPConfig``): pre-LN, quick GELU,
#: LayerNorm ε 1e-5, learned positions
_CLIP_BLOCK = dict(activation="quick_gelu", norm_eps=1e-5, norm_position="pre", position="learned")
_VISION = dict(
    _CLIP_BLOCK,
    image_size=32,
    patch_size=4,
    in_channels=3,
    num_classes=0,
    pooling="cls",
    embed_norm=True,
    patch_bias=False,
)

CLIP_PRESETS: dict[str, dict[str, Any]] = {
    # CPU seconds per hundred steps on 32x32 scenes: 64 patches, captions of <= 24 tokens
    "tiny": dict(
        vision=dict(_VISION, d_model=32, n_layers=2, n_heads=4, ffn_hidden=64),
        text=dict(_CLIP_BLOCK, d_model=32, n_layers=2, n_heads=4, ffn_hidden=64),
        projection_dim=32,
    ),
    "small": dict(
        vision=dict(_VISION, d_model=64, n_layers=4, n_heads=4, ffn_hidden=128),
        text=dict(_CLIP_BLOCK, d_model=64, n_layers=2, n_heads=4, ffn_hidden=128),
        projection_dim=64,
    ),
}


def merge_nested(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``over`` on top, nested mappings merged key by key (not replaced)."""
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Config):
            v = v.to_dict()
        old = out.get(k)
        if isinstance(old, Config):
            old = old.to_dict()
        out[k] = merge_nested(old, v) if isinstance(old, Mapping) and isinstance(v, Mapping) else v
    return out


@dataclass
class TextTowerConfig(BlockConfig):
    """The text tower of a dual encoder: a Transformer encoder over token ids, or a bag of words.

    The block fields default to CLIP's text model (pre-LN, quick GELU, ε 1e-5, learned positions).

    Attributes:
        arch: ``transformer`` (blocks, final norm, the feature at the end-of-text token) or
            ``bow`` (the mean of the token embeddings of the non-padding tokens: no order, no
            attention; the baseline).
        vocab_size: V, special tokens included.
        max_seq_len: longest text in tokens (rows of the learned position table).
        n_layers: blocks (transformer only).
        causal: each token sees only earlier ones (CLIP's text model); False: bidirectional,
            padding keys masked.
        eos_id: the end-of-text token whose output is the text's feature.
        eos_pooling: ``first`` (the first position holding ``eos_id``, HF since PR 24773) or
            ``argmax`` (the position of the largest id: original CLIP, whose EOS has the top id,
            and HF when ``eos_token_id == 2``).
        pad_id: the padding token (the bag of words and bidirectional masks leave it out).
        init_std: standard deviation of the normal initialisation.
    """

    arch: Literal["transformer", "bow"] = "transformer"
    activation: Activation = "quick_gelu"
    vocab_size: int = 64
    max_seq_len: int = 24
    n_layers: int = 2
    causal: bool = True
    eos_id: int = 3
    eos_pooling: Literal["first", "argmax"] = "first"
    pad_id: int = 0
    init_std: float = 0.02

    def validate(self) -> None:
        super().validate()
        self.positive("vocab_size", "max_seq_len", "n_layers", "init_std")
        for name in ("eos_id", "pad_id"):
            if not 0 <= getattr(self, name) < self.vocab_size:
                raise ConfigError(
                    f"{name}={getattr(self, name)} is not a token id of vocab_size={self.vocab_size}"
                )


@dataclass
class ClipConfig(Config):
    """A CLIP-style dual encoder (:class:`attnlab.models.multimodal.clip.DualEncoder`).

    Attributes:
        vision: the image tower's :class:`~attnlab.config.ViTConfig` (no head: ``num_classes``
            0; its pooled class token is projected).
        text: the text tower's :class:`TextTowerConfig`.
        projection_dim: width of the joint embedding space (both projections are bias-free).
        logit_scale_init: initial log of the temperature's inverse, log(1/0.07) as in CLIP.
        max_logit_scale: the learned scale exp(s) is clamped to this (CLIP: 100).
    """

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = CLIP_PRESETS

    vision: ViTConfig = field(default_factory=lambda: ViTConfig(**CLIP_PRESETS["tiny"]["vision"]))
    text: TextTowerConfig = field(
        default_factory=lambda: TextTowerConfig(**CLIP_PRESETS["tiny"]["text"])
    )
    projection_dim: int = 32
    logit_scale_init: float = math.log(1 / 0.07)
    max_logit_scale: float = 100.0

    def validate(self) -> None:
        super().validate()
        self.positive("projection_dim", "max_logit_scale")
        if self.vision.num_classes != 0:
            raise ConfigError(
                f"the image tower has no classifier: vision.num_classes must be 0, "
                f"got {self.vision.num_classes}"
            )
        if self.vision.pooling == "cls" and self.vision.pooler:
            raise ConfigError("the image tower projects its class token: vision.pooler must be off")

    @property
    def image_size(self) -> int:
        """Side of the square images the image tower reads."""
        return self.vision.image_size

    @property
    def max_len(self) -> int:
        """Longest text in tokens."""
        return self.text.max_seq_len

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> ClipConfig:
        """A preset with ``overrides`` merged into it (nested sections key by key)."""
        if name not in cls.PRESETS:
            return super().preset(name)  # the error names the known presets
        return cls.from_dict(merge_nested(cls.PRESETS[name], overrides))
