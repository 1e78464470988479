"""``attnlab convert``: Hugging Face checkpoint folders to attnlab run directories and back.

    attnlab convert --from-hf DIR --out runs/NAME     # then attnlab generate / eval runs/NAME
    attnlab convert --to-hf runs/NAME --out DIR       # transformers' from_pretrained(DIR) loads it
    attnlab convert --consolidate runs/NAME           # an FSDP run's sharded checkpoint ->
                                                      # runs/NAME/model.safetensors

(``attnlab generate --from-hf DIR`` lives with the other LM commands and calls
:func:`attnlab.interop.load_hf_lm`.)
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from attnlab.commands.flags import add_flags
from attnlab.errors import RunDirError, UserError

_SIZE_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
}


def parse_size(text: str) -> int:
    """``"2GB"`` / ``"500MB"`` / ``"4096"`` -> bytes."""
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


#: the key of an exported config.json that holds the attnlab run's task section
TASK_KEY = "attnlab_task"


def _n_params(model) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def _from_hf(args: argparse.Namespace) -> int:
    from attnlab.interop.hf import HF_GENERATION_KEYS, TOKENIZER_NAME, from_hf, load_hf_tokenizer
    from attnlab.runs import atomic_write_text, save_model

    src, out = Path(args.from_hf), Path(args.out)
    if out.exists() and not out.is_dir():
        raise RunDirError(f"{str(out)!r} exists and is not a directory")
    if out.exists() and any(out.iterdir()) and not args.overwrite:
        raise RunDirError(f"{str(out)!r} already exists; pass --overwrite to replace it")
    model = from_hf(src, dtype=args.dtype)
    tok = load_hf_tokenizer(src)  # validates tokenizer.json before anything is written
    hf = model.hf_config
    arch = (hf.get("architectures") or [hf.get("model_type")])[0]
    config = {
        "kind": model.kind,
        "model": model.config.to_dict(),
        # a folder attnlab exported keeps the run's task (corpus, split): eval works again
        **({"task": hf[TASK_KEY]} if isinstance(hf.get(TASK_KEY), dict) else {}),
        "source": {
            "format": "huggingface",
            "path": str(src.resolve()),
            "architecture": arch,
            **{k: hf[k] for k in HF_GENERATION_KEYS if k in hf},
        },
    }
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("best.safetensors", "state.pt", "metrics.jsonl", TOKENIZER_NAME):
        (out / stale).unlink(missing_ok=True)
    save_model(model, out / "model.safetensors")
    if tok is not None:
        shutil.copyfile(src / TOKENIZER_NAME, out / TOKENIZER_NAME)
    atomic_write_text(out / "config.json", json.dumps(config, indent=2) + "\n")
    print(
        f"converted {arch} ({_n_params(model):,} parameters) from {src} into {out}"
        + (
            ""
            if tok is not None
            else f"; {src} has no tokenizer.json, so 'attnlab generate' and 'eval' refuse the "
            "run until you copy the checkpoint's tokenizer.json into it"
        )
    )
    return 0


def _to_hf(args: argparse.Namespace) -> int:
    from attnlab.data.tokenizers import CharTokenizer, load_tokenizer
    from attnlab.interop.hf import HF_GENERATION_KEYS, TOKENIZER_NAME, to_hf
    from attnlab.runs import describe_weights, load_model, read_config

    run = Path(args.to_hf)
    cfg = read_config(run)
    model = load_model(run, weights=args.weights)
    weights = describe_weights(run, args.weights)
    source = cfg.get("source") or {}
    extra = {k: source[k] for k in HF_GENERATION_KEYS if k in source}
    if isinstance(cfg.get("task"), dict):  # read back by --from-hf (transformers ignores it)
        extra[TASK_KEY] = cfg["task"]
    tok, note = None, "; the run has no tokenizer.json, so none was written"
    if (run / TOKENIZER_NAME).exists():
        tok = run / TOKENIZER_NAME  # copied verbatim when it is a Hugging Face tokenizer.json
        plain = load_tokenizer(run)
        note = " with its tokenizer"
        if isinstance(getattr(plain, "base", plain), CharTokenizer):  # with specials, or not
            tok, note = plain, " with its character tokenizer (a tokenizers WordLevel model)"
    out = to_hf(
        model,
        args.out,
        tokenizer=tok,
        overwrite=args.overwrite,
        moe_layout=args.moe_layout,
        extra_config=extra,
        max_shard_size=parse_size(args.max_shard_size) if args.max_shard_size else None,
    )
    arch = json.loads((out / "config.json").read_text())["architectures"][0]
    print(
        f"wrote {arch} ({_n_params(model):,} parameters) from {run} ({weights}) into {out}" + note
    )
    return 0


def _consolidate(args: argparse.Namespace) -> int:
    """Gather the newest sharded checkpoint of a run into its model.safetensors (one process)."""
    from attnlab.runs import last_sharded, load_model, newest_weights, read_config, weights_step
    from attnlab.train.checkpoint import LAST_FILE, lock_run_dir, save_weights

    run = Path(args.consolidate)
    read_config(run)
    if args.out is not None:
        raise UserError("--consolidate writes model.safetensors into the run itself; drop --out")
    lock = lock_run_dir(run)  # not while a training writes there
    try:
        source = newest_weights(run)
        if not source.is_dir():
            if not source.exists():
                raise RunDirError(f"{str(run)!r} has neither weights nor a sharded checkpoint")
            print(
                f"{run}: {LAST_FILE} already holds the newest weights (step {weights_step(source)})"
            )
            return 0
        step = last_sharded(run)[0]
        model = load_model(run, weights="last")  # the sharded checkpoint: DCP reassembles it
        save_weights(model, run / LAST_FILE, step)
    finally:
        lock.release()
    print(
        f"consolidated {source} ({_n_params(model):,} parameters, step {step}) into "
        f"{run / LAST_FILE}"
    )
    return 0


def _convert(args: argparse.Namespace) -> int:
    if args.consolidate:
        return _consolidate(args)
    if args.out is None:
        raise UserError("--out is required with --from-hf and --to-hf")
    return _from_hf(args) if args.from_hf else _to_hf(args)


def register(groups) -> None:
    """Add ``attnlab convert``."""
    p = groups["top"].add_parser(
        "convert",
        help="convert Hugging Face checkpoint folders to attnlab runs and back; consolidate "
        "an FSDP run's sharded checkpoint",
        description="Convert between Hugging Face checkpoint folders (config.json + safetensors, "
        "sharded or not; GPT-2, Llama, Mixtral, ViT, Swin, BERT) and attnlab run directories, "
        "or gather the sharded checkpoint of a run trained with --strategy fsdp into its "
        "model.safetensors. Only local files are read.",
    )
    src = p.add_mutually_exclusive_group(required=True)
    # fmt: off
    add_flags(src, [
        ("--from-hf", None, None, "Hugging Face checkpoint folder to import", {"metavar": "DIR"}),
        ("--to-hf", None, None, "attnlab run directory to export", {"metavar": "RUN_DIR"}),
        ("--consolidate", None, None,
         "write RUN_DIR/model.safetensors from its newest sharded "
         "checkpoint (a run trained with --strategy fsdp that stopped before its end), in one "
         "process", {"metavar": "RUN_DIR"}),
    ])
    # fmt: on
    # fmt: off
    add_flags(p, [
        ("--out", None, None, "run directory (--from-hf) or folder (--to-hf)"),
        ("--overwrite", "store_true", None, "replace an existing output"),
        ("--dtype", ["float32", "bfloat16", "float16", "auto"], "float32",
         "--from-hf: parameter dtype (auto = the checkpoint's; default float32)"),
        ("--weights", ["best", "last"], "best",
         "--to-hf: which checkpoint of the run: best (the lowest validation loss; default, as in "
         "every command) or last"),
        ("--moe-layout", ["per_expert", "fused"], "per_expert",
         "--to-hf, Mixtral: block_sparse_moe.experts.N.w1/w2/w3 (default, what save_pretrained "
         "writes) or fused mlp.experts.gate_up_proj"),
        ("--max-shard-size", None, None,
         "--to-hf: split the weights into shards of this size (e.g. 2GB)"),
    ])
    # fmt: on
    p.set_defaults(func=_convert)
