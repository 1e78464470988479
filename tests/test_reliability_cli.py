"""What `attnlab train lm` survives, end to end: a full disk (injected, and a real full tmpfs),
a read-only file system, SIGTERM / Ctrl-C from outside, and a second start on a directory in use.
Each failure is one 'attnlab: error:' line with a non-zero exit status, and what was saved before
still loads and resumes exactly.

The real-file-system tests mount a tmpfs in a user namespace (`unshare -rm`, no root needed where
unprivileged user namespaces are allowed) and are skipped where that is impossible; the injected
variants run everywhere.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from attnlab import fileio, runs
from attnlab.cli import main

pytestmark = pytest.mark.slow

TINY = "--preset tiny --set d_model=32 --set n_layers=1 --seq-len 32 --batch-size 8".split()
TINY += "--eval-batches 2 --warmup 2 --max-chars 20000 --no-progress --device cpu".split()

# `python -m attnlab.cli` with one hook: at the start of step PAUSE_AT it touches MARKER and
# sleeps, so that the test's signal (or a second start) arrives while it trains, at a known step
DRIVER = """
import os, sys, time
from attnlab.train import trainer
from attnlab.cli import main

pause_at, marker = int(os.environ["PAUSE_AT"]), os.environ["MARKER"]
step = trainer._Loop._step

def pausing(self, s):
    if s == pause_at:
        open(marker, "w").close()
        time.sleep(300)
    return step(self, s)

trainer._Loop._step = pausing
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))


def _env() -> dict:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(sys.path),
        "OMP_NUM_THREADS": "1",  # every process computes alike (and shares two cores politely)
        "MKL_NUM_THREADS": "1",
    }


def _paused(run: Path, pause_at: int, *args: str) -> tuple[subprocess.Popen, Path]:
    """Start a training that pauses at step ``pause_at``; return once it has got there."""
    marker = run.parent / f"{run.name}.paused"
    env = {**_env(), "PAUSE_AT": str(pause_at), "MARKER": str(marker)}
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER, "train", "lm", *TINY, *args, "--out", str(run)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    deadline = time.monotonic() + 600
    while not marker.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return proc, marker


def _error_lines(stderr: str) -> list[str]:
    assert "Traceback" not in stderr, stderr
    return [line for line in stderr.splitlines() if line.startswith("attnlab: error:")]


def _step_of(path: Path) -> int:
    with safe_open(str(path), "pt") as f:
        return int(f.metadata()["step"])


