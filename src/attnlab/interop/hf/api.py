"""``from_hf`` / ``to_hf``: Hugging Face checkpoint folders in and out, for every family.

One path serves every family (:mod:`~attnlab.interop.hf.family`): the config.json's architecture
picks a :class:`~attnlab.interop.hf.family.Family`; its key map, run on the shapes of the model
the config describes (built on the ``meta`` device, within bounds from the safetensors header:
:mod:`attnlab.checkpoint_check`), gives the names and shapes the files must hold, which are
checked before anything is allocated or read; then the key map converts the tensors. Writing runs the same key map the
other way. The families: GPT-2, Llama, Mixtral (:mod:`~attnlab.interop.hf.lm`), ViT, Swin
(:mod:`~attnlab.interop.hf.vision`), DeiT (:mod:`~attnlab.interop.hf.deit`), BERT
(:mod:`~attnlab.interop.hf.bert`), T5 (:mod:`~attnlab.interop.hf.t5`), CLIP
(:mod:`~attnlab.interop.hf.clip`).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

from attnlab.checkpoint_check import read_header
from attnlab.errors import UserError
from attnlab.interop.hf.bert import BERT, bert_export
from attnlab.interop.hf.checkpoint import (
    HF_GENERATION_KEYS,
    TOKENIZER_NAME,
    check_dir,
    check_writable,
    generation_token_ids,
    load_hf_tokenizer,
    read_hf_config,
    read_hf_weights,
    tokenizer_json,
    weight_files,
    write_checkpoint,
)
from attnlab.interop.hf.clip import CLIP, clip_export
from attnlab.interop.hf.deit import DEIT, deit_export
from attnlab.interop.hf.family import Family, check_config, load_weights, prepare
from attnlab.interop.hf.lm import LM_FAMILIES, lm_export
from attnlab.interop.hf.t5 import T5_FAMILY, t5_export
from attnlab.interop.hf.vision import SWIN, VIT, swin_export, vit_export
from attnlab.interop.keymap import KeyMap

__all__ = [
    "FAMILIES",
    "SUPPORTED_ARCHITECTURES",
    "family_of_config",
    "from_hf",
    "to_hf",
    "load_hf_lm",
]

FAMILIES: tuple[Family, ...] = (*LM_FAMILIES, VIT, DEIT, SWIN, BERT, T5_FAMILY, CLIP)
SUPPORTED_ARCHITECTURES = tuple(a for f in FAMILIES for a in f.architectures)


def family_of_config(hf: dict) -> Family:
    """The family that reads a config.json dict (by ``architectures[0]``, else ``model_type``).

    Raises:
        UserError: an unsupported architecture, listing the supported ones.
    """
    archs = hf.get("architectures") or []
    model_type = hf.get("model_type")
    for f in FAMILIES:
        if any(a in f.architectures for a in archs) or model_type in f.model_types:
            return f
    for f in FAMILIES:
        if not archs and model_type == f.name:
            return f
    what = ", ".join(archs) if archs else f"model_type {model_type!r}"
    raise UserError(
        f"unsupported Hugging Face architecture {what}; supported: "
        f"{', '.join(SUPPORTED_ARCHITECTURES)}"
    )


def _resolve_dtype(dtype: torch.dtype | str | None, hf: dict) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "float32"):
        return torch.float32
    name = (hf.get("dtype") or hf.get("torch_dtype") or "float32") if dtype == "auto" else dtype
    value = getattr(torch, str(name), None)
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise UserError(f"unknown dtype {name!r}; use float32, bfloat16, float16 or 'auto'")
    return value


def from_hf(path: str | os.PathLike, *, dtype: torch.dtype | str | None = None) -> nn.Module:
    """Load a local Hugging Face checkpoint as an attnlab model (eval mode).

    GPT-2, Llama and Mixtral become a :class:`attnlab.DecoderLM`; ViT and Swin (``...Model`` or
    ``...ForImageClassification``) and DeiT (``DeiTModel``,
    ``DeiTForImageClassificationWithTeacher``) the vision models of :mod:`attnlab.models.vision`; BERT
    (``BertForMaskedLM`` / ``BertModel``) an :class:`attnlab.models.encoder.EncoderMLM`; T5
    (``T5ForConditionalGeneration``, 1.0 and 1.1 layouts) a :class:`attnlab.models.t5.T5`;
    ``CLIPModel`` a :class:`attnlab.models.multimodal.clip.DualEncoder`.

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
            shape mismatches (named with both shapes, after the config.json field that explains
            them), found from the safetensors header and a ``meta`` build of config.json's
            model before anything is allocated (:mod:`attnlab.checkpoint_check`). Nothing is
            returned half-loaded.
    """
    path = check_dir(path)
    hf = read_hf_config(path)
    family = family_of_config(hf)
    target_dtype = _resolve_dtype(dtype, hf)
    files = weight_files(path)
    header = read_header(sorted(set(files.values())))
    # config.json against the header, on the meta device: nothing real is built before it fits
    check_config(family, hf, header, what=f"cannot load {str(path)!r}")
    shapes = header.shapes
    model, keymap = prepare(family, hf, list(shapes))
    canonical = keymap.canonical(shapes)  # current name -> name in the file
    raw = read_hf_weights(path, list(canonical.values()))
    model = load_weights(model, keymap, {c: raw[n] for c, n in canonical.items()}, target_dtype)
    model.hf_config = {**hf, **generation_token_ids(path)}
    return model


def _export(model: nn.Module, moe_layout: str) -> tuple[dict, KeyMap]:
    kind = getattr(model, "kind", None)
    if kind == "vit":
        return vit_export(model)
    if kind == "deit":
        return deit_export(model)
    if kind == "swin":
        return swin_export(model)
    if kind == "encoder_mlm":
        return bert_export(model)
    if kind in ("t5", "t5_span"):
        return t5_export(model)
    if kind == "clip":
        return clip_export(model)
    return lm_export(model, moe_layout=moe_layout)  # refuses anything else, by name


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
    ``AutoModel`` or ``AutoModelForImageClassification``; BERT: ``BertForMaskedLM``; T5:
    ``T5ForConditionalGeneration``).

    Args:
        model: a DecoderLM expressible as GPT-2, Llama or Mixtral, a ViT / Swin model, an
            EncoderMLM expressible as BERT, a T5 with shared embeddings, or a DualEncoder
            expressible as CLIP.
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
    path = Path(path)
    check_writable(path, overwrite)
    hf_cfg, keymap = _export(model, moe_layout)
    src = getattr(model, "hf_config", None) or {}
    hf_cfg.update({k: src[k] for k in HF_GENERATION_KEYS if k in src})
    hf_cfg.update(extra_config or {})
    state = keymap.to_theirs(model.state_dict())
    return write_checkpoint(
        path,
        hf_cfg,
        state,
        tokenizer_text=tokenizer_json(tokenizer),
        dtype=dtype,
        max_shard_size=max_shard_size,
    )


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
    family = family_of_config(read_hf_config(path))
    if family not in LM_FAMILIES:
        raise UserError(
            f"{str(path)!r} holds a {family.name} model, not a language model; text generation "
            f"needs one of {', '.join(a for f in LM_FAMILIES for a in f.architectures)}"
        )
    tok = load_hf_tokenizer(path)
    if tok is None:
        raise UserError(
            f"{str(path)!r} has no {TOKENIZER_NAME}; generating text needs the "
            "checkpoint's tokenizer beside its weights"
        )
    return from_hf(path, dtype=dtype).to(device), tok
