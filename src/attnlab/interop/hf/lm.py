"""Hugging Face GPT-2, Llama and Mixtral <-> :class:`attnlab.models.lm.DecoderLM`.

One key map per family (:func:`gpt2_keymap`, :func:`llama_keymap`) and the config translation
both ways. Shape legend: C d_model, H query heads, Hkv key/value heads, D head_dim, I FFN width,
E experts, V vocabulary.

==============================================  ==============================================
Hugging Face                                    attnlab ``DecoderLM``
==============================================  ==============================================
GPT-2 ``transformer.wte`` / ``wpe``             ``tok_emb`` / ``pos_emb``
GPT-2 ``h.i.attn.c_attn.weight (C, 3C)``        ``blocks.i.attn.qkv.weight (3C, C)``: GPT-2's
                                                Conv1D stores ``(in, out)``: ``Transpose``
GPT-2 ``ln_1`` ``attn.c_proj`` ``ln_2``         ``norm1`` ``attn.out_proj`` ``norm2``
``mlp.c_fc/c_proj``                             ``ffn.fc1/fc2`` (projections transposed)
Llama ``self_attn.{q,k,v}_proj``                rows of ``attn.qkv``: ``Concat`` with sizes
                                                (H·D, Hkv·D, Hkv·D); no RoPE permutation, both
                                                rotate halves
Llama ``o_proj`` / ``mlp.{gate,up,down}_proj``  ``attn.out_proj`` / ``ffn.{gate,up,down}``
Mixtral ``mlp.gate (E, C)``                     ``ffn.router`` (softmax, top-k, renormalise)
Mixtral ``mlp.experts.gate_up_proj (E,2I,C)``   ``ffn.w_in`` (rows gate | up, same layout)
Mixtral ``mlp.experts.down_proj (E, C, I)``     ``ffn.w_out``
Mixtral ``block_sparse_moe.experts.e.w1/w3/w2``  ``w_in = stack_e [w1; w3]``, ``w_out = stack_e
(what ``save_pretrained`` writes)               w2``: ``Stack(0, E, each=Concat(0))``
``input_layernorm`` / ``post_attention_...``    ``norm1`` / ``norm2``
``model.norm`` / ``ln_f``, ``lm_head``          ``norm_f``, ``lm_head`` (tied: ``tok_emb``)
==============================================  ==============================================

attnlab has one ``bias`` switch. A bias-free model written as GPT-2 (which always has biases) gets
zero biases (``ZeroBias``); a Llama checkpoint with attention biases but no MLP biases (or the
reverse) loads with zero biases for the other group, which are left out again on the way back
when they are still zero.
"""

from __future__ import annotations

import logging
from collections.abc import Collection

from torch import nn

from attnlab.config.lm import ModelConfig
from attnlab.errors import UserError
from attnlab.interop.hf.family import (
    TO_HF_ACTIVATION,
    Family,
    get,
    hf_activation,
    require,
    require_plain_heads,
)
from attnlab.interop.keymap import (
    Chain,
    Concat,
    Identity,
    Inverse,
    KeyMap,
    Rule,
    Stack,
    Transform,
    Transpose,
    ZeroBias,
)
from attnlab.models.lm import DecoderLM

__all__ = [
    "LM_FAMILIES",
    "gpt2_keymap",
    "llama_keymap",
    "lm_config_from_hf",
    "lm_config_to_hf",
    "lm_export",
    "lm_family_of_model",
]

log = logging.getLogger(__name__)

MOE_LAYOUTS = ("per_expert", "fused")
ARCHITECTURES = {
    "gpt2": "GPT2LMHeadModel",
    "llama": "LlamaForCausalLM",
    "mixtral": "MixtralForCausalLM",
}


# ---- key maps -----------------------------------------------------------------------------------


