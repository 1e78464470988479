"""``attnlab convert``: Hugging Face checkpoint folders to attnlab run directories and back.

    attnlab convert --from-hf DIR --out runs/NAME     # then attnlab generate / eval runs/NAME
    attnlab convert --to-hf runs/NAME --out DIR       # transformers' from_pretrained(DIR) loads it
    attnlab convert --consolidate runs/NAME           # an FSDP run's sharded checkpoint ->
                                                      # runs/NAME/model.safetensors

The work is :mod:`attnlab.interop.hf.run_dir` and :mod:`attnlab.train.consolidate`.
(``attnlab generate --from-hf DIR`` lives with the other LM commands and calls
:func:`attnlab.interop.load_hf_lm`.)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from attnlab.commands.flags import add_command, add_flags
from attnlab.errors import UserError
from attnlab.interop.hf import to_hf
from attnlab.interop.hf.run_dir import export_extras, import_run, parse_size
from attnlab.runs import describe_weights, load_model, read_config
from attnlab.tasks.reports import n_params
from attnlab.train.consolidate import consolidate

__all__ = ["register", "parse_size"]


def _from_hf(args: argparse.Namespace) -> int:
    src, out = Path(args.from_hf), Path(args.out)
    print(import_run(src, out, dtype=args.dtype, overwrite=args.overwrite)[1])
    return 0


def _to_hf(args: argparse.Namespace) -> int:
    run = Path(args.to_hf)
    cfg = read_config(run)
    model = load_model(run, weights=args.weights)
    weights = describe_weights(run, args.weights)
    extra, tok, note = export_extras(run, cfg)
    size = parse_size(args.max_shard_size) if args.max_shard_size else None
    out = to_hf(model, args.out, tokenizer=tok, overwrite=args.overwrite,
                moe_layout=args.moe_layout, extra_config=extra, max_shard_size=size)  # fmt: skip
    arch = json.loads((out / "config.json").read_text())["architectures"][0]
    print(f"wrote {arch} ({n_params(model):,} parameters) from {run} ({weights}) into {out}{note}")
    return 0


def _convert(args: argparse.Namespace) -> int:
    if args.consolidate:
        read_config(args.consolidate)
        if args.out is not None:
            raise UserError(
                "--consolidate writes model.safetensors into the run itself; drop --out"
            )
        print(consolidate(args.consolidate))
        return 0
    if args.out is None:
        raise UserError("--out is required with --from-hf and --to-hf")
    return _from_hf(args) if args.from_hf else _to_hf(args)


# fmt: off
def register(groups) -> None:
    """Add ``attnlab convert``."""
    p = add_command(groups["top"], "convert", func=_convert,
        help="convert Hugging Face checkpoint folders to attnlab runs and back; consolidate "
        "an FSDP run's sharded checkpoint",
        description="Convert between Hugging Face checkpoint folders (config.json + safetensors, "
        "sharded or not; GPT-2, Llama, Mixtral, ViT, Swin, BERT) and attnlab run directories, "
        "or gather the sharded checkpoint of a run trained with --strategy fsdp into its "
        "model.safetensors. Only local files are read.")
    add_flags(p.add_mutually_exclusive_group(required=True), [
        ("--from-hf", None, None, "Hugging Face checkpoint folder to import", {"metavar": "DIR"}),
        ("--to-hf", None, None, "attnlab run directory to export", {"metavar": "RUN_DIR"}),
        ("--consolidate", None, None,
         "write RUN_DIR/model.safetensors from its newest sharded "
         "checkpoint (a run trained with --strategy fsdp that stopped before its end), in one "
         "process", {"metavar": "RUN_DIR"}),
    ])
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
