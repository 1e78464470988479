"""A CPU speedrun: which parts of the modern (modded-nanogpt) recipe pay at small scale (issue 33).

Every row is ``attnlab train lm --max-time S`` run as a user would (a subprocess): the baseline
with AdamW (``BASELINE``: the budget rule's recipe before this table, which made the rule take
Muon; the rule chooses the model and recipe for it), then one technique added
with ``--set`` to the baseline's own recorded settings (``--config`` its config.json: naming a
model field would otherwise turn the budget rule off and change more than the technique), then
the best combination (every technique whose mean score beat the baseline at that budget), then
the rows of ``WITH_THE_RULE``: a change given to the budget rule itself (no ``--config``), so
that it chooses the model and recipe again for it (``muon+rule``: with Muon the rule takes row
s from fewer steps than with AdamW). Data and scoring are those of
``benchmarks/lm_vs_nanogpt.py`` (``pydoc_score.py``: attnlab's character ids, first 90 % of
pydoc for training, last 10 % scored in non-overlapping 64-character windows).

Seeds: every row at ``--seeds``; the baseline, the combination and the rule's rows (the final
rows) also at ``--final-seeds``. ``--keep`` scores a row's run directory again instead of
training it when it holds a finished run of that budget, seed and ``--set`` values, so a table
can be split over several invocations (one per core, into one ``--workdir``) and an interrupted
one continued. ``--no-baseline`` runs the rule's rows alone.

Columns: nats/char of the final weights (mean ± spread over the row's seeds) and the time to
target: the first elapsed time at which the run's own validation estimate (``val_loss`` in
metrics.jsonl, every ``eval_every`` steps, over the whole held-out split: the score's windows)
is at or below ``--target`` (default 1.423, nanoGPT's CPU recipe on this split,
docs/performance.md); "-" if it never is. The estimates are inside the timed budget, as
nanoGPT's periodic estimate is inside its loop.

    python benchmarks/speedrun.py --budgets 75 150 300 --final-seeds 0 1 2 --combine muon relu2
    python benchmarks/speedrun.py --budgets 10 --only baseline muon --max-chars 200000  # smoke
    python benchmarks/speedrun.py --only --combine muon relu2  # baseline and one combination
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import torch

import attnlab
from attnlab.config import ModelConfig
from attnlab.config.overrides import parse_overrides
from attnlab.runspec.budget import ROWS
from attnlab.train import TrainConfig
from attnlab.train.stopping import saved_progress

sys.path.insert(0, str(Path(__file__).parent))
from pydoc_score import pydoc_task, score  # noqa: E402

#: the baseline's ``--set``: the budget rule with AdamW and no token shift (its choice until this
#: table moved it to Muon and the token shift; ``model.token_shift`` leaves the rule on)
BASELINE = ["train.optimizer=adamw", "model.token_shift=false"]

#: technique -> its ``--set`` overrides (each alone on top of the baseline)
TECHNIQUES: dict[str, list[str]] = {
    # with the AdamW part at the budget rule's lr_with_muon (rows xs and s: 0.02); the
    # baseline's config.json fixes its own lr, which the rule would otherwise change with Muon
    "muon": ["train.optimizer=muon", f"train.lr={ROWS[0].lr_with_muon:g}"],
    "relu2": ["model.activation=relu2"],
    "qk_norm": ["model.qk_norm=rmsnorm"],
    # RoPE: no row; the budget rule's rows use it already (model.position=rope since the sweep)
    "zero_init": ["model.zero_init_proj=true"],
    "untied": ["model.tie_embeddings=false"],
    "softcap": ["model.logit_softcap=15"],
    "value_embeds": ["model.value_embeds=1"],
    "unet_skips": ["model.unet_skips=true"],
    # warm-up free, the peak rate, then a linear cool-down over the last 40 % (TrainConfig "wsd")
    "wsd": ["train.schedule=wsd", "train.warmup_steps=0"],
    # e_t + mu * e_{t-1} before the stack, mu learned per channel from 0 (ModelConfig.token_shift)
    "token_shift": ["model.token_shift=true"],
}

#: rows run without the baseline's config.json: the budget rule chooses again for the change
#: (with Muon a larger row pays from fewer steps: BudgetRow.min_steps_with_muon)
WITH_THE_RULE: dict[str, list[str]] = {
    "muon+rule": ["train.optimizer=muon", "model.token_shift=false"],
    # the combination given to the rule: Muon (the rule's row and rates for it) and the schedule
    "muon+wsd+rule": [
        "train.optimizer=muon",
        "train.schedule=wsd",
        "train.warmup_steps=0",
        "model.token_shift=false",
    ],
    # RWKV's token shift given to the rule with Muon (the rule's own choice on row xs now)
    "token_shift+rule": ["model.token_shift=true"],
}

#: nanoGPT's CPU recipe on the same split: its final nats/char (docs/performance.md)
NANOGPT_LOSS = 1.423


def command(budget: float, sets: list[str], seed: int, config: Path | None = None) -> list[str]:
    """The row's command line, as the table shows it (``config``: the baseline's config.json)."""
    # the periodic estimate reads the whole held-out split: its windows are then the score's
    # (LMTask.eval_batches: consecutive non-overlapping windows from the start), so the time to
    # target is on the target's scale; a 10-batch prefix reads ~0.25 nats/char high
    cmd = ["attnlab", "train", "lm", "--max-time", f"{budget:g}", "--eval-batches", "100000"]
    cmd += ["--config", str(config)] if config else []
    for s in sets:
        cmd += ["--set", s]
    return cmd + (["--set", f"train.seed={seed}"] if seed else [])


def finished(out: Path, budget: float, seed: int, sets: list[str]) -> bool:
    """Whether ``out`` holds a run of ``budget`` seconds and ``seed`` that ended on its budget and
    has the row's ``--set`` values (a field its config.json lacks reads as the field's default:
    the run predates it). A run left by an earlier recipe of the row is trained again."""
    progress = saved_progress(out)
    if not progress or not progress.get("finished") or not (out / "config.json").is_file():
        return False
    recorded = json.loads((out / "config.json").read_text())
    train = recorded.get("train", {})
    if train.get("max_time") != budget or train.get("seed") != seed:
        return False
    configs = {
        "model": ModelConfig.from_dict(recorded.get("model", {})),
        "train": TrainConfig.from_dict(train),
    }
    for key, value in parse_overrides(sets).items():
        section, name = key.split(".", 1)
        if getattr(configs[section], name) != value:
            return False
    return True


def run(cmd: list[str], out: Path, threads: int | None, max_chars: int | None) -> None:
    """Run ``cmd`` into ``out`` (with this interpreter; no progress bar)."""
    env = dict(os.environ)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    extra = ["--out", str(out), "--overwrite", "--no-progress", "--device", "cpu"]
    extra += ["--max-chars", str(max_chars)] if max_chars else []
    proc = subprocess.run(
        [sys.executable, "-m", "attnlab.cli", *cmd[1:], *extra],
        capture_output=True,
        text=True,
        env=env,
    )
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")


def time_to_target(run_dir: Path, target: float) -> float | None:
    """First ``elapsed`` with ``val_loss <= target`` in the run's metrics.jsonl (None: never)."""
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if "val_loss" in rec and rec["val_loss"] <= target:
            return rec["elapsed"]
    return None