def _layer(ours: str, theirs: str | tuple[str, ...], t: Transform, ours_bias: bool, theirs_bias):
    """The rule of one layer's weight and bias; a bias only one side holds must be zero.

    ``ours`` and ``theirs`` name the module(s); ``t`` converts the weights (a bias the same way).
    """
    names = (theirs,) if isinstance(theirs, str) else theirs
    if ours_bias == theirs_bias:  # both or neither: one rule for weight and bias
        return Rule(f"{ours}.{{w}}", tuple(f"{n}.{{w}}" for n in names), t)
    if theirs_bias:  # GPT-2's biases for a bias-free attnlab layer
        (name,) = names
        return Rule(f"{ours}.weight", (f"{name}.weight", f"{name}.bias"), Chain(ZeroBias(), t))
    return Rule(  # a Llama group without biases in a model that has them
        (f"{ours}.weight", f"{ours}.bias"),
        tuple(f"{n}.weight" for n in names),
        Chain(Inverse(ZeroBias()), t),
    )


def _head(rules: list[Rule], c: ModelConfig, embed: str, ignore: list[str], renames=None):
    """The key map with the output projection: a tied copy of the embedding, or its own rule."""
    if not c.tie_embeddings:
        rules = [*rules, Rule("lm_head.weight", "lm_head.weight")]
    tied = c.tie_embeddings  # a tied file storing lm_head as well: the embedding wins
    return KeyMap(
        rules,
        tied_ours={"lm_head.weight": "tok_emb.weight"} if tied else None,
        tied_theirs={"lm_head.weight": embed} if tied else None,
        ignore_theirs=ignore,
        renames=renames,
    )


def gpt2_keymap(c: ModelConfig) -> KeyMap:
    """The key map between a GPT-2-shaped :class:`DecoderLM` and ``GPT2LMHeadModel``.

    Older files without the ``transformer.`` prefix and with the causal-mask buffers
    (``attn.bias``, ``attn.masked_bias``) are read too.
    """
    h, b = "transformer.h.{i}.", c.bias

    def layer(ours: str, theirs: str, conv: bool = False) -> Rule:
        return _layer(ours, theirs, Transpose() if conv else Identity(), b, True)

    rules = [
        Rule("tok_emb.weight", "transformer.wte.weight"),
        Rule("pos_emb.weight", "transformer.wpe.weight"),
        layer("blocks.{i}.norm1", h + "ln_1"),
        layer("blocks.{i}.attn.qkv", h + "attn.c_attn", conv=True),
        layer("blocks.{i}.attn.out_proj", h + "attn.c_proj", conv=True),
        layer("blocks.{i}.norm2", h + "ln_2"),
        layer("blocks.{i}.ffn.fc1", h + "mlp.c_fc", conv=True),
        layer("blocks.{i}.ffn.fc2", h + "mlp.c_proj", conv=True),
        layer("norm_f", "transformer.ln_f"),
    ]
    no_prefix = {
        "wte.weight": "transformer.wte.weight",
        "wpe.weight": "transformer.wpe.weight",
        "ln_f.{w}": "transformer.ln_f.{w}",
        "h.{i}.{m}.{w}": "transformer.h.{i}.{m}.{w}",  # ln_1, and attn.bias (a buffer)
        "h.{i}.{m}.{p}.{w}": "transformer.h.{i}.{m}.{p}.{w}",
    }
    ignore = [r"\.attn\.(bias|masked_bias)\Z"]
    return _head(rules, c, "transformer.wte.weight", ignore, no_prefix)


