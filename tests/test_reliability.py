"""What a run survives, on the toy task: a locked or read-only run directory, a full disk in the
middle of a checkpoint, SIGTERM and Ctrl-C; and the file primitives underneath (atomic groups,
directory locks). The command-line versions (a real LM run, a real full file system, a real
signal from outside) are in test_reliability_cli.py."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError, safe_open

import attnlab.train.trainer as trainer
from attnlab import fileio
from attnlab.errors import RunDirError
from attnlab.fileio import AtomicFiles, DirectoryLock, LockHeld, atomic_save, lock_holder
from attnlab.train import RunWriteError, Terminated, check_run_dir, train
from attnlab.train import checkpoint as ckpt
from test_train import ToyTask, base_cfg, make_model, train_losses

LOCK = ".attnlab.lock"
HOLD_SCRIPT = """
import sys, time
from pathlib import Path
from attnlab.train.checkpoint import lock_run_dir
lock = lock_run_dir(Path(sys.argv[1]))
print("locked", flush=True)
time.sleep(120)
"""


def _weights_step(path: Path) -> int:
    with safe_open(str(path), "pt") as f:
        return int(f.metadata()["step"])


def _state_step(run: Path) -> int:
    return torch.load(run / "state.pt", weights_only=True)["progress"]["step"]


def _hidden(run: Path) -> list[str]:
    return sorted(p.name for p in run.glob(".*"))


def _holder_process(run: Path) -> subprocess.Popen:
    """Another process that takes the run directory's lock and keeps it."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD_SCRIPT, str(run)], stdout=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout.readline().strip() == "locked"
    return proc


# ---------------------------------------------------------------------------------------------
# locks


def test_a_run_directory_in_use_is_refused_and_a_dead_holders_lock_is_taken_over(tmp_path, caplog):
    """Another live process holds the lock: train, resume and overwrite are refused, naming its
    pid, host and start time, and nothing is deleted. Killed with SIGKILL, its lock is stale:
    the next start takes it over and leaves no lock file behind."""
    run = tmp_path / "run"
    cfg = base_cfg(steps=4, eval_every=2)
    train(make_model(), ToyTask(), cfg, run)
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    holder = _holder_process(run)
    try:
        for kw in ({}, {"resume": True}, {"overwrite": True}):
            with pytest.raises(RunDirError) as err:
                train(make_model(), ToyTask(), cfg, run, **kw)
            msg = str(err.value)
            assert f"{str(run)!r} is in use by another attnlab process" in msg
            assert f"pid {holder.pid} on host {socket.gethostname()}, started 20" in msg
            assert "\n" not in msg
        with pytest.raises(RunDirError, match="in use"):  # the early check commands make
            check_run_dir(run, resume=True)
        assert {p.name: p.read_bytes() for p in run.iterdir() if p.name != LOCK} == before
    finally:
        holder.kill()  # SIGKILL: no clean-up, the lock file stays
        holder.wait()
    assert (run / LOCK).exists() and lock_holder(run / LOCK) is None  # stale
    with caplog.at_level("WARNING"):
        res = train(make_model(), ToyTask(), base_cfg(steps=6, eval_every=2), run, resume=True)
    assert res.steps == 6
    assert f"taking over the lock of a process that is gone (pid {holder.pid}" in caplog.text
    assert _hidden(run) == []


