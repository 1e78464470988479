"""Hugging Face checkpoints in and out: GPT-2, Llama and Mixtral as :class:`attnlab.DecoderLM`.

(ViT and Swin folders go through the same reading, checking and writing code here; their tensor
mappings live in :mod:`attnlab.interop.vision`.)

A Hugging Face checkpoint is a local folder holding ``config.json`` and the weights, either one
``model.safetensors`` or shards listed by ``model.safetensors.index.json``; a ``tokenizer.json``
beside them is read with the ``tokenizers`` library. Nothing is ever fetched from a hub.

How the Hugging Face layouts map onto attnlab's (C d_model, H query heads, Hkv key/value heads,
D head_dim, I FFN width, E experts, V vocabulary):

============================================  ==============================================
Hugging Face                                  attnlab ``DecoderLM``
============================================  ==============================================
GPT-2 ``transformer.wte`` / ``wpe``            ``tok_emb`` / ``pos_emb``
GPT-2 ``h.i.attn.c_attn.weight (C, 3C)``       ``blocks.i.attn.qkv.weight (3C, C)``: GPT-2's
                                              Conv1D stores ``(in, out)``, so every GPT-2
                                              projection is transposed
GPT-2 ``ln_1`` ``ln_2`` ``mlp.c_fc/c_proj``    ``norm1`` ``norm2`` ``ffn.fc1/fc2`` (transposed)
Llama ``self_attn.{q,k,v}_proj``               rows of ``attn.qkv`` (Q | K | V): no RoPE
                                              permutation, both use rotate-half pairs
Llama ``o_proj`` / ``mlp.{gate,up,down}_proj``  ``attn.out_proj`` / ``ffn.{gate,up,down}``
Mixtral ``mlp.gate (E, C)``                    ``ffn.router`` (softmax, top-k, renormalise)
Mixtral ``mlp.experts.gate_up_proj (E,2I,C)``  ``ffn.w_in`` (rows gate | up, same layout)
Mixtral ``mlp.experts.down_proj (E, C, I)``    ``ffn.w_out``
Mixtral (older) ``block_sparse_moe.experts.e.  stacked into ``w_in`` = [w1; w3] and
w1/w3/w2``, ``block_sparse_moe.gate``          ``w_out`` = w2, ``router`` = gate
``input_layernorm`` / ``post_attention_...``   ``norm1`` / ``norm2``
``model.norm`` / ``ln_f``, ``lm_head``         ``norm_f``, ``lm_head`` (tied: ``tok_emb``)
============================================  ==============================================

Every load checks names and shapes against the model the config describes *before* any weight
is copied, and raises :class:`~attnlab.errors.UserError` naming the tensor and both shapes, so a
model is either fully loaded or not returned at all.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.errors import UserError
from attnlab.interop.bert import BERT_ARCHITECTURES, bert_from_hf, bert_to_hf, is_bert_config

__all__ = [
    "from_hf",
    "to_hf",
    "load_hf_tokenizer",
    "load_hf_lm",
    "read_hf_config",
    "read_hf_weights",
    "hf_to_model_config",
    "model_config_to_hf",
    "hf_to_attnlab_state_dict",
    "attnlab_to_hf_state_dict",
    "SUPPORTED_ARCHITECTURES",
    "HF_GENERATION_KEYS",
]

log = logging.getLogger(__name__)

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
TOKENIZER_NAME = "tokenizer.json"

# config.json keys carried along so generation can stop at the model's end-of-text token
HF_GENERATION_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")

# tensors some checkpoints store that are not parameters (GPT-2's causal mask, RoPE frequencies)
_IGNORED = {
    "gpt2": re.compile(r"\.attn\.(bias|masked_bias)$"),
    "llama": re.compile(r"\.rotary_emb\.inv_freq$"),
    "mixtral": re.compile(r"\.rotary_emb\.inv_freq$"),
}


# ----------------------------------------------------------------------------------------------
# families


@dataclass(frozen=True)
class _Family:
    name: str  # model_type in config.json
    architecture: str  # architectures[0] in config.json
    config_from_hf: Callable[[dict], dict]  # HF config -> ModelConfig kwargs
    config_to_hf: Callable[[nn.Module], dict]  # DecoderLM -> HF config.json
    to_hf: Callable[..., dict[str, Tensor]]  # attnlab state dict -> HF state dict


def _get(hf: dict, *names: str, default: Any = None) -> Any:
    for n in names:
        if n in hf and hf[n] is not None:
            return hf[n]
    return default


def _rope_theta(hf: dict, default: float) -> float:
    """RoPE θ from ``rope_parameters`` (v5), ``rope_theta`` (v4) or the family default."""
    params = hf.get("rope_parameters") or {}
    scaling = hf.get("rope_scaling") or {}
    for p in (params, scaling):
        kind = p.get("rope_type", p.get("type", "default"))
        if kind != "default":
            raise UserError(
                f"RoPE scaling {kind!r} is not supported (only the default RoPE); config has {p}"
            )
    return float(params.get("rope_theta", hf.get("rope_theta", default)) or default)


_GPT2_ACTIVATIONS = {
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu": "gelu",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}


def _gpt2_config(hf: dict) -> dict:
    act = hf.get("activation_function", "gelu_new")
    if act not in _GPT2_ACTIVATIONS:
        raise UserError(
            f"GPT-2 activation_function {act!r} is not supported; "
            f"supported: {sorted(_GPT2_ACTIVATIONS)}"
        )
    if hf.get("scale_attn_by_inverse_layer_idx"):
        raise UserError("GPT-2 scale_attn_by_inverse_layer_idx=true is not supported")
    if hf.get("scale_attn_weights") is False:
        raise UserError("GPT-2 scale_attn_weights=false (unscaled attention) is not supported")
    if hf.get("add_cross_attention"):
        raise UserError("GPT-2 with add_cross_attention=true is not a decoder-only model")
    d = _get(hf, "n_embd", "hidden_size", default=768)
    return dict(
        vocab_size=_get(hf, "vocab_size", default=50257),
        max_seq_len=_get(hf, "n_positions", "max_position_embeddings", default=1024),
        d_model=d,
        n_layers=_get(hf, "n_layer", "num_hidden_layers", default=12),
        n_heads=_get(hf, "n_head", "num_attention_heads", default=12),
        ffn="mlp",
        ffn_hidden=_get(hf, "n_inner", default=4 * d),
        activation=_GPT2_ACTIVATIONS[act],
        norm="layernorm",
        norm_eps=float(_get(hf, "layer_norm_epsilon", default=1e-5)),
        norm_position="pre",
        position="learned",
        bias=True,
        tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
    )


def _llama_like_config(hf: dict, *, default_eps: float, default_theta: float) -> dict:
    act = hf.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise UserError(f"{hf.get('model_type')} hidden_act {act!r} is not supported (only 'silu')")
    d = hf["hidden_size"]
    n_heads = hf["num_attention_heads"]
    n_kv = _get(hf, "num_key_value_heads", default=n_heads)
    max_len = _get(hf, "max_position_embeddings", default=2048)
    window = hf.get("sliding_window")
    if window is not None and window < max_len:
        # sliding-window attention equals full causal attention for sequences up to the window
        log.warning(
            "sliding_window=%d: attnlab runs full attention, so max_seq_len is limited "
            "to the window (exact up to that length)",
            window,
        )
        max_len = window
    return dict(
        vocab_size=hf["vocab_size"],
        max_seq_len=max_len,
        d_model=d,
        n_layers=hf["num_hidden_layers"],
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=_get(hf, "head_dim", default=d // n_heads),
        ffn_hidden=hf["intermediate_size"],
        activation="silu",
        norm="rmsnorm",
        norm_eps=float(_get(hf, "rms_norm_eps", default=default_eps)),
        norm_position="pre",
        position="rope",
        rope_theta=_rope_theta(hf, default_theta),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
    )


def _llama_config(hf: dict) -> dict:
    kw = _llama_like_config(hf, default_eps=1e-6, default_theta=10000.0)
    # attnlab has one bias switch; a checkpoint with only one of the two gets zero biases for the
    # other, which computes exactly the same thing
    kw.update(ffn="swiglu", bias=bool(hf.get("attention_bias") or hf.get("mlp_bias")))
    return kw


def _mixtral_config(hf: dict) -> dict:
    kw = _llama_like_config(hf, default_eps=1e-5, default_theta=1e6)
    kw.update(
        ffn="moe",
        bias=False,
        n_experts=_get(hf, "num_local_experts", "num_experts", default=8),
        top_k=_get(hf, "num_experts_per_tok", default=2),
        moe_aux_coef=float(_get(hf, "router_aux_loss_coef", default=0.001)),
    )
    return kw


def _check_exportable(cfg, family: str) -> None:
    problems = []
    if cfg.norm_position != "pre":
        problems.append(f"norm_position={cfg.norm_position!r} (needs 'pre')")
    if cfg.qk_norm is not None:
        problems.append(f"qk_norm={cfg.qk_norm!r} (needs None)")
    if family == "gpt2" and (cfg.n_kv_heads or cfg.n_heads) != cfg.n_heads:
        problems.append(f"n_kv_heads={cfg.n_kv_heads} != n_heads={cfg.n_heads}")
    if (
        family == "gpt2"
        and (cfg.head_dim or cfg.d_model // cfg.n_heads) * cfg.n_heads != cfg.d_model
    ):
        problems.append(f"head_dim={cfg.head_dim} · n_heads != d_model={cfg.d_model}")
    if problems:
        raise UserError(
            f"this model cannot be written as a Hugging Face {family} checkpoint: "
            + "; ".join(problems)
        )


def _gpt2_config_to_hf(model: nn.Module) -> dict:
    cfg = model.config
    _check_exportable(cfg, "gpt2")
    inv = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu", "silu": "silu"}
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": cfg.vocab_size,
        "n_positions": cfg.max_seq_len,
        "n_embd": cfg.d_model,
        "n_layer": cfg.n_layers,
        "n_head": cfg.n_heads,
        "n_inner": _ffn_hidden(model),
        "activation_function": inv[cfg.activation],
        "layer_norm_epsilon": cfg.norm_eps,
        "resid_pdrop": cfg.dropout,
        "embd_pdrop": cfg.dropout,
        "attn_pdrop": cfg.attn_dropout,
        "scale_attn_weights": True,
        "tie_word_embeddings": bool(cfg.tie_embeddings),
        "bos_token_id": None,
        "eos_token_id": None,
    }


def _llama_like_to_hf(model: nn.Module) -> dict:
    cfg = model.config
    return {
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": _ffn_hidden(model),
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads or cfg.n_heads,
        "head_dim": cfg.head_dim or cfg.d_model // cfg.n_heads,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_seq_len,
        "rms_norm_eps": cfg.norm_eps,
        "rope_parameters": {"rope_type": "default", "rope_theta": float(cfg.rope_theta)},
        "rope_theta": float(cfg.rope_theta),  # transformers 4.x reads this one
        "attention_dropout": cfg.attn_dropout,
        "tie_word_embeddings": bool(cfg.tie_embeddings),
        "bos_token_id": None,
        "eos_token_id": None,
    }


def _llama_config_to_hf(model: nn.Module) -> dict:
    cfg = model.config
    _check_exportable(cfg, "llama")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **_llama_like_to_hf(model),
        "attention_bias": bool(cfg.bias),
        "mlp_bias": bool(cfg.bias),
    }


def _mixtral_config_to_hf(model: nn.Module) -> dict:
    cfg = model.config
    _check_exportable(cfg, "mixtral")
    return {
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        **_llama_like_to_hf(model),
        "num_local_experts": cfg.n_experts,
        "num_experts_per_tok": cfg.top_k,
        "router_aux_loss_coef": cfg.moe_aux_coef,
        "sliding_window": None,
    }


def _ffn_hidden(model: nn.Module) -> int:
    """The FFN width the model was built with (its config may leave it None)."""
    ffn = model.blocks[0].ffn
    if model.config.ffn == "mlp":
        return ffn.fc1.out_features
    if model.config.ffn == "swiglu":
        return ffn.gate.out_features
    return ffn.hidden


# ---- state-dict mappings, attnlab -> HF (the inverse is derived from these, see below) --------


def _t(w: Tensor) -> Tensor:
    """nn.Linear ``(out, in)`` <-> Conv1D ``(in, out)``."""
    return w.t()


def _gpt2_to_hf(sd: dict[str, Tensor], cfg, **_) -> dict[str, Tensor]:
    out = {
        "transformer.wte.weight": sd["tok_emb.weight"],
        "transformer.wpe.weight": sd["pos_emb.weight"],
    }
    for i in range(cfg.n_layers):
        a, h = f"blocks.{i}.", f"transformer.h.{i}."
        for ours, theirs, transpose in (
            ("norm1", "ln_1", False),
            ("attn.qkv", "attn.c_attn", True),
            ("attn.out_proj", "attn.c_proj", True),
            ("norm2", "ln_2", False),
            ("ffn.fc1", "mlp.c_fc", True),
            ("ffn.fc2", "mlp.c_proj", True),
        ):
            w = sd[f"{a}{ours}.weight"]
            out[f"{h}{theirs}.weight"] = _t(w) if transpose else w
            b = sd.get(f"{a}{ours}.bias")
            # GPT-2 always has biases; a bias-free attnlab model exports zeros (same function)
            out[f"{h}{theirs}.bias"] = b if b is not None else w.new_zeros(w.shape[0])
    out["transformer.ln_f.weight"] = sd["norm_f.weight"]
    out["transformer.ln_f.bias"] = sd.get("norm_f.bias", sd["norm_f.weight"].new_zeros(cfg.d_model))
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = sd["lm_head.weight"]
    return out


def _llama_like_to_hf_sd(
    sd: dict[str, Tensor], cfg, moe_layout: str = "per_expert", **_
) -> dict[str, Tensor]:
    H, Hkv = cfg.n_heads, cfg.n_kv_heads or cfg.n_heads
    D = cfg.head_dim or cfg.d_model // cfg.n_heads
    out = {"model.embed_tokens.weight": sd["tok_emb.weight"]}
    for i in range(cfg.n_layers):
        a, h = f"blocks.{i}.", f"model.layers.{i}."
        for kind in ("weight", "bias"):
            if f"{a}attn.qkv.{kind}" not in sd:
                continue
            q, k, v = sd[f"{a}attn.qkv.{kind}"].split([H * D, Hkv * D, Hkv * D], dim=0)
            out[f"{h}self_attn.q_proj.{kind}"] = q
            out[f"{h}self_attn.k_proj.{kind}"] = k
            out[f"{h}self_attn.v_proj.{kind}"] = v
            if f"{a}attn.out_proj.{kind}" in sd:
                out[f"{h}self_attn.o_proj.{kind}"] = sd[f"{a}attn.out_proj.{kind}"]
        out[f"{h}input_layernorm.weight"] = sd[f"{a}norm1.weight"]
        out[f"{h}post_attention_layernorm.weight"] = sd[f"{a}norm2.weight"]
        if cfg.ffn == "swiglu":
            for ours, theirs in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
                for kind in ("weight", "bias"):
                    if f"{a}ffn.{ours}.{kind}" in sd:
                        out[f"{h}mlp.{theirs}.{kind}"] = sd[f"{a}ffn.{ours}.{kind}"]
        else:  # moe
            w_in, w_out = sd[f"{a}ffn.w_in"], sd[f"{a}ffn.w_out"]  # (E, 2I, C), (E, C, I)
            if moe_layout == "fused":
                out[f"{h}mlp.gate.weight"] = sd[f"{a}ffn.router.weight"]
                out[f"{h}mlp.experts.gate_up_proj"] = w_in
                out[f"{h}mlp.experts.down_proj"] = w_out
            elif moe_layout == "per_expert":
                out[f"{h}block_sparse_moe.gate.weight"] = sd[f"{a}ffn.router.weight"]
                for e in range(w_in.shape[0]):
                    w1, w3 = w_in[e].chunk(2, dim=0)  # gate | up rows, each (I, C)
                    p = f"{h}block_sparse_moe.experts.{e}."
                    out[p + "w1.weight"], out[p + "w3.weight"] = w1, w3
                    out[p + "w2.weight"] = w_out[e]
            else:
                raise UserError(f"moe_layout must be 'fused' or 'per_expert', got {moe_layout!r}")
    out["model.norm.weight"] = sd["norm_f.weight"]
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = sd["lm_head.weight"]
    return out


_FAMILIES = {
    "gpt2": _Family("gpt2", "GPT2LMHeadModel", _gpt2_config, _gpt2_config_to_hf, _gpt2_to_hf),
    "llama": _Family(
        "llama", "LlamaForCausalLM", _llama_config, _llama_config_to_hf, _llama_like_to_hf_sd
    ),
    "mixtral": _Family(
        "mixtral",
        "MixtralForCausalLM",
        _mixtral_config,
        _mixtral_config_to_hf,
        _llama_like_to_hf_sd,
    ),
}
# vision models: the tensor mappings live in attnlab.interop.vision
_VISION_ARCHITECTURES = {
    "ViTModel": "vit",
    "ViTForImageClassification": "vit",
    "SwinModel": "swin",
    "SwinForImageClassification": "swin",
}
SUPPORTED_ARCHITECTURES = (
    *(f.architecture for f in _FAMILIES.values()),
    *_VISION_ARCHITECTURES,
    *BERT_ARCHITECTURES,  # attnlab.interop.bert
)


# ---- HF -> attnlab --------------------------------------------------------------------------


def hf_to_attnlab_state_dict(family: str, hf_sd: dict[str, Tensor], cfg) -> dict[str, Tensor]:
    """Convert a (validated, canonically named) HF state dict into DecoderLM names.

    Args:
        family: ``gpt2`` | ``llama`` | ``mixtral``.
        hf_sd: tensors under the names :func:`attnlab_to_hf_state_dict` produces.
        cfg: the :class:`attnlab.config.ModelConfig` of the target model.

    Returns:
        A state dict for ``DecoderLM(cfg).load_state_dict`` (``lm_head.weight`` included when tied).
    """
    g = hf_sd.__getitem__
    sd: dict[str, Tensor] = {}
    if family == "gpt2":
        sd["tok_emb.weight"] = g("transformer.wte.weight")
        sd["pos_emb.weight"] = g("transformer.wpe.weight")
        for i in range(cfg.n_layers):
            a, h = f"blocks.{i}.", f"transformer.h.{i}."
            for ours, theirs, transpose in (
                ("norm1", "ln_1", False),
                ("attn.qkv", "attn.c_attn", True),
                ("attn.out_proj", "attn.c_proj", True),
                ("norm2", "ln_2", False),
                ("ffn.fc1", "mlp.c_fc", True),
                ("ffn.fc2", "mlp.c_proj", True),
            ):
                w = g(f"{h}{theirs}.weight")
                sd[f"{a}{ours}.weight"] = _t(w) if transpose else w
                sd[f"{a}{ours}.bias"] = g(f"{h}{theirs}.bias")
        sd["norm_f.weight"] = g("transformer.ln_f.weight")
        sd["norm_f.bias"] = g("transformer.ln_f.bias")
    else:
        sd["tok_emb.weight"] = g("model.embed_tokens.weight")
        for i in range(cfg.n_layers):
            a, h = f"blocks.{i}.", f"model.layers.{i}."
            for kind in ("weight", "bias"):
                names = [f"{h}self_attn.{p}_proj.{kind}" for p in "qkv"]
                if names[0] in hf_sd:
                    sd[f"{a}attn.qkv.{kind}"] = torch.cat([g(n) for n in names], dim=0)  # Q|K|V
                if f"{h}self_attn.o_proj.{kind}" in hf_sd:
                    sd[f"{a}attn.out_proj.{kind}"] = g(f"{h}self_attn.o_proj.{kind}")
            sd[f"{a}norm1.weight"] = g(f"{h}input_layernorm.weight")
            sd[f"{a}norm2.weight"] = g(f"{h}post_attention_layernorm.weight")
            if family == "llama":
                for ours, theirs in (
                    ("gate", "gate_proj"),
                    ("up", "up_proj"),
                    ("down", "down_proj"),
                ):
                    for kind in ("weight", "bias"):
                        if f"{h}mlp.{theirs}.{kind}" in hf_sd:
                            sd[f"{a}ffn.{ours}.{kind}"] = g(f"{h}mlp.{theirs}.{kind}")
            else:
                sd[f"{a}ffn.router.weight"] = g(f"{h}mlp.gate.weight")
                sd[f"{a}ffn.w_in"] = g(f"{h}mlp.experts.gate_up_proj")
                sd[f"{a}ffn.w_out"] = g(f"{h}mlp.experts.down_proj")
        sd["norm_f.weight"] = g("model.norm.weight")
    sd["lm_head.weight"] = sd["tok_emb.weight"] if cfg.tie_embeddings else g("lm_head.weight")
    return sd


def attnlab_to_hf_state_dict(
    model: nn.Module, *, moe_layout: str = "per_expert"
) -> dict[str, Tensor]:
    """The HF state dict (names and layouts) of a DecoderLM, sharing storage where possible.

    Args:
        model: a :class:`attnlab.DecoderLM` whose config maps onto GPT-2, Llama or Mixtral.
        moe_layout: Mixtral experts as ``per_expert`` (``block_sparse_moe.experts.e.w1/w2/w3``,
            what ``save_pretrained`` writes and every transformers version reads) or ``fused``
            (``mlp.experts.gate_up_proj`` / ``down_proj``, transformers ≥ 5 in memory).

    Raises:
        UserError: a model that no supported HF architecture can express.
    """
    family = _family_of_model(model)
    return _FAMILIES[family].to_hf(dict(model.state_dict()), model.config, moe_layout=moe_layout)


def _family_of_model(model: nn.Module) -> str:
    cfg = getattr(model, "config", None)
    if getattr(model, "kind", None) != "decoder_lm" or cfg is None:
        raise UserError(
            f"to_hf exports attnlab DecoderLM models (as {', '.join(SUPPORTED_ARCHITECTURES)}); "
            f"got {type(model).__name__}"
        )
    if cfg.position == "learned" and cfg.norm == "layernorm" and cfg.ffn == "mlp":
        return "gpt2"
    if cfg.position == "rope" and cfg.norm == "rmsnorm" and cfg.activation == "silu":
        if cfg.ffn == "swiglu":
            return "llama"
        if cfg.ffn == "moe":
            return "mixtral"
    raise UserError(
        "this model matches no supported Hugging Face architecture: GPT2LMHeadModel needs "
        "position='learned', norm='layernorm', ffn='mlp'; LlamaForCausalLM needs position='rope', "
        "norm='rmsnorm', ffn='swiglu', activation='silu'; MixtralForCausalLM the same with "
        f"ffn='moe'. Got position={cfg.position!r}, norm={cfg.norm!r}, ffn={cfg.ffn!r}, "
        f"activation={cfg.activation!r}"
    )


# ----------------------------------------------------------------------------------------------
# reading a checkpoint folder


def _check_dir(path: str | os.PathLike) -> Path:
    path = Path(path)
    if not path.exists():
        raise UserError(f"{str(path)!r} does not exist")
    if not path.is_dir():
        raise UserError(
            f"{str(path)!r} is not a directory (expected a Hugging Face checkpoint "
            f"folder with {CONFIG_NAME} and {WEIGHTS_NAME})"
        )
    return path


def read_hf_config(path: str | os.PathLike) -> dict:
    """``config.json`` of a Hugging Face checkpoint folder, checked to be one."""
    path = _check_dir(path)
    cfg_path = path / CONFIG_NAME
    if not cfg_path.exists():
        hint = (
            " (it looks like an attnlab run directory; use attnlab.load)"
            if (path / "metrics.jsonl").exists()
            else ""
        )
        raise UserError(f"{str(path)!r} is not a Hugging Face checkpoint: no {CONFIG_NAME}{hint}")
    try:
        cfg = json.loads(cfg_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UserError(f"{cfg_path} is not valid JSON: {err}") from None
    if not isinstance(cfg, dict) or ("model_type" not in cfg and "architectures" not in cfg):
        raise UserError(
            f"{cfg_path} is not a Hugging Face model config (no 'model_type' or "
            f"'architectures'); an attnlab run directory is read with attnlab.load"
        )
    return cfg


def _family_of_config(hf: dict) -> str:
    archs = hf.get("architectures") or []
    for f in _FAMILIES.values():
        if f.architecture in archs:
            return f.name
    for arch, family in _VISION_ARCHITECTURES.items():
        if arch in archs:
            return family
    if not archs and hf.get("model_type") in (*_FAMILIES, *_VISION_ARCHITECTURES.values()):
        return hf["model_type"]
    what = ", ".join(archs) if archs else f"model_type {hf.get('model_type')!r}"
    raise UserError(
        f"unsupported Hugging Face architecture {what}; supported: "
        f"{', '.join(SUPPORTED_ARCHITECTURES)}"
    )


def _open(shard: Path):
    """``safe_open`` with unreadable files reported as a UserError naming the file."""
    from safetensors import safe_open

    try:
        return safe_open(str(shard), "pt")
    except Exception as err:  # safetensors raises its own error type for a corrupted file
        raise UserError(f"cannot read {shard} as safetensors: {err}") from None


def _weight_files(path: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it (single file or sharded with an index)."""
    index = path / INDEX_NAME
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise UserError(
                f"{index} is not a safetensors index (needs 'weight_map'): {err}"
            ) from None
        if not isinstance(weight_map, dict) or not all(
            isinstance(f, str) for f in weight_map.values()
        ):
            raise UserError(f"{index}: 'weight_map' must map tensor names to shard file names")
        missing = sorted({f for f in weight_map.values() if not (path / f).exists()})
        if missing:
            raise UserError(f"{index} lists shard files that are not in {str(path)!r}: {missing}")
        files = {name: path / f for name, f in weight_map.items()}
        # the index must describe the shards truthfully, both ways
        listed: set[str] = set()
        for shard in sorted(set(files.values())):
            with _open(shard) as f:
                for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                    if files.get(name) != shard:
                        raise UserError(
                            f"tensor {name!r} is in shard {shard.name} but {INDEX_NAME} "
                            f"says {files[name].name if name in files else 'nothing'}"
                        )
                    listed.add(name)
        absent = sorted(set(files) - listed)
        if absent:
            raise UserError(
                f"{INDEX_NAME} lists tensors that their shards do not hold: "
                + ", ".join(f"{n} ({files[n].name})" for n in absent[:10])
                + (" ..." if len(absent) > 10 else "")
            )
        return files
    single = path / WEIGHTS_NAME
    if single.exists():
        with _open(single) as f:
            return {name: single for name in f.keys()}  # noqa: SIM118
    others = sorted(p.name for p in path.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".h5"))
    hint = f" (found {others}: only safetensors weights are read)" if others else ""
    raise UserError(f"{str(path)!r} has no {WEIGHTS_NAME} or {INDEX_NAME}{hint}")