def _same_weights(a: Path, b: Path) -> None:
    wa, wb = load_file(a), load_file(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k


# ---------------------------------------------------------------------------------------------
# full disk, read-only


def test_a_full_disk_at_the_second_checkpoint_is_one_line_and_the_first_resumes(
    tmp_path, capsys, monkeypatch
):
    """ENOSPC injected into the atomic writer half-way through the second checkpoint's weights:
    exit status 2, one line naming the file, the cause and the kept step; the step-3 checkpoint
    loads (attnlab.runs.load) and --resume then ends where an uninterrupted run ends."""
    run, ref = tmp_path / "run", tmp_path / "ref"
    args = ["train", "lm", *TINY, "--steps", "6", "--eval-every", "3"]
    real, calls = fileio._write_temp, []

    def write_temp(path, writer, suffix):
        if Path(path).name == "model.safetensors":
            calls.append(path)
            if len(calls) == 2:
                return real(path, _half_then_enospc, suffix)
        return real(path, writer, suffix)

    monkeypatch.setattr(fileio, "_write_temp", write_temp)
    assert main([*args, "--out", str(run)]) == 2
    err = capsys.readouterr().err
    assert _error_lines(err) == [
        f"attnlab: error: cannot write checkpoint {run / 'model.safetensors'}: No space left on "
        "device (the previous checkpoint, step 3, is kept)"
    ]
    monkeypatch.undo()
    assert sorted(p.name for p in run.glob(".*")) == []  # no temporary, no lock
    model, tokenizer = runs.load(run)
    assert tokenizer is not None and _step_of(run / "model.safetensors") == 3
    assert main([*args, "--resume", "--out", str(run)]) == 0
    assert main([*args, "--out", str(ref)]) == 0
    _same_weights(run / "model.safetensors", ref / "model.safetensors")


def _half_then_enospc(tmp: str) -> None:
    with open(tmp, "wb") as f:
        f.write(b"\0" * 1000)
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _namespace_ok() -> bool:
    if shutil.which("unshare") is None or not sys.platform.startswith("linux"):
        return False
    probe = "d=$(mktemp -d) && mount -t tmpfs -o size=1m tmpfs $d && umount $d && rmdir $d"
    r = subprocess.run(["unshare", "-rm", "sh", "-c", probe], capture_output=True)
    return r.returncode == 0


needs_tmpfs = pytest.mark.skipif(
    not _namespace_ok(), reason="cannot mount a tmpfs (no unprivileged user namespaces here)"
)

FULL_DISK = """
set -e
mount -t tmpfs -o size=8m tmpfs "$MNT"
run="$MNT/run"
set +e
# fill the file system at step 4, between the checkpoints of steps 3 and 6
FILL_AT=4 python -c "$FILLER" train lm $ARGS --steps 9 --eval-every 3 --out "$run" 2>"$OUT/err"
echo "rc=$?"
set -e
grep -v '^WARNING' "$OUT/err" || true
ls -a "$run" | tr '\\n' ' '; echo
rm "$MNT/filler"
python -c "
import attnlab.runs, sys
model, tok = attnlab.runs.load(sys.argv[1])
from safetensors import safe_open
print('loaded step', safe_open(sys.argv[1] + '/model.safetensors', 'pt').metadata()['step'])
" "$run"
set +e
python -m attnlab.cli train lm $ARGS --steps 9 --eval-every 3 --resume --out "$run" 2>"$OUT/resume.err"
echo "resume rc=$?"
set -e
cp "$run/model.safetensors" "$OUT/resumed.safetensors"
"""

FILLER = """
import os, sys
from attnlab.train import trainer
from attnlab.cli import main
step, fill_at = trainer._Loop._step, int(os.environ["FILL_AT"])

def filling(self, s):
    if s == fill_at:
        with open(os.path.join(os.environ["MNT"], "filler"), "wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"\\0" * 65536)
            except OSError:
                pass
            try:
                while True:
                    f.write(b"\\0" * 512)
            except OSError:
                pass
    return step(self, s)

trainer._Loop._step = filling
sys.exit(main(sys.argv[1:]))
"""


@needs_tmpfs
def test_a_real_full_file_system(tmp_path, one_thread):
    """A tmpfs that fills up between two checkpoints: the real errors of safetensors / torch
    become the same one line, and the earlier checkpoint loads and resumes exactly."""
    mnt, out = tmp_path / "mnt", tmp_path / "out"
    mnt.mkdir()
    out.mkdir()
    env = {
        **_env(),
        "MNT": str(mnt),
        "OUT": str(out),
        "ARGS": " ".join(TINY),
        "FILLER": FILLER,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    r = subprocess.run(
        ["unshare", "-rm", "sh", "-c", FULL_DISK], capture_output=True, text=True, env=env
    )
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "rc=2", r.stdout
    errors = [x for x in lines if x.startswith("attnlab: error:")]
    assert len(errors) == 1 and "Traceback" not in r.stdout, r.stdout
    assert re.fullmatch(
        rf"attnlab: error: cannot write checkpoint {re.escape(str(mnt))}/run/\S+: No space left "
        r"on device \(the previous checkpoint, step 3, is kept\)",
        errors[0],
    ), errors[0]
    listing = next(x for x in lines if x.startswith(". .."))
    assert ".attnlab.lock" not in listing and ".tmp" not in listing, listing  # nothing left over
    assert "loaded step 3" in lines, r.stdout
    assert "resume rc=0" in lines, (out / "resume.err").read_text()
    ref = tmp_path / "ref"  # (the reference needs no process of its own: trained in this one)
    assert main(["train", "lm", *TINY, "--steps", "9", "--eval-every", "3", "--out", str(ref)]) == 0
    _same_weights(out / "resumed.safetensors", ref / "model.safetensors")


READ_ONLY = """
set -e
mount -t tmpfs -o size=1m tmpfs "$MNT"
mkdir "$MNT/old"
echo '{"kind": "decoder_lm", "model": {}}' > "$MNT/old/config.json"
mount -o remount,ro "$MNT"
set +e
python -m attnlab.cli train lm $ARGS --steps 2 --out "$MNT/new/run"
echo "rc=$?"
python -m attnlab.cli train lm $ARGS --steps 2 --overwrite --out "$MNT/old"
echo "rc=$?"
"""


@needs_tmpfs
def test_a_read_only_file_system_is_refused_before_training(tmp_path):
    """Root cannot write there either: a new run and an --overwrite are refused up front with
    one line naming the directory and 'Read-only file system' (no corpus is read)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    env = {**_env(), "MNT": str(mnt), "ARGS": " ".join(TINY)}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    r = subprocess.run(
        ["unshare", "-rm", "sh", "-c", READ_ONLY], capture_output=True, text=True, env=env
    )
    assert r.stdout.splitlines() == ["rc=2", "rc=2"], r.stdout + r.stderr
    assert _error_lines(r.stderr) == [
        f"attnlab: error: cannot write to run directory {str(mnt / d)!r}: Read-only file "
        "system; choose a writable --out"
        for d in ("new/run", "old")
    ]
    assert "training tokens" not in r.stderr  # refused before the data was prepared


# root writes into a chmod 500 directory anyway: CAP_DAC_OVERRIDE lets it ignore the mode bits.
# setpriv drops that capability (and CAP_DAC_READ_SEARCH) from the command it runs, so that the
# kernel applies the owner's bits to root too
NO_OVERRIDE = ["setpriv", "--inh-caps=-dac_override,-dac_read_search"]
NO_OVERRIDE += ["--bounding-set=-dac_override,-dac_read_search"]


def _mode_bits_bind(tmp_path: Path) -> list[str] | None:
    """A command prefix under which a chmod 500 directory refuses writes ([] for non-root)."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        return None
    probe = tmp_path / "probe"
    probe.mkdir(mode=0o500)
    r = subprocess.run([*NO_OVERRIDE, "touch", str(probe / "x")], capture_output=True)
    probe.chmod(0o700)
    return NO_OVERRIDE if r.returncode != 0 and not (probe / "x").exists() else None


def test_a_directory_without_write_permission_is_refused(tmp_path, monkeypatch, capsys):
    """``chmod 500`` on the parent of --out: the kernel's EACCES, one line, nothing created.

    As root the CLI runs without CAP_DAC_OVERRIDE (setpriv), so the mode bits bind; where that
    is impossible the EACCES is injected where creating a file in the directory would give it.
    """
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    run = locked / "run"
    args = ["train", "lm", *TINY, "--steps", "2", "--out", str(run)]
    prefix = _mode_bits_bind(tmp_path)
    try:
        if prefix is not None:
            cache = str(tmp_path / "cache")
            r = subprocess.run(
                [*prefix, sys.executable, "-m", "attnlab.cli", *args],
                capture_output=True,
                text=True,
                env={**_env(), "ATTNLAB_CACHE": cache},
                timeout=600,
            )
            status, err = r.returncode, r.stderr
        else:  # root without setpriv: the error the kernel would give, injected
            real = tempfile.mkstemp

            def mkstemp(*a, dir=None, **kw):
                if Path(str(dir)) == locked:
                    raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), dir)
                return real(*a, dir=dir, **kw)

            monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
            status, err = main([*args]), capsys.readouterr().err
    finally:
        locked.chmod(0o700)
    assert status == 2
    assert _error_lines(err) == [
        f"attnlab: error: cannot write to run directory {str(run)!r}: Permission "
        "denied; choose a writable --out"
    ]
    assert list(locked.iterdir()) == []  # no run directory, no probe left behind