def llama_keymap(
    c: ModelConfig,
    *,
    attention_bias: bool | None = None,
    mlp_bias: bool | None = None,
    moe_layout: str = "fused",
) -> KeyMap:
    """The key map between a Llama/Mixtral-shaped :class:`DecoderLM` and the HF checkpoint.

    Args:
        c: the model's config (``ffn`` ``swiglu``: Llama; ``moe``: Mixtral).
        attention_bias, mlp_bias: whether the checkpoint holds those biases (default:
            ``c.bias``); a group without them loads as zero biases.
        moe_layout: Mixtral's experts ``fused`` (``mlp.experts.gate_up_proj``, transformers 5
            in memory) or ``per_expert`` (``block_sparse_moe.experts.e.w1/w2/w3``).
    """
    attention_bias = c.bias if attention_bias is None else attention_bias
    mlp_bias = c.bias if mlp_bias is None else mlp_bias
    lay, D = "model.layers.{i}.", c.head_dim
    qkv = tuple(f"{lay}self_attn.{p}_proj" for p in "qkv")
    sizes = (c.n_heads * D, c.n_kv_heads * D, c.n_kv_heads * D)  # Q | K | V rows
    rules = [
        Rule("tok_emb.weight", "model.embed_tokens.weight"),
        _layer("blocks.{i}.attn.qkv", qkv, Concat(0, sizes), c.bias, attention_bias),
        _layer(
            "blocks.{i}.attn.out_proj", lay + "self_attn.o_proj", Identity(), c.bias, attention_bias
        ),
        Rule("blocks.{i}.norm1.weight", lay + "input_layernorm.weight"),
        Rule("blocks.{i}.norm2.weight", lay + "post_attention_layernorm.weight"),
        Rule("norm_f.weight", "model.norm.weight"),
    ]
    if c.ffn == "swiglu":
        rules += [
            _layer(f"blocks.{{i}}.ffn.{ours}", f"{lay}mlp.{theirs}", Identity(), c.bias, mlp_bias)
            for ours, theirs in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj"))
        ]
    elif moe_layout == "fused":
        rules += [
            Rule("blocks.{i}.ffn.router.weight", lay + "mlp.gate.weight"),
            Rule("blocks.{i}.ffn.w_in", lay + "mlp.experts.gate_up_proj"),  # (E, 2I, C)
            Rule("blocks.{i}.ffn.w_out", lay + "mlp.experts.down_proj"),  # (E, C, I)
        ]
    elif moe_layout == "per_expert":
        E, ex = c.n_experts, lay + "block_sparse_moe.experts."
        rules += [
            Rule("blocks.{i}.ffn.router.weight", lay + "block_sparse_moe.gate.weight"),
            Rule(  # w_in[e] = [w1; w3] (gate | up rows)
                "blocks.{i}.ffn.w_in",
                tuple(f"{ex}{e}.{w}.weight" for e in range(E) for w in ("w1", "w3")),
                Stack(dim=0, n=E, each=Concat(dim=0)),
            ),
            Rule(
                "blocks.{i}.ffn.w_out",
                tuple(f"{ex}{e}.w2.weight" for e in range(E)),
                Stack(dim=0, n=E),
            ),
        ]
    else:
        raise UserError(f"moe_layout must be 'fused' or 'per_expert', got {moe_layout!r}")
    return _head(rules, c, "model.embed_tokens.weight", [r"\.rotary_emb\.inv_freq\Z"])


# ---- config.json -> ModelConfig -----------------------------------------------------------------


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


