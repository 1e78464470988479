"""Hugging Face checkpoint folders: reading and writing the files, whatever the family.

A checkpoint is a local folder holding ``config.json`` and the weights, either one
``model.safetensors`` or shards listed by ``model.safetensors.index.json``; a ``tokenizer.json``
beside them is read with the ``tokenizers`` library, and the token ids of a
``generation_config.json`` are picked up. Nothing is ever fetched from a hub. Every reader checks
what it reads and raises :class:`~attnlab.errors.UserError` naming the file (and the tensor).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor

from attnlab.data.tokenizers import (
    ByteBPETokenizer,
    CharTokenizer,
    TokenizerWithSpecials,
    as_hf_tokenizer,
    tokenizer_from_json,
)
from attnlab.errors import UserError
from attnlab.fileio import atomic_save, atomic_write_text

__all__ = [
    "CONFIG_NAME",
    "WEIGHTS_NAME",
    "INDEX_NAME",
    "TOKENIZER_NAME",
    "HF_GENERATION_KEYS",
    "check_dir",
    "read_hf_config",
    "weight_files",
    "tensor_shapes",
    "read_hf_weights",
    "generation_token_ids",
    "load_hf_tokenizer",
    "tokenizer_json",
    "write_checkpoint",
]

log = logging.getLogger(__name__)

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
TOKENIZER_NAME = "tokenizer.json"
GENERATION_CONFIG_NAME = "generation_config.json"

# config.json keys carried along so generation can stop at the model's end-of-text token
HF_GENERATION_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")


# ---- reading ------------------------------------------------------------------------------------


def check_dir(path: str | os.PathLike) -> Path:
    """``path`` as a Path, checked to be an existing folder.

    Raises:
        UserError: it does not exist or is a file.
    """
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
    """``config.json`` of a Hugging Face checkpoint folder, checked to be one.

    Raises:
        UserError: no such folder or file, not JSON, or not a model config (an attnlab run
            directory is named as such).
    """
    path = check_dir(path)
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


def _open(shard: Path):
    """``safe_open`` with unreadable files reported as a UserError naming the file."""
    try:
        return safe_open(str(shard), "pt")
    except Exception as err:  # safetensors raises its own error type for a corrupted file
        raise UserError(f"cannot read {shard} as safetensors: {err}") from None


def _index_files(path: Path, index: Path) -> dict[str, Path]:
    """Tensor name -> shard of a sharded checkpoint, the index checked against its shards."""
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise UserError(f"{index} is not a safetensors index (needs 'weight_map'): {err}") from None
    if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
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


def weight_files(path: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it (single file or sharded with an index).

    Raises:
        UserError: no safetensors weights (``.bin`` files are named), an unreadable file, or an
            index that disagrees with its shards.
    """
    index = path / INDEX_NAME
    if index.exists():
        return _index_files(path, index)
    single = path / WEIGHTS_NAME
    if single.exists():
        with _open(single) as f:
            return {name: single for name in f.keys()}  # noqa: SIM118
    others = sorted(p.name for p in path.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".h5"))
    hint = f" (found {others}: only safetensors weights are read)" if others else ""
    raise UserError(f"{str(path)!r} has no {WEIGHTS_NAME} or {INDEX_NAME}{hint}")


def tensor_shapes(files: dict[str, Path]) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape, read from the file headers (no tensor is loaded)."""
    shapes = {}
    for shard in sorted(set(files.values())):
        with _open(shard) as f:
            for name in f.keys():  # noqa: SIM118
                shapes[name] = tuple(f.get_slice(name).get_shape())
    return shapes


def read_hf_weights(path: str | os.PathLike, names: list[str] | None = None) -> dict[str, Tensor]:
    """Tensors of a checkpoint folder (all, or only ``names``), single file or sharded."""
    files = weight_files(check_dir(path))
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


def generation_token_ids(path: Path) -> dict:
    """``bos/eos/pad_token_id`` set in ``generation_config.json`` (``{}`` when none or unreadable)."""
    gen_path = path / GENERATION_CONFIG_NAME
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


def load_hf_tokenizer(path: str | os.PathLike):
    """The tokenizer in ``path/tokenizer.json``, or None when there is none.

    Returns attnlab's tokenizer interface (``encode(text) -> list[int]``, ``decode(ids)``,
    ``vocab_size``) around the ``tokenizers.Tokenizer`` (``.tokenizer``), the same object
    ``attnlab.load`` gives for a run directory holding that file.

    Raises:
        UserError: the file is not a readable ``tokenizers`` JSON.
    """
    tok_path = check_dir(path) / TOKENIZER_NAME
    if not tok_path.exists():
        return None
    try:
        text = tok_path.read_text(encoding="utf-8")
        data = json.loads(text)
        if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
            raise ValueError("no 'model' section")
        return tokenizer_from_json(text, str(tok_path))  # (a character tokenizer comes back one)
    except Exception as err:  # tokenizers raises its own exception type
        raise UserError(f"{tok_path} is not a Hugging Face tokenizer.json: {err}") from None


# ---- writing ------------------------------------------------------------------------------------


def tokenizer_json(tokenizer) -> str | None:
    """The ``tokenizer.json`` text of a tokenizer given to ``to_hf`` (None for none).

    attnlab's own tokenizers (character or byte-level BPE, with or without BERT's specials) are
    written in the ``tokenizers`` form (:func:`attnlab.data.tokenizers.as_hf_tokenizer`); a path
    is copied as it is.

    Raises:
        UserError: something that is neither a tokenizer nor a tokenizer.json path.
    """
    if tokenizer is None:
        return None
    if isinstance(tokenizer, (str, os.PathLike)):
        return Path(tokenizer).read_text(encoding="utf-8")
    if isinstance(tokenizer, (CharTokenizer, ByteBPETokenizer, TokenizerWithSpecials)):
        return as_hf_tokenizer(tokenizer).to_str()
    if hasattr(tokenizer, "to_str"):  # a tokenizers.Tokenizer
        return tokenizer.to_str()
    raise UserError(
        f"a {type(tokenizer).__name__} has no Hugging Face tokenizer.json form; pass a "
        "tokenizers.Tokenizer, an attnlab tokenizer or a tokenizer.json path"
    )


#: what ``AutoTokenizer.from_pretrained`` reads next to tokenizer.json: without it, transformers
#: builds the model type's own tokenizer class (Llama's, GPT-2's) and rebuilds its pipeline
#: instead of reading the file as written
TOKENIZER_CONFIG_NAME = "tokenizer_config.json"


def tokenizer_config(tokenizer_text: str) -> dict:
    """``tokenizer_config.json`` for a ``tokenizer.json``: the generic fast tokenizer, and
    BERT's special tokens when the file has them (``[MASK]`` for a fill-mask pipeline)."""
    config: dict = {"tokenizer_class": "PreTrainedTokenizerFast"}
    added = {a.get("content") for a in json.loads(tokenizer_text).get("added_tokens") or []}
    for name, token in (("pad", "[PAD]"), ("cls", "[CLS]"), ("sep", "[SEP]"), ("mask", "[MASK]")):
        if token in added:
            config[f"{name}_token"] = token
    return config


