"""Hugging Face T5 (``T5ForConditionalGeneration``) <-> :class:`attnlab.models.t5.T5`.

``from_hf`` / ``to_hf`` in :mod:`attnlab.interop.hf` read and write the folders; this module holds
the config translation and ONE declarative key map (:func:`t5_keymap`) from which both directions
are derived (``{s}`` is ``encoder`` or ``decoder``; the decoder's layer 1 is cross-attention, so
its FFN is layer 2):

====================================================  ==========================================
Hugging Face                                          attnlab ``T5``
====================================================  ==========================================
``shared``                                            ``src_emb`` (= ``tgt_emb``: shared)
``{s}.embed_tokens``, tied ``lm_head`` (1.0)          tied copies (not stored)
``lm_head`` (1.1, untied)                             ``lm_head``
``{s}.block.0.layer.0.SelfAttention.                  ``enc_bias`` / ``dec_bias`` (one table per
relative_attention_bias``                             stack, added in every layer)
``{s}.block.i.layer.0.SelfAttention.{q,k,v}``         rows of ``{s}.i.attn.qkv`` (Q | K | V)
``{s}.block.i.layer.0.SelfAttention.o``               ``{s}.i.attn.out_proj``
``{s}.block.i.layer.0.layer_norm``                    ``{s}.i.norm1``
``decoder.block.i.layer.1.EncDecAttention.q`` /       ``decoder.i.cross_attn.q_proj`` / rows of
``{k,v}`` / ``o``                                     ``cross_attn.kv_proj`` (K | V) / ``out_proj``
``decoder.block.i.layer.1.layer_norm``                ``decoder.i.norm_cross``
``...DenseReluDense.wi`` / ``wo`` (1.0)               ``{s}.i.ffn.fc1`` / ``fc2``
``...DenseReluDense.wi_0`` / ``wi_1`` / ``wo`` (1.1)  ``{s}.i.ffn.gate`` / ``up`` / ``down``
``...layer.{1,2}.layer_norm`` (before the FFN)        ``{s}.i.norm2``
``{s}.final_layer_norm``                              ``enc_norm`` / ``dec_norm``
====================================================  ==========================================

T5's choices the config must carry: RMS norm without bias (ε from ``layer_norm_epsilon``),
unscaled scores, no biases, no embedding scaling, relative buckets from
``relative_attention_num_buckets`` / ``relative_attention_max_distance``, the FFN from
``feed_forward_proj`` (``relu``: 1.0; ``gated-gelu``: 1.1's gated tanh-GELU), and one flag for
the head: tied embeddings with the d_model^-0.5 output scaling (1.0), or an untied head without
it (1.1, ``tie_word_embeddings: false``; transformers 5 records this as
``scale_decoder_outputs``).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Any

import torch
from torch import Tensor

from attnlab.config.t5 import T5Config
from attnlab.errors import UserError
from attnlab.interop.hf.family import (
    HF_ACTIVATIONS,
    Family,
    get,
    model_from_state_dict,
    require,
    require_plain_heads,
)
from attnlab.interop.keymap import Concat, KeyMap, Rule
from attnlab.models.t5 import T5

__all__ = [
    "T5_FAMILY",
    "T5_ARCHITECTURES",
    "t5_config_from_hf",
    "t5_config_to_hf",
    "t5_keymap",
    "t5_export",
    "t5_from_hf",
    "t5_to_hf",
]

T5_ARCHITECTURES = ("T5ForConditionalGeneration",)
#: T5 heads and bodies attnlab has no model for (their checkpoints are refused by name)
_OTHER_T5 = (
    "T5Model",
    "T5EncoderModel",
    "T5ForSequenceClassification",
    "T5ForTokenClassification",
    "T5ForQuestionAnswering",
)
#: the gated activation Hugging Face spells ``gated-gelu`` is the tanh GELU (``gelu_new``)
_GATED_GELU = "gated-gelu"
#: the encoder-decoder attention of old checkpoints carried an unused bias table
_UNUSED = r"\Adecoder\.block\.0\.layer\.1\.EncDecAttention\.relative_attention_bias\.weight\Z"


def _ffn_from_hf(proj: str) -> tuple[str, str]:
    """``feed_forward_proj`` -> ``(ffn, activation)``.

    Raises:
        UserError: a feed-forward layout attnlab has no block for (named).
    """
    parts = proj.split("-")
    gated = len(parts) == 2 and parts[0] == "gated"
    if len(parts) > 2 or (len(parts) == 2 and not gated):
        raise UserError(
            f"T5 feed_forward_proj {proj!r} is not a supported layout: use 'relu' (T5 1.0), "
            "'gated-gelu' (T5 1.1) or '[gated-]ACTIVATION'"
        )
    act = parts[-1]
    if proj == _GATED_GELU:
        return "gated", "gelu_tanh"
    if act not in HF_ACTIVATIONS:
        raise UserError(
            f"T5 feed_forward_proj {proj!r}: activation {act!r} is not supported; supported: "
            f"{sorted(HF_ACTIVATIONS)}"
        )
    return ("gated" if gated else "mlp"), HF_ACTIVATIONS[act]


def _ffn_to_hf(c: T5Config) -> str:
    if c.ffn == "gated" and c.activation == "gelu_tanh":
        return _GATED_GELU
    names = {"relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu_new", "silu": "silu"}
    if c.ffn == "mlp":
        return names[c.activation]
    if c.ffn == "gated" and c.activation in ("relu", "silu"):
        return f"gated-{names[c.activation]}"
    raise UserError(
        f"Hugging Face T5 has no feed-forward layer ffn={c.ffn!r} with "
        f"activation={c.activation!r} (it has mlp with relu, gelu, gelu_tanh or silu, and gated "
        "with gelu_tanh ('gated-gelu'), relu or silu)"
    )


def _check_layout(hf: dict, names: Collection[str]) -> None:
    archs = hf.get("architectures") or []
    if archs and archs[0] not in T5_ARCHITECTURES:
        raise UserError(
            f"unsupported T5 architecture {archs[0]}: attnlab reads "
            f"{', '.join(T5_ARCHITECTURES)} (the encoder-decoder with its LM head)"
        )
    if hf.get("is_decoder"):
        raise UserError("a decoder-only T5 (is_decoder: true) is not a supported layout")
    per_layer = sorted(
        n
        for n in names
        if re.search(r"\.block\.[1-9]\d*\..*relative_attention_bias", n)
        or (re.search(r"EncDecAttention\.relative_attention_bias", n) and not re.search(_UNUSED, n))
    )
    if per_layer:
        raise UserError(
            f"unsupported T5 layout: relative_attention_bias beyond the first layer of each "
            f"stack ({per_layer[0]}; UMT5 gives every layer its own table); attnlab's T5 shares "
            "one table per stack"
        )


def _scaled_and_tied(hf: dict) -> bool:
    """Whether the head is 1.0's (tied and scaled by d_model^-0.5) rather than 1.1's."""
    if hf.get("scale_decoder_outputs") is not None:  # what transformers 5 writes
        return bool(hf["scale_decoder_outputs"])
    return hf.get("tie_word_embeddings", True) is not False


def t5_config_from_hf(hf: dict, names: Collection[str] = ()) -> T5Config:
    """The :class:`T5Config` of a Hugging Face T5 ``config.json`` dict.

    Raises:
        UserError: an unsupported layout (named: another T5 head, a decoder-only T5, per-layer
            bias tables, an unknown ``feed_forward_proj``), a missing field.
    """
    _check_layout(hf, names)
    ffn, act = _ffn_from_hf(str(hf.get("feed_forward_proj", "relu")))
    tied = _scaled_and_tied(hf)
    dropout = float(get(hf, "dropout_rate", default=0.1))
    try:
        n_layers = int(hf["num_layers"])
        fields = dict(
            src_vocab_size=hf["vocab_size"],
            tgt_vocab_size=hf["vocab_size"],
            d_model=hf["d_model"],
            head_dim=hf["d_kv"],
            ffn_hidden=hf["d_ff"],
            n_heads=hf["num_heads"],
            n_enc_layers=n_layers,
            n_dec_layers=int(get(hf, "num_decoder_layers", default=n_layers)),
            num_buckets=int(hf.get("relative_attention_num_buckets", 32)),
            max_distance=int(hf.get("relative_attention_max_distance", 128)),
            norm_eps=float(hf.get("layer_norm_epsilon", 1e-6)),
            pad_id=int(get(hf, "pad_token_id", default=0)),
        )
    except KeyError as err:
        raise UserError(f"T5 config.json lacks the field {err}") from None
    try:
        return T5Config(
            **fields,
            ffn=ffn,
            activation=act,
            dropout=dropout,
            attn_dropout=dropout,
            share_embeddings=True,
            tie_embeddings=tied,
            scale_output=tied,
            max_seq_len=int(hf.get("n_positions") or 512),
        )
    except (TypeError, ValueError) as err:
        raise UserError(f"config.json describes a model attnlab cannot build: {err}") from None


def t5_config_to_hf(c: T5Config) -> dict[str, Any]:
    """The Hugging Face ``config.json`` dict of a T5 model transformers can express.

    Raises:
        UserError: naming the first setting Hugging Face T5 has no counterpart for.
    """
    what = "Hugging Face T5"
    require(c, what, norm="rmsnorm", norm_position="pre", bias=False, attn_scale=1.0)
    require(c, what, qk_norm=None, linformer_k=None, final_norm=True, scale_embeddings=False)
    require(c, what, residual=True)
    require(c, what, share_embeddings=True, encoder=None, decoder=None)
    if c.tie_embeddings != c.scale_output:
        raise UserError(
            f"{what} ties the head and scales the output together (1.0) or does neither (1.1); "
            f"got tie_embeddings={c.tie_embeddings}, scale_output={c.scale_output}"
        )
    if c.n_kv_heads != c.n_heads:
        require_plain_heads(c, what)
    return {
        "architectures": list(T5_ARCHITECTURES),
        "model_type": "t5",
        "vocab_size": c.src_vocab_size,
        "d_model": c.d_model,
        "d_kv": c.head_dim,
        "d_ff": c.ffn_hidden,
        "num_layers": c.n_enc_layers,
        "num_decoder_layers": c.n_dec_layers,
        "num_heads": c.n_heads,
        "relative_attention_num_buckets": c.num_buckets,
        "relative_attention_max_distance": c.max_distance,
        "dropout_rate": c.dropout,
        "layer_norm_epsilon": c.norm_eps,
        "feed_forward_proj": _ffn_to_hf(c),
        "tie_word_embeddings": c.tie_embeddings,
        "scale_decoder_outputs": c.scale_output,
        "is_encoder_decoder": True,
        "pad_token_id": c.pad_id,
        "decoder_start_token_id": c.pad_id,
        "eos_token_id": 1,
    }


def t5_keymap(c: T5Config) -> KeyMap:
    """The key map between a :class:`T5` of config ``c`` and ``T5ForConditionalGeneration``."""
    rules = [
        Rule("src_emb.weight", "shared.weight"),
        Rule(
            "enc_bias.weight",
            "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
        ),
        Rule(
            "dec_bias.weight",
            "decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
        ),
        Rule("enc_norm.weight", "encoder.final_layer_norm.weight"),
        Rule("dec_norm.weight", "decoder.final_layer_norm.weight"),
    ]
    gated = c.ffn == "gated"
    for stack, ffn_layer in (("encoder", 1), ("decoder", 2)):
        hf = f"{stack}.block.{{i}}.layer."
        attn = hf + "0.SelfAttention."
        dense = f"{hf}{ffn_layer}.DenseReluDense."
        rules += [
            Rule(
                f"{stack}.{{i}}.attn.qkv.weight",
                tuple(f"{attn}{n}.weight" for n in "qkv"),
                Concat(dim=0),
            ),  # Q | K | V rows
            Rule(f"{stack}.{{i}}.attn.out_proj.weight", attn + "o.weight"),
            Rule(f"{stack}.{{i}}.norm1.weight", hf + "0.layer_norm.weight"),
            Rule(f"{stack}.{{i}}.norm2.weight", f"{hf}{ffn_layer}.layer_norm.weight"),
        ]
        if gated:
            rules += [
                Rule(f"{stack}.{{i}}.ffn.gate.weight", dense + "wi_0.weight"),
                Rule(f"{stack}.{{i}}.ffn.up.weight", dense + "wi_1.weight"),
                Rule(f"{stack}.{{i}}.ffn.down.weight", dense + "wo.weight"),
            ]
        else:
            rules += [
                Rule(f"{stack}.{{i}}.ffn.fc1.weight", dense + "wi.weight"),
                Rule(f"{stack}.{{i}}.ffn.fc2.weight", dense + "wo.weight"),
            ]
    cross = "decoder.block.{i}.layer.1."
    rules += [
        Rule("decoder.{i}.cross_attn.q_proj.weight", cross + "EncDecAttention.q.weight"),
        Rule(
            "decoder.{i}.cross_attn.kv_proj.weight",
            tuple(f"{cross}EncDecAttention.{n}.weight" for n in "kv"),
            Concat(dim=0),
        ),  # K | V
        Rule("decoder.{i}.cross_attn.out_proj.weight", cross + "EncDecAttention.o.weight"),
        Rule("decoder.{i}.norm_cross.weight", cross + "layer_norm.weight"),
    ]
    tied_ours = {"tgt_emb.weight": "src_emb.weight"}
    tied_theirs = {
        "encoder.embed_tokens.weight": "shared.weight",
        "decoder.embed_tokens.weight": "shared.weight",
    }
    if c.tie_embeddings:
        tied_ours["lm_head.weight"] = "src_emb.weight"
        tied_theirs["lm_head.weight"] = "shared.weight"
    else:
        rules.append(Rule("lm_head.weight", "lm_head.weight"))
    return KeyMap(rules, tied_ours=tied_ours, tied_theirs=tied_theirs, ignore_theirs=[_UNUSED])


T5_FAMILY = Family(
    name="t5",
    architectures=(*T5_ARCHITECTURES, *_OTHER_T5),
    config_from_hf=t5_config_from_hf,
    build=T5,
    keymap=lambda hf, c, names: t5_keymap(c),
    model_types=("t5",),
)


def t5_from_hf(hf: dict, weights: dict[str, Tensor], dtype: torch.dtype = torch.float32) -> T5:
    """A :class:`T5` from a T5 ``config.json`` dict and its tensors (eval mode, ``hf_config``
    set).

    Raises:
        UserError: an unsupported layout (named); missing, unexpected or misshapen tensors
            (named, with both shapes), checked before anything is loaded.
    """
    model = model_from_state_dict(T5_FAMILY, hf, weights, dtype)
    model.hf_config = hf
    return model


def t5_export(model: T5) -> tuple[dict, KeyMap]:
    """``(config.json dict, key map)`` of ``model`` as ``T5ForConditionalGeneration``.

    Raises:
        UserError: a model Hugging Face T5 cannot express (named).
    """
    return t5_config_to_hf(model.config), t5_keymap(model.config)


def t5_to_hf(model: T5) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """``(config.json dict, state dict)`` of ``model`` as ``T5ForConditionalGeneration``; tied
    copies are left out, as ``save_pretrained`` does.

    Raises:
        UserError: a model Hugging Face T5 cannot express (named).
    """
    hf_cfg, keymap = t5_export(model)
    return hf_cfg, keymap.to_theirs(model.state_dict())
