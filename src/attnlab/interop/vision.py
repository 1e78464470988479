"""Hugging Face ViT and Swin checkpoints <-> attnlab's vision models (state dicts and configs).

``from_hf`` / ``to_hf`` in :mod:`attnlab.interop.hf` read and write the folders; this module maps
the tensors: HF's separate Q/K/V projections become the fused ``qkv`` (rows Q|K|V), HF's per-stage
Swin ``downsample`` (end of stage s) is our ``stages.{s}.downsample``, and the key names of
transformers < 5.9 (``encoder.layer.{i}.attention.attention.query`` ...) are accepted as well as
the current ones.

Shape legend: C width, L classes.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from attnlab.config.block import BlockConfig
from attnlab.config.vision import SwinConfig, ViTConfig
from attnlab.errors import UserError
from attnlab.models.vision.swin import SwinTransformer
from attnlab.models.vision.vit import VisionTransformer

__all__ = [
    "hf_activation",
    "hf_num_labels",
    "vit_config_from_hf",
    "vit_from_hf_state_dict",
    "vit_to_hf",
    "swin_config_from_hf",
    "swin_from_hf_state_dict",
    "swin_to_hf",
]


def _check_hf_block(block: BlockConfig, what: str) -> None:
    """Refuse block fields HF ViT/Swin cannot express (they have no GQA, SwiGLU, RMSNorm...).

    Raises:
        UserError: naming the first field that differs from HF's fixed choice.
    """
    fixed = dict(ffn="mlp", norm="layernorm", norm_position="pre", qk_norm=None, bias=True)
    for name, value in fixed.items():
        if getattr(block, name) != value:
            raise UserError(
                f"HF {what} needs {name}={value!r}, this model has {getattr(block, name)!r}"
            )
    if block.n_kv_heads != block.n_heads or block.head_dim * block.n_heads != block.d_model:
        raise UserError(
            f"HF {what} needs n_kv_heads = n_heads and head_dim = d_model / n_heads "
            f"(got n_kv_heads={block.n_kv_heads}, head_dim={block.head_dim})"
        )


# transformers < 5.9 names (also the 4.x names) -> current names, per layer
_VIT_OLD_LAYER_NAMES = {
    "attention.attention.query.": "attention.q_proj.",
    "attention.attention.key.": "attention.k_proj.",
    "attention.attention.value.": "attention.v_proj.",
    "attention.output.dense.": "attention.o_proj.",
    "intermediate.dense.": "mlp.fc1.",
    "output.dense.": "mlp.fc2.",
}


def _square(v: Any, name: str) -> int:
    if isinstance(v, (list, tuple)):
        if len(v) != 2 or v[0] != v[1]:
            raise UserError(f"only square {name} are supported, got {v}")
        v = v[0]
    return int(v)


_HF_ACT = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}
_ACT_TO_HF = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "silu"}


def hf_activation(name: str) -> str:
    """Our activation name for an HF ``hidden_act``."""
    if name not in _HF_ACT:
        raise UserError(f"unsupported hidden_act {name!r}; supported: {sorted(_HF_ACT)}")
    return _HF_ACT[name]


def hf_num_labels(cfg_dict: dict) -> tuple[int, list[str]]:
    """``(num_labels, label names)`` from an HF config dict (``id2label`` or ``num_labels``)."""
    id2label = cfg_dict.get("id2label")
    if id2label:
        items = sorted(((int(k), str(v)) for k, v in id2label.items()))
        return len(items), [v for _, v in items]
    n = int(cfg_dict.get("num_labels", 2))
    return n, []


def _hf_config(c: ViTConfig | SwinConfig, architecture: str, **fields: Any) -> dict:
    """An HF config dict: what ViT and Swin share (image, activation, norm ε, Q/K/V bias, no
    dropout, the class names of a head) plus their own ``fields``."""
    cfg = {
        "architectures": [architecture],
        "image_size": c.image_size,
        "patch_size": c.patch_size,
        "num_channels": c.in_channels,
        **fields,
        "hidden_act": _ACT_TO_HF[c.activation],
        "layer_norm_eps": c.norm_eps,
        "qkv_bias": c.qkv_bias,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
    }
    if c.num_classes > 0:
        names = c.labels or [f"LABEL_{i}" for i in range(c.num_classes)]
        cfg["id2label"] = {str(i): n for i, n in enumerate(names)}
        cfg["label2id"] = {n: i for i, n in enumerate(names)}
    return cfg


def _strip_prefix(state_dict: dict[str, Tensor], prefix: str) -> dict[str, Tensor]:
    if any(k.startswith(prefix) for k in state_dict):
        return {(k[len(prefix) :] if k.startswith(prefix) else k): v for k, v in state_dict.items()}
    return dict(state_dict)


def _renamed(name: str, old_to_new: dict[str, str]) -> str:
    """``name`` with its first matching old prefix replaced by the new one."""
    for old, new in old_to_new.items():
        if name.startswith(old):
            return new + name[len(old) :]
    return name


def _hf_image_fields(
    cfg_dict: dict,
    state_dict: dict[str, Tensor] | None,
    family: str,
    *,
    patch_size: int,
    norm_eps: float,
) -> dict[str, Any]:
    """The config fields HF ViT and Swin configs give alike: image, head, activation, ε, Q/K/V bias.

    The head is included when ``state_dict`` holds ``classifier.weight``; without a state dict,
    when the architecture is ``<family>ForImageClassification``. ``patch_size`` and ``norm_eps``
    are the family's HF defaults.
    """
    sd = _strip_prefix(state_dict or {}, f"{family.lower()}.")
    archs = cfg_dict.get("architectures") or []
    has_head = (
        ("classifier.weight" in sd)
        if state_dict is not None
        else (f"{family}ForImageClassification" in archs)
    )
    n_labels, labels = hf_num_labels(cfg_dict)
    return dict(
        image_size=_square(cfg_dict.get("image_size", 224), "images"),
        patch_size=_square(cfg_dict.get("patch_size", patch_size), "patches"),
        in_channels=int(cfg_dict.get("num_channels", 3)),
        num_classes=n_labels if has_head else 0,
        labels=labels if has_head else [],
        activation=hf_activation(cfg_dict.get("hidden_act", "gelu")),
        norm_eps=float(cfg_dict.get("layer_norm_eps", norm_eps)),
        qkv_bias=bool(cfg_dict.get("qkv_bias", True)),
    )


def _rename_vit_keys(sd: dict[str, Tensor]) -> dict[str, Tensor]:
    """Accept transformers < 5.9 key names (``encoder.layer.{i}.attention.attention.query``...)."""
    out = {}
    for k, v in sd.items():
        if k.startswith("encoder.layer."):
            rest = k[len("encoder.layer.") :]
            i, name = rest.split(".", 1)
            k = f"layers.{i}.{_renamed(name, _VIT_OLD_LAYER_NAMES)}"
        out[k] = v
    return out


def vit_config_from_hf(cfg_dict: dict, state_dict: dict[str, Tensor] | None = None) -> ViTConfig:
    """Our :class:`ViTConfig` for an HF ViT ``config.json`` dict.

    The classification head and the pooler are included when ``state_dict`` holds their weights
    (``classifier.weight``, ``pooler.dense.weight``); without a state dict, a head is assumed when
    the architecture is ``ViTForImageClassification``.
    """
    sd = _strip_prefix(state_dict or {}, "vit.")
    hidden = int(cfg_dict.get("hidden_size", 768))
    return ViTConfig(
        **_hf_image_fields(cfg_dict, state_dict, "ViT", patch_size=16, norm_eps=1e-12),
        d_model=hidden,
        n_layers=int(cfg_dict.get("num_hidden_layers", 12)),
        n_heads=int(cfg_dict.get("num_attention_heads", 12)),
        ffn_hidden=int(cfg_dict.get("intermediate_size", 4 * hidden)),
        pooling="cls",
        position="learned",
        pooler=("pooler.dense.weight" in sd) if state_dict is not None else False,
    )


def vit_from_hf_state_dict(cfg_dict: dict, state_dict: dict[str, Tensor]) -> VisionTransformer:
    """Our ViT from an HF ViT config dict and state dict (ViTModel / ViTForImageClassification).

    Q, K and V are stacked into our fused ``qkv`` (rows Q|K|V). Key names of transformers < 5.9
    (``encoder.layer.{i}.attention.attention.query`` ...) are accepted as well as the current ones.

    Raises:
        UserError: missing or unexpected weights (the message names them).
    """
    cfg = vit_config_from_hf(cfg_dict, state_dict)
    model = VisionTransformer(cfg)
    sd = _rename_vit_keys(_strip_prefix(state_dict, "vit."))
    ours: dict[str, Tensor] = {}

    def take(src: str, dst: str) -> None:
        if src not in sd:
            raise UserError(f"HF ViT state dict lacks {src!r}")
        ours[dst] = sd.pop(src)

    take("embeddings.cls_token", "cls_token")
    take("embeddings.position_embeddings", "pos_embed.weight")
    for p in ("weight", "bias"):
        take(f"embeddings.patch_embeddings.projection.{p}", f"patch_embed.proj.{p}")
    for i in range(cfg.n_layers):
        a, b = f"layers.{i}.", f"blocks.{i}."
        for p in ("weight", "bias") if cfg.qkv_bias else ("weight",):
            parts = [sd.pop(f"{a}attention.{n}_proj.{p}", None) for n in "qkv"]
            if any(t is None for t in parts):
                raise UserError(f"HF ViT state dict lacks {a}attention.q/k/v_proj.{p}")
            ours[f"{b}attn.qkv.{p}"] = torch.cat(parts, dim=0)  # (3C, C) rows Q|K|V
        for p in ("weight", "bias"):
            take(f"{a}attention.o_proj.{p}", f"{b}attn.out_proj.{p}")
            take(f"{a}layernorm_before.{p}", f"{b}norm1.{p}")
            take(f"{a}layernorm_after.{p}", f"{b}norm2.{p}")
            take(f"{a}mlp.fc1.{p}", f"{b}ffn.fc1.{p}")
            take(f"{a}mlp.fc2.{p}", f"{b}ffn.fc2.{p}")
    for p in ("weight", "bias"):
        take(f"layernorm.{p}", f"norm.{p}")
        if cfg.pooler:
            take(f"pooler.dense.{p}", f"pooler.{p}")
        if cfg.num_classes:
            take(f"classifier.{p}", f"head.{p}")
    if sd:
        raise UserError(f"unexpected HF ViT weights: {sorted(sd)[:8]}")
    model.load_state_dict(ours, strict=True)
    return model


def vit_to_hf(model: VisionTransformer) -> tuple[dict, dict[str, Tensor]]:
    """``(config dict, state dict)`` in the layout of HF ViT (transformers >= 5.9 names).

    A model with a head maps to ``ViTForImageClassification`` (``vit.`` prefix), one without to
    ``ViTModel``. Only class-token pooling with learned positions has an HF counterpart.
    """
    c = model.config
    if c.pooling != "cls" or c.position != "learned":
        raise UserError("HF ViT needs pooling='cls' and position='learned'")
    _check_hf_block(c, "ViT")
    has_head = c.num_classes > 0
    cfg = _hf_config(
        c,
        "ViTForImageClassification" if has_head else "ViTModel",
        model_type="vit",
        hidden_size=c.d_model,
        num_hidden_layers=c.n_layers,
        num_attention_heads=c.n_heads,
        intermediate_size=c.ffn_hidden,
    )
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    pre = "vit." if has_head else ""
    out: dict[str, Tensor] = {
        f"{pre}embeddings.cls_token": sd["cls_token"],
        f"{pre}embeddings.position_embeddings": sd["pos_embed.weight"],
    }
    for p in ("weight", "bias"):
        out[f"{pre}embeddings.patch_embeddings.projection.{p}"] = sd[f"patch_embed.proj.{p}"]
    for i in range(c.n_layers):
        a, b = f"{pre}layers.{i}.", f"blocks.{i}."
        for p in ("weight", "bias") if c.qkv_bias else ("weight",):
            for n, t in zip("qkv", sd[f"{b}attn.qkv.{p}"].chunk(3, dim=0), strict=True):
                out[f"{a}attention.{n}_proj.{p}"] = t.clone()
        for p in ("weight", "bias"):
            out[f"{a}attention.o_proj.{p}"] = sd[f"{b}attn.out_proj.{p}"]
            out[f"{a}layernorm_before.{p}"] = sd[f"{b}norm1.{p}"]
            out[f"{a}layernorm_after.{p}"] = sd[f"{b}norm2.{p}"]
            out[f"{a}mlp.fc1.{p}"] = sd[f"{b}ffn.fc1.{p}"]
            out[f"{a}mlp.fc2.{p}"] = sd[f"{b}ffn.fc2.{p}"]
    for p in ("weight", "bias"):
        out[f"{pre}layernorm.{p}"] = sd[f"norm.{p}"]
        if c.pooler:
            out[f"{pre}pooler.dense.{p}"] = sd[f"pooler.{p}"]
        if has_head:
            out[f"classifier.{p}"] = sd[f"head.{p}"]
    return cfg, out


_SWIN_OLD_NAMES = {  # transformers < 5.9 (and 4.x) -> current, inside a block
    "attention.self.query.": "attention.q_proj.",
    "attention.self.key.": "attention.k_proj.",
    "attention.self.value.": "attention.v_proj.",
    "attention.self.relative_position_bias_table": "attention.relative_position_bias.relative_position_bias_table",
    "attention.output.dense.": "attention.o_proj.",
    "intermediate.dense.": "mlp.fc1.",
    "output.dense.": "mlp.fc2.",
}


def _rename_swin_keys(sd: dict[str, Tensor]) -> dict[str, Tensor]:
    out = {}
    for k, v in sd.items():
        if k.endswith("relative_position_index"):
            continue  # a persistent buffer in transformers 5.0–5.6 (and 4.x); we recompute it
        if ".blocks." in k:
            head, name = k.split(".blocks.", 1)
            j, name = name.split(".", 1)
            k = f"{head}.blocks.{j}.{_renamed(name, _SWIN_OLD_NAMES)}"
        out[k] = v
    return out


def swin_config_from_hf(cfg_dict: dict, state_dict: dict[str, Tensor] | None = None) -> SwinConfig:
    """Our :class:`SwinConfig` for an HF Swin ``config.json`` dict (head from the state dict)."""
    return SwinConfig(
        **_hf_image_fields(cfg_dict, state_dict, "Swin", patch_size=4, norm_eps=1e-5),
        d_model=int(cfg_dict.get("embed_dim", 96)),
        depths=list(cfg_dict.get("depths", [2, 2, 6, 2])),
        n_heads=list(cfg_dict.get("num_heads", [3, 6, 12, 24])),
        window_size=int(cfg_dict.get("window_size", 7)),
        mlp_ratio=float(cfg_dict.get("mlp_ratio", 4.0)),
        absolute_positions=bool(cfg_dict.get("use_absolute_embeddings", False)),
    )


def _swin_key_pairs(c: SwinConfig, has_head: bool) -> list[tuple[str, str]]:
    """(HF key without prefix, our key) for every tensor except the fused Q/K/V."""
    pairs = [
        ("embeddings.patch_embeddings.projection.weight", "patch_embed.proj.weight"),
        ("embeddings.patch_embeddings.projection.bias", "patch_embed.proj.bias"),
        ("embeddings.norm.weight", "embed_norm.weight"),
        ("embeddings.norm.bias", "embed_norm.bias"),
    ]
    if c.absolute_positions:
        pairs.append(("embeddings.position_embeddings", "pos_embed.weight"))
    for s, depth in enumerate(c.depths):
        for j in range(depth):
            a, r = f"encoder.layers.{s}.blocks.{j}.", f"stages.{s}.blocks.{j}."
            b = f"{r}block."  # the shared TransformerBlock inside the window wrapper
            pairs.append(
                (
                    f"{a}attention.relative_position_bias.relative_position_bias_table",
                    f"{r}rel_pos.table",
                )
            )
            for p in ("weight", "bias"):
                pairs += [
                    (f"{a}attention.o_proj.{p}", f"{b}attn.out_proj.{p}"),
                    (f"{a}layernorm_before.{p}", f"{b}norm1.{p}"),
                    (f"{a}layernorm_after.{p}", f"{b}norm2.{p}"),
                    (f"{a}mlp.fc1.{p}", f"{b}ffn.fc1.{p}"),
                    (f"{a}mlp.fc2.{p}", f"{b}ffn.fc2.{p}"),
                ]
        if s < len(c.depths) - 1:
            a, b = f"encoder.layers.{s}.downsample.", f"stages.{s}.downsample."
            pairs += [
                (f"{a}reduction.weight", f"{b}reduction.weight"),
                (f"{a}norm.weight", f"{b}norm.weight"),
                (f"{a}norm.bias", f"{b}norm.bias"),
            ]
    pairs += [("layernorm.weight", "norm.weight"), ("layernorm.bias", "norm.bias")]
    if has_head:
        pairs += [("classifier.weight", "head.weight"), ("classifier.bias", "head.bias")]
    return pairs


def swin_from_hf_state_dict(cfg_dict: dict, state_dict: dict[str, Tensor]) -> SwinTransformer:
    """Our Swin from an HF Swin config dict and state dict (SwinModel / SwinForImageClassification).

    Q, K and V are stacked into ``qkv``; HF's per-stage ``downsample`` (end of stage s) is our
    ``stages.{s}.downsample``. Key names of transformers < 5.9 (``attention.self.query`` …) and a
    stored ``relative_position_index`` are accepted.

    Raises:
        UserError: missing or unexpected weights (the message names them).
    """
    cfg = swin_config_from_hf(cfg_dict, state_dict)
    model = SwinTransformer(cfg)
    sd = _rename_swin_keys(_strip_prefix(state_dict, "swin."))
    ours: dict[str, Tensor] = {}
    for src, dst in _swin_key_pairs(cfg, cfg.num_classes > 0):
        if src not in sd:
            raise UserError(f"HF Swin state dict lacks {src!r}")
        ours[dst] = sd.pop(src)
    for s, depth in enumerate(cfg.depths):
        for j in range(depth):
            a, b = f"encoder.layers.{s}.blocks.{j}.attention.", f"stages.{s}.blocks.{j}.block.attn."
            for p in ("weight", "bias") if cfg.qkv_bias else ("weight",):
                parts = [sd.pop(f"{a}{n}_proj.{p}", None) for n in "qkv"]
                if any(t is None for t in parts):
                    raise UserError(f"HF Swin state dict lacks {a}q/k/v_proj.{p}")
                ours[f"{b}qkv.{p}"] = torch.cat(parts, dim=0)  # (3C, C) rows Q|K|V
    if sd:
        raise UserError(f"unexpected HF Swin weights: {sorted(sd)[:8]}")
    model.load_state_dict(ours, strict=True)
    return model


def swin_to_hf(model: SwinTransformer) -> tuple[dict, dict[str, Tensor]]:
    """``(config dict, state dict)`` in HF Swin's layout (transformers >= 5.9 names)."""
    c = model.config
    if c.position != "relative":
        raise UserError("HF Swin needs position='relative' (the window table)")
    for s in range(len(c.depths)):
        _check_hf_block(c.stage_block(s), f"Swin (stage {s})")
    has_head = c.num_classes > 0
    cfg = _hf_config(
        c,
        "SwinForImageClassification" if has_head else "SwinModel",
        model_type="swin",
        embed_dim=c.d_model,
        depths=list(c.depths),
        num_heads=list(c.n_heads),
        window_size=c.window_size,
        mlp_ratio=c.mlp_ratio,
        use_absolute_embeddings=c.absolute_positions,
        drop_path_rate=0.0,
    )
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    pre = "swin." if has_head else ""
    out = {}
    for hf_key, our_key in _swin_key_pairs(c, has_head):
        out[hf_key if hf_key.startswith("classifier") else pre + hf_key] = sd[our_key]
    for s, depth in enumerate(c.depths):
        for j in range(depth):
            a, b = (
                f"{pre}encoder.layers.{s}.blocks.{j}.attention.",
                f"stages.{s}.blocks.{j}.block.attn.",
            )
            for p in ("weight", "bias") if c.qkv_bias else ("weight",):
                for n, t in zip("qkv", sd[f"{b}qkv.{p}"].chunk(3, dim=0), strict=True):
                    out[f"{a}{n}_proj.{p}"] = t.clone()
    return cfg, out
