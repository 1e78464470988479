"""Files written so that a crash never leaves half of one, and directories locked while in use.

Every file attnlab writes into a run directory, a cache or an output folder goes through
:func:`atomic_write_bytes`, :func:`atomic_write_text` or :func:`atomic_save`: the data goes to a
temporary file next to the target (``.NAME.XXXXXXXX.tmp``), is flushed to disk, and is renamed
onto the target, so a reader sees the old file or the new one, never half of one.
:class:`AtomicFiles` writes several files that belong together (a checkpoint's weights and
state) so that none is renamed before all of them are written. A failed write removes its
temporary file and raises an :class:`OSError` naming the target (not the temporary), also when the
writer is a library that reports disk errors its own way (safetensors).

:class:`DirectoryLock` is an advisory ``flock`` on a file in a directory, held as long as the
process keeps it: the operating system drops it when the holder exits or is killed, so a lock
file left behind by a dead process is stale and is taken over.
"""

from __future__ import annotations

import errno
import json
import os
import re
import socket
import sys
import tempfile
import time
import weakref
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no advisory locks, runs are not locked
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "atomic_write_bytes",
    "atomic_write_text",
    "atomic_save",
    "AtomicFiles",
    "check_writable",
    "PROBE_PREFIX",
    "remove_temporaries",
    "is_temporary",
    "DirectoryLock",
    "LockHeld",
    "lock_holder",
    "describe_holder",
]

# mkstemp creates files readable by the owner only; give them the usual 0o666 & ~umask instead
_UMASK = os.umask(0)
os.umask(_UMASK)
_FILE_MODE = 0o666 & ~_UMASK
# how Rust libraries (safetensors) report the errno of a failed write in their message
_OS_ERROR_CODE = re.compile(r"\(os error (\d+)\)")


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _target_error(err: BaseException, tmp: str | None, path: Path) -> OSError | None:
    """The OSError behind a failed write of ``path`` (through ``tmp``), naming ``path``.

    ``None`` when ``err`` is not a disk error, or already names another file.
    """
    if isinstance(err, OSError):
        if err.errno is None or err.filename not in (None, tmp, str(path)):
            return None
        code, text = err.errno, err.strerror
    else:
        found = _OS_ERROR_CODE.search(str(err)) if isinstance(err, Exception) else None
        if found is None:
            return None
        code = int(found.group(1))
        text = os.strerror(code)
    return OSError(code, text, str(path))  # OSError(ENOSPC, ...) is an OSError, EACCES a
    # PermissionError, EROFS an OSError: the constructor picks the subclass from the code


