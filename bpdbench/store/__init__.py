"""Result files: per-example JSONL (appended as each example finishes), then summary CSV/Markdown from it.

The JSONL is the source of truth: summaries, tables and plots are rendered from files, never from stdout, and an
interrupted run resumes by skipping ids already in the JSONL. Every command that appends (run, replay, oracle,
speed, analyze) goes through `OutputLock` + `AppendOnlyJsonl`, so that:

- one directory has one writer: a second process fails at once, naming the pid that holds the lock (flock is
  released by the kernel when the holder dies, so a `kill -9` never leaves a stale lock);
- a record is one `write` of one line, flushed and fsynced before the next example starts: `kill -9` at any
  moment loses at most the example in flight;
- a torn last line (a crash mid-write) is cut off before anything is appended, and a line that a crash glued to the
  next record is split back into the complete record it holds, so no finished example is lost;
- a record whose key (id) is already in the file is never counted twice;
- a folder holds one command's results (config.json `command`), and a resumed record the prompt it states
  (`prompt_sha256`): another command's folder or an edited prompt is refused before the model loads;
- a write the disk refuses (full, a file-size limit, read-only) raises `WriteError`, one line naming the file and the
  fix, after putting the file back as it was: the earlier records and files stay intact and `--resume` continues.
  The lock file stays behind on purpose: it is an flock, so a leftover file blocks no later run, while deleting it
  could hand the lock to two processes at once.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Callable, Iterable

from ..paths import comparable
from .files import (LOCK, WRITE_ERRNOS, OutputBusy, OutputLock, WriteError, append_bytes,  # noqa: F401 (re-exported)
                    ensure_writable_dir, update_json, write_atomic, write_failed)

EXAMPLES, CONFIG = "examples.jsonl", "config.json"
Key = Callable[[dict], object]
COMMAND = "command"             # the config.json (certify: certify.json) field naming the command that made a folder
PROMPT_HASH = "prompt_sha256"   # the per-example record field: a hash of the prompt text it was decoded from


def by_id(record: dict) -> object:
    return record.get("id")


def _salvage(line: str) -> dict | None:
    """The complete record at the end of a line a crash glued to its successor (`{"id": "p2", "se{...}`)."""
    decoder = json.JSONDecoder()
    for i, ch in enumerate(line):
        if ch == "{" and i:
            try:
                obj, end = decoder.raw_decode(line, i)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict) and not line[end:].strip():
                return obj
    return None


def repair(path: Path, log: Callable[[str], None] = print) -> int:
    """Cut a torn last line off `path` and split glued lines back into their complete records (atomically, with a
    warning). Returns the number of bytes dropped; raises on a corrupt line that holds no complete record."""
    if not path.exists():
        return 0
    raw = path.read_bytes()
    body, _, tail = raw.rpartition(b"\n")
    good = body + b"\n" if body or raw.startswith(b"\n") else b""
    if tail.strip():                    # no trailing newline: the line in flight when the process died
        try:
            json.loads(tail)
            good, tail = raw + b"\n", b""   # a whole record whose newline was lost: keep it
        except ValueError:
            pass
    dropped = len(raw) - len(good) if good != raw and tail.strip() else 0
    lines, fixed = [], False
    for i, line in enumerate(good.decode("utf-8", "replace").splitlines()):
        if not line.strip():
            continue
        try:
            json.loads(line)
            lines.append(line)
        except ValueError:
            rec = _salvage(line)
            if rec is None:
                raise ValueError(f"{path}:{i + 1}: corrupt line holding no complete record; delete that line and "
                                 f"rerun with --resume") from None
            lines.append(json.dumps(rec))
            fixed = True
    if good != raw or fixed:
        write_atomic(path, "".join(line + "\n" for line in lines))
        log(f"warning: {path}: cut {dropped} bytes of a torn last line (the example in flight when a run died)"
            + ("; split a glued line back into its complete record" if fixed else ""))
    return dropped


def read_table(path: Path):
    """A result CSV as a DataFrame, its `method` column read as written. Why not plain `pd.read_csv`: pandas reads
    the strings null, NA, None and nan as missing by default, and `null` is a method label (methods/ar.py: AR timed
    as a method, every board's noise-floor row), so its row lost its name in every table."""
    import pandas as pd
    df = pd.read_csv(path)
    if "method" in df.columns:
        df["method"] = pd.read_csv(path, usecols=["method"], dtype=str, keep_default_na=False)["method"]
    return df


def read_json(path: Path, flag: str, what: str, example: str, fix: str):
    """A JSON file a command reads as its input, or one line naming it (a directory, or not JSON) and the fix: the
    check every such input gets before its command loads a model."""
    if path.is_dir():
        raise ValueError(f"{flag} {path} is a directory; pass the {what} JSON file ({example})")
    try:
        return json.loads(path.read_text())
    except ValueError as e:
        raise ValueError(f"{what} {path} is not valid JSON ({e}); {fix}") from None


def read_examples(path: Path, key: Key = by_id) -> list[dict]:
    """Records of a JSONL, each key once (the first copy: a file written twice is never double counted); a torn
    last line (a crash mid-write) is ignored, a glued line yields its complete record."""
    records, seen = [], set()
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            rec = _salvage(line)
            if rec is None:
                if i == len(lines) - 1:
                    continue
                raise ValueError(f"{path}:{i + 1}: corrupt JSON line; delete it and rerun with --resume") from None
        k = key(rec)
        if k in seen:
            continue
        seen.add(k)
        records.append(rec)
    return records


class AppendOnlyJsonl:
    """The one way result records reach disk: locked directory, repaired tail, one fsynced line per record."""

    def __init__(self, out: Path, name: str, key: Key = by_id, log: Callable[[str], None] = print,
                 lock: OutputLock | None = None):
        """`lock`: the folder's lock the command holds (taken before its model loaded); without one the file takes
        the lock itself and releases it on close."""
        self.out, self.path, self.key, self.log = Path(out), Path(out) / name, key, log
        if lock is not None and (not lock.held or lock.out.resolve() != self.out.resolve()):
            raise RuntimeError(f"{self.out}: the lock handed to the writer is not this folder's held lock")
        self.own = lock is None
        self.lock = OutputLock(self.out) if self.own else lock
        if self.own:
            self.lock.acquire()
        self.keys: set = set()

    def __enter__(self) -> "AppendOnlyJsonl":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.own:
            self.lock.release()

    def existing(self) -> list[dict]:
        """What earlier runs finished (after repairing a crash's torn tail)."""
        if not self.path.exists():
            return []
        repair(self.path, self.log)
        records = read_examples(self.path, self.key)
        self.keys = {self.key(r) for r in records}
        return records

    def start_fresh(self) -> None:
        """An explicit restart (no --resume on a command that replaces its results)."""
        try:
            with open(self.path, "w") as f:
                os.fsync(f.fileno())
        except OSError as e:
            raise write_failed(e, self.path) from None
        self.keys = set()

    def rewrite(self, records: list[dict]) -> None:
        """Replace the file atomically (write, fsync, rename): used only to drop incomplete groups of records."""
        write_atomic(self.path, "".join(json.dumps(r, default=_json_default) + "\n" for r in records))
        self.keys = {self.key(r) for r in records}

    def append(self, records: Iterable[dict]) -> list[dict]:
        """Append records not already in the file, in one write; returns those written."""
        new = [r for r in records if self.key(r) not in self.keys]
        if not new:
            return []
        text = "".join(json.dumps(r, default=_json_default) + "\n" for r in new).encode()
        append_bytes(self.path, text)
        self.keys.update(self.key(r) for r in new)
        return new


class ResultWriter:
    """examples.jsonl of one `run`: refuses to mix with an earlier run unless --resume and the settings match."""

    def __init__(self, out: Path, config: dict, resume: bool, log: Callable[[str], None] = print,
                 lock: OutputLock | None = None):
        self.out = Path(out)
        self.path = self.out / EXAMPLES
        self.file = AppendOnlyJsonl(self.out, EXAMPLES, by_id, log, lock)   # a second writer fails at the lock
        try:
            if lock is None:            # a command holding the lock checked before its model loaded
                precheck_run(self.out, config.get("config", {}), resume)
            self.records = resumable(self.out, EXAMPLES, config, settings_and_heads, resume,
                                     ignore=RUN_RESUME_IGNORES, file=self.file)
            write_atomic(self.out / CONFIG, json.dumps(config, indent=2, default=str))
        except BaseException:
            self.file.close()
            raise

    def __enter__(self) -> "ResultWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.file.close()

    def done_ids(self) -> set[str]:
        return {r["id"] for r in self.records}

    def append(self, record: dict) -> None:
        if self.file.append([record]):
            self.records.append(record)


def precheck_run(out: Path, config: dict, resume: bool) -> None:
    """The checks ResultWriter makes, made before the model loads and before the progress bar: an existing
    examples.jsonl without --resume, or --resume with other settings, is one line now rather than after loading."""
    path = Path(out) / EXAMPLES
    if not path.exists() or not path.stat().st_size:
        return
    if not resume:
        raise FileExistsError(f"{path} exists; pass --resume to continue it or --out to write elsewhere")
    if (Path(out) / CONFIG).exists():
        try:
            old = json.loads((Path(out) / CONFIG).read_text()).get("config", {})
        except ValueError:
            raise ValueError(f"{Path(out) / CONFIG} is corrupt; pass a new --out (examples.jsonl is kept)") from None
        changed = _differences({"config": comparable(old)},
                               {"config": comparable(json.loads(json.dumps(config, default=str)))}, RUN_RESUME_IGNORES)
        if changed:
            raise ValueError(f"cannot resume {out}: its config.json differs in {', '.join(changed)}; "
                             f"pass a new --out or drop --resume")


# a resumed run may ask for more examples, start elsewhere, use another number of threads or read its greedy
# references from another folder (a sweep cell with private_greedy gets a fresh one per attempt)
RUN_RESUME_IGNORES = ("resume", "limit", "offset", "out", "threads", "greedy_dir")


def _json_default(o):
    if isinstance(o, float) and math.isnan(o):
        return None
    return str(o)


def settings_and_heads(meta: dict) -> dict:
    """What a resumed folder must share with the command resuming it: its settings and the heads it decoded with
    (their path and training record). Settings alone let a run resumed after the heads were retrained keep the old
    heads' examples under a config.json naming the new ones."""
    return {"config": meta.get("config", {}), "heads": (meta.get("resolved") or {}).get("heads")}


def makers(out: Path, result_files: dict[str, str] | None = None) -> set[str]:
    """The command that made folder `out`, as its config.json (certify: certify.json) records it; in a folder
    written before that was recorded, the commands whose result file it holds (`result_files`: command -> the file
    it appends to, experiments/commands.py; replay and oracle share one); none: a new folder, or an old one that
    holds no result file, which any command may write as before."""
    for name in (CONFIG, "certify.json"):
        try:
            recorded = json.loads((Path(out) / name).read_text()).get(COMMAND)
        except (OSError, ValueError, AttributeError):     # absent or unreadable: the writer's own check names it
            continue
        if isinstance(recorded, str):
            return {recorded}
    return {c for c, f in (result_files or {}).items() if (Path(out) / f).is_file() and (Path(out) / f).stat().st_size}


def check_command(out: Path, command: str, result_files: dict[str, str] | None = None) -> None:
    """One folder holds one command's results: `run --resume --out <a replay folder>` would append run records
    beside the replay's and overwrite its config.json, and no settings check sees it (the run's own file is not
    there yet). Every command checks its --out here before its model loads, with or without --resume."""
    made = makers(out, result_files)
    if made and command not in made:
        by = " or ".join(f"`bpdbench {c.replace('_', '-')}`" for c in sorted(made))
        raise ValueError(f"{out} holds the results of {by}, not of `bpdbench {command.replace('_', '-')}`; "
                         f"pass a new --out")


def check_prompts(path: Path, prompts: dict[str, str]) -> None:
    """Refuse to resume `path` when an example it holds was decoded from another prompt than its id names now
    (`prompts`: id -> prompt hash): the settings check compares the data file's path, not its content, so an edited
    prompt would keep the old output. Records written before the hash was recorded are kept as before."""
    if not path.is_file():
        return
    changed: list[str] = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            rec = _salvage(line)            # a torn or corrupt line: the writer repairs or names it
        if not isinstance(rec, dict) or not isinstance(rec.get("id"), str):
            continue
        was, now = rec.get(PROMPT_HASH), prompts.get(rec["id"])
        if was and now and was != now and rec["id"] not in changed:
            changed.append(rec["id"])
    if changed:
        more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
        raise ValueError(f"cannot resume {path.parent}: the prompt of example {', '.join(map(repr, changed[:3]))}"
                         f"{more} differs from the one {path.name} recorded (the data changed since); pass a new "
                         f"--out")


def resumable(out: Path, jsonl: str, config: dict, key: Callable[[dict], dict], resume: bool,
              ignore: tuple[str, ...] = (), file: AppendOnlyJsonl | None = None) -> list[dict]:
    """Records an interrupted run in `out` already wrote, when `key` of its config.json equals `key(config)` (fields
    in `ignore`, e.g. limit or threads, may change) and the folder is the same command's. One check for run,
    replay and speed, so every --resume refuses to mix results made with other settings or heads in the same
    words."""
    if config.get(COMMAND):
        check_command(out, config[COMMAND])
    path = out / jsonl
    if not resume or not path.exists():
        return []
    old = json.loads((out / CONFIG).read_text()) if (out / CONFIG).exists() else {}
    changed = _differences(comparable(key(old)), comparable(key(json.loads(json.dumps(config, default=str)))),
                           ignore)     # paths compared portable: a folder recorded with absolute ones still resumes
    if changed:
        raise ValueError(f"cannot resume {out}: its config.json differs in {', '.join(changed)}; "
                         f"pass a new --out or drop --resume")
    if file is not None:
        return file.existing()
    return read_examples(path)


def _differences(a: dict, b: dict, ignore: tuple[str, ...]) -> list[str]:
    """Keys whose values differ, one level deep (`config.dtype`), so the error names what to change."""
    out = []
    for k in sorted(set(a) | set(b)):
        x, y = a.get(k), b.get(k)
        if isinstance(x, dict) and isinstance(y, dict):
            out += [f"{k}.{f}" for f in sorted(set(x) | set(y)) if f not in ignore and x.get(f) != y.get(f)]
        elif k not in ignore and x != y:
            out.append(k)
    return out
