"""Helpers shared by the C++ kernel builds of :mod:`attnlab.fast.matvec` and
:mod:`attnlab.fast.int8_bf16` (torch's extension loader)."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import time

__all__ = ["STALE_LOCK_S", "clear_stale_lock", "cpu_flags", "put_ninja_on_path"]

log = logging.getLogger(__name__)

#: a build takes seconds (a minute on a busy machine); a lock this old was left by a killed build
STALE_LOCK_S = 600.0


@functools.cache
def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags (``/proc/cpuinfo``; empty where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as f:
            return frozenset(next((line for line in f if line.startswith("flags")), "").split())
    except OSError:
        return frozenset()


def put_ninja_on_path() -> None:
    """Put the ``ninja`` package's binary on PATH where none is: torch runs ``ninja`` from PATH,
    and the package (a dependency) lives beside the interpreter of a virtual environment that is
    used without being activated."""
    if shutil.which("ninja") is None:
        try:
            import ninja  # the kernel build's tool: imported only when a kernel is built

            os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
        except ImportError:
            pass


def clear_stale_lock(lock: str) -> None:
    """Remove the build lock a killed process left behind: torch's loader waits for it forever
    (every later test run or generation would hang in ``FileBaton.wait``)."""
    try:
        age = time.time() - os.path.getmtime(lock)
    except OSError:
        return  # no lock: nobody is building
    if age > STALE_LOCK_S:
        log.warning("attnlab: removing a stale kernel build lock (%.0f s old): %s", age, lock)
        with contextlib.suppress(OSError):
            os.remove(lock)