def test_a_directory_holding_only_a_stale_lock_counts_as_empty(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    holder = _holder_process(run)
    holder.kill()
    holder.wait()
    assert os.listdir(run) == [LOCK]
    check_run_dir(run)  # neither "already exists" nor "in use"
    res = train(make_model(), ToyTask(), base_cfg(steps=2, eval_every=2), run)
    assert res.steps == 2 and _hidden(run) == []


def test_another_ranks_writability_probe_does_not_make_a_directory_taken(tmp_path):
    """Under torchrun every rank checks the run directory at once; the empty file one rank's
    check creates for a moment must not read as an existing run to another rank."""
    run = tmp_path / "run"
    run.mkdir()
    (run / ".attnlab-probe-abcd1234").touch()
    check_run_dir(run)  # not "already exists"
    (run / "notes.txt").touch()
    with pytest.raises(RunDirError, match="already exists"):
        check_run_dir(run)


def test_another_rank_checking_while_rank_0_takes_the_lock_sees_no_run(tmp_path, monkeypatch):
    """Under torchrun rank 0 takes the lock while rank 1 may still be checking the directory:
    the lock file rank 0 writes and links into place must not read as an existing run (CI hung
    there: rank 1 was refused with "already exists" and rank 0 waited for it forever)."""
    run = tmp_path / "run"
    run.mkdir()
    seen = []

    checking = []

    def rank_1_checks():
        if checking:  # (the check's own writability probe)
            return
        seen.append(sorted(os.listdir(run)))
        checking.append(True)
        monkeypatch.setenv("RANK", "1")
        try:
            check_run_dir(run)  # neither "already exists" nor "in use"
        finally:
            monkeypatch.setenv("RANK", "0")
            checking.clear()

    real_link, real_unlink = os.link, fileio._unlink_quietly

    def link(src, dst, *args, **kwargs):
        rank_1_checks()  # the lock's temporary file only
        return real_link(src, dst, *args, **kwargs)

    def unlink(path):
        rank_1_checks()  # the lock and its temporary file, hard-linked
        return real_unlink(path)

    monkeypatch.setattr(fileio.os, "link", link)
    monkeypatch.setattr(fileio, "_unlink_quietly", unlink)
    lock = ckpt.lock_run_dir(run)
    monkeypatch.undo()
    try:
        assert len(seen) == 2 and len(seen[0]) == 1 and seen[0][0].endswith(".tmp"), seen
        assert seen[1] == sorted([LOCK, seen[0][0]])
        (run / "notes.txt").touch()
        monkeypatch.setenv("RANK", "1")
        with pytest.raises(RunDirError, match="already exists"):
            check_run_dir(run)  # what is not the lock still counts
    finally:
        lock.release()


def test_two_concurrent_starts_one_trains_one_is_refused(tmp_path):
    """Two processes released at the same moment on one directory: exactly one trains, the
    other is refused as 'in use' and writes nothing."""
    script = (
        f"import os, sys, time; sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "import torch; torch.set_num_threads(1)\n"
        "from test_train import ToyTask, base_cfg, make_model\n"
        "from attnlab.errors import RunDirError\n"
        "from attnlab.train import train\n"
        "print('ready', flush=True)\n"
        "while not os.path.exists(sys.argv[2]): time.sleep(0.001)\n"
        "try:\n"
        "    train(make_model(), ToyTask(delay=0.1), base_cfg(steps=20, eval_every=10), sys.argv[1])\n"
        "except RunDirError as err:\n"
        "    print(err); sys.exit(2)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    run, go = tmp_path / "run", tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(run), str(go)],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(2)
    ]
    for p in procs:
        assert p.stdout.readline().strip() == "ready"
    go.touch()
    outs = [p.communicate(timeout=300)[0] for p in procs]
    codes = [p.returncode for p in procs]
    assert sorted(codes) == [0, 2], outs
    assert "is in use by another attnlab process" in outs[codes.index(2)]
    assert _state_step(run) == 20 and _hidden(run) == []


def test_overwrite_keeps_the_lock_and_deletes_the_rest(tmp_path, monkeypatch):
    run = tmp_path / "run"
    train(make_model(), ToyTask(), base_cfg(steps=2, eval_every=2), run)
    (run / "old.txt").write_text("x")
    (run / "sub").mkdir()
    seen = []

    def spy(d):
        seen.append(lock_holder(d / LOCK))
        ckpt.clear_run_dir(d)
        seen.append(sorted(os.listdir(d)))

    monkeypatch.setattr("attnlab.train.trainer.clear_run_dir", spy)
    train(make_model(), ToyTask(), base_cfg(steps=2, eval_every=2), run, overwrite=True)
    assert seen[0]["pid"] == os.getpid()  # the lock was held while deleting
    assert seen[1] == [LOCK]
    assert not (run / "old.txt").exists()


def test_lock_file_mechanics(tmp_path):
    """Created whole (holder JSON) and locked; a second acquire fails with the holder; release
    deletes it; a forked child does not keep the lock alive after its parent dies."""
    path = tmp_path / LOCK
    with DirectoryLock.acquire(path) as lock:
        assert lock.enforced and lock.previous is None
        holder = json.loads(path.read_text())
        assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
        with pytest.raises(LockHeld) as err:
            DirectoryLock.acquire(path, attempts=2)
        assert err.value.holder == holder and lock_holder(path) == holder
    assert not path.exists() and lock_holder(path) is None

    script = (
        "import os, sys, time\n"
        "from attnlab.fileio import DirectoryLock\n"
        "lock = DirectoryLock.acquire(sys.argv[1])\n"
        "if os.fork() == 0:\n"
        "    os.close(1); os.close(2); time.sleep(10); os._exit(0)\n"
        "print('forked', flush=True); os._exit(0)\n"  # the parent dies, the child lives on
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(
        [sys.executable, "-c", script, str(path)], capture_output=True, text=True, env=env
    )
    assert proc.stdout.strip() == "forked", proc.stderr
    assert path.exists() and lock_holder(path) is None  # stale although the child still runs
    taken = DirectoryLock.acquire(path)
    assert taken.previous["pid"] != os.getpid()
    taken.release()


# ---------------------------------------------------------------------------------------------
# write errors


class _FailOn:
    """A writer wrapper that fails the ``n``-th write of files named ``name`` half-way."""

    def __init__(self, monkeypatch, name: str, n: int, code: int = errno.ENOSPC):
        self.name, self.n, self.code, self.calls = name, n, code, 0
        real = fileio._write_temp

        def write_temp(path, writer, suffix):
            if Path(path).name == self.name:
                self.calls += 1
                if self.calls == self.n:
                    return real(path, self._broken, suffix)
            return real(path, writer, suffix)

        monkeypatch.setattr(fileio, "_write_temp", write_temp)

    def _broken(self, tmp: str) -> None:
        with open(tmp, "wb") as f:
            f.write(b"half a file")
        raise OSError(self.code, os.strerror(self.code))


@pytest.mark.parametrize("victim", ["model.safetensors", "state.pt", "metrics.jsonl"])
def test_a_full_disk_at_the_second_checkpoint_keeps_the_first(tmp_path, monkeypatch, victim):
    """ENOSPC while writing any file of the second checkpoint: one RunWriteError line naming the
    file, the cause and the kept step; the first checkpoint stays whole and consistent (weights
    and state from the same step: the group is renamed only when every file is written), no
    temporary file is left, and a resume from it ends where an uninterrupted run ends."""
    run = tmp_path / "run"
    cfg = base_cfg(steps=12, eval_every=4)
    _FailOn(monkeypatch, victim, n=2)
    with pytest.raises(RunWriteError) as err:
        train(make_model(dropout=0.2), ToyTask(), cfg, run)
    assert str(err.value) == (
        f"cannot write checkpoint {run / victim}: No space left on device "
        "(the previous checkpoint, step 4, is kept)"
    )
    assert err.value.errno == errno.ENOSPC
    assert _weights_step(run / "model.safetensors") == _state_step(run) == 4
    assert max(json.loads(line)["step"] for line in (run / "metrics.jsonl").open()) == 4
    assert _hidden(run) == []
    monkeypatch.undo()
    ref_model = make_model(dropout=0.2)
    ref = train(ref_model, ToyTask(), cfg, tmp_path / "ref")
    model = make_model(seed=5, dropout=0.2)
    res = train(model, ToyTask(), cfg, run, resume=True)
    assert train_losses(res) == train_losses(ref)
    for p, q in zip(model.parameters(), ref_model.parameters()):
        assert torch.equal(p, q)


def test_safetensors_and_torch_disk_errors_become_os_errors_naming_the_file(tmp_path):
    """The libraries report a full disk their own way (safetensors: SafetensorError '... (os
    error 28)'; torch.save to a path: RuntimeError 'unexpected pos'); the writers attnlab uses
    turn both into the OSError, naming the target, not the temporary."""

    def st_full(tmp):
        raise SafetensorError(
            "Error while serializing: I/O error: No space left on device (os error 28)"
        )

    with pytest.raises(OSError) as err:
        atomic_save(tmp_path / "model.safetensors", st_full)
    assert (err.value.errno, err.value.filename) == (
        errno.ENOSPC,
        str(tmp_path / "model.safetensors"),
    )
    if os.path.exists("/dev/full"):  # torch.save through the checkpoint writer on a full device
        with pytest.raises(OSError) as err:
            fd = os.open("/dev/full", os.O_WRONLY)
            try:
                torch.save({"w": torch.zeros(100_000)}, ckpt._WholeWrites(fd))
            finally:
                os.close(fd)
        assert err.value.errno == errno.ENOSPC
    assert os.listdir(tmp_path) == []


def test_a_group_of_files_appears_together_or_not_at_all(tmp_path):
    (tmp_path / "a").write_text("old a")
    (tmp_path / "b").write_text("old b")
    with pytest.raises(KeyboardInterrupt):
        with AtomicFiles() as files:
            files.write_text(tmp_path / "a", "new a")
            files.write_text(tmp_path / "b", "new b")
            raise KeyboardInterrupt  # Ctrl-C after both were written, before the renames
    assert [(tmp_path / n).read_text() for n in "ab"] == ["old a", "old b"]
    assert sorted(os.listdir(tmp_path)) == ["a", "b"]
    with AtomicFiles() as files:
        files.write_text(tmp_path / "a", "new a")
        files.write_text(tmp_path / "b", "new b")
    assert [(tmp_path / n).read_text() for n in "ab"] == ["new a", "new b"]


def test_temporaries_of_a_killed_writer_are_removed_when_the_lock_is_taken(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    leftovers = [
        ".model.safetensors.ab12cd_9.safetensors",
        ".state.pt.x1y2z3w4.pt",
        ".metrics.jsonl.abcdefgh.tmp",
    ]
    for name in leftovers + [".keep_me", "notes.model.safetensors.abcdefgh.tmp"]:
        (run / name).write_text("x")
    lock = ckpt.lock_run_dir(run)
    lock.release()
    assert sorted(os.listdir(run)) == [".keep_me", "notes.model.safetensors.abcdefgh.tmp"]


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES, errno.ENOSPC])
def test_a_directory_that_cannot_be_written_is_refused_before_training(tmp_path, monkeypatch, code):
    """Creating a file in the run directory fails (read-only file system, no permission — as
    root, chmod does not stop writes, so the error is injected where the OS would give it): the
    run is refused before any batch is drawn, naming the directory and the cause."""
    real = tempfile.mkstemp

    def mkstemp(*a, dir=None, **kw):
        if str(dir).startswith(str(tmp_path)):
            raise OSError(code, os.strerror(code), os.path.join(dir, ".probe"))
        return real(*a, dir=dir, **kw)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    task = ToyTask(interrupt_at=0)  # a batch drawn would raise KeyboardInterrupt
    for run in (tmp_path / "new", tmp_path):
        with pytest.raises(RunDirError) as err:
            train(make_model(), task, base_cfg(), run)
        assert str(err.value) == (
            f"cannot write to run directory {str(run)!r}: {os.strerror(code)}; choose a "
            "writable --out"
        )
    assert not (tmp_path / "new").exists()


def test_a_metrics_write_error_between_checkpoints_names_the_kept_checkpoint(tmp_path, monkeypatch):
    monkeypatch.setattr("attnlab.train.trainer._METRICS_FLUSH_SECONDS", 0.0)  # flush every log
    # writes of metrics.jsonl: steps 1 and 2, the step-2 checkpoint, step 3 <- fails
    _FailOn(monkeypatch, "metrics.jsonl", n=4, code=errno.EIO)
    run = tmp_path / "run"
    with pytest.raises(
        RunWriteError,
        match=r"cannot write metrics .*metrics.jsonl: Input/output "
        r"error \(the previous checkpoint, step 2, is kept\)",
    ):
        train(make_model(), ToyTask(), base_cfg(steps=12, eval_every=2, log_every=1), run)
    assert _state_step(run) == 2 and _hidden(run) == []


# ---------------------------------------------------------------------------------------------
# signals


@pytest.fixture
def default_signals():
    """Python's own SIGINT / SIGTERM handlers, whatever the test runner set (xdist workers)."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


class _SignalAt(ToyTask):
    """Sends ``signum`` to this process when the batch of micro-step ``at`` is requested."""

    def __init__(self, signum: int, at: int, **kw):
        super().__init__(**kw)
        self.signum, self.at = signum, at

    def get_batch(self, split, step, batch_size, rank=0, world=1):
        if split == "train" and step == self.at:
            os.kill(os.getpid(), self.signum)
            time.sleep(5)  # the handler raises in here
        return super().get_batch(split, step, batch_size, rank, world)


@pytest.mark.parametrize(
    "signum, exc", [(signal.SIGTERM, Terminated), (signal.SIGINT, KeyboardInterrupt)]
)
def test_sigterm_and_ctrl_c_save_the_last_step_and_resume_exactly(
    tmp_path, default_signals, signum, exc
):
    """The signal arrives in the middle of step 8 (second micro-batch): the checkpoint holds the
    7 completed steps, the handlers are restored, and a resume equals an uninterrupted run."""
    cfg = base_cfg(steps=12, eval_every=100, grad_accum=2)
    ref_model = make_model(dropout=0.2)
    ref = train(ref_model, ToyTask(), cfg, tmp_path / "ref")
    run = tmp_path / "run"
    with pytest.raises(exc) as err:
        train(make_model(dropout=0.2), _SignalAt(signum, at=7 * 2 + 1), cfg, run)
    assert (type(err.value) is Terminated) == (signum == signal.SIGTERM)
    assert _state_step(run) == _weights_step(run / "model.safetensors") == 7
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handlers restored
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert _hidden(run) == []  # the lock is released on the way out
    model = make_model(seed=3, dropout=0.2)
    res = train(model, ToyTask(), cfg, run, resume=True)
    assert train_losses(res) == train_losses(ref)
    for p, q in zip(model.parameters(), ref_model.parameters()):
        assert torch.equal(p, q)


def test_a_signal_during_the_parameter_update_waits_for_the_update(
    tmp_path, monkeypatch, default_signals
):
    """SIGTERM arriving inside optimizer.step() is raised once the step is complete: the
    checkpoint holds that step, not a half-updated model."""
    real = trainer.make_optimizer

    def make_optimizer(model, cfg, device):
        opt = real(model, cfg, device)
        step, calls = opt.step, []

        def stepping(*a, **kw):
            calls.append(1)
            if len(calls) == 5:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.5)  # the signal is pending here, not raised
            return step(*a, **kw)

        opt.step = stepping
        return opt

    monkeypatch.setattr(trainer, "make_optimizer", make_optimizer)
    run = tmp_path / "run"
    with pytest.raises(Terminated):
        train(make_model(), ToyTask(), base_cfg(steps=12, eval_every=100), run)
    assert _state_step(run) == 5
