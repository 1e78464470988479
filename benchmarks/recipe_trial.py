"""One decoder-LM recipe on the pydoc split, for a wall-clock or a number of steps, scored as the
speedrun and the nanoGPT comparison score (``pydoc_score.py``: the last 10 % of pydoc in
non-overlapping 64-character windows, nats/char).

The model is the budget rule's GPT-2-style row (RoPE, tied embeddings) with the given size; the
trainer is attnlab's, with no validation during training (all of the time goes to steps). It
prints one JSON line: steps, tokens, nats/char, seconds and the settings. The trials behind the
budget rule's Muon crossing and the demo's soft cap (docs/performance.md, section 5) are::

    OMP_NUM_THREADS=1 taskset -c 1 python benchmarks/recipe_trial.py --max-time 161 \\
        --layers 4 --d-model 128 --warmup 100
    OMP_NUM_THREADS=1 python benchmarks/recipe_trial.py --steps 1459 --set logit_softcap=15
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from attnlab.config import ModelConfig
from attnlab.config.overrides import parse_overrides
from attnlab.models.lm import DecoderLM
from attnlab.runspec.budget import ROWS
from attnlab.train import TrainConfig, train

sys.path.insert(0, str(Path(__file__).parent))
from pydoc_score import pydoc_task, score  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    length = ap.add_mutually_exclusive_group(required=True)
    length.add_argument("--max-time", type=float, help="seconds of training")
    length.add_argument("--steps", type=int, help="optimizer steps")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--batch", type=int, default=12, help="windows per step")
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--optimizer", default="muon", choices=["muon", "adamw"])
    ap.add_argument("--lr", type=float, default=0.02, help="AdamW's rate (Muon's AdamW part)")
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0, help="the initialisation's and the batches'")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="as in attnlab train lm: model.FIELD (the default section) or "
                    "train.FIELD, e.g. logit_softcap=15, train.muon_lr=0.03 (repeatable)")  # fmt: skip
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--workdir", default="runs/recipe_trial")
    args = ap.parse_args()
    sets = {"model": {}, "train": {}}
    for key, value in parse_overrides(args.set).items():
        section, name = key.split(".", 1)
        if section not in sets:
            raise SystemExit(f"--set {key}: only model.* and train.* fields here")
        sets[section][name] = value
    torch.set_num_threads(args.threads)
    task = pydoc_task(seq_len=args.seq_len)
    fields = {
        **ROWS[0].model_fields(),
        "token_shift": False,  # as measured before the rule took it: --set token_shift=true
        "n_layers": args.layers,
        "d_model": args.d_model,
        "n_heads": args.heads,
        "max_seq_len": args.seq_len,
        "vocab_size": task.vocab_size,
        **sets["model"],
    }
    torch.manual_seed(args.seed)
    model = DecoderLM(ModelConfig.from_dict(fields))
    run_length = {"max_time": args.max_time} if args.max_time else {"steps": args.steps}
    cfg = TrainConfig(
        **{
            "lr": args.lr,
            "warmup_steps": args.warmup,
            "optimizer": args.optimizer,
            "batch_size": args.batch,
            "seed": args.seed,
            "device": "cpu",
            "progress": False,
            "eval_every": 10**9,
            "eval_batches": 0,
            **run_length,
            **sets["train"],
        }
    )
    t0 = time.time()
    result = train(model, task, cfg, Path(args.workdir), overwrite=True)
    seconds = time.time() - t0
    nats = score(model, task.splits["val"])
    tokens = result.steps * args.batch * args.seq_len
    row = {"steps": result.steps, "tokens": tokens, "nats": round(nats, 4)}
    print(json.dumps({**row, "s": round(seconds, 1), "args": vars(args)}), flush=True)


if __name__ == "__main__":
    main()
