"""Corpus preparation: set-up time, MB/s and peak memory, streaming vs the first release's path,
and a short training run on the largest corpus.

    python benchmarks/prepare.py                        # 50 MB, 200 MB and 1 GB; old path at 50/200
    python benchmarks/prepare.py --sizes 20 --old-sizes 20 --kinds char bpe
    python benchmarks/prepare.py --sizes 200 --old-sizes --kinds bpe    # a busy machine: 200 MB

The corpora are CPython's standard-library source (the ``.py`` files, each after a ``# path``
line) repeated to the size asked, written as one file into a temporary directory that is deleted
afterwards. Each measurement runs in a fresh process:

- ``new``: :func:`attnlab.data.prepare.prepare_corpus` (streaming, shards on disk, BPE trained on
  a 5M-character sample, encoding in one worker process per core);
- ``old``: the first release's in-memory path (``load_corpus`` -> ``corpus_tokenizer`` ->
  ``tokenize_cached``: the whole text, BPE trained on all of it, ids as a Python list). It needs
  ~15x (char) to ~55x (BPE) the corpus in memory, so it is only run at the sizes of
  ``--old-sizes``.

Set-up time is measured inside the process, from the start of the work to the ids on disk. Peak
memory is the high-water mark of the whole process tree (the process and its encoding workers):
the sum of their resident set sizes, sampled every 50 ms from ``/proc`` (Linux), next to the
largest single process's peak (``getrusage``). ``cpu s`` is the CPU time of the process tree
(user + system; less sensitive than wall time to other work on the machine). BPE uses a vocabulary
of 8192.

- ``train``: at the sizes of ``--train-sizes`` (default: the largest of ``--sizes``), the whole
  command a user runs, ``attnlab train lm --data FILE --tokenizer bpe --vocab-size 8192 --preset
  tiny --steps 10`` (preparation on the fly into a fresh cache, then ten steps), in a fresh
  process: its wall time from launch to exit, and the same peak memory of its process tree.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path


def make_corpus(path: Path, mb: float) -> int:
    """Write the standard library's source, repeated, until ``mb`` MB; returns the bytes."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
    files = [
        p
        for p in sorted(root.rglob("*.py"), key=lambda p: p.relative_to(root).as_posix())
        if not skip & set(p.relative_to(root).parts)
    ]
    target, size = int(mb * 1e6), 0
    with open(path, "wb") as out:
        while size < target:
            for p in files:
                try:
                    data = p.read_bytes()
                    data.decode("utf-8")
                except (OSError, UnicodeDecodeError):
                    continue
                piece = f"# {p.relative_to(root).as_posix()}\n".encode() + data + b"\n"
                piece = piece[: target - size]
                out.write(piece)
                size += len(piece)
                if size >= target:
                    break
    with open(path, "rb+") as f:  # the cut may fall inside a character: end on a whole one
        f.seek(max(0, size - 4))
        tail = f.read()
        keep = len(tail.decode("utf-8", errors="ignore").encode())
        f.truncate(size - len(tail) + keep)
    return path.stat().st_size


def _tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and all its descendants (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo += children.get(p, [])
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def measure(path: str, how: str, kind: str, vocab: int, work: Path) -> dict:
    """Run one preparation in a fresh process; its time, tokens and peak memory."""
    cmd = [sys.executable, __file__, "--child", how, kind, str(vocab), path, str(work)]
    env = {**os.environ, "ATTNLAB_CACHE": str(work / "cache")}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, env=env, text=True)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, _tree_rss(proc.pid))
        time.sleep(0.05)
    out = proc.stdout.read() if proc.stdout else ""
    if proc.returncode != 0:
        return {"error": f"exit {proc.returncode}"}
    result = json.loads(out.strip().splitlines()[-1])
    return {**result, "peak_tree_mb": peak / 1e6}


TRAIN = ["train", "lm", "--tokenizer", "bpe", "--preset", "tiny", "--steps", "10", "--no-progress"]


def measure_train(path: str, vocab: int, work: Path) -> dict:
    """``attnlab train lm --data path ...`` in a fresh process: wall time, exit and peak memory."""
    cli = "import sys; from attnlab.cli import main; sys.exit(main(sys.argv[1:]))"
    args = [*TRAIN, "--vocab-size", str(vocab), "--data", path, "--out", str(work / "run")]
    env = {**os.environ, "ATTNLAB_CACHE": str(work / "cache")}
    work.mkdir(parents=True, exist_ok=True)
    log = work / "train.log"
    with open(log, "wb") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-c", cli, *args], env=env, stdout=out, stderr=out)
        peak = 0
        while proc.poll() is None:
            peak = max(peak, _tree_rss(proc.pid))
            time.sleep(0.05)
        seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-1:]
        return {"error": f"exit {proc.returncode}: {' '.join(tail)}"}
    ids = work / "cache"
    shard_bytes = sum(f.stat().st_size for f in ids.rglob("*") if f.is_file())
    return {"seconds": seconds, "peak_tree_mb": peak / 1e6, "cache_mb": shard_bytes / 1e6}


