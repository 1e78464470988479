"""Decoding speed: milliseconds per new token at several context lengths, with and without the KV
cache, against Hugging Face ``generate`` on the same weights (GPT-2 style, greedy).

Per-token cost is the decode cost only: (time for n new tokens − time for 1) / (n − 1), so the
prompt's prefill is not counted. With the cache a step attends over the cached keys (flat in the
context up to the attention term); without it every step re-encodes the whole context (growing).

Usage (short settings for a shared CPU):

    python benchmarks/generate.py --contexts 64 512 2048 --new-tokens 8
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

from attnlab.config import ModelConfig
from attnlab.decoding import generate
from attnlab.models.lm import DecoderLM

sys.path.insert(0, str(Path(__file__).parent))
from train_throughput import hf_gpt2_from  # noqa: E402  (the same weight copy as that benchmark)

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, device: str, reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        _sync(device)
        t = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - t)
    return best


def per_token_ms(run, n: int, device: str, reps: int) -> float:
    """Decode ms per token: (t(n) − t(1)) / (n − 1)."""
    t1 = timed(lambda: run(1), device, reps)
    tn = timed(lambda: run(n), device, reps)
    return 1000 * (tn - t1) / (n - 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--contexts", type=int, nargs="+", default=[64, 512, 2048])
    ap.add_argument("--new-tokens", type=int, default=8)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--d-model", type=int, default=384)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--reps", type=int, default=2, help="best of this many timings")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dev, n = args.device, args.new_tokens
    torch.manual_seed(0)
    cfg = ModelConfig.preset(
        "gpt2-small",
        vocab_size=args.vocab,
        max_seq_len=max(args.contexts) + n,
        d_model=args.d_model,
        n_layers=args.layers,
        n_heads=args.heads,
    )
    ours = DecoderLM(cfg).eval().to(dev)
    hf = hf_gpt2_from(ours).eval().to(dev)
    print(
        f"device {dev} ({torch.get_num_threads()} threads); {args.layers} layers, d={args.d_model}, "
        f"vocab={args.vocab}; batch 1, greedy, {n} new tokens, best of {args.reps}"
    )
    print(f"{'context':>8}{'attnlab cache':>15}{'attnlab no cache':>18}{'HF generate':>13}  same")
    for ctx in args.contexts:
        idx = torch.randint(0, args.vocab, (1, ctx), device=dev)
        mask = torch.ones_like(idx)

        def ours_run(k, cache=True, idx=idx):
            return generate(ours, idx, k, temperature=0, use_cache=cache)

        def hf_run(k, idx=idx, mask=mask):
            with torch.no_grad():
                return hf.generate(
                    idx,
                    attention_mask=mask,
                    max_new_tokens=k,
                    min_new_tokens=k,
                    do_sample=False,
                    use_cache=True,
                    pad_token_id=0,
                )

        same = torch.equal(ours_run(n)[0, ctx:], hf_run(n)[0, ctx:])
        c = per_token_ms(ours_run, n, dev, args.reps)
        nc = per_token_ms(lambda k: ours_run(k, cache=False), n, dev, 1)
        h = per_token_ms(hf_run, n, dev, args.reps)
        print(f"{ctx:>8}{c:>13.1f}ms{nc:>16.1f}ms{h:>11.1f}ms  {same}")


if __name__ == "__main__":
    main()
