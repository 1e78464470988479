"""Per-rank memory of DDP against FSDP, measured and by formula, and training tokens/s.

Trains a GPT-2-style DecoderLM on the pydoc corpus for a few steps with ``attnlab.train.train``
under torchrun and reports, for every rank, the bytes it holds after the first step (the sum of
its local tensors: a sharded ``DTensor`` counts only its shard), the process's resident set size
(RSS, peak), and the tokens/s of the steps after the first:

    torchrun --nproc_per_node=2 benchmarks/fsdp_memory.py --strategy ddp
    torchrun --nproc_per_node=2 benchmarks/fsdp_memory.py --strategy fsdp

It prints a Markdown table (the one in docs/training.md). Tensor bytes are exact; they leave out
activations, DDP's gradient buckets (another 4P) and, under FSDP, the parameters of the block being
computed (gathered for a moment); RSS (the whole process: Python, torch, the corpus) shows those.

The formula for P parameters in fp32 with AdamW on N ranks:

    DDP   parameters 4P, gradients 4P, optimizer state 8P (two moments) on every rank  = 16P
    FSDP  the same divided by N (each rank keeps one shard of each)                    = 16P/N
          + while a block computes: its gathered parameters (and gradients before the
            reduce-scatter); the model's own parameters (embeddings, head) from the forward to
            the end of the backward
"""

from __future__ import annotations

import argparse
import ctypes
import os

import torch
import torch.distributed as dist

from attnlab.config import LMTaskConfig, ModelConfig
from attnlab.models.lm import DecoderLM
from attnlab.tasks.lm import LMTask
from attnlab.train import TrainConfig, fsdp, train

MIB = 2**20


def _trimmed_report(model, optimizer):
    """:func:`fsdp.memory_report` after glibc hands freed heap memory back (``malloc_trim``), so
    "RSS now" counts live memory, not what the allocator keeps for later."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass
    return _report(model, optimizer)


_report, fsdp.memory_report = fsdp.memory_report, _trimmed_report


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
        f"{args.strategy}, {world} rank(s), P = {n_params:,} parameters "
        f"(d_model {args.d_model}, {args.n_layers} layers), T={args.seq_len}, global batch "
        f"{args.batch_size}, amp {args.amp}, {result.steps} steps, {result.run_dir}"
    )
    print("| rank | parameters | gradients | optimizer state | total | RSS now | RSS peak |")
    print("|---|---|---|---|---|---|---|")
    for rank, r in enumerate(reports):
        total = r["params"] + r["grads"] + r["optimizer"]
        print(
            f"| {rank} | {_mib(r['params'])} | {_mib(r['grads'])} | {_mib(r['optimizer'])} | "
            f"{_mib(total)} | {r['rss'] / MIB:.0f} MiB | {r['peak_rss'] / MIB:.0f} MiB |"
            + (f" CUDA peak {_mib(r['cuda_peak'])}" if "cuda_peak" in r else "")
        )
    name = "16P" if n == 1 else f"16P/{n}"
    print(
        f"| formula ({name}) | {_mib(4 * n_params / n)} | {_mib(4 * n_params / n)} | "
        f"{_mib(8 * n_params / n)} | {_mib(16 * n_params / n)} | | |"
    )
    if speeds:
        print(f"tokens/s (all ranks, steps 2..{result.steps}): {sum(speeds) / len(speeds):,.0f}")


def _mib(n: float) -> str:
    return f"{n / MIB:.2f} MiB"


if __name__ == "__main__":
    main()