# ---------------------------------------------------------------------------------------------
# signals and concurrent starts


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    """The reference run, trained in this process (only the interrupted runs need their own),
    on one thread like the processes it is compared with (OMP_NUM_THREADS=1)."""
    run = tmp_path_factory.mktemp("ref") / "run"
    args = ["train", "lm", *TINY, "--steps", "24", "--eval-every", "1000", "--out", str(run)]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("ATTNLAB_CACHE", str(run.parent / "cache"))
            assert main(args) == 0
    finally:
        torch.set_num_threads(threads)
    return run


@pytest.mark.parametrize(
    "signum, status, word",
    [(signal.SIGTERM, 143, "terminated (SIGTERM)"), (signal.SIGINT, 130, "interrupted")],
)
def test_a_signal_from_outside_saves_and_resume_is_exact(
    tmp_path, uninterrupted, signum, status, word, one_thread
):
    """SIGTERM (a scheduler) or SIGINT (Ctrl-C) while step 10 runs, with no checkpoint due before
    step 24: the process saves the 9 completed steps and exits 143 / 130; --resume then ends with
    exactly the weights of the uninterrupted run."""
    run = tmp_path / "run"
    proc, _ = _paused(run, 9, "--steps", "24", "--eval-every", "1000")
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == status, err
    assert f"{word}: saving a checkpoint at step 9" in err
    last = err.rstrip().splitlines()[-1]  # where it stopped and the exact command (issue 18)
    assert last.startswith(f"attnlab: {word.split()[0]}") and "at step 9 of 24" in last
    assert last.endswith(f"resume with: attnlab train lm --resume --out {run}")
    assert "Traceback" not in err
    assert _step_of(run / "model.safetensors") == 9
    assert not (run / ".attnlab.lock").exists()
    assert main(["train", "lm", "--resume", "--out", str(run)]) == 0  # as the message says
    _same_weights(run / "model.safetensors", uninterrupted / "model.safetensors")


