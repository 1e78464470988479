"""attnlab's defaults against nanoGPT's CPU recipe at equal wall-clock, on the same pydoc split.

The peer: nanoGPT's ``GPT`` (imported from ``--nanogpt DIR/model.py``, a checkout of
github.com/karpathy/nanoGPT; never vendored here) trained with the recipe of its README for
machines without a GPU (``config/train_shakespeare_char.py`` with ``--block_size=64
--batch_size=12 --n_layer=4 --n_head=4 --n_embd=128 --max_iters=2000 --lr_decay_iters=2000
--dropout=0.0``): bias-free, AdamW lr 1e-3 -> 1e-4 (cosine), warm-up 100, betas (0.9, 0.99),
weight decay 0.1 on matrices, gradient clipping 1.0, and its periodic estimate of the loss
(``--eval_iters=20`` every 250 iterations) inside the timed loop. The loop is written here from
that recipe.

attnlab: ``attnlab train lm --max-time S`` with nothing else (the budget rule chooses), run as a
user would (a subprocess), at S = the peer's measured wall-clock and at any longer ``--budgets``.

Both train on the same character ids (attnlab's tokenizer; the first 90 % of the text) and are
scored alike (``pydoc_score.py``: last 10 %, non-overlapping 64-character windows). Target of
issue 12: attnlab <= 1.35 nats/char and at least 0.10 better than the peer at the peer's time.

    git -C /work/.mirror/karpathy+nanoGPT/repo archive HEAD model.py | tar -x -C /tmp/nanogpt
    python benchmarks/lm_vs_nanogpt.py --nanogpt /tmp/nanogpt --budgets 300
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

import attnlab

sys.path.insert(0, str(Path(__file__).parent))
from pydoc_score import pydoc_task, score  # noqa: E402

PEER = dict(
    n_layer=4,
    n_head=4,
    n_embd=128,
    block_size=64,
    batch_size=12,
    max_iters=2000,
    lr=1e-3,
    min_lr=1e-4,
    warmup=100,
    betas=(0.9, 0.99),
    weight_decay=0.1,
    grad_clip=1.0,
    dropout=0.0,
    bias=False,
    eval_interval=250,
)


def import_nanogpt(directory: str):
    """nanoGPT's ``model`` module from a checkout."""
    path = Path(directory) / "model.py"
    if not path.exists():
        raise SystemExit(f"--nanogpt {directory}: no model.py there (a nanoGPT checkout?)")
    spec = importlib.util.spec_from_file_location("nanogpt_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def peer_lr(it: int) -> float:
    """The recipe's schedule: linear warm-up, then cosine from lr to min_lr at max_iters."""
    p = PEER
    if it < p["warmup"]:
        return p["lr"] * (it + 1) / (p["warmup"] + 1)
    ratio = min(1.0, (it - p["warmup"]) / (p["max_iters"] - p["warmup"]))
    return p["min_lr"] + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (p["lr"] - p["min_lr"])


def train_peer(
    nanogpt, train_ids, val_ids, vocab_size: int, eval_iters: int, seed: int, device: str = "cpu"
):
    """nanoGPT's CPU recipe; returns ``(model, seconds)`` (seconds of the training loop)."""
    p = PEER
    torch.manual_seed(seed)
    cfg = nanogpt.GPTConfig(
        block_size=p["block_size"],
        vocab_size=vocab_size,
        n_layer=p["n_layer"],
        n_head=p["n_head"],
        n_embd=p["n_embd"],
        dropout=p["dropout"],
        bias=p["bias"],
    )
    model = nanogpt.GPT(cfg).to(device)
    device_type = torch.device(device).type
    opt = model.configure_optimizers(p["weight_decay"], p["lr"], p["betas"], device_type)
    data = {
        split: torch.as_tensor(np.asarray(ids, dtype=np.int64))
        for split, ids in (("train", train_ids), ("val", val_ids))
    }
    T, B = p["block_size"], p["batch_size"]

    def batch(split: str):
        ids = data[split]
        ix = torch.randint(len(ids) - T, (B,))
        x = torch.stack([ids[i : i + T] for i in ix])
        y = torch.stack([ids[i + 1 : i + 1 + T] for i in ix])
        return x.to(device), y.to(device)

    def sync() -> None:
        if device_type == "cuda":
            torch.cuda.synchronize()

    @torch.no_grad()
    def estimate() -> None:  # the recipe's periodic loss estimate (timed, as in nanoGPT)
        model.eval()
        for split in ("train", "val"):
            for _ in range(eval_iters):
                model(*batch(split))
        model.train()

    start = time.perf_counter()
    for it in range(p["max_iters"]):
        if eval_iters and it % p["eval_interval"] == 0:
            estimate()
        for group in opt.param_groups:
            group["lr"] = peer_lr(it)
        _, loss = model(*batch("train"))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), p["grad_clip"])
        opt.step()
        opt.zero_grad(set_to_none=True)
    sync()
    return model.eval(), time.perf_counter() - start


