"""Speculative decoding and prompt lookup against plain decoding and Hugging Face, same weights.

The benchmark trains its own pair on pydoc (character tokenizer) with short budgets: a GPT-2
style target and a draft with at least 8x fewer parameters, both through ``attnlab train lm``,
cached in ``--runs`` (a rerun with the same settings skips training). Prompts are taken from the
held-out split. For the target it measures tokens/s of

- plain greedy decoding in every fast setting (fp32, bf16, int8; eager and ``--compile``; each
  prepared as ``attnlab generate`` does with those flags, ``attnlab.fast.for_decoding``), the
  best of which is "plain";
- speculative decoding with the draft (``generate(..., draft=...)``) for each fixed K
  (``adapt=False``) and adaptive K, in the best plain setting, with acceptance rate, mean
  accepted drafts per round and tokens per target forward;
- prompt lookup (``prompt_lookup=N``), on the held-out prompts (documentation: it repeats
  itself) and on prompts of random characters (nothing to look up);
- Hugging Face on the same weights (``attnlab.interop.to_hf`` exports both): plain ``generate``,
  assisted generation (``assistant_model=``) and prompt lookup (``prompt_lookup_num_tokens=``),
  fp32 and bf16, the best of each, timed beside attnlab's plain, adaptive and fastest fixed-K
  speculative decoding and prompt lookup.

Every greedy output is compared with plain greedy decoding's tokens. Timing: wall-clock time of
whole generations (prefill included, the same prompts for every method), methods taking turns
within each repetition, best of ``--reps``. The machine this runs on may be shared: compare
ratios within one run, not absolute numbers across runs.

Usage:

    python benchmarks/speculative.py                       # trains once (~9 min), then measures
    python benchmarks/speculative.py --prompts 2 --new-tokens 64 --reps 1 --no-compile
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import time
from pathlib import Path

import torch

from attnlab import cli
from attnlab.interop import to_hf
from attnlab.tasks.lm import LMTask

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch._dynamo.config.recompile_limit = 64

import attnlab  # noqa: E402
from attnlab.decoding import generate  # noqa: E402
from attnlab.decoding.speculative import SpeculativeStats, check_tokenizers  # noqa: E402
from attnlab.fast import for_decoding  # noqa: E402

TARGET = {"d_model": 512, "n_layers": 4, "n_heads": 8}
DRAFT = {"d_model": 128, "n_layers": 1, "n_heads": 4}


# ----------------------------------------------------------------------------------------------
# the pair


LR = 3e-3  # the pair's peak learning rate (AdamW, 5 warm-up steps, cosine)


def train_run(
    out: Path,
    model: dict,
    seconds: float,
    seq_len: int,
    seed: int,
    threads: int | None = None,
    lr: float = LR,
) -> Path:
    """Train (or reuse) a GPT-2 style char LM on pydoc for ``seconds`` (on ``threads`` torch
    threads, the measurement's when None)."""
    settings = {"model": model, "seconds": seconds, "seq_len": seq_len, "seed": seed}
    if lr != LR:
        settings["lr"] = lr  # (a pair trained at the default rate keeps its marker)
    marker = out / "bench_settings.json"
    if marker.exists() and json.loads(marker.read_text()) == settings:
        return out
    argv = ["train", "lm", "--preset", "gpt2-tiny", "--seq-len", str(seq_len)]
    for key, value in model.items():
        argv += ["--set", f"{key}={value}"]
    argv += ["--max-time", str(seconds), "--batch-size", "8", "--lr", str(lr), "--warmup", "5"]
    argv += ["--seed", str(seed), "--no-progress", "--out", str(out), "--overwrite"]
    print(f"training {out.name}: {model}, {seconds:g} s ...", flush=True)
    measuring = torch.get_num_threads()
    torch.set_num_threads(threads or measuring)
    try:
        failed = cli.main(argv) != 0
    finally:
        torch.set_num_threads(measuring)
    if failed:
        raise SystemExit(f"training {out} failed")
    marker.write_text(json.dumps(settings))
    return out


def load(run: Path, setting: str):
    kw = {"bf16": {"dtype": "bfloat16"}, "int8": {"quantize": "int8"}}.get(setting, {})
    return attnlab.load(run, **kw)


def fast(run: Path, setting: str):
    """The model as ``attnlab generate`` decodes it with a fast-path flag (``--dtype``,
    ``--quantize``, ``--compile``): :func:`attnlab.fast.for_decoding` (the kernel of a few rows
    for the floating-point layers, fp32 attention products for one query)."""
    return for_decoding(load(run, setting).model)


def held_out_prompts(loaded, n: int, length: int) -> list[list[int]]:
    """``n`` prompts of ``length`` tokens, evenly spaced over the held-out split."""
    task = LMTask.from_config(loaded.task, loaded.tokenizer)
    val = task.splits["val"]
    ids = val[: len(val)].astype("int64").tolist()
    step = (len(ids) - length) // max(n, 1)
    return [ids[i * step : i * step + length] for i in range(n)]


def random_prompts(vocab: int, n: int, length: int) -> list[list[int]]:
    """Random characters: no n-gram to look up."""
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, vocab, (n, length), generator=g).tolist()


