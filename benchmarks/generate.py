"""Decoding speed near the memory limit: ms per new token for fp32, bf16 and int8 weights, eager
and compiled, against Hugging Face ``generate`` on the same weights (GPT-2 style, greedy).

Batch-1 decoding reads every weight once per token, so its floor is

    roofline = weight bytes / matrix-vector bandwidth

with the bandwidth measured in this run on the largest matrix (the output projection, V x d) in
each precision: the faster of torch's ``F.linear`` and attnlab's layer (whose one-row product is
``attnlab.fast.matvec``'s kernel for fp32 and bf16, ``torch._weight_int8pack_mm`` for int8);
both rates are printed. The table gives each setting's ms per token, its speed-up over HF fp32 and the
fraction of its roofline reached. Per-token cost is the decode cost only: the median interval
between consecutive new tokens (timestamps from ``generate``'s callback and HF's streamer), so the
prompt's prefill is not counted and a busy machine's spikes are left out; the settings take turns
(one generation of each per repetition), so a drifting machine slows them alike. Then batched
throughput (``--batch``, tokens/s) against HF, and with ``--agreement RUN`` how often bf16 and
int8 greedy continuations of a trained run equal fp32's.

Settings, each the plain model with the fast-path transforms applied
(``attnlab.fast.for_decoding``, what ``attnlab generate --dtype/--quantize/--compile`` applies):
``fp32`` / ``bf16`` (``dtype=torch.bfloat16``), ``int8`` (weight-only int8 with bf16
activations, ``quantize="int8"``), each with the one-row kernel and fp32 one-query attention;
``+compile``: a static KV cache and a torch.compile'd step (``compile=True``, CUDA graphs on a
GPU; compiled once per setting before timing). ``plain fp32`` is the model as built, without
any transform.

Usage (short settings for a shared CPU; the lead's full run is in docs/performance.md):

    python benchmarks/generate.py --contexts 64 512 --new-tokens 8 --reps 2 --no-compile
    python benchmarks/generate.py                         # 64/512/2048, compile, batch 16
    python benchmarks/generate.py --device cuda --new-tokens 64
    python benchmarks/generate.py --agreement runs/demo/transformer --prompts 50
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
from pathlib import Path

import torch

import attnlab
from attnlab.config import ModelConfig
from attnlab.decoding import generate
from attnlab.fast import CompiledDecoder, Int8Linear, for_decoding
from attnlab.models.lm import DecoderLM
from attnlab.tasks.lm import LMTask

sys.path.insert(0, str(Path(__file__).parent))
from train_throughput import hf_gpt2_from  # noqa: E402  (the same weight copy as that benchmark)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch._dynamo.config.recompile_limit = 64  # one graph per (setting, capacity)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, device: str, reps: int) -> float:
    """Best wall-clock seconds of ``reps`` calls."""
    best = float("inf")
    for _ in range(reps):
        _sync(device)
        t = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - t)
    return best


def _gaps(run, n: int, device: str) -> list[float]:
    """Seconds between consecutive new tokens of one ``run(n, stamp)`` (decode steps only);
    ``run`` calls ``stamp()`` as each token arrives."""
    stamps: list[float] = []

    def stamp() -> None:
        _sync(device)
        stamps.append(time.perf_counter())

    run(n, stamp)
    return [b - a for a, b in zip(stamps[1:], stamps[2:])]


def per_token_ms_interleaved(runs: dict, n: int, device: str, reps: int) -> dict[str, float]:
    """Median ms between consecutive new tokens of each run over ``reps`` repetitions, the runs
    taking turns (one of each per repetition), so that a machine whose speed drifts during the
    benchmark slows every setting alike."""
    gaps: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(reps):
        for k, run in runs.items():
            gaps[k] += _gaps(run, n, device)
    return {k: 1000 * sorted(g)[len(g) // 2] for k, g in gaps.items()}


# ----------------------------------------------------------------------------------------------
# the memory floor


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the matrices read per token: every linear layer (the output head included) and
    its scales; the token embedding is a lookup (one row) and is not counted."""
    total = 0
    for mod in model.modules():
        if isinstance(mod, Int8Linear):
            total += mod.weight.numel() + mod.scale.numel() * mod.scale.element_size()
        elif isinstance(mod, torch.nn.Linear):
            total += mod.weight.numel() * mod.weight.element_size()
    return total


def matvec_bandwidth(
    layer: torch.nn.Module, d_in: int, dtype: torch.dtype, device: str, reps: int = 20
) -> float:
    """Bytes per second of ``layer`` on one vector (the weights dominate the traffic)."""
    x = torch.randn(1, d_in, device=device, dtype=dtype)
    with torch.no_grad():
        layer(x)
        secs = timed(lambda: layer(x), device, reps)
    return weight_bytes(layer) / secs


