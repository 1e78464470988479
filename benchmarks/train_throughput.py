"""Training throughput: attnlab DecoderLM (eager and torch.compile'd) vs Hugging Face
GPT2LMHeadModel, same config and weights.

Measures tokens/s of full training steps (forward, cross-entropy, backward, fused AdamW - the
optimizer of attnlab's trainer and of HF's Trainer with torch >= 2.8) for a 6-layer, d=384,
T=256 GPT-2-style model in fp32 and with bf16 autocast, and the model FLOPs utilisation (MFU)
against this machine's matmul rate measured in the same run:

    model FLOPs per token = 6·N_matmul + 12·L·T·d      (PaLM appendix B: weights + attention)
    MFU = tokens/s · FLOPs per token / measured peak matmul FLOP/s

``attnlab+compile`` is what ``attnlab train lm --compile`` runs (``TrainConfig(compile=True)``:
torch.compile with inductor); it is compiled during the warm-up steps, which are not timed.
``--optimizers`` times one AdamW step of the same model with torch's three implementations
(one tensor at a time, ``foreach``, ``fused``): why attnlab uses the fused one on CPUs too.

Usage (short settings for a shared CPU):

    python benchmarks/train_throughput.py --steps 3 --batch-size 4 --no-compile
    python benchmarks/train_throughput.py --steps 10 --batch-size 8 --optimizers
    python benchmarks/train_throughput.py --device cuda --steps 20 --batch-size 32
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import time

import torch
import torch.nn.functional as F

from attnlab.config import ModelConfig
from attnlab.fast import FusedLMLoss
from attnlab.models.lm import DecoderLM

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def matmul_rate(device: str, dtype: torch.dtype, n: int = 1024, reps: int = 3) -> float:
    """Measured FLOP/s of an n×n×n matmul (best of ``reps``)."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best = float("inf")
    for _ in range(reps + 1):
        _sync(device)
        t = time.perf_counter()
        a @ b
        _sync(device)
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def hf_gpt2_from(model: DecoderLM):
    """A GPT2LMHeadModel with the same configuration and weights as ``model``."""
    from transformers import (  # heavy optional (the test extra): HF side only
        GPT2Config,
        GPT2LMHeadModel,
    )

    c = model.config
    hf_cfg = GPT2Config(
        vocab_size=c.vocab_size,
        n_positions=c.max_seq_len,
        n_embd=c.d_model,
        n_layer=c.n_layers,
        n_head=c.n_heads,
        n_inner=c.ffn_hidden,
        activation_function="gelu_new",
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        layer_norm_epsilon=c.norm_eps,
        bos_token_id=0,
        eos_token_id=0,
        attn_implementation="sdpa",
    )
    hf = GPT2LMHeadModel(hf_cfg)
    sd = {
        "transformer.wte.weight": model.tok_emb.weight,
        "transformer.wpe.weight": model.pos_emb.weight,
        "transformer.ln_f.weight": model.norm_f.weight,
        "transformer.ln_f.bias": model.norm_f.bias,
        "lm_head.weight": model.lm_head.weight,
    }
    for i, b in enumerate(model.blocks):
        p = f"transformer.h.{i}."
        sd |= {
            p + "ln_1.weight": b.norm1.weight,
            p + "ln_1.bias": b.norm1.bias,
            p + "ln_2.weight": b.norm2.weight,
            p + "ln_2.bias": b.norm2.bias,
            # HF's Conv1D stores (in, out): the transpose of nn.Linear's weight
            p + "attn.c_attn.weight": b.attn.qkv.weight.T,
            p + "attn.c_attn.bias": b.attn.qkv.bias,
            p + "attn.c_proj.weight": b.attn.out_proj.weight.T,
            p + "attn.c_proj.bias": b.attn.out_proj.bias,
            p + "mlp.c_fc.weight": b.ffn.fc1.weight.T,
            p + "mlp.c_fc.bias": b.ffn.fc1.bias,
            p + "mlp.c_proj.weight": b.ffn.fc2.weight.T,
            p + "mlp.c_proj.bias": b.ffn.fc2.bias,
        }
    hf.load_state_dict({k: v.detach().clone().contiguous() for k, v in sd.items()}, strict=True)
    return hf


def flops_per_token(model: DecoderLM, seq_len: int) -> float:
    c = model.config
    n_matmul = sum(p.numel() for n, p in model.named_parameters() if p.dim() == 2)
    n_matmul -= model.pos_emb.weight.numel()  # a table lookup, not a matmul
    # tok_emb is tied to lm_head: counted once, as the output projection's matmul
    return 6 * n_matmul + 12 * c.n_layers * seq_len * c.d_model


