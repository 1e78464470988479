"""Hugging Face BERT (``BertForMaskedLM``, ``BertModel``) <-> :class:`attnlab.models.encoder.EncoderMLM`.

``from_hf`` / ``to_hf`` in :mod:`attnlab.interop.hf` read and write the folders; this module holds
the config translation and ONE declarative key map (:func:`bert_keymap`, see
:mod:`attnlab.interop.keymap`) from which both directions are derived:

==============================================  ==============================================
Hugging Face (``bert.`` prefix in ...ForMaskedLM) attnlab ``EncoderMLM``
==============================================  ==============================================
``embeddings.word_embeddings``                  ``tok_emb``
``embeddings.position_embeddings``              ``pos_emb`` (learned)
``embeddings.token_type_embeddings``            ``type_emb``
``embeddings.LayerNorm``                        ``emb_norm``
``encoder.layer.i.attention.self.{query,key,     rows of ``blocks.i.attn.qkv`` (Q | K | V)
value}``
``encoder.layer.i.attention.output.dense``      ``blocks.i.attn.out_proj``
``encoder.layer.i.attention.output.LayerNorm``  ``blocks.i.norm1`` (post-norm)
``encoder.layer.i.intermediate.dense``          ``blocks.i.ffn.fc1``
``encoder.layer.i.output.dense`` / ``LayerNorm``  ``blocks.i.ffn.fc2`` / ``blocks.i.norm2``
``cls.predictions.transform.dense`` /           ``head.dense`` / ``head.norm``
``LayerNorm``
``cls.predictions.bias``                        ``head.bias``
``cls.predictions.decoder.{weight,bias}``       tied copies of the word embeddings and of
                                                ``cls.predictions.bias`` (not stored)
==============================================  ==============================================

BERT's choices that the config must carry: post-norm, LayerNorm ε = 1e-12, exact (erf) GELU,
learned absolute positions counted from 0 whatever the padding, token types 0 by default.
Checkpoint extras attnlab has no use for are skipped: the non-persistent ``position_ids`` /
``token_type_ids`` buffers some versions saved, ``BertModel``'s pooler (a tanh layer over
``[CLS]``, not part of the features) and BERT pre-training's next-sentence head. Old
TensorFlow-converted names ``LayerNorm.gamma`` / ``beta`` are read as ``weight`` / ``bias``.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Any

import torch
from torch import Tensor

from attnlab.config.encoder import EncoderConfig
from attnlab.errors import UserError
from attnlab.interop.hf.family import (
    TO_HF_ACTIVATION,
    Family,
    hf_activation,
    model_from_state_dict,
    require,
    require_plain_heads,
)
from attnlab.interop.keymap import Concat, KeyMap, Rule
from attnlab.models.encoder import EncoderMLM

__all__ = [
    "BERT",
    "BERT_ARCHITECTURES",
    "bert_config_from_hf",
    "bert_config_to_hf",
    "bert_keymap",
    "bert_export",
    "bert_from_hf",
    "bert_to_hf",
]

BERT_ARCHITECTURES = ("BertForMaskedLM", "BertModel")
_BUFFERS = r"\.(position_ids|token_type_ids)\Z"


def _architecture(hf: dict, names: Collection[str]) -> str:
    archs = hf.get("architectures") or []
    if not archs:
        return "BertForMaskedLM" if any(n.startswith("cls.") for n in names) else "BertModel"
    if archs[0] not in BERT_ARCHITECTURES:
        raise UserError(
            f"unsupported BERT architecture {archs[0]}; supported: {', '.join(BERT_ARCHITECTURES)}"
        )
    return archs[0]


def bert_config_from_hf(hf: dict, names: Collection[str] = ()) -> EncoderConfig:
    """The :class:`EncoderConfig` of a Hugging Face BERT ``config.json`` dict.

    Args:
        hf: the config.json dict.
        names: the checkpoint's tensor names (they tell the head when config.json does not).

    Raises:
        UserError: options attnlab's encoder does not have (relative position embeddings, a
            decoder or cross-attention BERT, an unknown activation or head), a missing field.
    """
    _architecture(hf, names)
    kind = hf.get("position_embedding_type", "absolute")
    if kind != "absolute":
        raise UserError(f"BERT position_embedding_type {kind!r} is not supported (only absolute)")
    if hf.get("is_decoder") or hf.get("add_cross_attention"):
        raise UserError("a decoder BERT (is_decoder / add_cross_attention) is not supported")
    act = hf_activation(hf.get("hidden_act", "gelu"), "BERT hidden_act")
    try:
        fields = dict(
            vocab_size=hf["vocab_size"],
            d_model=hf["hidden_size"],
            n_layers=hf["num_hidden_layers"],
            n_heads=hf["num_attention_heads"],
            ffn_hidden=hf["intermediate_size"],
            max_seq_len=hf["max_position_embeddings"],
            type_vocab_size=hf.get("type_vocab_size", 2),
            norm_eps=float(hf.get("layer_norm_eps", 1e-12)),
            dropout=float(hf.get("hidden_dropout_prob", 0.1)),
            attn_dropout=float(hf.get("attention_probs_dropout_prob", 0.1)),
            init_std=float(hf.get("initializer_range", 0.02)),
            tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
        )
    except KeyError as err:
        raise UserError(f"BERT config.json lacks the field {err}") from None
    try:
        return EncoderConfig.preset("bert-base", activation=act, **fields)
    except (TypeError, ValueError) as err:
        raise UserError(f"config.json describes a model attnlab cannot build: {err}") from None


def bert_config_to_hf(c: EncoderConfig, architecture: str = "BertForMaskedLM") -> dict:
    """The Hugging Face ``config.json`` dict of an encoder BERT can express.

    Raises:
        UserError: naming the first setting BERT has no counterpart for.
    """
    what = "Hugging Face BERT"
    require(c, what, norm_position="post", position="learned", norm="layernorm", ffn="mlp")
    require(c, what, bias=True, qk_norm=None, embed_norm=True, linformer_k=None, residual=True)
    require_plain_heads(c, what)
    return {
        "architectures": [architecture],
        "model_type": "bert",
        "vocab_size": c.vocab_size,
        "hidden_size": c.d_model,
        "num_hidden_layers": c.n_layers,
        "num_attention_heads": c.n_heads,
        "intermediate_size": c.ffn_hidden,
        "hidden_act": TO_HF_ACTIVATION[c.activation],
        "hidden_dropout_prob": c.dropout,
        "attention_probs_dropout_prob": c.attn_dropout,
        "max_position_embeddings": c.max_seq_len,
        "type_vocab_size": c.type_vocab_size,
        "initializer_range": c.init_std,
        "layer_norm_eps": c.norm_eps,
        "position_embedding_type": "absolute",
        "tie_word_embeddings": c.tie_embeddings,
        "pad_token_id": 0,
    }


def bert_keymap(c: EncoderConfig, architecture: str = "BertForMaskedLM") -> KeyMap:
    """The key map between an :class:`EncoderMLM` of config ``c`` and HF ``architecture``."""
    mlm = architecture == "BertForMaskedLM"
    p = "bert." if mlm else ""
    layer = p + "encoder.layer.{i}."
    rules = [
        Rule("tok_emb.weight", f"{p}embeddings.word_embeddings.weight"),
        Rule("pos_emb.weight", f"{p}embeddings.position_embeddings.weight"),
        Rule("type_emb.weight", f"{p}embeddings.token_type_embeddings.weight"),
        Rule("emb_norm.{w}", p + "embeddings.LayerNorm.{w}"),
        Rule(
            "blocks.{i}.attn.qkv.{w}",
            tuple(layer + f"attention.self.{n}.{{w}}" for n in ("query", "key", "value")),
            Concat(dim=0),  # Q | K | V rows
        ),
        Rule("blocks.{i}.attn.out_proj.{w}", layer + "attention.output.dense.{w}"),
        Rule("blocks.{i}.norm1.{w}", layer + "attention.output.LayerNorm.{w}"),
        Rule("blocks.{i}.ffn.fc1.{w}", layer + "intermediate.dense.{w}"),
        Rule("blocks.{i}.ffn.fc2.{w}", layer + "output.dense.{w}"),
        Rule("blocks.{i}.norm2.{w}", layer + "output.LayerNorm.{w}"),
    ]
    norms = [p + "embeddings", layer + "attention.output", layer + "output"]
    ignore_theirs = [_BUFFERS, r"\A" + re.escape(p) + r"pooler\.", r"\Acls\.seq_relationship\."]
    if not mlm:  # features only: the MLM head has no counterpart
        return KeyMap(
            rules, ignore_ours=[r"\Ahead\."], ignore_theirs=ignore_theirs, renames=_tf_names(norms)
        )
    rules += [
        Rule("head.dense.{w}", "cls.predictions.transform.dense.{w}"),
        Rule("head.norm.{w}", "cls.predictions.transform.LayerNorm.{w}"),
        Rule("head.bias", "cls.predictions.bias"),
    ]
    tied_ours, tied_theirs = {}, {"cls.predictions.decoder.bias": "cls.predictions.bias"}
    if c.tie_embeddings:
        tied_ours["head.decoder.weight"] = "tok_emb.weight"
        tied_theirs["cls.predictions.decoder.weight"] = f"{p}embeddings.word_embeddings.weight"
    else:
        rules.append(Rule("head.decoder.weight", "cls.predictions.decoder.weight"))
    return KeyMap(
        rules,
        tied_ours=tied_ours,
        tied_theirs=tied_theirs,
        ignore_theirs=ignore_theirs,
        renames=_tf_names([*norms, "cls.predictions.transform"]),
    )


def _tf_names(owners: list[str]) -> dict[str, str]:
    """TensorFlow-era names of the LayerNorms under ``owners``: ``gamma`` / ``beta``."""
    return {
        f"{o}.LayerNorm.{old}": f"{o}.LayerNorm.{new}"
        for o in owners
        for old, new in (("gamma", "weight"), ("beta", "bias"))
    }


BERT = Family(
    name="bert",
    architectures=BERT_ARCHITECTURES,
    config_from_hf=bert_config_from_hf,
    build=EncoderMLM,
    keymap=lambda hf, c, names: bert_keymap(c, _architecture(hf, names)),
    model_types=("bert",),
)


def bert_from_hf(
    hf: dict, weights: dict[str, Tensor], dtype: torch.dtype = torch.float32
) -> EncoderMLM:
    """Build an :class:`EncoderMLM` from a BERT ``config.json`` dict and its tensors.

    A ``BertModel`` checkpoint gives the encoder (features equal to ``last_hidden_state``) with a
    freshly initialised MLM head.

    Returns:
        The model in eval mode, ``hf_config`` set to ``hf``.

    Raises:
        UserError: unsupported architecture or option; missing, unexpected or misshapen tensors
            (named, with both shapes), checked before anything is loaded.
    """
    model = model_from_state_dict(BERT, hf, weights, dtype)
    model.hf_config = hf
    return model


def bert_export(model: EncoderMLM, architecture: str = "BertForMaskedLM") -> tuple[dict, KeyMap]:
    """``(config.json dict, key map)`` of ``model`` as Hugging Face ``architecture``.

    Raises:
        UserError: an unknown architecture, or an encoder BERT cannot express (named).
    """
    if architecture not in BERT_ARCHITECTURES:
        raise UserError(
            f"unknown BERT architecture {architecture!r}; choose from {list(BERT_ARCHITECTURES)}"
        )
    return bert_config_to_hf(model.config, architecture), bert_keymap(model.config, architecture)


def bert_to_hf(
    model: EncoderMLM, architecture: str = "BertForMaskedLM"
) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """``(config.json dict, state dict)`` of ``model`` as Hugging Face ``architecture``.

    Tied copies are left out, as ``save_pretrained`` does; ``from_pretrained`` ties them again.

    Raises:
        UserError: an unknown architecture, or an encoder BERT cannot express (named).
    """
    hf_cfg, keymap = bert_export(model, architecture)
    return hf_cfg, keymap.to_theirs(model.state_dict())