def measure(name, sets, budget, seeds, args, val_ids, base: Path | None = None) -> dict:
    """Train and score one row over the seeds (``base``: the baseline run whose config.json
    the technique starts from)."""
    nats, ttt = [], []
    config = None if base is None else base / "config.json"
    for seed in seeds:
        out = Path(args.workdir) / f"{name}_{budget:g}s_seed{seed}"
        if not (args.keep and finished(out, budget, seed, sets)):
            run(command(budget, sets, seed, config), out, args.threads, args.max_chars)
        nats.append(score(attnlab.load(out, weights="last").model, val_ids))
        ttt.append(time_to_target(out, args.target))
    shown = " ".join(command(budget, sets, seeds[0], config))
    return {"name": name, "budget": budget, "nats": nats, "ttt": ttt, "cmd": shown}


def _fmt(row: dict) -> str:
    n = row["nats"]
    spread = f" ± {statistics.pstdev(n):.3f}" if len(n) > 1 else ""
    hit = [t for t in row["ttt"] if t is not None]
    ttt = f"{statistics.mean(hit):.0f} s ({len(hit)}/{len(n)})" if hit else "-"
    return (
        f"| {row['name']} | {row['budget']:g} s | {statistics.mean(n):.3f}{spread} | {ttt} | "
        f"`{row['cmd']}` |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--budgets", type=float, nargs="+", default=[75, 150, 300])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0], help="every row's seeds")
    ap.add_argument(
        "--final-seeds",
        type=int,
        nargs="*",
        default=[],
        help="more seeds for the baseline, the combination and the rule's rows",
    )
    ap.add_argument(
        "--keep",
        action="store_true",
        help="score finished runs of a row's budget, seed and --set values in --workdir again, "
        "not retrain them",
    )
    ap.add_argument("--target", type=float, default=NANOGPT_LOSS, help="loss for time-to-target")
    ap.add_argument("--only", nargs="*", default=None, help="baseline and these techniques only")
    ap.add_argument("--no-combination", action="store_true", help="skip the best-combination row")
    ap.add_argument(
        "--no-baseline",
        action="store_true",
        help="skip the baseline (only the rule's rows: no technique needs its config.json)",
    )
    ap.add_argument(
        "--combine",
        nargs="+",
        default=None,
        metavar="TECHNIQUE",
        help="the combination row's techniques, instead of this run's winners (rows split "
        "over several runs, e.g. one per core)",
    )
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--workdir", default="runs/speedrun")
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    ap.add_argument("--max-chars", type=int, default=None, help="a prefix of pydoc (smoke tests)")
    args = ap.parse_args()
    techniques = {k: v for k, v in TECHNIQUES.items() if args.only is None or k in args.only}
    ruled = {k: v for k, v in WITH_THE_RULE.items() if args.only is None or k in args.only}
    known = set(TECHNIQUES) | set(WITH_THE_RULE)
    unknown = (set(args.only or []) - known - {"baseline"}) | (
        set(args.combine or []) - set(TECHNIQUES)
    )
    if unknown:
        raise SystemExit(f"unknown techniques {sorted(unknown)}; choose from {sorted(known)}")
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    val_ids = pydoc_task(max_chars=args.max_chars).splits["val"]
    rows = []
    final = args.seeds + [s for s in args.final_seeds if s not in args.seeds]
    if args.no_baseline and techniques:
        raise SystemExit(f"--no-baseline: {sorted(techniques)} start from the baseline's config")
    for budget in args.budgets:
        if args.no_baseline:
            rows += [measure(k, v, budget, final, args, val_ids) for k, v in ruled.items()]
            continue
        base = measure("baseline", BASELINE, budget, final, args, val_ids)
        rows.append(base)
        # the baseline's own settings (a named model turns the budget rule off) plus one change
        frozen = Path(args.workdir) / f"baseline_{budget:g}s_seed{args.seeds[0]}"
        alone = [
            measure(k, v, budget, args.seeds, args, val_ids, frozen) for k, v in techniques.items()
        ]
        rows += alone
        best = statistics.mean(base["nats"])
        winners = [r["name"] for r in alone if statistics.mean(r["nats"]) < best]
        winners = args.combine or winners
        if len(winners) > 1 and not args.no_combination:
            sets = [s for w in winners for s in TECHNIQUES[w]]
            combo = measure("+".join(winners), sets, budget, final, args, val_ids, frozen)
            rows.append(combo)
        rows += [measure(k, v, budget, final, args, val_ids) for k, v in ruled.items()]
    print(
        f"\npydoc, last 10 %, 64-character windows; seeds {args.seeds} (final rows {final}); "
        f"target {args.target} "
        f"({torch.get_num_threads()} threads)\n"
    )
    print("| recipe | budget | nats/char | time to target (runs reaching it) | command |")
    print("|---|---:|---:|---:|---|")
    for row in rows:
        print(_fmt(row))
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