def check_writable(path: Path, overwrite: bool) -> None:
    """Refuse a file in the way or a non-empty folder (unless ``overwrite``).

    Raises:
        UserError: naming the path.
    """
    if path.exists() and not path.is_dir():
        raise UserError(f"{str(path)!r} exists and is not a directory")
    if path.exists() and any(path.iterdir()) and not overwrite:
        raise UserError(
            f"{str(path)!r} is not empty; add --overwrite (overwrite=True in Python) to replace it"
        )


def _shards(sd: dict[str, Tensor], max_shard_size: int) -> list[dict[str, Tensor]]:
    """Tensors in order, cut into groups of at most ``max_shard_size`` bytes (or one tensor)."""
    shards: list[dict[str, Tensor]] = [{}]
    size = 0
    for n, t in sd.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_shard_size:
            shards.append({})
            size = 0
        shards[-1][n] = t
        size += nbytes
    return shards


def write_checkpoint(
    path: Path,
    hf_config: dict,
    state_dict: dict[str, Tensor],
    *,
    tokenizer_text: str | None = None,
    dtype: torch.dtype | None = None,
    max_shard_size: int | None = None,
) -> Path:
    """Write ``config.json``, the weights (one file or shards plus an index) and the tokenizer.

    Files of a checkpoint already in ``path`` that would describe another model (its weights,
    ``tokenizer.json``, ``generation_config.json``) are removed first; ``config.json`` is written
    last, so a folder without it is visibly incomplete.

    Args:
        path: the folder (created; check it with :func:`check_writable` first).
        hf_config: the ``config.json`` dict (``dtype`` is set from the tensors).
        state_dict: Hugging Face names -> tensors.
        tokenizer_text: the ``tokenizer.json`` text, or None for none.
        dtype: save in this dtype (default: each tensor's).
        max_shard_size: bytes per shard; above it, writes shards and an index file.

    Returns:
        ``path``.
    """
    # safetensors refuses tensors sharing storage (q/k/v are views of one qkv weight)
    sd = {
        n: t.detach().to("cpu", dtype or t.dtype).contiguous().clone()
        for n, t in state_dict.items()
    }
    hf_config = {**hf_config, "dtype": str(next(iter(sd.values())).dtype).removeprefix("torch.")}
    path.mkdir(parents=True, exist_ok=True)
    stale = [
        *path.glob("model*.safetensors*"),
        path / GENERATION_CONFIG_NAME,
        path / TOKENIZER_NAME,
        path / TOKENIZER_CONFIG_NAME,
    ]
    for old in stale:
        old.unlink(missing_ok=True)
    meta = {"format": "pt"}
    total = sum(t.numel() * t.element_size() for t in sd.values())
    if max_shard_size is None or total <= max_shard_size:
        atomic_save(path / WEIGHTS_NAME, lambda tmp: save_file(sd, tmp, metadata=meta))
    else:
        shards = _shards(sd, max_shard_size)
        weight_map = {}
        for k, shard in enumerate(shards, 1):
            fname = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
            atomic_save(path / fname, lambda tmp, s=shard: save_file(s, tmp, metadata=meta))
            weight_map.update(dict.fromkeys(shard, fname))
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        atomic_write_text(path / INDEX_NAME, json.dumps(index, indent=2) + "\n")
    if tokenizer_text is not None:
        atomic_write_text(path / TOKENIZER_NAME, tokenizer_text)
        tok_config = json.dumps(tokenizer_config(tokenizer_text), indent=2) + "\n"
        atomic_write_text(path / TOKENIZER_CONFIG_NAME, tok_config)
    atomic_write_text(path / CONFIG_NAME, json.dumps(hf_config, indent=2, sort_keys=True) + "\n")
    return path
