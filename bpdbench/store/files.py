"""Files that are never half written: atomic replacement, appends cut back on failure, one writer per folder.

Why apart from the result files (store/__init__.py): every artefact, cache and result goes through these few
primitives, and a write the system refuses (a file-size limit, a full disk, a read-only folder) must end the same
way everywhere: `WriteError`, one line naming the file and the fix, with the earlier file intact.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
from pathlib import Path
from typing import Callable

LOCK = ".bpdbench.lock"


class OutputBusy(FileExistsError):
    """Another live process writes into the same result directory."""


class WriteError(OSError):
    """A write the system refused (disk full, file-size limit, read-only folder): one line naming the file and the
    fix, raised after the file was put back as it was, so earlier results are intact and --resume continues."""

    def __init__(self, message: str, code: int | None = None):
        super().__init__(code, message)
        self.message = message

    def __str__(self) -> str:
        return self.message


_WHY = {errno.EFBIG: "a file-size limit was reached (ulimit -f)", errno.ENOSPC: "the disk is full",
        errno.EDQUOT: "the disk quota is used up", errno.EROFS: "its folder is on a read-only file system",
        errno.EACCES: "its folder is not writable", errno.EPERM: "its folder is not writable"}


WRITE_ERRNOS = frozenset(_WHY)          # the errnos of a refused write (what `one_line_errors` turns into a line)


def write_failed(e: BaseException, path: Path | str) -> WriteError:
    """The one-line error of a failed write of `path`: what happened, then the fix (free space, raise the limit, or
    write elsewhere: --out for results, BPDBENCH_CACHE for the cache)."""
    from .. import paths
    if isinstance(e, WriteError):
        return e
    code = getattr(e, "errno", None)
    why = _WHY.get(code) or getattr(e, "strerror", None) or str(e).split("\n")[0] or type(e).__name__
    a, root = os.path.abspath(path), os.path.abspath(paths.cache_setting())
    in_cache = a == root or a.startswith(root.rstrip(os.sep) + os.sep)
    denied = code in (errno.EROFS, errno.EACCES, errno.EPERM)
    fix = {errno.EFBIG: "raise the limit (ulimit -f unlimited) and rerun", errno.ENOSPC: "free space and rerun",
           errno.EDQUOT: "free space and rerun"}.get(code, "check that disk and rerun")
    if denied:
        fix = paths.CACHE_FIX if in_cache else "pass --out a writable folder"
    elif not in_cache:
        fix += " (--resume continues a run)"
    return WriteError(f"cannot write {path}: {why}; {fix}; what was written before is intact", code)


class OutputLock:
    """An exclusive, non-blocking lock on a result directory, held for the whole command.

    Taken once per command, before the model loads (experiments/commands.py, run.py, speed.py), and handed to the
    writers (`AppendOnlyJsonl(..., lock=)`), which never take it again: a second acquisition in one process is a bug
    and raises, rather than being counted."""
    _held: dict[Path, list] = {}        # resolved dir -> [fd, 1, created]

    def __init__(self, out: Path):
        self.out = Path(out)

    def __enter__(self) -> "OutputLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def acquire(self) -> None:
        key = self.out.resolve()
        if key in self._held:
            raise RuntimeError(f"{self.out}: this process holds its lock already; hand the held lock to the writer")
        from .. import paths
        paths.check_cache_writable()        # the command writes the cache too: a bad BPDBENCH_CACHE is one line now
        created = not self.out.exists()
        ensure_writable_dir(self.out)
        path = self.out / LOCK
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            if created:
                self.out.rmdir()
            raise write_failed(e, path) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 512, 0).decode("utf-8", "replace").strip() or "unknown process"
            os.close(fd)
            raise OutputBusy(f"{self.out} is being written by another bpdbench ({holder}); wait for it to finish "
                             f"or pass a different --out") from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}: {' '.join(sys.argv[:3])}\n".encode(), 0)
        except OSError:
            pass                # the holder's name is a courtesy to a second writer; the flock is what excludes
        self._held[key] = [fd, 1, created]

    @property
    def held(self) -> bool:
        return self.out.resolve() in self._held

    def release(self) -> None:
        key = self.out.resolve()
        entry = self._held.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            del self._held[key]
            os.close(entry[0])       # closing the descriptor releases the flock
            if entry[2] and [p.name for p in self.out.iterdir()] == [LOCK]:
                (self.out / LOCK).unlink()      # a command that failed before writing leaves no empty folder
                self.out.rmdir()


def ensure_writable_dir(out: Path) -> None:
    """Create `out` (and parents) now, so a file in the way or an unwritable place is one line before any model
    loads, not an errno after it."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"--out {out} is a file, not a directory; pass a directory path")
    for parent in out.parents:
        if parent.exists() and not parent.is_dir():
            raise FileExistsError(f"--out {out}: {parent} is a file, not a directory; pass a directory path")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise FileNotFoundError(f"--out {out} cannot be created ({e.strerror}); pass a writable directory") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise FileNotFoundError(f"--out {out} is not writable; pass a writable directory")


def append_bytes(path: Path, data: bytes) -> None:
    """Append `data` in one write, fsynced; a write the disk refuses part way (a file-size limit, a full disk)
    cuts the file back to its old end, so no torn line is left behind, and raises WriteError."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as e:
        raise write_failed(e, path) from None
    try:
        end = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        except BaseException as e:
            try:
                os.ftruncate(fd, end)       # shrinking is allowed at any size limit, and frees space on a full disk
            except OSError:
                pass
            if isinstance(e, OSError):
                raise write_failed(e, path) from None
            raise
    finally:
        os.close(fd)


def write_atomic(path: Path, text: str | bytes) -> None:
    """Write, fsync, rename: a reader (or a crash) sees the old file or the new one, never half of either. A write
    the disk refuses removes the temporary file, keeps the old file and raises WriteError (one line: the file and
    the fix)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(text.encode() if isinstance(text, str) else text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        try:
            tmp.unlink()
        except OSError:
            pass
        if isinstance(e, OSError):
            raise write_failed(e, path) from None
        raise


def update_json(path: Path, change: Callable[[dict], dict]) -> dict:
    """Read-modify-write of a JSON table that several processes update (the tuned-alpha table, written by tune cells
    running side by side in a sweep): under an exclusive lock beside it, so no writer loses another's entries."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path.with_name(f".{path.name}.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise write_failed(e, path) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)          # blocking: writers take turns
        table = change(json.loads(path.read_text()) if path.exists() else {})
        write_atomic(path, json.dumps(dict(sorted(table.items())), indent=2) + "\n")
        return table
    finally:
        os.close(fd)
