"""Sealed artefacts: the sha256 of every file, recorded when an artefact is built and checked when it is loaded.

Why: a cache file that a crash, a full disk or a stray write damaged must neither load as a silently different
artefact (a valid pickle holding other weights decodes without a word) nor end in a parser's traceback. Every
artefact the cache builds goes through `building`: it is written under a private temporary name, sealed, then
renamed into place, so a reader sees the old artefact or the whole new one, and a kill at any moment leaves no
half-built one where the next run looks. The seal is written last, so its presence also marks the build complete.

- A file artefact `x.npz` is sealed by `x.npz.sha256` beside it, a folder by `SHA256SUMS` inside it, both in the
  format of `sha256sum`, so `sha256sum -c` checks them by hand.
- `problem(path)` says what is wrong (a file missing, truncated or changed since the build), naming the file, or
  None. An artefact built before seals existed has none and is accepted as it is: nobody has to rebuild, and its
  loader's own checks still name a truncated file.
- `build_lock(path)` lets one process build an artefact while another that needs it waits, then loads it, instead of
  both building it and racing on its files.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import shutil
import socket
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, TypeVar

from . import WRITE_ERRNOS, WriteError, write_atomic, write_failed

SUMS = "SHA256SUMS"
Log = Callable[[str], None]
T = TypeVar("T")

_DIGESTS: dict[str, tuple[tuple[int, int, int], str]] = {}   # path -> (size, mtime_ns, inode), sha256: hashed once
_HELD: dict[Path, list] = {}                                  # build locks this process holds: [fd, depth]


class ArtefactDamaged(FileNotFoundError):
    """An artefact whose files do not match the seal recorded when it was built, or that cannot be read: one line
    naming the file and the fix (a FileNotFoundError, so every command prints it as one line)."""


def digest(path: Path) -> str:
    """sha256 of a file, read in 1 MiB blocks; remembered while the file's size, mtime and inode stay the same."""
    st = os.stat(path)
    stamp = (st.st_size, st.st_mtime_ns, st.st_ino)
    known = _DIGESTS.get(str(path))
    if known and known[0] == stamp:
        return known[1]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    _DIGESTS[str(path)] = (stamp, h.hexdigest())
    return h.hexdigest()


HASHED_UP_TO = 64 << 20      # an unsealed file above this is recorded without its hash (reading it costs seconds)


def content_hash(path: Path) -> str | None:
    """The sha256 that names an artefact's content: a sealed folder's is that of its SHA256SUMS (which lists every
    file's), a sealed file's its seal, an unsealed file's its own (up to HASHED_UP_TO); None for an unsealed folder
    (a place, such as the greedy references' folder, not one artefact) and for what is not there."""
    try:
        if path.is_dir():
            return digest(path / SUMS) if (path / SUMS).is_file() else None
        if sidecar(path).is_file():
            return sidecar(path).read_text().split()[0]
        return digest(path) if path.is_file() and path.stat().st_size <= HASHED_UP_TO else None
    except (OSError, IndexError):
        return None