def make_settings(base: DecoderLM, device: str) -> dict[str, DecoderLM]:
    """fp32, bf16 and int8 (bf16 activations) copies of ``base``, through
    :func:`attnlab.fast.for_decoding` (``base`` itself stays plain)."""
    return {
        "fp32": for_decoding(copy.deepcopy(base)),
        "bf16": for_decoding(copy.deepcopy(base), dtype=torch.bfloat16),
        "int8": for_decoding(copy.deepcopy(base), dtype=torch.bfloat16, quantize="int8").to(device),
    }


def bandwidths(models: dict[str, DecoderLM], device: str) -> tuple[dict, dict]:
    """Matrix-vector bandwidth of each setting's output head (V x d): attnlab's layer, and
    torch's ``F.linear`` on the same (floating-point) weight."""
    d = models["fp32"].config.d_model
    ours, torchs = {}, {}
    for name, m in models.items():
        dtype = torch.float32 if name == "fp32" else torch.bfloat16
        ours[name] = matvec_bandwidth(m.lm_head, d, dtype, device)
        if not isinstance(m.lm_head, Int8Linear):
            plain = torch.nn.Linear(1, 1, bias=False)
            plain.weight = m.lm_head.weight
            torchs[name] = matvec_bandwidth(plain, d, dtype, device)
    return ours, torchs


# ----------------------------------------------------------------------------------------------
# the runs


def attnlab_run(model: DecoderLM, idx: torch.Tensor, compile: bool):
    decoder = CompiledDecoder(model) if compile else model  # for_decoding(..., compile=True)

    def run(k: int, stamp=None) -> torch.Tensor:
        callback = None if stamp is None else (lambda nxt: stamp())
        return generate(decoder, idx, k, temperature=0, callback=callback)

    return run


class _Stamps:
    """An HF streamer that only records when each token arrives."""

    def __init__(self, stamp) -> None:
        self.stamp, self.prompt_seen = stamp, False

    def put(self, value) -> None:
        if self.prompt_seen:  # the first call carries the prompt
            self.stamp()
        self.prompt_seen = True

    def end(self) -> None:
        pass


def hf_run(hf, idx: torch.Tensor):
    mask = torch.ones_like(idx)

    def run(k: int, stamp=None) -> torch.Tensor:
        with torch.no_grad():
            return hf.generate(
                idx,
                attention_mask=mask,
                max_new_tokens=k,
                min_new_tokens=k,
                do_sample=False,
                use_cache=True,
                pad_token_id=0,
                streamer=None if stamp is None else _Stamps(stamp),
            )

    return run


def latency_table(args, models, hfs, bw, device: str) -> None:
    n, reps = args.new_tokens, args.reps
    variants = [(name, False) for name in models]
    if not args.no_compile:
        variants += [(name, True) for name in models]
    floors = {name: 1000 * weight_bytes(m) / bw[name] for name, m in models.items()}
    print(
        "\nbatch 1, greedy: ms per new token (speed-up over HF fp32; fraction of the roofline "
        "= weight bytes / matvec bandwidth)"
    )
    print(
        "roofline: "
        + ", ".join(
            f"{k} {weight_bytes(models[k]) / 1e6:.0f} MB / {bw[k] / 1e9:.1f} GB/s = "
            f"{floors[k]:.2f} ms"
            for k in models
        )
    )
    head = f"{'context':>8}{'HF fp32':>10}{'HF bf16':>10}"
    head += "".join(f"{name + (' +compile' if c else ''):>22}" for name, c in variants)
    print(head)
    for ctx in args.contexts:
        idx = torch.randint(0, models["fp32"].config.vocab_size, (1, ctx), device=device)
        runs = {f"HF {k}": hf_run(hf, idx) for k, hf in hfs.items()}
        for name, comp in variants:
            run = attnlab_run(models[name], idx, comp)
            if comp:
                run(n)  # compile before timing (once per setting and capacity)
            runs[name + (" +compile" if comp else "")] = run
        ms = per_token_ms_interleaved(runs, n, device, reps)
        row = f"{ctx:>8}{ms['HF fp32']:>8.2f}ms{ms['HF bf16']:>8.2f}ms"
        for name, comp in variants:
            got = ms[name + (" +compile" if comp else "")]
            speedup = ms["HF fp32"] / got if got > 0 else float("inf")
            row += f"{got:>8.2f}ms {speedup:>4.1f}x {floors[name] / got:>5.0%}"
        same = torch.equal(runs["fp32"](n)[0, ctx:], runs["HF fp32"](n)[0, ctx:])
        print(row + f"   fp32 tokens = HF's: {same}")


