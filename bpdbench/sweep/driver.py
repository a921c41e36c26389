"""The driver: which cells are left, Ray tasks for them and their artefacts, progress, the sweep report.

Ray schedules: every task is submitted at once with its declared resources (num_cpus = the cell's torch threads,
num_gpus = its GPUs), its cell (carrying the Plan grid.load prepared, so the worker plans nothing again) and the
results of the tasks it needs as arguments, so Ray starts it when they are done and a CPU is free. The driver only waits, prints progress with an ETA, and writes <results>/sweep/<name>/report.json. A
cell that still fails after its retries is listed there and makes the sweep exit non-zero once the others finish.
"""
from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Callable

from ..artefacts.graph import KINDS, describe
from ..paths import portable_tree
from ..config import ConfigError
from ..store import write_atomic
from . import commands
from .cells import OK, run_artefact, run_cell
from .grid import SweepPlan

Log = Callable[[str], None]
ADDRESS = re.compile(r"^(local|auto|ray://\S+|[\w.-]+:\d+)$")


def check_address(address: str) -> None:
    if not ADDRESS.match(address):
        raise ConfigError(f"--address {address!r}: use local (a Ray instance started here), auto (the cluster this "
                          f"machine joined with `ray start`) or ray://<head>:10001")


def status(plan: SweepPlan) -> tuple[list, list]:
    """(cells left to run, cells finished earlier), from the results tree as the driver sees it."""
    todo, done = [], []
    for c in plan.cells:
        (done if commands.finished(c, plan.results) else todo).append(c)
    return todo, done


def show(plan: SweepPlan, out: Callable[[str], None] = print) -> None:
    """`--dry-run`: the plan, what is finished, what each cell waits for; nothing runs."""
    todo, done = status(plan)
    needed = _needed(plan, todo)
    out(f"{plan.grid}: {len(plan.cells)} cells ({len(done)} finished, {len(todo)} to run), {len(needed)} artefacts "
        f"to check; results {plan.results}; cache {plan.cache or 'each worker default'}; data "
        f"{plan.data or 'each worker default'}; retries {plan.retries}")
    for a in needed:
        out(f"  artefact {a.id}: {describe(a)}" + (f"  after {', '.join(a.needs)}" if a.needs else ""))
    for c in plan.cells:
        state = "finished" if c in done else "to run  "
        what = c.options.get("methods") or c.config.method if c.spec.methods != "fixed" else ""
        waits = [n for n in c.needs if n in {a.id for a in needed} or n in {t.id for t in todo}]
        out(f"  {state} {c.command:9s} {c.id}  limit {c.config.limit}, {c.threads} thread(s)"
            + (f", {c.gpus:g} GPU" if c.gpus else "") + (f"  [{what}]" if what else "")
            + (f"  after {', '.join(waits)}" if waits and c in todo else ""))


def _needed(plan: SweepPlan, todo: list) -> list:
    """Artefacts the cells left to run need, with the artefacts those are built from."""
    want = {n for c in todo for n in c.needs}
    if not plan.cells:          # a grid of trainings alone ([[train]]): they are what it asks for
        want = {a.id for a in plan.artefacts if a.kind == "network"}
    by_id = {a.id: a for a in plan.artefacts}
    for a in reversed(plan.artefacts):
        if a.id in want:
            want.update(a.needs)
    return [a for a in plan.artefacts if a.id in want and a.id in by_id]


