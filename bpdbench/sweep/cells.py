"""What a Ray worker runs: one cell or one artefact, with a bounded retry of exceptions, logged to a file.

Ray retries a task whose worker died (max_retries); an exception inside the task is retried here, in the same
worker, up to `retries` more times, because only this side knows which errors are the user's (a bad setting, missing
data, a lost example) and would fail the same way again. A task that needs another which did not succeed does not
run and says which. Torch threads come from the cell's declared `threads`, through its RunConfig (open_session sets
them); roots come from the task's environment, set by the driver from the grid. Each cell keeps a small state file
beside its log, so an attempt that finds a `running` state from an earlier one reports that it was interrupted.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import time
import traceback
from pathlib import Path
from typing import Callable, Iterator

from .. import paths

OK = ("ok", "finished", "present", "built")


def slug(ident: str) -> str:
    """A task id as one file name: the folder rule (paths.folder_name), its `/` doubled first so that the ids
    `a/b` and `a_b` keep apart, and any character a file name had better not hold as `_`."""
    return re.sub(r"[^\w.+-]", "_", paths.folder_name(ident.replace("/", "__")))


def _user_errors() -> tuple:
    from tasks import DataError
    from ..config import ConfigError
    from ..experiments.certificate import LostExamples
    from ..models import ModelError
    return (LostExamples, ConfigError, DataError, ModelError, FileExistsError, FileNotFoundError, ValueError)


@contextlib.contextmanager
def _logged(state_dir: str, ident: str) -> Iterator[tuple[Callable[[str], None], Path]]:
    """A log file per task under <results>/<state_dir>/logs/; the commands' printed tables go there too."""
    root = paths.results_root() / state_dir
    (root / "logs").mkdir(parents=True, exist_ok=True)
    (root / "cells").mkdir(parents=True, exist_ok=True)
    with open(root / "logs" / f"{slug(ident)}.log", "a", buffering=1) as f:
        def log(message: str) -> None:
            f.write(f"{time.strftime('%H:%M:%S')} {message}\n")
        with contextlib.redirect_stdout(f):
            yield log, root / "cells" / f"{slug(ident)}.json"


def _blocked(ident: str, deps: tuple) -> dict | None:
    failed = [d["id"] for d in deps if d.get("status") not in OK]
    if failed:
        return {"id": ident, "status": "blocked", "error": f"needs {', '.join(failed)}, which did not succeed"}
    return None


def _attempts(ident: str, state: Path, retries: int, log: Callable[[str], None], work: Callable[[], dict]) -> dict:
    """Run `work` up to 1 + retries times; user errors end it at once. The state file records a running attempt,
    so one that finds an earlier `running` state knows its worker died."""
    host, start = socket.gethostname(), time.time()
    earlier = None
    try:
        earlier = json.loads(state.read_text())
    except (OSError, ValueError):
        pass
    interrupted = earlier if earlier and earlier.get("state") == "running" else None
    if interrupted:
        log(f"an earlier attempt on {interrupted.get('host')} (pid {interrupted.get('pid')}) was interrupted; "
            f"resuming")
    result: dict = {"id": ident, "host": host, "interrupted": 1 if interrupted else 0}
    for attempt in range(1, retries + 2):
        state.write_text(json.dumps({"state": "running", "host": host, "pid": os.getpid(), "attempt": attempt,
                                     "started": time.time()}))
        log(f"attempt {attempt} on {host} (pid {os.getpid()})")
        try:
            result.update({"status": "ok", **work(), "attempts": attempt})
            result.pop("error", None)
            break
        except _user_errors() as e:
            log(f"error: {e}")
            result.update(status="failed", error=str(e).splitlines()[0], attempts=attempt)
            break
        except Exception as e:       # noqa: BLE001 -- anything else may be transient: retried, then reported
            log(traceback.format_exc())
            first = str(e).splitlines()[0] if str(e) else ""
            result.update(status="failed", error=f"{type(e).__name__}: {first}", attempts=attempt)
    result["seconds"] = round(time.time() - start, 1)
    state.write_text(json.dumps({"state": result["status"], **{k: v for k, v in result.items() if k != "id"}}))
    log(f"{result['status']} in {result['seconds']}s" + (f": {result['error']}" if result.get("error") else ""))
    return result


def _other_code(ident: str, commit: str | None) -> dict | None:
    """A node running another checkout than the driver's would mix two versions' numbers in one results tree."""
    from ..config import git_commit
    mine = git_commit()
    if commit and "unknown" not in (commit, mine) and mine != commit:
        return {"id": ident, "status": "failed", "host": socket.gethostname(),
                "error": f"this node runs bpdbench at {mine}, the driver at {commit}: install the driver's checkout "
                         f"on every node"}
    return None


def run_cell(cell, retries: int, state_dir: str, commit: str | None, *deps: dict) -> dict:
    """One cell on this worker, running the Plan the driver prepared for it (`cell.plan`: validated, parsed and
    selected there, so nothing is again here). `commit`: the driver's git commit (None: unchecked). `deps`: the
    results of the artefacts and tune cells it needs (Ray passes them in once they are done, which is how the cell
    waits)."""
    import torch
    from . import commands
    blocked = _other_code(cell.id, commit) or _blocked(cell.id, deps)
    if blocked:
        return blocked
    torch.set_num_threads(cell.threads)        # the commands set it again from the cell's RunConfig (the same)
    if commands.finished(cell, paths.results_root()):      # e.g. finished since the driver looked
        return {"id": cell.id, "status": "finished"}
    with _logged(state_dir, cell.id) as (log, state):
        log(f"{cell.command} {cell.id}: threads {cell.threads}, gpus {cell.gpus}, results {paths.results_root()}")
        return _attempts(cell.id, state, retries, log, lambda: commands.execute(cell, log))


def run_artefact(artefact, auto_train: bool, threads: int, retries: int, state_dir: str, commit: str | None,
                 *deps: dict) -> dict:
    """Build one artefact (model cache, heads, n-gram, neural LM) unless it is there."""
    import torch
    from ..artefacts.graph import build
    from ..experiments.session import register_builders
    register_builders()
    blocked = _other_code(artefact.id, commit) or _blocked(artefact.id, deps)
    if blocked:
        return blocked
    torch.set_num_threads(threads)
    with _logged(state_dir, artefact.id) as (log, state):
        def work() -> dict:
            done = build(artefact, auto_train, log)
            return {"status": done}
        return _attempts(artefact.id, state, retries, log, work)