def train_attnlab(
    budget: float, out: Path, threads: int | None, device: str = "cpu", max_chars: int | None = None
) -> tuple[Path, dict]:
    """``attnlab train lm --max-time budget`` with the defaults; returns the run and its record."""
    cmd = [sys.executable, "-m", "attnlab.cli", "train", "lm", "--max-time", f"{budget:g}"]
    cmd += ["--out", str(out), "--overwrite", "--no-progress", "--device", device]
    if max_chars:
        cmd += ["--max-chars", str(max_chars)]
    env = dict(os.environ)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"attnlab failed:\n{proc.stderr}")
    chosen = next((ln for ln in proc.stderr.splitlines() if ln.startswith("budget rule")), "")
    metrics = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    steps = max((r.get("step", 0) for r in metrics), default=0)
    return out, {"rule": chosen, "steps": steps}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--nanogpt", required=True, metavar="DIR", help="a nanoGPT checkout")
    ap.add_argument("--budgets", type=float, nargs="*", default=[], help="longer attnlab budgets")
    ap.add_argument("--peer-seconds", type=float, default=None, help="skip the peer's training")
    ap.add_argument("--peer-eval-iters", type=int, default=20, help="0: no periodic estimate")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", default="runs/lm_vs_nanogpt")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (both sides)")
    ap.add_argument(
        "--max-iters", type=int, default=PEER["max_iters"], help="the peer's (smoke tests only)"
    )
    ap.add_argument("--max-chars", type=int, default=None, help="a prefix of pydoc (smoke tests)")
    args = ap.parse_args()
    PEER["max_iters"] = args.max_iters
    PEER["warmup"] = min(PEER["warmup"], max(1, args.max_iters // 10))
    if args.threads:
        torch.set_num_threads(args.threads)
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    task = pydoc_task(max_chars=args.max_chars)
    train_ids, val_ids, V = task.splits["train"], task.splits["val"], task.vocab_size
    rows = []
    peer_s = args.peer_seconds
    if peer_s is None:
        nanogpt = import_nanogpt(args.nanogpt)
        model, peer_s = train_peer(
            nanogpt, train_ids, val_ids, V, args.peer_eval_iters, args.seed, args.device
        )
        peer = score(lambda x: _nanogpt_logits(model, x), val_ids, device=args.device)
        label = "nanoGPT CPU recipe (4x128, block 64, batch 12)"
        rows.append((label, peer_s, PEER["max_iters"], peer))

    for budget in [peer_s, *args.budgets]:
        out = work / f"attnlab_{budget:.0f}s"
        run, info = train_attnlab(budget, out, args.threads, args.device, args.max_chars)
        loaded = attnlab.load(run, weights="last", map_location=args.device)
        nats = score(loaded.model, val_ids, device=args.device)
        label = f"attnlab defaults ({info['rule'].split(':')[1].split(';')[0].strip()})"
        rows.append((label, budget, info["steps"], nats))
    print(
        f"\npydoc, last 10 %, non-overlapping 64-character windows ({torch.get_num_threads()} "
        "threads)\n"
    )
    print("| recipe | wall-clock | steps | nats/char |")
    print("|---|---:|---:|---:|")
    for label, secs, steps, nats in rows:
        print(f"| {label} | {secs:.0f} s | {steps} | {nats:.3f} |")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")


def _nanogpt_logits(model, x: torch.Tensor) -> torch.Tensor:
    """All positions' logits: nanoGPT's forward returns them only when given targets."""
    logits, _ = model(x, torch.zeros_like(x))
    return logits


if __name__ == "__main__":
    main()