def _tensor_shapes(files: dict[str, Path]) -> dict[str, tuple[int, ...]]:
    shapes = {}
    for shard in sorted(set(files.values())):
        with _open(shard) as f:
            for name in f.keys():  # noqa: SIM118
                shapes[name] = tuple(f.get_slice(name).get_shape())
    return shapes


def read_hf_weights(path: str | os.PathLike, names: list[str] | None = None) -> dict[str, Tensor]:
    """Tensors of a checkpoint folder (all, or only ``names``), single file or sharded."""
    files = _weight_files(_check_dir(path))
    names = list(files) if names is None else names
    out: dict[str, Tensor] = {}
    by_file: dict[Path, list[str]] = {}
    for n in names:
        by_file.setdefault(files[n], []).append(n)
    for shard, ns in by_file.items():
        with _open(shard) as f:
            for n in ns:
                out[n] = f.get_tensor(n)
    return out


def _canonical_names(family: str, names: list[str]) -> dict[str, str]:
    """Map file tensor names to the names the converters use (file name kept for messages).

    Handles GPT-2 checkpoints saved without the ``transformer.`` prefix and drops buffers that
    some versions stored (GPT-2's causal ``attn.bias``, ``rotary_emb.inv_freq``).
    """
    out = {}
    for n in names:
        if _IGNORED[family].search(n):
            continue
        canon = n
        if family == "gpt2" and not n.startswith(("transformer.", "lm_head.")):
            canon = "transformer." + n
        out[canon] = n
    return out


