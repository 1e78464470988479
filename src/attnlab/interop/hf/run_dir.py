"""Hugging Face checkpoint folders as attnlab run directories (``attnlab convert``): a folder
imported into a run (config.json with the model and where it came from, model.safetensors, the
tokenizer), and what a run adds to an exported folder (its task section, generation settings,
tokenizer).

    model, message = import_run("hf/gpt2", "runs/gpt2")
    extra, tokenizer, note = export_extras("runs/gpt2", read_config("runs/gpt2"))
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from safetensors.torch import save_model

from attnlab.data.tokenizers import CharTokenizer, load_tokenizer
from attnlab.errors import RunDirError, UserError
from attnlab.fileio import atomic_save, atomic_write_text
from attnlab.interop.hf.api import from_hf
from attnlab.interop.hf.checkpoint import HF_GENERATION_KEYS, TOKENIZER_NAME, load_hf_tokenizer

__all__ = ["TASK_KEY", "import_run", "export_extras", "parse_size"]

#: the key of an exported config.json that holds the attnlab run's task section
TASK_KEY = "attnlab_task"
#: files of an earlier run that an import replaces or removes
_STALE = ("best.safetensors", "state.pt", "metrics.jsonl", TOKENIZER_NAME)
_SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9}
_SIZE_UNITS.update({"KIB": 2**10, "MIB": 2**20, "GIB": 2**30})


def parse_size(text: str) -> int:
    """``"2GB"`` / ``"500MB"`` / ``"4096"`` -> bytes.

    Raises:
        UserError: anything else (named as ``--max-shard-size``).
    """
    t = text.strip().upper().replace(" ", "")
    num = t.rstrip("KMGIB")
    unit = t[len(num) :]
    try:
        value = float(num)
    except ValueError:
        value = -1.0
    if unit not in _SIZE_UNITS or value <= 0:
        raise UserError(f"--max-shard-size must look like 500MB, 2GB or a byte count, got {text!r}")
    return int(value * _SIZE_UNITS[unit])


def import_run(
    src: str | Path, out: str | Path, *, dtype: str = "float32", overwrite: bool = False
) -> tuple[Any, str]:
    """Convert the Hugging Face folder ``src`` into the run directory ``out``.

    A folder attnlab exported keeps the run's task (corpus, split), so ``attnlab eval`` works
    on the import again.

    Returns:
        ``(model, what was done in one line)``.

    Raises:
        RunDirError: ``out`` is a file, or a run that is not empty (without ``overwrite``).
    """
    src, out = Path(src), Path(out)
    if out.exists() and not out.is_dir():
        raise RunDirError(f"{str(out)!r} exists and is not a directory")
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise RunDirError(f"{str(out)!r} already exists; pass --overwrite to replace it")
    model = from_hf(src, dtype=dtype)
    tok = load_hf_tokenizer(src)  # validates tokenizer.json before anything is written
    hf = model.hf_config
    arch = (hf.get("architectures") or [hf.get("model_type")])[0]
    config = {
        "kind": model.kind,
        "model": model.config.to_dict(),
        **({"task": hf[TASK_KEY]} if isinstance(hf.get(TASK_KEY), dict) else {}),
        "source": {
            "format": "huggingface",
            "path": str(src.resolve()),
            "architecture": arch,
            **{k: hf[k] for k in HF_GENERATION_KEYS if k in hf},
        },
    }
    out.mkdir(parents=True, exist_ok=True)
    for stale in _STALE:
        (out / stale).unlink(missing_ok=True)
    atomic_save(out / "model.safetensors", lambda tmp: save_model(model, tmp))  # tied: once
    if tok is not None:
        shutil.copyfile(src / TOKENIZER_NAME, out / TOKENIZER_NAME)
    atomic_write_text(out / "config.json", json.dumps(config, indent=2) + "\n")
    n = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    return model, f"converted {arch} ({n:,} parameters) from {src} into {out}" + (
        ""
        if tok is not None
        else f"; {src} has no tokenizer.json, so 'attnlab generate' and 'eval' refuse the "
        "run until you copy the checkpoint's tokenizer.json into it"
    )


def export_extras(run: str | Path, cfg: dict[str, Any]) -> tuple[dict[str, Any], Any, str]:
    """What a run adds to its exported folder.

    Returns:
        ``(extra config.json keys, tokenizer or None, a note on the tokenizer for the message)``:
        the source checkpoint's generation keys and the run's task (read back by an import;
        transformers ignores it); a Hugging Face tokenizer.json is copied verbatim, a
        character tokenizer becomes a tokenizers WordLevel model.
    """
    run = Path(run)
    source = cfg.get("source") or {}
    extra = {k: source[k] for k in HF_GENERATION_KEYS if k in source}
    if isinstance(cfg.get("task"), dict):
        extra[TASK_KEY] = cfg["task"]
    tok, note = None, "; the run has no tokenizer.json, so none was written"
    if (run / TOKENIZER_NAME).exists():
        tok, note = run / TOKENIZER_NAME, " with its tokenizer"
        plain = load_tokenizer(run)
        if isinstance(getattr(plain, "base", plain), CharTokenizer):  # with specials, or not
            tok, note = plain, " with its character tokenizer (a tokenizers WordLevel model)"
    return extra, tok, note