def test_a_second_start_on_a_directory_in_use_is_refused_and_a_killed_ones_is_taken_over(
    tmp_path, capsys, caplog
):
    """While another process trains in --out, train / --resume / --overwrite are refused with
    one line naming it (pid, host, start time) and touch nothing; once it is killed (SIGKILL,
    its lock file left behind) the directory is an ordinary finished-or-not run again, and
    --overwrite takes the stale lock over."""
    run = tmp_path / "run"
    proc, _ = _paused(run, 2, "--steps", "20", "--eval-every", "1000")
    try:
        before = sorted(p.name for p in run.iterdir())
        for extra in ([], ["--resume"], ["--overwrite"]):
            assert main(["train", "lm", *TINY, "--steps", "4", *extra, "--out", str(run)]) == 2
            (line,) = _error_lines(capsys.readouterr().err)
            assert line.startswith(
                f"attnlab: error: run directory {str(run)!r} is in use by another attnlab process "
                f"(pid {proc.pid} on host {socket.gethostname()}, started "
            ), line
            assert "wait for it to end, or choose another --out" in line
        assert sorted(p.name for p in run.iterdir()) == before
    finally:
        proc.kill()  # SIGKILL: its lock file stays behind, unlocked
        proc.communicate()
    assert (run / ".attnlab.lock").exists()
    assert main(["train", "lm", *TINY, "--steps", "4", "--out", str(run)]) == 2
    assert "already exists" in capsys.readouterr().err  # a dead run is not "in use"
    with caplog.at_level("WARNING"):
        assert main(["train", "lm", *TINY, "--steps", "2", "--overwrite", "--out", str(run)]) == 0
    assert f"taking over the lock of a process that is gone (pid {proc.pid}" in caplog.text
    assert not (run / ".attnlab.lock").exists()
    assert json.loads((run / "config.json").read_text())["train"]["steps"] == 2