def _gpt2_config(hf: dict) -> dict:
    act = hf.get("activation_function", "gelu_new")
    if hf.get("scale_attn_by_inverse_layer_idx"):
        raise UserError("GPT-2 scale_attn_by_inverse_layer_idx=true is not supported")
    if hf.get("scale_attn_weights") is False:
        raise UserError("GPT-2 scale_attn_weights=false (unscaled attention) is not supported")
    if hf.get("add_cross_attention"):
        raise UserError("GPT-2 with add_cross_attention=true is not a decoder-only model")
    d = get(hf, "n_embd", "hidden_size", default=768)
    return dict(
        vocab_size=get(hf, "vocab_size", default=50257),
        max_seq_len=get(hf, "n_positions", "max_position_embeddings", default=1024),
        d_model=d,
        n_layers=get(hf, "n_layer", "num_hidden_layers", default=12),
        n_heads=get(hf, "n_head", "num_attention_heads", default=12),
        ffn="mlp",
        ffn_hidden=get(hf, "n_inner", default=4 * d),
        activation=hf_activation(act, "GPT-2 activation_function"),
        norm="layernorm",
        norm_eps=float(get(hf, "layer_norm_epsilon", default=1e-5)),
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
    max_len = get(hf, "max_position_embeddings", default=2048)
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
        n_kv_heads=get(hf, "num_key_value_heads", default=n_heads),
        head_dim=get(hf, "head_dim", default=d // n_heads),
        ffn_hidden=hf["intermediate_size"],
        activation="silu",
        norm="rmsnorm",
        norm_eps=float(get(hf, "rms_norm_eps", default=default_eps)),
        norm_position="pre",
        position="rope",
        rope_theta=_rope_theta(hf, default_theta),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
    )


def _llama_config(hf: dict) -> dict:
    kw = _llama_like_config(hf, default_eps=1e-6, default_theta=10000.0)
    # one bias switch: a checkpoint with only one of the two groups gets zero biases for the other
    kw.update(ffn="swiglu", bias=bool(hf.get("attention_bias") or hf.get("mlp_bias")))
    return kw


def _mixtral_config(hf: dict) -> dict:
    kw = _llama_like_config(hf, default_eps=1e-5, default_theta=1e6)
    kw.update(
        ffn="moe",
        bias=False,
        n_experts=get(hf, "num_local_experts", "num_experts", default=8),
        top_k=get(hf, "num_experts_per_tok", default=2),
        moe_aux_coef=float(get(hf, "router_aux_loss_coef", default=0.001)),
    )
    return kw


_CONFIG_FROM_HF = {"gpt2": _gpt2_config, "llama": _llama_config, "mixtral": _mixtral_config}


def lm_config_from_hf(hf: dict, family: str) -> ModelConfig:
    """The :class:`ModelConfig` of a GPT-2 / Llama / Mixtral ``config.json`` dict.

    Raises:
        UserError: an option attnlab does not have (RoPE scaling, another activation...).
        KeyError, ValueError: a missing field, values the config rejects.
    """
    return ModelConfig(**_CONFIG_FROM_HF[family](hf))


# ---- DecoderLM -> config.json -------------------------------------------------------------------


def lm_family_of_model(model: nn.Module) -> str:
    """``gpt2`` | ``llama`` | ``mixtral``: the Hugging Face family a DecoderLM's config matches.

    Raises:
        UserError: not a DecoderLM, or a combination no supported family has.
    """
    cfg = getattr(model, "config", None)
    if getattr(model, "kind", None) != "decoder_lm" or cfg is None:
        raise UserError(
            "to_hf exports attnlab DecoderLM models (as GPT2LMHeadModel, LlamaForCausalLM or "
            "MixtralForCausalLM), EncoderMLM (BERT) and the ViT / Swin models; "
            f"got {type(model).__name__}"
        )
    if cfg.position == "learned" and cfg.norm == "layernorm" and cfg.ffn == "mlp":
        return "gpt2"
    if cfg.position == "rope" and cfg.norm == "rmsnorm" and cfg.activation == "silu":
        if cfg.ffn in ("swiglu", "moe"):
            return "llama" if cfg.ffn == "swiglu" else "mixtral"
    raise UserError(
        "this model matches no supported Hugging Face architecture: GPT2LMHeadModel needs "
        "position='learned', norm='layernorm', ffn='mlp'; LlamaForCausalLM needs position='rope', "
        "norm='rmsnorm', ffn='swiglu', activation='silu'; MixtralForCausalLM the same with "
        f"ffn='moe'. Got position={cfg.position!r}, norm={cfg.norm!r}, ffn={cfg.ffn!r}, "
        f"activation={cfg.activation!r}"
    )


def _llama_like_to_hf(c: ModelConfig) -> dict:
    return {
        "vocab_size": c.vocab_size,
        "hidden_size": c.d_model,
        "intermediate_size": c.ffn_hidden,
        "num_hidden_layers": c.n_layers,
        "num_attention_heads": c.n_heads,
        "num_key_value_heads": c.n_kv_heads,
        "head_dim": c.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": c.max_seq_len,
        "rms_norm_eps": c.norm_eps,
        "rope_parameters": {"rope_type": "default", "rope_theta": float(c.rope_theta)},
        "rope_theta": float(c.rope_theta),  # transformers 4.x reads this one
        "attention_dropout": c.attn_dropout,
        "tie_word_embeddings": bool(c.tie_embeddings),
        "bos_token_id": None,
        "eos_token_id": None,
    }


def lm_config_to_hf(c: ModelConfig, family: str) -> dict:
    """The ``config.json`` dict of a DecoderLM config as ``family``.

    Raises:
        UserError: a setting the family cannot express (named).
    """
    what = ARCHITECTURES[family]
    require(c, what, norm_position="pre", qk_norm=None, embed_scale=1.0, logit_softcap=None)
    wirings = dict(value_embeds=0, unet_skips=False, token_shift=False)  # no HF family has them
    require(c, what, residual=True, **wirings)
    if family == "gpt2":
        require_plain_heads(c, what)
        return {
            "architectures": [what],
            "model_type": "gpt2",
            "vocab_size": c.vocab_size,
            "n_positions": c.max_seq_len,
            "n_embd": c.d_model,
            "n_layer": c.n_layers,
            "n_head": c.n_heads,
            "n_inner": c.ffn_hidden,
            "activation_function": TO_HF_ACTIVATION[c.activation],
            "layer_norm_epsilon": c.norm_eps,
            "resid_pdrop": c.dropout,
            "embd_pdrop": c.dropout,
            "attn_pdrop": c.attn_dropout,
            "scale_attn_weights": True,
            "tie_word_embeddings": bool(c.tie_embeddings),
            "bos_token_id": None,
            "eos_token_id": None,
        }
    if family == "llama":
        return {
            "architectures": [what],
            "model_type": "llama",
            **_llama_like_to_hf(c),
            "attention_bias": bool(c.bias),
            "mlp_bias": bool(c.bias),
        }
    require(c, what, bias=False)
    return {
        "architectures": [what],
        "model_type": "mixtral",
        **_llama_like_to_hf(c),
        "num_local_experts": c.n_experts,
        "num_experts_per_tok": c.top_k,
        "router_aux_loss_coef": c.moe_aux_coef,
        "sliding_window": None,
    }


def _bias_groups(model: nn.Module) -> dict[str, bool]:
    """Llama's ``attention_bias`` / ``mlp_bias`` to write for a model with biases.

    A group the source checkpoint did not have (``model.hf_config`` says so) and whose biases are
    all still zero is left out again, so a round trip gives the checkpoint back.
    """
    src = getattr(model, "hf_config", None) or {}
    sd = model.state_dict()
    flags = {}
    for flag, part in (("attention_bias", ".attn."), ("mlp_bias", ".ffn.")):
        biases = [t for n, t in sd.items() if part in n and n.endswith(".bias")]
        flags[flag] = bool(src.get(flag, True)) or any(bool(t.any()) for t in biases)
    return flags


def lm_export(model: nn.Module, *, moe_layout: str = "per_expert") -> tuple[dict, KeyMap]:
    """``(config.json dict, key map)`` of a DecoderLM as GPT-2, Llama or Mixtral.

    Args:
        model: the DecoderLM.
        moe_layout: Mixtral experts as ``per_expert`` (what ``save_pretrained`` writes and every
            transformers version reads) or ``fused``.

    Raises:
        UserError: a model no supported architecture expresses, an unknown layout.
    """
    family = lm_family_of_model(model)
    c = model.config
    hf_cfg = lm_config_to_hf(c, family)
    if family == "gpt2":
        return hf_cfg, gpt2_keymap(c)
    if moe_layout not in MOE_LAYOUTS:
        raise UserError(f"moe_layout must be 'fused' or 'per_expert', got {moe_layout!r}")
    if family == "llama" and c.bias:
        hf_cfg.update(_bias_groups(model))
    flags = {k: hf_cfg[k] for k in ("attention_bias", "mlp_bias") if k in hf_cfg}
    return hf_cfg, llama_keymap(c, moe_layout=moe_layout, **flags)


# ---- the families -------------------------------------------------------------------------------


def _reader(family: str) -> Family:
    def keymap(hf: dict, c: ModelConfig, names: Collection[str]) -> KeyMap:
        if family == "gpt2":
            return gpt2_keymap(c)
        layout = "per_expert" if any(".block_sparse_moe." in n for n in names) else "fused"
        flags = dict(
            attention_bias=bool(hf.get("attention_bias")), mlp_bias=bool(hf.get("mlp_bias"))
        )
        return llama_keymap(c, moe_layout=layout, **(flags if family == "llama" else {}))

    return Family(
        name=family,
        architectures=(ARCHITECTURES[family],),
        config_from_hf=lambda hf, names: lm_config_from_hf(hf, family),
        build=DecoderLM,
        keymap=keymap,
    )


#: The causal-LM families, in the order SUPPORTED_ARCHITECTURES lists them.
LM_FAMILIES = tuple(_reader(f) for f in ("gpt2", "llama", "mixtral"))