def _write_temp(path: Path, writer: Callable[[str], None], suffix: str) -> str:
    """Write a temporary file next to ``path`` with ``writer(tmp)``; flush it to disk."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
        os.close(fd)
    except OSError as err:
        raise OSError(err.errno, err.strerror, str(path)) from err
    try:
        writer(tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)  # on delayed-allocation file systems a full disk shows only here
        finally:
            os.close(fd)
        os.chmod(tmp, _FILE_MODE)
    except BaseException as err:
        _unlink_quietly(tmp)
        named = _target_error(err, tmp, path)
        if named is not None:
            raise named from err
        raise
    return tmp


def _write_bytes_to(data: bytes) -> Callable[[str], None]:
    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            f.write(data)

    return write


class AtomicFiles:
    """Write several files that belong together: all are written first, then all renamed.

    Used as a context manager; each ``save`` / ``write_bytes`` / ``write_text`` writes a
    temporary file at once, and leaving the block without an exception renames every temporary
    onto its target, in the order written. An exception (a full disk while writing the third
    file, Ctrl-C) removes all the temporaries and leaves every target as it was. Only the renames
    themselves (no data written, microseconds apart) can be cut in between, by a crash.

    Example::

        with AtomicFiles() as files:
            files.save(run / "model.safetensors", lambda tmp: save_model(model, tmp))
            files.save(run / "state.pt", lambda tmp: torch.save(state, tmp))
    """

    def __init__(self) -> None:
        self._written: list[tuple[str, Path]] = []

    def save(self, path: str | os.PathLike, writer: Callable[[str], None]) -> None:
        """Call ``writer(tmp_path)`` (torch.save, savefig...); ``tmp_path`` keeps the suffix."""
        path = Path(path)
        self._written.append((_write_temp(path, writer, path.suffix or ".tmp"), path))

    def write_bytes(self, path: str | os.PathLike, data: bytes) -> None:
        self._written.append((_write_temp(Path(path), _write_bytes_to(data), ".tmp"), Path(path)))

    def write_text(self, path: str | os.PathLike, text: str) -> None:
        self.write_bytes(path, text.encode("utf-8"))

    def __enter__(self) -> AtomicFiles:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        try:
            if exc_type is None:
                while self._written:
                    tmp, path = self._written[0]
                    try:
                        os.replace(tmp, path)
                    except OSError as err:
                        raise OSError(err.errno, err.strerror, str(path)) from err
                    self._written.pop(0)
        finally:
            for tmp, _ in self._written:
                _unlink_quietly(tmp)
            self._written.clear()
        return False


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file and a rename (never a half-written file).

    Raises:
        OSError: the write failed (full disk, read-only file system, no permission), naming
            ``path``; ``path`` is unchanged and no temporary file is left.
    """
    with AtomicFiles() as files:
        files.write_bytes(path, data)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """:func:`atomic_write_bytes` of ``text`` in UTF-8."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_save(path: str | os.PathLike, writer: Callable[[str], None]) -> None:
    """Call ``writer(tmp_path)`` then rename the result onto ``path`` (for torch.save, PNGs...).

    Raises:
        OSError: the write failed, naming ``path`` (also for writers that report a disk error
            inside another exception, as safetensors does); ``path`` is unchanged.
    """
    with AtomicFiles() as files:
        files.save(path, writer)


PROBE_PREFIX = ".attnlab-probe-"  # check_writable's empty file, there for a moment


def is_temporary(entry: str, names: Iterable[str]) -> bool:
    """True if the file name ``entry`` is a temporary file of one of ``names`` (an atomic
    write's, or a lock file's before it is linked into place) or a writability probe."""
    patterns = []
    for name in names:
        suffixes = {".tmp", Path(name).suffix or ".tmp"}
        ends = "|".join(re.escape(s) for s in sorted(suffixes))
        patterns.append(re.escape(f".{name}.") + rf"[a-z0-9_]{{8}}(?:{ends})\Z")
    patterns.append(re.escape(PROBE_PREFIX) + r"[a-z0-9_]{8}\Z")
    return any(re.match(p, entry) for p in patterns)


def remove_temporaries(directory: str | os.PathLike, names: Iterable[str]) -> list[str]:
    """Delete the temporary files of ``names`` that a killed writer left in ``directory``.

    Call it only while no other process can be writing there (holding the directory's lock).

    Returns:
        The names of the files removed.
    """
    names = tuple(names)
    removed = []
    try:
        entries = os.listdir(directory)
    except OSError:
        return removed
    for entry in entries:
        if is_temporary(entry, names):
            _unlink_quietly(os.path.join(directory, entry))
            removed.append(entry)
    return removed


def check_writable(directory: str | os.PathLike) -> None:
    """Check that files can be created in ``directory`` (or, if it is absent, that it can be made).

    It creates and deletes an empty file: permission bits alone do not tell (a read-only file
    system, or root, who ignores them).

    Raises:
        OSError: the error creating a file there would give (EACCES, EROFS, ENOSPC...), naming
            ``directory``.
    """
    directory = Path(directory)
    existing = directory
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    try:
        fd, probe = tempfile.mkstemp(dir=existing, prefix=PROBE_PREFIX, suffix="")
    except OSError as err:
        raise OSError(err.errno, err.strerror, str(directory)) from None
    os.close(fd)
    _unlink_quietly(probe)


# ----------------------------------------------------------------------------------------------
# directory locks


class LockHeld(BlockingIOError):
    """Another live process holds the lock; ``holder`` describes it (pid, host, started)."""

    def __init__(self, path: str | os.PathLike, holder: dict | None):
        super().__init__(errno.EWOULDBLOCK, "locked by another process", str(path))
        self.holder = holder


def describe_holder(holder: dict | None) -> str:
    """``"pid 123 on host h, started 2025-01-02T03:04:05+00:00: attnlab train lm ..."``."""
    if not holder:
        return "a process that has not yet written its name into the lock"
    text = f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}"
    if holder.get("started"):
        text += f", started {holder['started']}"
    if holder.get("command"):
        text += f": {holder['command']}"
    return text


def _read_holder(path: str | os.PathLike) -> dict | None:
    try:
        with open(path, encoding="utf-8") as f:
            holder = json.load(f)
    except (OSError, ValueError):
        return None
    return holder if isinstance(holder, dict) else None


def _holder_info() -> dict:
    command = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]) if sys.argv else ""
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": command[:300],
    }


def _try_flock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _same_file(fd: int, path: str) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    here = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (here.st_dev, here.st_ino)


_HELD: weakref.WeakSet[DirectoryLock] = weakref.WeakSet()


def _close_in_child() -> None:
    # a forked child (a data-loader worker) shares the lock; closing its copy of the file
    # descriptor lets the lock go when the parent dies, whatever the child does
    for lock in list(_HELD):
        if lock._fd is not None:
            os.close(lock._fd)
            lock._fd = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_in_child)


class DirectoryLock:
    """An exclusive advisory lock on the file ``path``, held until :meth:`release`.

    ``DirectoryLock.acquire(path)`` creates ``path`` atomically with the holder's pid, host, start
    time and command line (JSON), already locked with ``flock``. A lock file whose ``flock`` can be
    taken belongs to a process that has ended (the kernel drops the lock when its holder exits, is
    killed or crashes): it is stale and is taken over; ``previous`` then holds its description.
    :meth:`release` deletes the file. Forked children do not inherit the lock.

    On a file system that cannot lock (some network mounts) the lock is not enforced and
    ``enforced`` is false; on Windows neither.
    """

    def __init__(self, path: Path, fd: int | None, previous: dict | None, enforced: bool):
        self.path = path
        self._fd = fd
        self.previous = previous
        self.enforced = enforced
        if fd is not None:
            _HELD.add(self)

    @classmethod
    def acquire(cls, path: str | os.PathLike, *, attempts: int = 5) -> DirectoryLock:
        """Take the lock at ``path`` (its directory must exist).

        Args:
            path: the lock file.
            attempts: how often to look again, 20 ms apart, while it is held (a process that
                merely checks the lock holds it for microseconds).

        Raises:
            LockHeld: a live process holds it.
            OSError: the lock file cannot be written (read-only directory, full disk...).
        """
        path = Path(path)
        info = json.dumps(_holder_info()).encode("utf-8")
        if fcntl is None:  # pragma: no cover
            return cls(path, None, None, enforced=False)
        for attempt in range(attempts):
            lock = cls._try_acquire(path, info)
            if lock is not None:
                return lock
            if attempt < attempts - 1:
                time.sleep(0.02)
        raise LockHeld(path, _read_holder(path))

    @classmethod
    def _try_acquire(cls, path: Path, info: bytes) -> DirectoryLock | None:
        """One attempt; ``None`` when a live process holds the lock."""
        name = str(path)
        while True:
            # our lock file, complete and locked before anyone can see it
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            keep = False
            try:
                os.write(fd, info)
                os.fchmod(fd, _FILE_MODE)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:  # no locks on this file system: go on, unprotected
                    return cls(path, None, None, enforced=False)
                try:
                    os.link(tmp, name)  # fails if a lock file exists: never replaces a live one
                    keep = True
                    return cls(path, fd, None, enforced=True)
                except FileExistsError:
                    pass
                except OSError:  # no hard links here (FAT, some network file systems)
                    return cls._acquire_in_place(path, info)
                taken = cls._take_stale(name, tmp)
                if taken is None:
                    return None
                if taken is False:
                    continue
                keep = True
                return cls(path, fd, taken, enforced=True)
            finally:
                if not keep:
                    os.close(fd)
                _unlink_quietly(tmp)

    @staticmethod
    def _take_stale(name: str, tmp: str) -> dict | bool | None:
        """Replace the lock file ``name`` by ``tmp`` if its holder is gone.

        Returns the stale holder's description (``{}`` if unreadable), ``None`` when a live
        process holds it, ``False`` when it changed meanwhile (try again).
        """
        try:
            old = os.open(name, os.O_RDONLY)
        except FileNotFoundError:  # released meanwhile
            return False
        try:
            if not _try_flock(old):
                return None
            if not _same_file(old, name):  # replaced or removed meanwhile
                return False
            # its holder is gone: publish ours while still holding the stale one, so nobody
            # can take the stale one in between
            previous = _read_holder(name) or {}
            os.replace(tmp, name)
            return previous
        finally:
            os.close(old)

    @classmethod
    def _acquire_in_place(cls, path: Path, info: bytes) -> DirectoryLock | None:
        """The classic lock file for file systems without hard links: lock, then write into it."""
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, _FILE_MODE)
            if not _try_flock(fd):
                os.close(fd)
                return None
            if not _same_file(fd, str(path)):
                os.close(fd)
                continue
            previous = _read_holder(path)
            os.ftruncate(fd, 0)
            os.pwrite(fd, info, 0)
            return cls(path, fd, previous, enforced=True)

    def release(self) -> None:
        """Delete the lock file (if it is still ours) and drop the lock. Never raises."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        _HELD.discard(self)
        try:
            if _same_file(fd, str(self.path)):
                os.unlink(self.path)  # while still locked: a waiting process finds no file
        except OSError:
            pass  # a read-only or vanished directory: the kernel still drops the lock
        finally:
            os.close(fd)

    def __enter__(self) -> DirectoryLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def lock_holder(path: str | os.PathLike) -> dict | None:
    """The description of the live process holding the lock file ``path``, or ``None``.

    ``None`` also for a stale lock file (its holder is dead). The check takes the lock for a
    moment, which :meth:`DirectoryLock.acquire` tolerates.
    """
    if fcntl is None:  # pragma: no cover
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        if _try_flock(fd):
            return None
        return _read_holder(path) or {}
    except OSError:
        return None
    finally:
        os.close(fd)
