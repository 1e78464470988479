"""``--strategy fsdp`` and ``--strategy ddp`` through the command line under ``torchrun
--nproc_per_node=2`` (CPU, gloo), for the LM and the translation families.

One torchrun launch runs a driver that calls ``attnlab.cli.main`` several times in the same two
processes (starting Python and torch is most of the cost of a launch): FSDP runs (with
activation checkpointing and gradient accumulation) follow the one-process loss trajectory with
the same global batch, as does DDP; an FSDP run resumes in two processes, a one-process run
resumes sharded over two (1 -> 2), a copy of the FSDP run resumes in one process (2 -> 1) and
the runs generate afterwards; a world size that does not divide the batch is one clear line; and
last, both ranks are SIGKILLed in the middle of writing the second sharded checkpoint: the first
one still loads (``attnlab generate``), ``attnlab convert --consolidate`` gathers it into
``model.safetensors``, and the run resumes onto the same trajectory.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from attnlab import runs
from attnlab.cli import main

pytestmark = pytest.mark.slow

LAST = "model.safetensors"

LM = [
    "--preset", "tiny", "--set", "d_model=32", "--set", "n_layers=2", "--seq-len", "32",
    "--batch-size", "8", "--grad-accum", "2", "--max-chars", "40000", "--no-progress",
    "--schedule", "constant", "--warmup", "0", "--log-every", "1", "--eval-every", "2",
    "--eval-batches", "3",
]  # fmt: skip
TRANSLATE = [
    "--task", "numbers", "--lang", "it", "--high", "999", "--n-examples", "600",
    "--model", "transformer", "--preset", "tiny", "--set", "dropout=0", "--batch-size", "8",
    "--steps", "4", "--eval-every", "2", "--eval-batches", "3", "--log-every", "1",
    "--schedule", "constant", "--warmup", "1", "--no-progress",
]  # fmt: skip

DRIVER = """
import faulthandler, json, os, shutil, signal, sys, time
faulthandler.dump_traceback_later(int(os.environ.get("FSDP_TEST_HANG_S", "600")), exit=True)
import torch
torch.set_num_threads(1)
import torch.distributed as dist
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from attnlab.cli import main

out = sys.argv[1]
LM, TRANSLATE = json.loads(sys.argv[2]), json.loads(sys.argv[3])
rank = int(os.environ["RANK"])

def run(name, argv):
    rc = main(argv)  # (errors are printed by rank 0 only)
    # each rank records its exit codes in its own file: lines two processes print to one pipe
    # can interleave, a file written by one process cannot
    with open(f"{out}/rc{rank}.txt", "a") as f:
        f.write(f"{name} {rc}\\n")

def lm(name, *extra):
    run(name, ["train", "lm", *LM, *extra, "--out", f"{out}/{name}"])

run("fsdp", ["train", "lm", *LM, "--strategy", "fsdp", "--checkpointing", "--steps", "2",
             "--out", f"{out}/fsdp"])
dist.barrier()
if rank == 0:
    shutil.copytree(f"{out}/fsdp", f"{out}/fsdp_one")  # resumed in one process by the test
dist.barrier()
run("fsdp_resume", ["train", "lm", *LM, "--strategy", "fsdp", "--steps", "4", "--resume",
                    "--out", f"{out}/fsdp"])
lm("ddp", "--steps", "4")
run("one_to_two", ["train", "lm", *LM, "--strategy", "fsdp", "--steps", "4", "--resume",
                   "--out", f"{out}/single2"])
lm("bf16", "--strategy", "fsdp", "--amp", "bf16", "--steps", "2")
run("translate", ["train", "translate", *TRANSLATE, "--strategy", "fsdp", "--out", f"{out}/tr"])
lm("bad", "--steps", "2", "--batch-size", "6")

# last: both ranks die (SIGKILL) in the middle of the second sharded checkpoint's write
real_write, saves = FileSystemWriter.write_data, []

def killed_after_writing(self, plan, planner):
    saves.append(1)
    result = real_write(self, plan, planner)
    if len(saves) == 2:
        result.wait()  # this rank's shard file is written; .metadata never will be
        # meet on the file system, not through gloo: a rank that dies while the other is still
        # in a collective (the plan's scatter) makes that one fail and return instead of dying
        open(f"{out}/written{rank}", "w").close()
        deadline = time.monotonic() + 60
        while not all(os.path.exists(f"{out}/written{r}") for r in range(2)):
            assert time.monotonic() < deadline, "the other rank never wrote its shard"
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGKILL)
    return result