# ----------------------------------------------------------------------------------------------
# timing


def measure(methods: dict, prompts: list[list[int]], reps: int) -> dict[str, dict]:
    """Each method's best total seconds over the prompts, its outputs and stats; methods take
    turns within each repetition."""
    res = {k: {"s": float("inf")} for k in methods}
    for _ in range(reps):
        for name, fn in methods.items():
            outs, stats = [], SpeculativeStats()
            t = time.perf_counter()
            for p in prompts:
                outs.append(fn(p, stats))
            secs = time.perf_counter() - t
            if secs < res[name]["s"]:
                res[name] = {"s": secs, "out": outs, "stats": stats}
    return res


def ours(model, n: int, compile: bool, temperature: float = 0.0, **kw):
    def fn(prompt, stats):
        idx = torch.tensor([prompt])
        extra = {"stats": stats} if ("draft" in kw or "prompt_lookup" in kw) else {}
        gen = torch.Generator().manual_seed(0)
        out = generate(
            model, idx, n, temperature=temperature, generator=gen, compile=compile, **kw, **extra
        )
        return out[0, len(prompt) :].tolist()

    return fn


def hf_fn(hf, n: int, **kw):
    def fn(prompt, stats):
        idx = torch.tensor([prompt])
        with torch.no_grad():
            out = hf.generate(
                idx,
                attention_mask=torch.ones_like(idx),
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                pad_token_id=0,
                **kw,
            )
        return out[0, len(prompt) :].tolist()

    return fn