def connect(address: str, cpus: int | None, log: Log):
    try:
        import ray
    except ModuleNotFoundError:
        raise ConfigError("bpdbench sweep needs Ray: pip install 'bpdbench[sweep]' (make install does)") from None
    t = time.time()
    try:
        if address == "local":     # cells at the priority of the command they replace: Ray would nice them to 15
            ray.init(num_cpus=cpus or os.cpu_count(), include_dashboard=False, log_to_driver=False,
                     object_store_memory=256 << 20, _system_config={"worker_niceness": 0})
        else:
            ray.init(address=address, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise ConfigError(f"cannot start or reach Ray at --address {address}: {str(e).splitlines()[0]}; on a "
                          f"cluster, run `ray start` on this machine first (docs/sweeps.md)") from None
    res = ray.cluster_resources()
    log(f"ray {ray.__version__} at {address}: {len(ray.nodes())} node(s), {res.get('CPU', 0):g} CPUs, "
        f"{res.get('GPU', 0):g} GPUs (connected in {time.time() - t:.1f}s)")
    return ray


def _check_fits(ray, plan: SweepPlan, todo: list, log: Log) -> None:
    """A cell no node can hold would wait forever: say so now."""
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    cpus = max((n.get("CPU", 0) for n in nodes), default=0)
    gpus = max((n.get("GPU", 0) for n in nodes), default=0)
    for c in todo:
        if c.threads > cpus or c.gpus > gpus:
            raise ConfigError(f"{c.id} asks for {c.threads} CPU(s) and {c.gpus:g} GPU(s) but the largest node has "
                              f"{cpus:g} and {gpus:g}; lower threads/gpus in {plan.grid} or pass --threads")
    if len(nodes) > 1 and not plan.cache:
        log(f"warning: {len(nodes)} nodes and no cache in {plan.grid}: a node whose own cache lacks an artefact "
            f"builds it on first use; set cache to a shared path (docs/sweeps.md)")


def run(plan: SweepPlan, address: str = "local", cpus: int | None = None, log: Log = print) -> dict:
    """Run what is left of the plan; returns the report (also written to <results>/sweep/<name>/report.json)."""
    check_address(address)
    todo, done = status(plan)
    report = {"grid": str(plan.grid), "name": plan.name, "address": address, "results": str(plan.results),
              "cache": plan.cache, "data": plan.data, "started": time.strftime("%Y-%m-%d %H:%M:%S"),
              "cells": [_earlier(c, plan) for c in done],
              "artefacts": []}
    t0 = time.time()
    if not todo and plan.cells:
        log(f"nothing to do: all {len(done)} cells of {plan.grid} are finished in {plan.results}")
        return _finish(plan, report, t0, log, ran=False)
    log(f"{len(todo)} of {len(plan.cells)} cells to run ({len(done)} finished earlier); results {plan.results}")
    ray = connect(address, cpus, log)
    try:
        _check_fits(ray, plan, todo, log)
        refs = _submit(ray, plan, todo)
        _wait(ray, refs, report, len(todo), log)
    except KeyboardInterrupt:
        report["interrupted"] = True
        log("interrupted: finished cells and examples are kept; run the same sweep again to continue")
        _finish(plan, report, t0, log, ran=True)
        raise
    finally:
        ray.shutdown()
    return _finish(plan, report, t0, log, ran=True)


def _earlier(c, plan: SweepPlan) -> dict:
    lost = commands.lost(c, plan.results)
    return {"id": c.id, "command": c.command, "status": "finished", "earlier": True, **({"lost": lost} if lost else {})}


def _submit(ray, plan: SweepPlan, todo: list) -> dict:
    """Every task at once: artefacts in build order, tune cells, then the rest; a task's needs are its arguments."""
    env = {"env_vars": plan.env()}
    state = f"sweep/{plan.name}"
    from ..config import git_commit
    commit = git_commit()
    threads = max((c.threads for c in todo), default=os.cpu_count() or 1)    # trainings alone: every core
    auto_train = all(c.config.auto_train for c in plan.cells)
    art = ray.remote(run_artefact)
    cell = ray.remote(run_cell)
    refs: dict = {}
    by_id: dict = {}
    for a in _needed(plan, todo):
        ref = art.options(num_cpus=threads, num_gpus=KINDS[a.kind].gpus(a), max_retries=plan.retries,
                          retry_exceptions=False, runtime_env=env,
                          name=a.id).remote(a, auto_train, threads, plan.retries, state, commit,
                                            *[by_id[n] for n in a.needs if n in by_id])
        refs[ref], by_id[a.id] = ("artefact", a), ref
    for c in sorted(todo, key=lambda c: c.spec.writes_folder):       # tune cells first: others read their alpha
        ref = cell.options(num_cpus=c.threads, num_gpus=c.gpus, max_retries=plan.retries, retry_exceptions=False,
                           runtime_env=env, name=c.id).remote(c, plan.retries, state, commit,
                                                              *[by_id[n] for n in c.needs if n in by_id])
        refs[ref], by_id[c.id] = ("cell", c), ref
    return refs


def _eta(seconds: float) -> str:
    m = int(seconds // 60)
    return f"{m // 60}h{m % 60:02d}m" if m >= 60 else f"{m}m{int(seconds % 60):02d}s"


def _wait(ray, refs: dict, report: dict, total: int, log: Log) -> None:
    pending, t0, n = list(refs), time.time(), 0
    while pending:
        ready, pending = ray.wait(pending, num_returns=1, timeout=60)
        if not ready:
            running = sum(1 for r in pending if refs[r][0] == "cell")
            log(f"[{n}/{total}] {running} cell(s) waiting or running, {_eta(time.time() - t0)} elapsed")
            continue
        for ref in ready:
            task, item = refs[ref]
            try:
                res = ray.get(ref)
            except Exception as e:          # noqa: BLE001 -- a worker that died beyond its retries, a lost node
                res = {"id": item.id, "status": "failed", "error": f"{type(e).__name__}: "
                       f"{(str(e).strip().splitlines() or [''])[-1][:300]}"}
            if task == "artefact":
                res = {"kind": item.kind, **res}
                report["artefacts"].append(res)
                log(f"artefact {item.id}: {res['status']}" + _tail(res))
                continue
            n += 1
            res = {"command": item.command, **res}
            report["cells"].append(res)
            left = total - n
            eta = f", ETA {_eta((time.time() - t0) / n * left)}" if left else ""
            log(f"[{n}/{total}] {res['status']:8s} {item.id}" + _tail(res) + eta)


def _tail(res: dict) -> str:
    parts = []
    if res.get("seconds") is not None:
        parts.append(f"{res['seconds']:.0f}s")
    if res.get("host"):
        parts.append(f"on {res['host']}")
    if res.get("attempts", 1) > 1 or res.get("interrupted"):
        parts.append(f"attempt {res.get('attempts')}" + (", resumed an interrupted attempt" if res.get("interrupted")
                                                          else ""))
    if res.get("error"):
        parts.append(f"error: {res['error']}")
    return (" (" + "; ".join(parts) + ")") if parts else ""


def _finish(plan: SweepPlan, report: dict, t0: float, log: Log, ran: bool) -> dict:
    cells = report["cells"]
    counts: dict = {}
    for c in cells + report["artefacts"]:
        counts[c["status"]] = counts.get(c["status"], 0) + 1
    failed = [c for c in cells + report["artefacts"] if c["status"] not in OK]
    lost = [c for c in cells if c.get("lost")]
    report.update(seconds=round(time.time() - t0, 1), counts=counts, failed=[c["id"] for c in failed],
                  lost=[c["id"] for c in lost])
    if plan.tables and ran and not failed and not report.get("interrupted"):
        from ..report.tables import build
        report["tables"] = [str(p) for p in build(plan.results)]
        log(f"tables: {len(report['tables'])} files under {plan.results / 'tables'}")
    path = plan.results / "sweep" / plan.name / "report.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(portable_tree(json.loads(json.dumps(report, default=str))), indent=2) + "\n")
    summary = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    log(f"sweep {plan.name}: {summary} in {_eta(report['seconds'])}; report {path}")
    for c in failed:
        log(f"FAILED {c['id']}: {c.get('error', c['status'])}")
    for c in lost:
        log(f"LOST {c['id']}: {c['lost']} example(s) differ from greedy beyond numerical noise")
    return report


def exit_code(report: dict) -> int:
    return 1 if report["failed"] or report["lost"] else 0


def load_report(results: Path, name: str) -> dict:
    return json.loads((results / "sweep" / name / "report.json").read_text())