def hf_to_model_config(hf: dict):
    """``(family, ModelConfig)`` for a Hugging Face ``config.json`` dict.

    Raises:
        UserError: unsupported architecture or option, or values the model config rejects.
    """
    from attnlab.config import ModelConfig

    family = _family_of_config(hf)
    if family not in _FAMILIES:
        raise UserError(f"a {family} checkpoint is not a language model; from_hf loads it")
    try:
        kwargs = _FAMILIES[family].config_from_hf(hf)
    except KeyError as err:
        raise UserError(f"{family} config.json lacks the field {err}") from None
    try:
        return family, ModelConfig(**kwargs)
    except (TypeError, ValueError) as err:
        raise UserError(f"config.json describes a model attnlab cannot build: {err}") from None


def model_config_to_hf(model: nn.Module) -> dict:
    """The Hugging Face ``config.json`` dict describing ``model`` (a DecoderLM)."""
    family = _family_of_model(model)
    return _FAMILIES[family].config_to_hf(model)


def _resolve_dtype(dtype: torch.dtype | str | None, hf: dict) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "float32"):
        return torch.float32
    if dtype == "auto":
        name = hf.get("dtype") or hf.get("torch_dtype") or "float32"
    else:
        name = dtype
    value = getattr(torch, str(name), None)
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise UserError(f"unknown dtype {name!r}; use float32, bfloat16, float16 or 'auto'")
    return value