def child(how: str, kind: str, vocab: int, path: str, work: str) -> None:
    # each path is imported inside its branch: the child's peak memory is the one path's alone
    t0 = time.perf_counter()
    if how == "new":
        from attnlab.data.prepare import prepare_corpus

        summary = prepare_corpus(path, Path(work) / "prepared", kind=kind, vocab_size=vocab)
        n = summary.n_tokens
    else:
        from attnlab.data.corpus import corpus_tokenizer, load_corpus, tokenize_cached

        corpus = load_corpus(path)
        n = len(tokenize_cached(corpus, corpus_tokenizer(corpus, kind, vocab)))
    seconds = time.perf_counter() - t0
    own, kids = (
        resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )
    cpu = own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
    peak = max(own.ru_maxrss, kids.ru_maxrss) * 1024
    print(json.dumps({"seconds": seconds, "cpu_s": cpu, "tokens": n, "peak_single_mb": peak / 1e6}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=float, nargs="+", default=[50, 200, 1000], help="MB")
    ap.add_argument("--old-sizes", type=float, nargs="*", default=[50, 200], help="MB")
    ap.add_argument(
        "--train-sizes", type=float, nargs="*", default=None,
        help="MB: also run 'attnlab train lm --data FILE' at these (default: the largest size)",
    )  # fmt: skip
    ap.add_argument("--kinds", nargs="+", default=["char", "bpe"], choices=["char", "bpe"])
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--tmp", default=None, help="where to write the corpora (default: $TMPDIR)")
    ap.add_argument("--json", default=None, help="also write the rows to this file")
    ap.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        how, kind, vocab, path, work = args.child
        return child(how, kind, int(vocab), path, work)
    train_sizes = [max(args.sizes)] if args.train_sizes is None else args.train_sizes
    rows = []
    print(f"{'corpus':>9} {'tok':>5} {'path':>4} {'set-up s':>9} {'cpu s':>7} {'MB/s':>7} "
          f"{'peak MB':>8} {'(1 proc)':>9} {'tokens':>13}", flush=True)  # fmt: skip
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        for mb in args.sizes:
            corpus = Path(tmp) / f"stdlib-{mb:g}MB.txt"
            size = make_corpus(corpus, mb)
            for kind in args.kinds:
                for how in ("new", "old") if mb in args.old_sizes else ("new",):
                    work = Path(tmp) / f"work-{how}-{kind}"
                    r = measure(str(corpus), how, kind, args.vocab_size, work)
                    shutil.rmtree(work, ignore_errors=True)
                    row = {"mb": size / 1e6, "kind": kind, "path": how, **r}
                    rows.append(row)
                    if "error" in r:
                        print(f"{size / 1e6:>7.0f}MB {kind:>5} {how:>4}  {r['error']}", flush=True)
                        continue
                    print(
                        f"{size / 1e6:>7.0f}MB {kind:>5} {how:>4} {r['seconds']:>9.1f} "
                        f"{r['cpu_s']:>7.1f} "
                        f"{size / 1e6 / r['seconds']:>7.1f} {r['peak_tree_mb']:>8.0f} "
                        f"{r['peak_single_mb']:>9.0f} {r['tokens']:>13,}",
                        flush=True,
                    )
            if mb in train_sizes:
                work = Path(tmp) / "work-train"
                r = measure_train(str(corpus), args.vocab_size, work)
                shutil.rmtree(work, ignore_errors=True)
                rows.append({"mb": size / 1e6, "kind": "bpe", "path": "train", **r})
                if "error" in r:
                    print(f"{size / 1e6:>7.0f}MB   bpe train  {r['error']}", flush=True)
                else:
                    print(
                        f"{size / 1e6:>7.0f}MB   bpe train {r['seconds']:>9.1f} {'':>7} "
                        f"{size / 1e6 / r['seconds']:>7.1f} {r['peak_tree_mb']:>8.0f}"
                        f"   (attnlab train lm --data FILE ... --steps 10; cache "
                        f"{r['cache_mb']:.0f} MB)",
                        flush=True,
                    )
            corpus.unlink()
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
