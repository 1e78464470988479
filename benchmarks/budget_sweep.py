"""The sweep behind the budget rule (attnlab.runspec.budget): every row of the table at several
wall-clock budgets -> held-out nats/char on the pydoc split.

Each cell trains one row (model, window, batch, learning rate x ``--lr-scales``, warm-up, dropout)
with attnlab's trainer for ``budget`` seconds, exactly as ``attnlab train lm --max-time`` would
(periodic validation included), and scores it like issue 12 (``pydoc_score.py``: last 10 %,
non-overlapping 64-character windows). Results are appended to ``--results`` (JSON lines) after
every cell, so an interrupted sweep resumes where it stopped; run it on an idle machine.

It prints a Markdown table (settings x budgets, the best of each budget in bold), what the rule
picks at each budget at this machine's measured speed, and for each row the budget from which it
beats the row below: ``min_steps`` = the steps the row makes there, which is what
``attnlab.runspec.budget.ROWS`` should hold.

    python benchmarks/budget_sweep.py                                   # the default sweep
    python benchmarks/budget_sweep.py --rows xs s m --budgets 30 75 150 --lr-scales 0.5 1 2
    python benchmarks/budget_sweep.py --table-only                      # print what is stored
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from pydoc_score import pydoc_task, score  # noqa: E402

from attnlab.config import ModelConfig  # noqa: E402
from attnlab.models.lm import DecoderLM  # noqa: E402
from attnlab.runspec.budget import (  # noqa: E402
    ROWS,
    choose_lm_settings,
    fastest_ref_steps_per_s,
    measure_ref_steps_per_s,
    row_cost,
)
from attnlab.train import TrainConfig, train  # noqa: E402

MIN_STEPS = 50  # cells whose row would make fewer steps in the budget are skipped


def _key(rec: dict) -> tuple:
    return (rec["row"], rec["budget"], rec["lr_scale"], rec["dropout"], rec["seed"])


def load_results(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_cell(
    row, budget, lr_scale, dropout, seed, speed, tasks, workdir: Path, args: argparse.Namespace
) -> dict:
    """Train one row for ``budget`` seconds and score it."""
    if row.seq_len not in tasks:
        tasks[row.seq_len] = pydoc_task(row.seq_len, max_chars=args.max_chars)
    task = tasks[row.seq_len]
    rule = choose_lm_settings(
        budget_s=budget, corpus_tokens=task.n_tokens["train"], ref_steps_per_s=speed
    )
    est_steps = int(budget * speed / row_cost(row, task.vocab_size))
    drop = rule.dropout if dropout == "rule" else float(dropout)
    torch.manual_seed(seed)
    fields = {**row.model_fields(), "vocab_size": task.vocab_size, "dropout": drop}
    model = DecoderLM(ModelConfig.from_dict(fields))
    cfg = TrainConfig(
        max_time=budget,
        batch_size=row.batch_size,
        lr=row.lr * lr_scale,
        warmup_steps=max(1, min(row.warmup_steps, est_steps // 10)),
        seed=seed,
        device=args.device,
        progress=False,
    )
    t0 = time.time()
    out = workdir / f"{row.name}_{budget:g}s_lr{lr_scale:g}_d{drop:g}_s{seed}"
    result = train(model, task, cfg, out, overwrite=True)
    return {
        "row": row.name,
        "budget": budget,
        "lr_scale": lr_scale,
        "dropout": dropout,
        "dropout_used": drop,
        "seed": seed,
        "steps": result.steps,
        "nats": score(model, task.splits["val"], device=args.device),
        "seconds": time.time() - t0,
        "ref_steps_per_s": speed,
        "threads": torch.get_num_threads(),
        "device": args.device,
        "corpus_tokens": task.n_tokens["train"],
    }


def print_tables(results: list[dict], budgets: list[float], speed: float | None) -> None:
    """The Markdown table, the rule's picks and the suggested ``min_steps``."""
    if not results:
        print("no results yet")
        return
    budgets = sorted({r["budget"] for r in results} | set(budgets))
    settings = sorted(
        {(r["row"], r["lr_scale"], r["dropout"]) for r in results},
        key=lambda s: ([x.name for x in ROWS].index(s[0]), s[1], str(s[2])),
    )
    cells: dict[tuple, list[dict]] = {}
    for r in results:
        cells.setdefault((r["row"], r["lr_scale"], r["dropout"], r["budget"]), []).append(r)
    best = {
        b: min((sum(x["nats"] for x in v) / len(v)) for k, v in cells.items() if k[3] == b)
        for b in budgets
        if any(k[3] == b for k in cells)
    }
    print("\nheld-out nats/char on pydoc (64-character windows; steps in brackets)\n")
    print("| row | lr | dropout | " + " | ".join(f"{b:g} s" for b in budgets) + " |")
    print("|---|---:|---:|" + "---:|" * len(budgets))
    for name, lr_scale, dropout in settings:
        row = next(x for x in ROWS if x.name == name)
        line = f"| {name} ({row.n_layers}x{row.d_model}, T{row.seq_len}, B{row.batch_size}) "
        line += f"| {row.lr * lr_scale:g} | {dropout} |"
        for b in budgets:
            got = cells.get((name, lr_scale, dropout, b))
            if not got:
                line += " |"
                continue
            nats = sum(x["nats"] for x in got) / len(got)
            steps = sum(x["steps"] for x in got) // len(got)
            text = f"{nats:.3f} ({steps})"
            line += f" **{text}** |" if nats == best.get(b) else f" {text} |"
        print(line)
    if speed:
        corpus = results[-1].get("corpus_tokens", 418_544)  # pydoc's training characters
        picks = [
            choose_lm_settings(budget_s=b, corpus_tokens=corpus, ref_steps_per_s=speed)
            for b in budgets
        ]
        print("| the rule picks | | | " + " | ".join(p.row.name for p in picks) + " |")
    print("\nsuggested min_steps (steps a row makes at the first budget where it beats every")
    print("smaller row at the table's lr/dropout):")
    names = [x.name for x in ROWS]
    for i, row in enumerate(ROWS[1:], start=1):
        for b in budgets:
            mine = [v for k, v in cells.items() if k[0] == row.name and k[3] == b]
            smaller = [v for k, v in cells.items() if k[0] in names[:i] and k[3] == b]
            if not mine or not smaller:
                continue
            m = min(sum(x["nats"] for x in v) / len(v) for v in mine)
            s = min(sum(x["nats"] for x in v) / len(v) for v in smaller)
            if m < s:
                steps = min(x["steps"] for v in mine for x in v)
                print(f"  {row.name}: from {b:g} s, about {steps} steps (table: {row.min_steps})")
                break
        else:
            print(f"  {row.name}: never ahead in these budgets (table: {row.min_steps})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rows", nargs="+", default=[r.name for r in ROWS])
    ap.add_argument("--budgets", type=float, nargs="+", default=[30, 75, 150, 300, 600])
    ap.add_argument("--lr-scales", type=float, nargs="+", default=[1.0])
    ap.add_argument("--dropouts", nargs="+", default=["rule"], help="'rule' or numbers")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--results", default="runs/budget_sweep/results.jsonl")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--table-only", action="store_true")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument(
        "--min-steps", type=int, default=MIN_STEPS, help="skip cells expected to make fewer"
    )
    ap.add_argument("--max-chars", type=int, default=None, help="a prefix of pydoc (smoke tests)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    path = Path(args.results)
    path.parent.mkdir(parents=True, exist_ok=True)
    results = load_results(path)
    if args.table_only:
        speeds = [r["ref_steps_per_s"] for r in results]
        print_tables(results, args.budgets, speeds[-1] if speeds else None)
        return
    if args.threads:  # as given; else torch's threads or one, whichever is faster now
        speed = measure_ref_steps_per_s(vocab_size=103, seconds=3.0, device=args.device)
    else:
        speed = fastest_ref_steps_per_s(vocab_size=103, seconds=3.0, device=args.device)
    print(f"reference row: {speed:.1f} steps/s on this machine ({torch.get_num_threads()} threads)")
    done = {_key(r) for r in results}
    tasks: dict[int, object] = {}
    rows = [r for r in ROWS if r.name in args.rows]
    for budget in sorted(args.budgets):
        for row in rows:
            if budget * speed / row_cost(row, 103) < args.min_steps:
                continue  # the row would not even warm up
            for lr_scale in args.lr_scales:
                for dropout in args.dropouts:
                    for seed in args.seeds:
                        key = (row.name, budget, lr_scale, dropout, seed)
                        if key in done:
                            continue
                        rec = run_cell(
                            row, budget, lr_scale, dropout, seed, speed, tasks, path.parent, args
                        )
                        with path.open("a") as f:
                            f.write(json.dumps(rec) + "\n")
                        results.append(rec)
                        print(
                            f"{row.name} {budget:g} s lr x{lr_scale:g} dropout {dropout}: "
                            f"{rec['nats']:.3f} nats/char in {rec['steps']} steps",
                            flush=True,
                        )
    print_tables(results, args.budgets, speed)


if __name__ == "__main__":
    main()