FileSystemWriter.write_data = killed_after_writing
lm("killed", "--strategy", "fsdp", "--steps", "4")
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _follows(run: Path, reference: Path, *, rel: float = 1e-3, keys=("loss", "val_loss")):
    """The metrics of ``run`` equal the reference's, step by step, within ``rel``."""
    got, want = _records(run), _records(reference)
    assert [r["step"] for r in got] == [r["step"] for r in want][: len(got)]
    for key in keys:
        a = [r[key] for r in got if key in r]
        b = [r[key] for r in want if key in r][: len(a)]
        assert len(a) > 0, key
        worst = max(abs(x - y) / max(abs(y), 1e-6) for x, y in zip(a, b))
        assert worst < rel, (run.name, key, a, b)


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """The one-process references, then the torchrun launch; yields (directory, its output)."""
    out = tmp_path_factory.mktemp("fsdp")
    cache = out / "cache"
    old_cache = os.environ.get("ATTNLAB_CACHE")
    os.environ["ATTNLAB_CACHE"] = str(cache)
    try:
        assert main(["train", "lm", *LM, "--steps", "4", "--out", str(out / "one")]) == 0
        assert main(["train", "lm", *LM, "--steps", "2", "--out", str(out / "single2")]) == 0
        # (single2 is resumed over two ranks below: keep its step-2 weights)
        (out / "two_steps.safetensors").write_bytes((out / "single2" / LAST).read_bytes())
        assert main(["train", "translate", *TRANSLATE, "--out", str(out / "tr_one")]) == 0
    finally:
        if old_cache is None:
            os.environ.pop("ATTNLAB_CACHE", None)
        else:
            os.environ["ATTNLAB_CACHE"] = old_cache
    script = out / "driver.py"
    script.write_text(DRIVER)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ATTNLAB_CACHE": str(cache)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2",
        "--master_addr=127.0.0.1", f"--master_port={_free_port()}",
        str(script), str(out), json.dumps(LM), json.dumps(TRANSLATE),
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=800)
    text = proc.stdout + proc.stderr
    (out / "torchrun.log").write_text(text)  # the whole output, for a failure's post-mortem

    def exit_codes(rank: int) -> dict[str, str]:
        path = out / f"rc{rank}.txt"
        lines = path.read_text().splitlines() if path.exists() else []
        return dict(line.split() for line in lines)

    codes = exit_codes(0)
    assert codes == exit_codes(1), text[-6000:]  # the two ranks agree
    return out, codes, text


def test_fsdp_and_ddp_follow_the_one_process_trajectory(launched):
    out, codes, text = launched
    for name in ("fsdp", "fsdp_resume", "ddp", "one_to_two", "bf16", "translate"):
        assert codes.get(name) == "0", (name, codes, text[-6000:])
    _follows(out / "fsdp", out / "one")  # steps 1-2 fresh (activation checkpointing), 3-4 resumed
    _follows(out / "ddp", out / "one")
    _follows(out / "single2", out / "one")  # a one-process checkpoint resumed over two ranks
    _follows(out / "tr", out / "tr_one", keys=("loss", "val_loss", "acc"))
    _follows(out / "bf16", out / "one", rel=3e-2)  # bf16 parameters: close, not equal
    tokens = lambda run: [r["tokens"] for r in _records(run) if "tokens" in r]  # noqa: E731
    assert tokens(out / "fsdp") == tokens(out / "one")

    # the sharded run: one DCP checkpoint (a file per rank), consolidated weights at the end
    run = out / "fsdp"
    assert [s for s, _ in runs.sharded_checkpoints(run)] == [4]
    ckpt = run / "checkpoints" / "step-00000004"
    assert sorted(p.name for p in ckpt.iterdir()) == [
        ".metadata", "__0_0.distcp", "__1_0.distcp", "checkpoint.json", "state.pt"
    ]  # fmt: skip
    assert not (run / "state.pt").exists()
    assert runs.newest_weights(run) == run / "model.safetensors"
    mine, one = load_file(run / "model.safetensors"), load_file(out / "one" / "model.safetensors")
    assert sorted(mine) == sorted(one)  # tied embeddings stored once, under the same name
    for k in one:
        torch.testing.assert_close(mine[k], one[k], rtol=1e-4, atol=1e-5)
    for name in ("fsdp", "tr", "single2"):
        assert not [p for p in (out / name).rglob(".*") if p.name != ".metadata"], name


def test_fsdp_run_resumes_in_one_process_and_generates(launched, capsys):
    out, codes, _ = launched
    assert codes.get("fsdp") == "0"
    run = out / "fsdp_one"  # the FSDP run at step 2, copied before the two-process resume
    assert main(["train", "lm", *LM, "--steps", "4", "--resume", "--out", str(run)]) == 0
    _follows(run, out / "one")
    assert runs.sharded_checkpoints(run) == [] and (run / "state.pt").exists()  # now whole
    for name in ("fsdp_one", "fsdp", "single2"):
        capsys.readouterr()
        assert main(["generate", str(out / name), "--prompt", "def ", "-n", "8"]) == 0
        assert capsys.readouterr().out.startswith("def ")


def test_world_size_not_dividing_the_batch_is_one_clear_line(launched):
    _, codes, text = launched
    assert codes.get("bad") == "2", codes
    msg = "batch_size 6 does not split into grad_accum 2 micro-batches over 2 processes"
    assert text.count(msg) == 1, text[-4000:]


def test_killed_mid_save_leaves_the_previous_checkpoint_loadable(launched, capsys):
    out, codes, text = launched
    assert "killed" not in codes, text[-4000:]  # the processes died in the second save
    run = out / "killed"
    assert [s for s, _ in runs.sharded_checkpoints(run)] == [2]
    partial = run / "checkpoints" / ".step-00000004.tmp"
    assert partial.is_dir() and not (partial / ".metadata").exists()
    assert not (run / "model.safetensors").exists()  # never got to the end
    model, tokenizer = runs.load(run)  # the step-2 checkpoint, read from its shards
    one = load_file(out / "two_steps.safetensors")  # the 2-step run in one process
    state = model.state_dict()
    for k in one:
        torch.testing.assert_close(state[k], one[k], rtol=1e-4, atol=1e-5)
    assert main(["generate", str(run), "--prompt", "def ", "-n", "8"]) == 0
    assert main(["convert", "--consolidate", str(run)]) == 0  # its model.safetensors, gathered
    weights = load_file(run / LAST)
    assert sorted(weights) == sorted(one)
    for k in one:
        torch.testing.assert_close(weights[k], one[k], rtol=1e-4, atol=1e-5)
    assert runs.newest_weights(run) == run / LAST
    assert main(["train", "lm", *LM, "--steps", "4", "--resume", "--out", str(run)]) == 0
    assert not partial.exists()
    _follows(run, out / "one")