def with_content_hashes(tree):
    """A result's JSON with every artefact it names in the cache (`$BPDBENCH_CACHE/<key>`, paths.portable) followed
    by its content hash (`#sha256=<16 hex>`; `#sha256=absent` where nothing is there): which weights, tables or
    curves a number was made with, not only where they lay. Resume and finished checks compare without it
    (paths.comparable)."""
    from .. import paths
    if isinstance(tree, dict):
        return {k: with_content_hashes(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [with_content_hashes(v) for v in tree]
    if isinstance(tree, str) and tree.startswith(paths.CACHE_TOKEN + "/") and paths.HASH not in tree:
        where = paths.resolve(tree)
        if where is None or not where.exists():         # named, but not there: said, not left to look like a place
            return f"{tree}{paths.HASH}{paths.ABSENT}"
        found = content_hash(where)
        return f"{tree}{paths.HASH}{found[:16]}" if found else tree
    return tree


def sidecar(path: Path) -> Path:
    """The seal of a file artefact."""
    return path.with_name(path.name + ".sha256")


def seal_of(path: Path) -> Path:
    """Where the seal of `path` (a file or a folder artefact) is."""
    return path / SUMS if path.is_dir() else sidecar(path)


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != SUMS and not p.name.startswith("."))


def seal(path: Path) -> None:
    """Record the sha256 of the artefact at `path` (every file of a folder), written atomically and last."""
    path = Path(path)
    if path.is_dir():
        lines = [f"{digest(f)}  {f.relative_to(path).as_posix()}\n" for f in _files(path)]
    else:
        lines = [f"{digest(path)}  {path.name}\n"]
    write_atomic(seal_of(path), "".join(lines))


def sealed(path: Path) -> bool:
    return seal_of(Path(path)).exists()


def _recorded(path: Path) -> dict[str, str] | None:
    """name -> sha256 as the seal records them; None without a seal; {} for a seal that cannot be read."""
    file = seal_of(path)
    if not file.exists():
        return None
    try:
        pairs = [line.split(None, 1) for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]
        out = {name.strip().lstrip("*"): h for h, name in pairs}
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    if not all(len(h) == 64 and all(c in "0123456789abcdef" for c in h) for h in out.values()):
        return {}
    return out


def problem(path: Path) -> str | None:
    """What is wrong with a sealed artefact, naming the file, or None when it matches its seal (or has none: built
    before seals existed, or absent, which its loader handles as missing)."""
    path = Path(path)
    if not path.exists():
        return None
    recorded = _recorded(path)
    if recorded is None:
        return None
    if not recorded:
        return f"its seal {seal_of(path)} is unreadable"
    for name, want in recorded.items():
        file = path / name if path.is_dir() else path
        if not file.is_file():
            return f"{file} is missing (listed in {seal_of(path).name})"
        try:
            got = digest(file)
        except OSError as e:
            return f"{file} cannot be read ({e.strerror})"
        if got != want:
            return f"{file} is truncated or damaged (its sha256 differs from the one recorded when it was built)"
    return None


def discard(path: Path) -> None:
    """Remove an artefact and its seal (a damaged one, before it is built again)."""
    path = Path(path)
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        for p in (path, sidecar(path)):
            p.unlink(missing_ok=True)


def check_writable(path: Path) -> None:
    """Before a build that takes minutes, whether its result can be written where it goes (the nearest existing
    folder above `path`, probed by making and removing a folder): a read-only place is one line now, not after."""
    path = Path(path)
    existing = next((p for p in (path.parent, *path.parent.parents) if p.exists()), None)
    if existing is None or not existing.is_dir():
        return                           # the build's own mkdir names it
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".bpdbench-probe-", dir=existing))
    except OSError as e:
        raise write_failed(e, path) from None


@contextmanager
def build_lock(path: Path, log: Log | None = None) -> Iterator[None]:
    """Hold the build lock of the artefact at `path` (an flock on `.<name>.lock` beside it, which the kernel releases
    when its holder dies, so a killed builder never blocks a later one). A second process that needs the artefact
    says whom it waits for and waits; it re-checks the artefact once it holds the lock. Re-entrant in a process."""
    key = Path(os.path.abspath(path))
    if key in _HELD:
        _HELD[key][1] += 1
        try:
            yield
        finally:
            _HELD[key][1] -= 1
        return
    lock = key.with_name(f".{key.name}.lock")
    try:
        key.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise write_failed(e, path) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 512, 0).decode("utf-8", "replace").strip() or "another process"
            (log or _stderr)(f"waiting for {holder}, which is building {path}")
            fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        except OSError:
            pass                        # the holder's name is a courtesy; the flock is what excludes
        _HELD[key] = [fd, 1]
        yield
    finally:
        _HELD.pop(key, None)
        os.close(fd)


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)     # stdout stays what a command prints for pipes


def _temporary(path: Path, folder: bool) -> Path:
    """A private name beside `path` that keeps its suffix (numpy and torch add none then)."""
    if folder:
        return path.with_name(f"{path.name}.tmp-{os.getpid()}")
    return path.with_name(f"{path.stem}.tmp-{os.getpid()}{path.suffix}")


def _clear_leftovers(path: Path, folder: bool) -> None:
    """Temporary files and folders of builds that were killed (none can be live: the build lock is held)."""
    patterns = (f"{path.name}.tmp-*", f"{path.name}.old-*") if folder else (f"{path.stem}.tmp-*{path.suffix}",)
    for pattern in patterns:
        for p in path.parent.glob(pattern):
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