def export_hf(run: Path, folder: Path, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM  # heavy optional (the test extra): HF side only

    if not (folder / "config.json").exists():
        with contextlib.redirect_stdout(io.StringIO()):
            to_hf(attnlab.load(run).model, folder, overwrite=True)
    return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()


# ----------------------------------------------------------------------------------------------


def row(name: str, r: dict, n_tokens: int, base: float, ref, extra: str = "") -> str:
    tps = n_tokens / r["s"]
    same = "" if ref is None else ("yes" if r["out"] == ref else "NO")
    st = r.get("stats")
    spec = ""
    if st is not None and st.rounds:
        spec = f"{st.acceptance_rate:>7.0%}{st.mean_accepted:>7.2f}{st.tokens_per_round:>7.2f}"
    return f"  {name:<34}{tps:>9.1f}{tps / base:>8.2f}x{same:>6}{spec:>21}{extra}"


HEAD = (
    f"  {'method':<34}{'tok/s':>9}{'vs plain':>9}{'same':>6}{'accept':>7}{'acc/rd':>7}{'tok/fw':>7}"
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--runs", default="runs/bench_speculative", help="trained pair (cached)")
    ap.add_argument("--target-time", type=float, default=480.0, help="target training, seconds")
    ap.add_argument("--draft-time", type=float, default=150.0, help="draft training, seconds")
    ap.add_argument("--seq-len", type=int, default=256)
    shape = {"nargs": 3, "type": int, "metavar": ("D_MODEL", "LAYERS", "HEADS")}
    ap.add_argument("--target-shape", default=list(TARGET.values()), help="the target", **shape)
    ap.add_argument("--draft-shape", default=list(DRAFT.values()), help="the draft", **shape)
    ap.add_argument(
        "--target-lr", type=float, default=LR, help="the target's training rate (a larger "
        "target may need less than the draft's)",
    )  # fmt: skip
    ap.add_argument(
        "--train-threads", type=int, default=None, help="torch threads of the pair's training "
        "(default: --threads); the trained pair is reused whatever threads trained it",
    )  # fmt: skip
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=96)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--ks", type=int, nargs="+", default=[2, 3, 4, 6, 8])
    ap.add_argument("--speculate", type=int, default=8, help="K of the adaptive runs")
    ap.add_argument("--lookup", type=int, default=3, help="prompt lookup's n-gram size")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--temperature", type=float, default=0.8, help="the sampling rows")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    runs = Path(args.runs)
    target_model = dict(zip(TARGET, args.target_shape))
    draft_model = dict(zip(DRAFT, args.draft_shape))
    t_run = train_run(runs / "target", target_model, args.target_time, args.seq_len, 0,
                      args.train_threads, args.target_lr)  # fmt: skip
    d_run = train_run(runs / "draft", draft_model, args.draft_time, args.seq_len, 0,
                      args.train_threads)  # fmt: skip
    target32, draft32 = load(t_run, "fp32"), load(d_run, "fp32")
    check_tokenizers(target32.tokenizer, draft32.tokenizer)
    nt, nd = target32.model.num_parameters(), draft32.model.num_parameters()
    n, P = args.new_tokens, args.prompts
    docs = held_out_prompts(target32, P, args.prompt_len)
    rand = random_prompts(target32.model.config.vocab_size, P, args.prompt_len)
    total = n * P
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; target {target_model} "
        f"{nt / 1e6:.2f}M parameters, draft {draft_model} {nd / 1e6:.2f}M ({nt / nd:.1f}x "
        "fewer); "
        f"{P} held-out prompts of {args.prompt_len} characters, {n} new tokens each, greedy; "
        f"best of {args.reps}"
    )

    # plain decoding in every fast setting
    settings = ["fp32", "bf16", "int8"]
    models = {s: fast(t_run, s) for s in settings}
    drafts = {s: fast(d_run, s) for s in settings}
    plain = {f"plain {s}": ours(models[s], n, False) for s in settings}
    if not args.no_compile:
        for s in settings:
            fn = ours(models[s], n, True)
            fn(docs[0], None)  # compile before timing
            plain[f"plain {s} +compile"] = fn
    res = measure(plain, docs, args.reps)
    best = min(res, key=lambda k: res[k]["s"])
    base = total / res[best]["s"]
    ref = res["plain fp32"]["out"]
    setting = best.split()[1]
    compile = best.endswith("+compile")
    print(f"\nplain decoding of the target (best: {best})")
    print(HEAD)
    for k, r in res.items():
        print(row(k, r, total, base, ref))

    # the draft in its own fastest setting, compiled or not apart from the target (a small
    # model is Python-bound: int8 may not pay, and compiling its step removes most of that cost)
    d_plain = {s: ours(drafts[s], n, False) for s in settings}
    if not args.no_compile:
        for s in settings:
            d_plain[f"{s} +compile"] = ours(drafts[s], n, True)
            d_plain[f"{s} +compile"](docs[0], None)
    res_d = measure(d_plain, docs[:1], args.reps)
    d_best = min(res_d, key=lambda k: res_d[k]["s"])
    d_setting, d_compile = d_best.split()[0], d_best.endswith("+compile")
    print(
        "\nplain decoding of the draft: "
        + ", ".join(f"{k} {n / r['s']:.0f} tok/s" for k, r in res_d.items())
        + f" (the draft runs in {d_best})"
    )

    # speculative decoding with the draft, in the best plain setting
    tgt, dft = models[setting], drafts[d_setting]

    def spec_fn(temperature: float = 0.0, **kw):
        if "draft" in kw:
            kw["draft_compile"] = d_compile
        return ours(tgt, n, compile, temperature, **kw)

    spec = {"plain (best)": plain[best]}
    for k in args.ks:
        spec[f"draft K={k}"] = spec_fn(draft=dft, speculate=k, adapt=False)
    spec[f"draft adaptive K<={args.speculate}"] = spec_fn(draft=dft, speculate=args.speculate)
    spec[f"lookup N={args.lookup} K={args.speculate}"] = spec_fn(
        prompt_lookup=args.lookup, speculate=args.speculate
    )
    if compile or d_compile:
        # compile every graph before timing: the verifications' widths follow the drafts' k,
        # which depends only on the tokens, so one pass over the prompts meets them all
        for fn in spec.values():
            for p in docs:
                fn(p, SpeculativeStats())
    res_s = measure(spec, docs, args.reps)
    base_s = total / res_s["plain (best)"]["s"]
    ref_s = res_s["plain (best)"]["out"]
    print(
        f"\nspeculative decoding, held-out prompts (target {setting}{' +compile' if compile else ''}"
        f", draft {d_best})"
    )
    print(HEAD)
    for k, r in res_s.items():
        print(row(k, r, total, base_s, ref_s))

    # sampling: the same methods at temperature 0.8 (exact: the target's distribution)
    temp = args.temperature
    samp = {
        "plain (best)": ours(tgt, n, compile, temp),
        f"draft adaptive K<={args.speculate}": spec_fn(temp, draft=dft, speculate=args.speculate),
        f"lookup N={args.lookup} K={args.speculate}": spec_fn(
            temp, prompt_lookup=args.lookup, speculate=args.speculate
        ),
    }
    res_t = measure(samp, docs, args.reps)
    base_t = total / res_t["plain (best)"]["s"]
    print(f"\nsampling at temperature {temp:g}, held-out prompts")
    print(HEAD)
    for k, r in res_t.items():
        print(row(k, r, total, base_t, None))

    # prompt lookup on prompts with nothing to look up
    look = {
        "plain (best)": plain[best],
        f"lookup N={args.lookup} K={args.speculate}": spec[f"lookup N={args.lookup} K={args.speculate}"],
    }  # fmt: skip
    res_r = measure(look, rand, args.reps)
    base_r = total / res_r["plain (best)"]["s"]
    print("\nprompt lookup, prompts of random characters")
    print(HEAD)
    for k, r in res_r.items():
        print(row(k, r, total, base_r, res_r["plain (best)"]["out"]))

    if args.no_hf:
        return
    # Hugging Face on the same weights
    hf = {}
    for dt, name in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
        t_hf = export_hf(t_run, runs / "hf_target", dt)
        d_hf = export_hf(d_run, runs / "hf_draft", dt)
        hf[f"HF {name} plain"] = hf_fn(t_hf, n)
        hf[f"HF {name} assisted"] = hf_fn(t_hf, n, assistant_model=d_hf)
        hf[f"HF {name} prompt lookup K={args.speculate}"] = hf_fn(
            t_hf, n, prompt_lookup_num_tokens=args.speculate
        )
    hf["ours: plain (best)"] = plain[best]
    adaptive = f"draft adaptive K<={args.speculate}"
    hf[f"ours: {adaptive}"] = spec[adaptive]
    fixed = [k for k in res_s if k.startswith("draft K=")]
    best_fixed = min(fixed, key=lambda k: res_s[k]["s"]) if fixed else None
    if best_fixed:  # the fastest fixed K of the section above, measured again beside HF
        hf[f"ours: {best_fixed}"] = spec[best_fixed]
    lookup = f"lookup N={args.lookup} K={args.speculate}"
    hf[f"ours: {lookup}"] = spec[lookup]
    res_h = measure(hf, docs, args.reps)
    base_h = total / res_h["ours: plain (best)"]["s"]
    print("\nHugging Face, same weights, held-out prompts (vs attnlab plain best)")
    print(HEAD)
    for k, r in res_h.items():
        print(row(k, r, total, base_h, ref))
    best_lookup = min((r["s"] for k, r in res_h.items() if "HF" in k and "lookup" in k))
    print(
        f"ours: prompt lookup / HF prompt lookup (best dtype): "
        f"{best_lookup / res_h[f'ours: {lookup}']['s']:.2f}x"
    )
    best_assisted = min((r["s"] for k, r in res_h.items() if "assisted" in k))
    ours_s = res_h[f"ours: {adaptive}"]["s"]
    print(
        f"\nours: speculative (adaptive) / HF assisted (best dtype): {best_assisted / ours_s:.2f}x;"
        f" / attnlab plain (best): {res_h['ours: plain (best)']['s'] / ours_s:.2f}x"
    )
    if best_fixed:
        fixed_s = res_h[f"ours: {best_fixed}"]["s"]
        print(
            f"ours: speculative ({best_fixed}, the fastest fixed K above) / HF assisted (best "
            f"dtype): {best_assisted / fixed_s:.2f}x; / attnlab plain (best): "
            f"{res_h['ours: plain (best)']['s'] / fixed_s:.2f}x"
        )


if __name__ == "__main__":
    sys.exit(main())