def from_hf(path: str | os.PathLike, *, dtype: torch.dtype | str | None = None) -> nn.Module:
    """Load a local Hugging Face checkpoint as an attnlab model (eval mode).

    GPT-2, Llama and Mixtral become a :class:`attnlab.DecoderLM`; ViT and Swin (``...Model`` or
    ``...ForImageClassification``) the vision models of :mod:`attnlab.models.vision`.

    Args:
        path: folder with ``config.json`` and ``model.safetensors`` (or shards plus
            ``model.safetensors.index.json``). Only local files are read.
        dtype: parameter dtype: ``float32`` (default), ``bfloat16``, ``float16``, or ``"auto"`` for
            the dtype recorded in config.json.

    Returns:
        The model. Its ``hf_config`` attribute keeps the checkpoint's
        ``config.json`` (e.g. ``eos_token_id`` for generation), with the token ids of a
        ``generation_config.json`` beside it taking precedence, as in transformers' ``generate``
        (chat checkpoints often list their extra end-of-turn ids only there). The tokenizer is
        separate: :func:`load_hf_tokenizer`.

    Raises:
        UserError: not a checkpoint folder, unsupported architecture, missing/extra tensors or
            shape mismatches (named with both shapes). Nothing is returned half-loaded.
    """
    from attnlab.models.lm import DecoderLM

    path = _check_dir(path)
    hf = read_hf_config(path)
    if is_bert_config(hf):
        return bert_from_hf(hf, read_hf_weights(path), _resolve_dtype(dtype, hf))
    if _family_of_config(hf) in ("vit", "swin"):
        return _vision_from_hf(path, hf, _resolve_dtype(dtype, hf))
    family, cfg = hf_to_model_config(hf)
    target_dtype = _resolve_dtype(dtype, hf)
    files = _weight_files(path)
    file_shapes = _tensor_shapes(files)
    canon = _canonical_names(family, list(file_shapes))
    if cfg.tie_embeddings:  # some tied checkpoints store the head as well; the embedding wins
        canon.pop("lm_head.weight", None)
    moe_layout = "per_expert" if any(".block_sparse_moe." in n for n in canon) else "fused"

    model = DecoderLM(cfg)
    expected = _FAMILIES[family].to_hf(dict(model.state_dict()), cfg, moe_layout=moe_layout)
    expected_shapes = {n: tuple(t.shape) for n, t in expected.items()}
    optional = {"lm_head.weight"} if cfg.tie_embeddings else set()
    zero_fill = _zero_fill_names(family, hf, expected_shapes)
    _validate(
        path,
        expected_shapes,
        {c: file_shapes[f] for c, f in canon.items()},
        canon,
        optional | zero_fill,
    )

    needed = [n for n in expected_shapes if n in canon]
    raw = read_hf_weights(path, [canon[n] for n in needed])
    hf_sd = {n: raw[canon[n]].to(target_dtype) for n in needed}
    for n in zero_fill - set(hf_sd):
        hf_sd[n] = torch.zeros(expected_shapes[n], dtype=target_dtype)
    if moe_layout == "per_expert":
        hf_sd = _merge_experts(hf_sd, cfg)
    sd = hf_to_attnlab_state_dict(family, hf_sd, cfg)
    model = _params_to(model, target_dtype)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [m for m in missing if not (cfg.tie_embeddings and m == "lm_head.weight")]
    if missing or unexpected:  # a mapping bug, not a user error: the names were checked above
        raise RuntimeError(f"internal mapping error: missing {missing}, unexpected {unexpected}")
    model.hf_config = {**hf, **_generation_token_ids(path)}
    return model.eval()