def _remove(p: Path) -> None:
    if p.is_dir():
        shutil.rmtree(p, ignore_errors=True)
    elif p.exists():
        p.unlink(missing_ok=True)


@contextmanager
def building(path: Path, log: Log | None = None, folder: bool = False) -> Iterator[Path]:
    """Build the artefact at `path` under its build lock: the body writes a private temporary file (or folder, with
    `folder`) that this yields; once the body returns it is sealed and renamed into place. A body that fails (a
    refused write, an interrupt, a kill) leaves the earlier artefact as it was and no temporary file behind; a
    refused write raises WriteError, one line naming the file and the fix."""
    path = Path(path)
    tmp = _temporary(path, folder)
    with build_lock(path, log):
        _clear_leftovers(path, folder)
        try:
            tmp.mkdir(parents=True) if folder else tmp.parent.mkdir(parents=True, exist_ok=True)
            yield tmp
            if folder:
                seal(tmp)
                old = path.with_name(f"{path.name}.old-{os.getpid()}")
                if path.exists():
                    path.rename(old)
                tmp.rename(path)
                _remove(old)
            else:
                sums = f"{digest(tmp)}  {path.name}\n"
                sidecar(path).unlink(missing_ok=True)     # a kill before the new seal leaves an unsealed whole file
                os.replace(tmp, path)
                write_atomic(sidecar(path), sums)
        except BaseException as e:
            refused = _refused(path, tmp, e)
            _remove(tmp)
            if refused is not None:
                raise refused from None
            raise


def _refused(path: Path, tmp: Path, e: BaseException) -> WriteError | None:
    """Whether a failed build was a write the system refused, and its one-line error. Writers say it in their own
    words (torch.save: a RuntimeError of its zip writer, np.save: an OSError without errno), so the place is probed
    with as many bytes as the build had written: a probe refused too names the cause (errno) and the fix."""
    if isinstance(e, WriteError):
        return e
    if not isinstance(e, (OSError, RuntimeError)):
        return None
    if isinstance(e, OSError) and e.errno is not None:
        return write_failed(e, path) if e.errno in WRITE_ERRNOS | {errno.EIO} else None
    files = _files(tmp) if tmp.is_dir() else [tmp] if tmp.exists() else []
    size = max([f.stat().st_size for f in files] + [0]) + (1 << 16)
    where = tmp if tmp.is_dir() else tmp.parent
    try:
        with tempfile.TemporaryFile(dir=where if where.exists() else None) as f:
            f.write(b"\0" * size)
            f.flush()
            os.fsync(f.fileno())
    except OSError as probe:
        return write_failed(probe, path)
    return None


def readable(path: Path, load: Callable[[Path], T], log: Log | None = None) -> T | None:
    """The artefact at `path` loaded, or None when it is missing, fails its seal or cannot be parsed (said in one
    line naming the file when `log` is given: the caller builds it again)."""
    path = Path(path)
    if not path.exists():
        return None
    why = problem(path)
    if why is None:
        try:
            return load(path)
        except Exception as e:          # a parser's own words (BadZipFile, pickle, UnicodeDecodeError): name the file
            why = f"{path} cannot be read ({type(e).__name__})"
    if log is not None:
        log(f"warning: {why}: building it again")
    return None


def load_or_build(path: Path, load: Callable[[Path], T], build: Callable[[Path], None], log: Log, *,
                  fresh: Callable[[T], bool] | None = None, say: str | None = None) -> T:
    """The artefact at `path`, built first (said with `say`) when missing, damaged, unreadable or not `fresh` (made
    from other sources than the current ones). `build(tmp)` writes it to the temporary path `building` seals and
    renames into place. Two processes that need it: one builds, the other waits for it and loads what it built."""
    ok = (lambda obj: obj is not None and (fresh is None or fresh(obj)))
    obj = readable(path, load, log)
    if ok(obj):
        return obj
    with build_lock(path, log):
        obj = readable(path, load)            # built by the process this one waited for
        if ok(obj):
            return obj
        if say:
            log(say)
        with building(path, log) as tmp:
            build(tmp)
    return load(Path(path))
