"""Per-rank memory of DDP against FSDP, measured and by formula, and training tokens/s.

Trains a GPT-2-style DecoderLM on the pydoc corpus for a few steps with ``attnlab.train.train``
under torchrun and reports, for every rank, the bytes it holds after the first step (the sum of
its local tensors: a sharded ``DTensor`` counts only its shard), the process's resident set size
(RSS, peak), and the tokens/s of the steps after the first:

    torchrun --nproc_per_node=2 benchmarks/fsdp_memory.py --strategy ddp
    torchrun --nproc_per_node=2 benchmarks/fsdp_memory.py --strategy fsdp

The formula for P parameters in fp32 with AdamW on N ranks:

    DDP   parameters 4P, gradients 4P, optimizer state 8P (two moments) on every rank  = 16P
    FSDP  the same divided by N (each rank keeps one shard of each)                    = 16P/N
          + while a block computes: its gathered parameters (and gradients before the
            reduce-scatter); the model's own parameters (embeddings, head) from the forward to
            the end of the backward
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist

from attnlab.config import LMTaskConfig, ModelConfig
from attnlab.models.lm import DecoderLM
from attnlab.tasks.lm import LMTask
from attnlab.train import TrainConfig, train

MIB = 2**20


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--strategy", choices=["ddp", "fsdp"], default="fsdp")
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--n-layers", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=8, help="global batch")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--amp", choices=["none", "bf16"], default="none")
    p.add_argument("--device", default="auto")
    p.add_argument("--out", help="run directory (default: /tmp/attnlab-fsdp-bench-STRATEGY)")
    args = p.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))

    task = LMTask.build(LMTaskConfig(seq_len=args.seq_len, max_chars=400_000))
    config = ModelConfig.preset(
        "gpt2-tiny",
        vocab_size=task.vocab_size,
        max_seq_len=args.seq_len,
        d_model=args.d_model,
        n_layers=args.n_layers,
        n_heads=max(1, args.d_model // 64),
    )
    torch.manual_seed(0)
    model = DecoderLM(config)
    n_params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    cfg = TrainConfig(
        steps=args.steps,
        batch_size=args.batch_size,
        strategy=args.strategy,
        amp=args.amp,
        eval_every=args.steps,
        eval_batches=0,
        log_every=1,
        warmup_steps=1,
        progress=False,
        device=args.device,
    )
    out = args.out or f"/tmp/attnlab-fsdp-bench-{args.strategy}"
    result = train(model, task, cfg, out, overwrite=True)
    reports = [result.memory]
    world = dist.get_world_size() if dist.is_initialized() else 1
    if dist.is_initialized():
        reports = [None] * world
        dist.all_gather_object(reports, result.memory)
    if int(os.environ.get("RANK", "0")) != 0:
        return
    speeds = [r["tokens_per_s"] for r in result.history if "tokens_per_s" in r][1:]
    n = 1 if args.strategy == "ddp" else world
    print(
        f"{args.strategy}, {world} rank(s), {n_params / 1e6:.2f}M parameters "
        f"(d_model {args.d_model}, {args.n_layers} layers), T={args.seq_len}, global batch "
        f"{args.batch_size}, amp {args.amp}, {result.steps} steps"
    )
    print("rank | parameters | gradients | optimizer | RSS now | RSS peak   (MiB, measured)")
    for rank, r in enumerate(reports):
        print(
            f"{rank:4d} | {r['params'] / MIB:10.1f} | {r['grads'] / MIB:9.1f} | "
            f"{r['optimizer'] / MIB:9.1f} | {r['rss'] / MIB:7.0f} | {r['peak_rss'] / MIB:8.0f}"
            + (f" | CUDA peak {r['cuda_peak'] / MIB:.0f}" if "cuda_peak" in r else "")
        )
    print(
        f"formula    | {4 * n_params / n / MIB:10.1f} | {4 * n_params / n / MIB:9.1f} | "
        f"{8 * n_params / n / MIB:9.1f} |   (4P/N, 4P/N, 8P/N; N={n})"
    )
    if speeds:
        print(f"tokens/s (all ranks, steps 2..{result.steps}): {sum(speeds) / len(speeds):,.0f}")


if __name__ == "__main__":
    main()
