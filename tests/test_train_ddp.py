"""Data parallelism: 2 CPU processes under torchrun (gloo) follow the same loss trajectory and
end with the same weights as 1 process with the same global batch; only rank 0 writes and warns."""

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

from attnlab.train import train
from test_train import ToyTask, base_cfg, make_model

TESTS_DIR = Path(__file__).resolve().parent

SCRIPT = """
import sys
sys.path.insert(0, {tests_dir!r})
import torch
torch.set_num_threads(1)
from test_train import ToyTask, base_cfg, make_model
from attnlab.train import train
from attnlab.train import distributed

class Spy(ToyTask):
    sizes = set()

    def get_batch(self, split, step, batch_size, rank=0, world=1):
        batch = super().get_batch(split, step, batch_size, rank, world)
        self.sizes.add((split, rank, world, len(batch["y"])))
        return batch


task = Spy()
res = train(make_model(), task, base_cfg(**{cfg!r}), sys.argv[1])
rank = distributed.get_rank()
assert distributed.get_world_size() == 2
# each rank computed its own half of every micro-batch (8 examples / 2 micro-batches / 2 ranks)
assert task.sizes == {{("train", rank, 2, 2)}}, task.sizes
assert (task.saved_to is not None) == (rank == 0)  # only rank 0 writes artifacts
"""

# a warm-up as long as the run makes the trainer warn: the warning must come once (rank 0 only)
CFG = dict(steps=6, batch_size=8, grad_accum=2, eval_every=3, eval_batches=3, warmup_steps=6)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_two_processes_match_one_process(tmp_path):
    script = tmp_path / "ddp_train.py"
    script.write_text(SCRIPT.format(tests_dir=str(TESTS_DIR), cfg=CFG))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        "--nproc_per_node=2",
        "--master_addr=127.0.0.1",
        f"--master_port={_free_port()}",
        str(script),
        str(tmp_path / "ddp"),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stderr.count("is not shorter than the run") == 1, proc.stderr[-4000:]

    single = train(make_model(), ToyTask(), base_cfg(**CFG), tmp_path / "single")
    ddp, one = _records(tmp_path / "ddp"), _records(tmp_path / "single")
    assert one == single.history
    assert [r["step"] for r in ddp] == [r["step"] for r in one]
    for key in ("loss", "acc", "val_loss", "val_acc", "lr", "grad_norm"):
        a = [r[key] for r in ddp if key in r]
        b = [r[key] for r in one if key in r]
        assert len(a) == len(b) > 0, key
        assert max(abs(x - y) for x, y in zip(a, b)) < 1e-5, (key, a, b)
    tokens = lambda recs: [r["tokens"] for r in recs if "tokens" in r]  # noqa: E731
    assert tokens(ddp) == tokens(one)
    w_ddp, w_one = (
        load_file(tmp_path / "ddp" / "model.safetensors"),
        load_file(tmp_path / "single" / "model.safetensors"),
    )
    for k in w_one:
        torch.testing.assert_close(w_ddp[k], w_one[k], rtol=0, atol=1e-5)
    # only rank 0 wrote: one run directory with the usual files and no temporaries
    assert sorted(p.name for p in (tmp_path / "ddp").iterdir()) == sorted(
        p.name for p in (tmp_path / "single").iterdir()
    )