def throughput_table(args, models, hfs, device: str) -> None:
    """Tokens per second of ``--batch`` prompts decoded together (context 64)."""
    B, n, ctx = args.batch, args.new_tokens, min(64, min(args.contexts))
    print(f"\nbatch {B}, context {ctx}, greedy: new tokens per second")
    idx = torch.randint(0, models["fp32"].config.vocab_size, (B, ctx), device=device)

    def tokens_per_s(run) -> float:  # (t(n) - t(1)) / (n - 1): no streamer for batches in HF
        t1 = timed(lambda: run(1), device, args.reps)
        tn = timed(lambda: run(n), device, args.reps)
        return B * (n - 1) / max(tn - t1, 1e-9)

    cells = [(f"HF {k}", tokens_per_s(hf_run(hf, idx))) for k, hf in hfs.items()]
    cells += [(f"attnlab {k}", tokens_per_s(attnlab_run(m, idx, False))) for k, m in models.items()]
    ref = cells[0][1]
    for label, tps in cells:
        print(f"  {label:<16}{tps:>10.0f} tokens/s  ({tps / ref:.2f}x HF fp32)")


def agreement(args, device: str) -> None:
    """How often bf16 and int8 greedy continuations equal fp32's, on a trained run."""
    fp32 = attnlab.load(args.agreement, map_location=device)
    task = LMTask.from_config(fp32.task, fp32.tokenizer)
    T, k, P = 64, 64, args.prompts
    val = torch.as_tensor(task.splits["val"][: (T + 1) * P].astype("int64"))
    prompts = val[: T * P].view(P, T).to(device)  # (P, 64) held-out prompts
    ref = generate(fp32.model, prompts, k, temperature=0)[:, T:]
    print(f"\n{args.agreement}: {P} held-out {T}-token prompts, {k} greedy tokens")
    for name, kw in (("bf16", {"dtype": "bfloat16"}), ("int8", {"quantize": "int8"})):
        model = attnlab.load(args.agreement, map_location=device, **kw).model
        out = generate(model, prompts, k, temperature=0)[:, T:]
        equal = (out == ref).all(-1).float().mean().item()
        first_diff = torch.where(out != ref, torch.arange(k, device=device), k).amin(-1)
        print(
            f"  {name}: {equal:.0%} of continuations identical to fp32; "
            f"mean identical prefix {first_diff.float().mean():.1f} of {k} tokens"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--contexts", type=int, nargs="+", default=[64, 512, 2048])
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--d-model", type=int, default=384)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--batch", type=int, default=16, help="batched throughput (0: skip)")
    ap.add_argument(
        "--reps",
        type=int,
        default=3,
        help="repetitions (latency: median token gap over all; throughput: best)",
    )
    ap.add_argument("--no-compile", action="store_true", help="skip the compiled settings")
    ap.add_argument("--agreement", metavar="RUN", default=None, help="a trained LM run directory")
    ap.add_argument("--prompts", type=int, default=50, help="prompts for --agreement")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = args.device
    if args.agreement:
        agreement(args, dev)
        return
    torch.manual_seed(0)
    cfg = ModelConfig.preset(
        "gpt2-small",
        vocab_size=args.vocab,
        max_seq_len=max(args.contexts) + args.new_tokens,
        d_model=args.d_model,
        n_layers=args.layers,
        n_heads=args.heads,
    )
    base = DecoderLM(cfg).eval()
    hf32 = hf_gpt2_from(base).eval()
    hfs = {"fp32": hf32.to(dev), "bf16": copy.deepcopy(hf32).to(dev, torch.bfloat16)}
    models = make_settings(base.to(dev), dev)
    ours_bw, torch_bw = bandwidths(models, dev)
    bw = {k: max(v, torch_bw.get(k, 0.0)) for k, v in ours_bw.items()}
    print(
        f"device {dev} ({torch.get_num_threads()} threads), torch {torch.__version__}; GPT-2 "
        f"{args.layers} layers x {args.d_model}, vocab {args.vocab}, "
        f"{base.num_parameters() / 1e6:.1f}M parameters; {args.new_tokens} new tokens, repetitions "
        f"{args.reps}"
    )
    with torch.no_grad():
        print(
            "matrix-vector bandwidth of the output head: "
            + ", ".join(
                f"{k} attnlab {ours_bw[k] / 1e9:.1f} GB/s"
                + (f" / torch F.linear {torch_bw[k] / 1e9:.1f}" if k in torch_bw else "")
                for k in ours_bw
            )
        )
        latency_table(args, models, hfs, bw, dev)
        if args.batch:
            throughput_table(args, models, hfs, dev)


if __name__ == "__main__":
    main()