def bench(models: dict, idx, targets, steps: int, warmup: int, amp: bool, device: str) -> dict:
    """Tokens/s of each model (median step), stepping the models in turn so that a busy machine
    slows them alike. ``models``: name -> (module, loss(idx, targets))."""
    fused = device.split(":")[0] in ("cpu", "cuda")
    opts = {
        n: torch.optim.AdamW(m.parameters(), lr=1e-4, fused=fused or None)
        for n, (m, _) in models.items()
    }
    ctx = (
        torch.autocast(device.split(":")[0], dtype=torch.bfloat16)
        if amp
        else contextlib.nullcontext()
    )
    times: dict[str, list[float]] = {n: [] for n in models}
    for i in range(warmup + steps):
        for name, (model, loss_of) in models.items():
            model.train()
            _sync(device)
            t = time.perf_counter()
            with ctx:
                loss = loss_of(idx, targets)
            loss.backward()
            opts[name].step()
            opts[name].zero_grad(set_to_none=True)
            _sync(device)
            if i >= warmup:
                times[name].append(time.perf_counter() - t)
    return {n: idx.numel() / sorted(ts)[len(ts) // 2] for n, ts in times.items()}


def hf_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def optimizer_steps(model: torch.nn.Module, device: str, reps: int = 10) -> dict[str, float]:
    """Median seconds of one AdamW step over ``model``'s parameters, per implementation."""
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    kinds = {"one tensor at a time": dict(foreach=False), "foreach": dict(foreach=True)}
    if device.split(":")[0] in ("cpu", "cuda"):
        kinds["fused"] = dict(fused=True)
    opts = {k: torch.optim.AdamW(model.parameters(), lr=1e-4, **kw) for k, kw in kinds.items()}
    times: dict[str, list[float]] = {k: [] for k in opts}
    for i in range(reps + 1):
        for k, opt in opts.items():  # in turn, so that a busy machine slows them alike
            _sync(device)
            t = time.perf_counter()
            opt.step()
            _sync(device)
            if i:
                times[k].append(time.perf_counter() - t)
    model.zero_grad(set_to_none=True)
    return {k: sorted(v)[len(v) // 2] for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--d-model", type=int, default=384)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--no-bf16", action="store_true")
    ap.add_argument("--no-compile", action="store_true", help="skip attnlab+compile")
    ap.add_argument("--optimizers", action="store_true", help="also time the AdamW variants")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = args.device
    if dev.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = False  # a fair fp32 comparison
        torch.backends.cudnn.allow_tf32 = False

    torch.manual_seed(0)
    cfg = ModelConfig.preset(
        "gpt2-small",
        vocab_size=args.vocab,
        max_seq_len=args.seq_len,
        d_model=args.d_model,
        n_layers=args.layers,
        n_heads=args.heads,
    )
    ours = DecoderLM(cfg)
    hf = hf_gpt2_from(ours)
    compiled_copy = copy.deepcopy(ours).to(dev)
    ours.to(dev)
    hf.to(dev)
    idx = torch.randint(0, args.vocab, (args.batch_size, args.seq_len), device=dev)
    targets = torch.randint(0, args.vocab, (args.batch_size, args.seq_len), device=dev)
    with torch.no_grad():  # same weights -> same logits
        diff = (ours.eval()(idx[:1]) - hf.eval()(idx[:1]).logits).abs().max().item()
        loss_diff = abs(
            ours(idx[:1], targets=targets[:1]).item()
            - hf_loss(hf(idx[:1]).logits, targets[:1]).item()
        )

    fpt = flops_per_token(ours, args.seq_len)
    peaks = {"fp32": matmul_rate(dev, torch.float32)}
    modes = ["fp32"] if args.no_bf16 else ["fp32", "bf16"]
    if "bf16" in modes:
        peaks["bf16"] = matmul_rate(dev, torch.bfloat16)
    print(
        f"device {dev} ({torch.get_num_threads()} threads), torch {torch.__version__}; "
        f"model: {args.layers} layers, d={args.d_model}, heads={args.heads}, T={args.seq_len}, "
        f"vocab={args.vocab}, {sum(p.numel() for p in ours.parameters()) / 1e6:.1f}M params; "
        f"batch {args.batch_size}; median of {args.steps} steps after {args.warmup} warm-up"
    )
    print(
        f"max |logits(attnlab) - logits(HF)| = {diff:.2e}, |loss(attnlab) - loss(HF)| = "
        f"{loss_diff:.2e}; model FLOPs/token = {fpt / 1e6:.1f}M"
    )
    print(
        "measured matmul peak: " + ", ".join(f"{k} {v / 1e9:.1f} GFLOP/s" for k, v in peaks.items())
    )
    # each as its users train it: attnlab's LM task asks the model for the loss with the output
    # projection and the cross-entropy fused (head_loss=attnlab.fast.FusedLMLoss()); HF's loss
    # is cross_entropy(logits.float()), what GPT2LMHeadModel(labels=...) computes after its shift
    fused, fused_compiled = FusedLMLoss(), FusedLMLoss()
    models = {
        "attnlab": (ours, lambda x, y: ours(x, targets=y, head_loss=fused)),
        "HF GPT2": (hf, lambda x, y: hf_loss(hf(x).logits, y)),
    }
    if not args.no_compile:
        compiled = torch.compile(compiled_copy)
        models["attnlab+compile"] = (
            compiled_copy,
            lambda x, y: compiled(x, targets=y, head_loss=fused_compiled),
        )
    print(f"{'model':<17}{'precision':<11}{'tokens/s':>10}{'MFU':>8}{'vs HF':>8}")
    for mode in modes:
        # the compiled model compiles (again, under autocast) in its warm-up steps
        warmup = max(args.warmup, 2 if "attnlab+compile" in models else 0)
        tps = bench(models, idx, targets, args.steps, warmup, mode == "bf16", dev)
        for name, v in tps.items():
            vs = v / tps["HF GPT2"]
            print(f"{name:<17}{mode:<11}{v:>10.0f}{v * fpt / peaks[mode]:>8.1%}{vs:>7.2f}x")
    if args.optimizers:
        print("\nAdamW step over the same parameters (median):")
        for kind, secs in optimizer_steps(copy.deepcopy(ours), dev).items():
            print(f"  {kind:<22}{secs * 1000:>8.1f} ms")


if __name__ == "__main__":
    main()