def _params_to(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Parameters to ``dtype``; buffers (RoPE's ``inv_freq``) stay fp32.

    ``Module.to(bfloat16)`` would round the RoPE frequencies to 8 bits of mantissa, which puts
    the rotation angles radians off after a few thousand positions; transformers keeps them fp32.
    """
    buffers = {n: b for n, b in model.named_buffers()}
    model = model.to(dtype)
    for name, b in buffers.items():
        owner, _, attr = name.rpartition(".")
        setattr(model.get_submodule(owner), attr, b)
    return model


def _generation_token_ids(path: Path) -> dict:
    """``bos/eos/pad_token_id`` set in ``generation_config.json`` (``{}`` when none or unreadable)."""
    gen_path = path / "generation_config.json"
    if not gen_path.exists():
        return {}
    try:
        gen = json.loads(gen_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        log.warning("ignoring %s: not valid JSON (%s)", gen_path, err)
        return {}
    if not isinstance(gen, dict):
        return {}
    return {k: gen[k] for k in HF_GENERATION_KEYS if gen.get(k) is not None}


def _vision_from_hf(path: Path, hf: dict, dtype: torch.dtype) -> nn.Module:
    """ViT / Swin through :mod:`attnlab.interop.vision`, after the same name/shape check.

    Old (transformers < 5.9) key names are accepted: the check compares the file's names after the
    vision module's renaming with the names its exporter writes for the configured model.
    """
    from attnlab.interop import vision as mod
    from attnlab.models.vision import SwinTransformer, VisionTransformer

    if _family_of_config(hf) == "vit":
        config_from_hf, build, export = mod.vit_config_from_hf, VisionTransformer, mod.vit_to_hf
        from_sd, prefix, rename = mod.vit_from_hf_state_dict, "vit.", mod._rename_vit_keys
    else:
        config_from_hf, build = mod.swin_config_from_hf, SwinTransformer
        export, from_sd = mod.swin_to_hf, mod.swin_from_hf_state_dict
        prefix, rename = "swin.", mod._rename_swin_keys
    files = _weight_files(path)
    file_shapes = _tensor_shapes(files)
    shape_probe = {n: torch.empty(0) for n in file_shapes}  # names only: picks the head/pooler
    try:
        cfg = config_from_hf(hf, shape_probe)
        _, expected = export(build(cfg))
    except (TypeError, ValueError) as err:
        raise UserError(f"config.json describes a model attnlab cannot build: {err}") from None

    def _strip(k: str, p: str) -> str:
        return k[len(p) :] if k.startswith(p) else k

    def canonical(names) -> dict[str, str]:  # canonical name -> file name
        return rename({_strip(n, prefix): n for n in names})

    canon = canonical(file_shapes)
    dropped = set(file_shapes) - set(canon.values())  # buffers the module ignores on purpose
    expected_shapes = {_strip(n, prefix): tuple(t.shape) for n, t in expected.items()}
    got = {c: file_shapes[f] for c, f in canon.items()}
    _validate(path, expected_shapes, got, canon, set())
    sd = {n: t.to(dtype) for n, t in read_hf_weights(path).items() if n not in dropped}
    try:
        model = from_sd(hf, sd)
    except RuntimeError as err:  # load_state_dict; the check above should have caught it
        raise UserError(f"the weights in {str(path)!r} do not fit the model: {err}") from None
    model = _params_to(model, dtype)
    model.hf_config = hf
    return model.eval()


def _zero_fill_names(family: str, hf: dict, expected: dict[str, tuple]) -> set[str]:
    """Llama biases attnlab needs but the checkpoint legitimately lacks (one flag off)."""
    if family != "llama" or not (hf.get("attention_bias") or hf.get("mlp_bias")):
        return set()
    off = []
    if not hf.get("attention_bias"):
        off.append(".self_attn.")
    if not hf.get("mlp_bias"):
        off.append(".mlp.")
    return {n for n in expected if n.endswith(".bias") and any(o in n for o in off)}


def _validate(
    path: Path,
    expected: dict[str, tuple],
    got: dict[str, tuple],
    file_name: dict[str, str],
    optional: set[str],
) -> None:
    missing = sorted(set(expected) - set(got) - optional)
    extra = sorted(file_name[n] for n in set(got) - set(expected))
    wrong = [
        (file_name[n], got[n], expected[n])
        for n in sorted(set(expected) & set(got))
        if tuple(got[n]) != tuple(expected[n])
    ]
    problems = []
    if wrong:
        problems.append(
            "shape mismatches: "
            + "; ".join(
                f"{n} has shape {list(g)} in the file but the config implies {list(e)}"
                for n, g, e in wrong[:10]
            )
            + (f" (and {len(wrong) - 10} more)" if len(wrong) > 10 else "")
        )
    if missing:
        problems.append(
            f"missing tensors ({len(missing)}): "
            + ", ".join(f"{n} {list(expected[n])}" for n in missing[:10])
            + (" ..." if len(missing) > 10 else "")
        )
    if extra:
        problems.append(
            f"unexpected tensors ({len(extra)}): "
            + ", ".join(extra[:10])
            + (" ..." if len(extra) > 10 else "")
        )
    if problems:
        raise UserError(
            f"the weights in {str(path)!r} do not match its config.json, nothing was "
            "loaded: " + " | ".join(problems)
        )


def _merge_experts(hf_sd: dict[str, Tensor], cfg) -> dict[str, Tensor]:
    """Older Mixtral layout -> fused: w_in[e] = [w1; w3] (gate | up), w_out[e] = w2."""
    out = {}
    for n, t in hf_sd.items():
        if ".block_sparse_moe.experts." not in n:
            out[n.replace(".block_sparse_moe.gate.", ".mlp.gate.")] = t
    for i in range(cfg.n_layers):
        p = f"model.layers.{i}.block_sparse_moe.experts."
        E = cfg.n_experts
        out[f"model.layers.{i}.mlp.experts.gate_up_proj"] = torch.stack(
            [
                torch.cat([hf_sd[f"{p}{e}.w1.weight"], hf_sd[f"{p}{e}.w3.weight"]], dim=0)
                for e in range(E)
            ]
        )  # (E, 2I, C)
        out[f"model.layers.{i}.mlp.experts.down_proj"] = torch.stack(
            [hf_sd[f"{p}{e}.w2.weight"] for e in range(E)]
        )  # (E, C, I)
    return out


def _drop_zero_bias_group(hf_cfg: dict, sd: dict[str, Tensor], src: dict) -> None:
    """Llama with only attention or only MLP biases: write back the flags the checkpoint had.

    attnlab's single ``bias`` switch loads such a checkpoint with zero biases for the other group;
    those are left out again (exact: a zero bias is no bias) when the source config said so.
    """
    for flag, part in (("attention_bias", ".self_attn."), ("mlp_bias", ".mlp.")):
        if src.get(flag, True):
            continue
        names = [n for n in sd if part in n and n.endswith(".bias")]
        if all(not sd[n].any() for n in names):
            for n in names:
                del sd[n]
            hf_cfg[flag] = False


def load_hf_tokenizer(path: str | os.PathLike):
    """The tokenizer in ``path/tokenizer.json``, or None when there is none.

    Returns attnlab's tokenizer interface (``encode(text) -> list[int]``, ``decode(ids)``,
    ``vocab_size``) around the ``tokenizers.Tokenizer`` (``.tokenizer``), the same object
    ``attnlab.load`` gives for a run directory holding that file.

    Raises:
        UserError: the file is not a readable ``tokenizers`` JSON.
    """
    from attnlab.data.tokenizers import ByteBPETokenizer

    tok_path = _check_dir(path) / TOKENIZER_NAME
    if not tok_path.exists():
        return None
    try:
        text = tok_path.read_text(encoding="utf-8")
        data = json.loads(text)
        if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
            raise ValueError("no 'model' section")
        return ByteBPETokenizer.from_json(text)
    except Exception as err:  # tokenizers raises its own exception type
        raise UserError(f"{tok_path} is not a Hugging Face tokenizer.json: {err}") from None


def load_hf_lm(
    path: str | os.PathLike,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | str | None = None,
):
    """``(model, tokenizer)`` of a Hugging Face causal-LM folder, ready for generation.

    What ``attnlab generate --from-hf DIR`` runs. The model's ``hf_config["eos_token_id"]`` is the
    checkpoint's end-of-text id (an int, a list, or None) to pass as ``stop``.

    Raises:
        UserError: not a GPT-2 / Llama / Mixtral checkpoint, or no ``tokenizer.json`` beside it.
    """
    hf = read_hf_config(path)
    if _family_of_config(hf) not in _FAMILIES:
        raise UserError(
            f"{str(path)!r} holds a {_family_of_config(hf)} model, not a language "
            f"model; text generation needs one of "
            f"{', '.join(f.architecture for f in _FAMILIES.values())}"
        )
    tok = load_hf_tokenizer(path)
    if tok is None:
        raise UserError(
            f"{str(path)!r} has no {TOKENIZER_NAME}; generating text needs the "
            "checkpoint's tokenizer beside its weights"
        )
    model = from_hf(path, dtype=dtype).to(device)
    return model, tok


def _tokenizer_json(tokenizer) -> str | None:
    """The ``tokenizer.json`` text of a tokenizer given to :func:`to_hf` (None for none)."""
    if tokenizer is None:
        return None
    if isinstance(tokenizer, (str, os.PathLike)):
        return Path(tokenizer).read_text(encoding="utf-8")
    inner = getattr(tokenizer, "tokenizer", tokenizer)  # attnlab's BPE wraps a tokenizers object
    if hasattr(inner, "to_str"):
        return inner.to_str()
    raise UserError(
        f"a {type(tokenizer).__name__} has no Hugging Face tokenizer.json form; pass a "
        "tokenizers.Tokenizer, an attnlab byte-level BPE tokenizer or a tokenizer.json path"
    )


# ----------------------------------------------------------------------------------------------
# writing


def to_hf(
    model: nn.Module,
    path: str | os.PathLike,
    *,
    tokenizer=None,
    overwrite: bool = False,
    moe_layout: str = "per_expert",
    dtype: torch.dtype | None = None,
    max_shard_size: int | None = None,
    extra_config: dict | None = None,
) -> Path:
    """Write ``model`` as a Hugging Face checkpoint folder (``config.json`` + safetensors).

    ``transformers.AutoModelForCausalLM.from_pretrained(path)`` loads the result (for ViT / Swin:
    ``AutoModel`` or ``AutoModelForImageClassification``).

    Args:
        model: a DecoderLM expressible as GPT-2, Llama or Mixtral, or a ViT / Swin model.
        path: output folder (created).
        tokenizer: a ``tokenizers.Tokenizer`` or attnlab byte-level BPE tokenizer (saved as
            ``tokenizer.json``), or the path of a Hugging Face ``tokenizer.json`` to copy.
        overwrite: replace an existing checkpoint in ``path`` (its weights, ``config.json``,
            ``tokenizer.json`` and ``generation_config.json``; other files are left alone).
        moe_layout: Mixtral expert layout, ``per_expert`` (default, readable by every
            transformers version) or ``fused``.
        dtype: save in this dtype (default: the model's).
        max_shard_size: bytes per shard; above it, writes shards and an index file.
        extra_config: keys merged into config.json (e.g. ``eos_token_id``). A model loaded with
            :func:`from_hf` passes its checkpoint's token ids on by default.

    Returns:
        The output folder.

    Raises:
        UserError: a model no supported architecture expresses, a tokenizer with no
            ``tokenizer.json`` form, or an existing checkpoint.
    """
    from safetensors.torch import save_file

    from attnlab.fileio import atomic_save, atomic_write_text

    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UserError(f"{str(path)!r} exists and is not a directory")
    if path.exists() and any(path.iterdir()) and not overwrite:
        raise UserError(
            f"{str(path)!r} is not empty; pass overwrite=True (--overwrite) to replace it"
        )
    kind = getattr(model, "kind", None)
    if kind in ("vit", "swin"):
        from attnlab.interop import vision

        export = vision.vit_to_hf if kind == "vit" else vision.swin_to_hf
        hf_cfg, sd = export(model)
        hf_cfg.update(extra_config or {})
    elif kind == "encoder_mlm":
        hf_cfg, sd = bert_to_hf(model)
        hf_cfg.update(extra_config or {})
    else:
        hf_cfg = model_config_to_hf(model)
        src = getattr(model, "hf_config", None) or {}
        hf_cfg.update({k: src[k] for k in HF_GENERATION_KEYS if k in src})
        hf_cfg.update(extra_config or {})
        sd = attnlab_to_hf_state_dict(model, moe_layout=moe_layout)
        if hf_cfg["model_type"] == "llama" and hf_cfg.get("attention_bias"):
            _drop_zero_bias_group(hf_cfg, sd, src)
    tok_json = _tokenizer_json(tokenizer)
    # safetensors refuses tensors sharing storage (q/k/v are views of one qkv weight)
    sd = {n: t.detach().to("cpu", dtype or t.dtype).contiguous().clone() for n, t in sd.items()}
    hf_cfg["dtype"] = str(next(iter(sd.values())).dtype).removeprefix("torch.")
    path.mkdir(parents=True, exist_ok=True)
    # replacing a checkpoint: none of the old one's weights, tokenizer or generation settings
    # may survive to describe the new model
    stale = [
        *path.glob("model*.safetensors*"),
        path / "generation_config.json",
        path / TOKENIZER_NAME,
    ]
    for old in stale:
        old.unlink(missing_ok=True)
    meta = {"format": "pt"}
    total = sum(t.numel() * t.element_size() for t in sd.values())
    if max_shard_size is None or total <= max_shard_size:
        atomic_save(path / WEIGHTS_NAME, lambda tmp: save_file(sd, tmp, metadata=meta))
    else:
        shards: list[dict[str, Tensor]] = [{}]
        size = 0
        for n, t in sd.items():
            nbytes = t.numel() * t.element_size()
            if shards[-1] and size + nbytes > max_shard_size:
                shards.append({})
                size = 0
            shards[-1][n] = t
            size += nbytes
        weight_map = {}
        for k, shard in enumerate(shards, 1):
            fname = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
            atomic_save(path / fname, lambda tmp, s=shard: save_file(s, tmp, metadata=meta))
            weight_map.update(dict.fromkeys(shard, fname))
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        atomic_write_text(path / INDEX_NAME, json.dumps(index, indent=2) + "\n")
    if tok_json is not None:
        atomic_write_text(path / TOKENIZER_NAME, tok_json)
    # config.json last: a folder without it is visibly incomplete
    atomic_write_text(path / CONFIG_NAME, json.dumps(hf_cfg, indent=2, sort_keys=True) + "\n")
    return path
