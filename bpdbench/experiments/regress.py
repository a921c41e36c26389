"""`bpdbench regress`: re-run a small fixed grid and compare with a committed baseline (CI regression of numbers).

The grid is deterministic: float32, fixed examples, heads trained by the `ci` profile (fixed seed and step count).
Block efficiency must stay within an absolute tolerance and every lossless_rate must be 1.0. `run`'s speedups are
printed and only checked against a wide factor; the speed check that can fail on any machine is regress_speed.py
(time and engine efficiency from a `speed` run with this machine's calibration). `--update` rewrites the baseline.
"""
from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

from ..config import RunConfig, environment
from ..store import read_json
from .execute import execute
from .plan import prepare

GRID = {"tasks": {"xsum": 3, "squad": 3, "mt_bench": 3}, "methods": ["bpd", "16best-0gram", "medusa"],
        "max_new_tokens": 24, "dtype": "float32", "heads_profile": "ci", "threads": 2}
TOLERANCE = {"block_efficiency_abs": 0.05, "speedup_factor": 3.0}


def run_grid(grid: dict, log=print) -> dict[str, dict]:
    """A private greedy cache: each task's first method times its own AR reference, so speedups are measured the
    same way on a fresh CI machine and on a machine whose cache already holds these prompts."""
    with tempfile.TemporaryDirectory() as tmp:
        return _grid(grid, tmp, log)


def _grid(grid: dict, tmp: str, log) -> dict[str, dict]:
    out = {}
    for task, limit in grid["tasks"].items():
        for method in grid["methods"]:
            cfg = RunConfig(task=task, limit=limit, max_new_tokens=grid["max_new_tokens"], dtype=grid["dtype"],
                            heads_profile=grid["heads_profile"], threads=grid["threads"],
                            method=method, out=f"{tmp}/{task}-{method}", greedy_dir=f"{tmp}/greedy")
            row = execute(prepare(cfg, "run", log=log), log=log)
            out[f"{task}/{method}"] = {k: row.get(k) for k in ("block_efficiency", "lossless_rate", "new_tokens",
                                                                  "serial_calls", "speedup_vs_ar")}
            sp = row.get("speedup_vs_ar")
            timing = f"speedup vs AR {sp:.2f}" if _measured(sp) else "speedup not timed (AR reference reused)"
            log(f"{task}/{method}: block efficiency {row['block_efficiency']:.4f}, lossless "
                f"{row['lossless_rate']:.2f}, {timing}")
    return out


def compare(baseline: dict, current: dict) -> list[str]:
    """Human-readable failures; empty when the numbers hold."""
    tol = baseline.get("tolerance", TOLERANCE)
    failures = []
    for key, base in baseline["results"].items():
        cur = current.get(key)
        if cur is None:
            failures.append(f"{key}: missing from the current run")
            continue
        if cur["lossless_rate"] != 1.0:
            failures.append(f"{key}: lossless_rate {cur['lossless_rate']} < 1.0")
        diff = cur["block_efficiency"] - base["block_efficiency"]
        if abs(diff) > tol["block_efficiency_abs"]:
            failures.append(f"{key}: block efficiency {cur['block_efficiency']:.4f} vs baseline "
                            f"{base['block_efficiency']:.4f} (diff {diff:+.4f} > {tol['block_efficiency_abs']})")
        b, c = base.get("speedup_vs_ar"), cur.get("speedup_vs_ar")
        if not (_measured(b) and _measured(c)):  # no speedup when the greedy reference came from the cache
            continue
        if not (b / tol["speedup_factor"] <= c <= b * tol["speedup_factor"]):
            failures.append(f"{key}: speedup {c:.2f} outside [{b / tol['speedup_factor']:.2f}, "
                            f"{b * tol['speedup_factor']:.2f}]")
    return failures


def _measured(x) -> bool:
    return isinstance(x, (int, float)) and x > 0 and not math.isnan(x)


def same_machine(saved_env: dict, machine: str, grid: dict) -> tuple[bool, str]:
    """Absolute speedups mean something only on the machine *and* kernels that made the baseline: the same CPU with
    oneDNN's packed linear verifies 16 tokens in 2.2 steps instead of 2.5, which moves every speedup."""
    from ..config import _linear
    if saved_env.get("fingerprint") != machine:
        return False, f"fingerprint {machine}, baseline {saved_env.get('fingerprint')}"
    linear = _linear(grid["dtype"], "cpu", grid["threads"]) or "torch"
    base_linear = saved_env.get("linear") or "torch"
    if linear != base_linear:
        return False, f"{machine}, but linear kernel {linear} where the baseline used {base_linear}"
    return True, f"{machine}, linear kernel {linear}"


def read_baseline(path: Path) -> dict:
    """The baseline, checked before the grid runs (minutes of decoding): bad JSON, a missing grid or results, or a
    number that is none is one line naming the file and what is wrong, not a KeyError after the last run."""
    fix = f"restore it (git checkout {path}) or write a new one with `bpdbench regress --update --baseline {path}`"
    saved = read_json(path, "--baseline", "baseline", "results/baseline.json", fix)
    grid, results = (saved.get("grid"), saved.get("results")) if isinstance(saved, dict) else (None, None)
    if not isinstance(grid, dict) or not isinstance(results, dict):
        raise ValueError(f"baseline {path} has no `grid` and `results` objects; {fix}")
    lacking = [k for k in GRID if k not in grid]
    if lacking or not isinstance(grid["tasks"], dict):
        what = f"no {', '.join(lacking)}" if lacking else "a `tasks` that is no {task: examples} object"
        raise ValueError(f"baseline {path}: its grid has {what}; {fix}")
    for key, row in results.items():
        bad = [f for f in ("block_efficiency", "lossless_rate") if not isinstance(row, dict) or isinstance(
            row.get(f), bool) or not isinstance(row.get(f), (int, float))]
        if bad:
            raise ValueError(f"baseline {path}: results.{key} has no number {', '.join(bad)}; {fix}")
    return saved


def regress(baseline_path: Path, update: bool = False, log=print) -> list[str]:
    """Block efficiency and losslessness of the grid, then (grids that have one) the speed check of
    regress_speed.py: efficiencies on any machine, absolute speedups on the baseline's own machine."""
    from . import regress_speed
    from ..hardware.fingerprint import current as fingerprint
    saved = read_baseline(baseline_path) if baseline_path.exists() and not update else None
    grid = saved["grid"] if saved else {**GRID, "speed": regress_speed.GRID}
    current = run_grid({k: v for k, v in grid.items() if k != "speed"}, log)
    machine = fingerprint(grid["threads"]).key()
    same, why = same_machine(saved.get("environment", {}), machine, grid) if saved else (False, "")
    base = saved.get("speed") if saved else None
    check = (lambda cur: regress_speed.compare(base, cur, same, saved.get("speed_tolerance"))) if base else None
    speed = regress_speed.measure(grid["speed"], log, check=check) if "speed" in grid else None
    if update:
        import torch
        baseline_path.parent.mkdir(parents=True, exist_ok=True)
        baseline_path.write_text(json.dumps({"grid": grid, "tolerance": TOLERANCE, "results": current,
                                             "speed": speed, "speed_tolerance": regress_speed.TOLERANCE,
                                             "environment": environment(torch.get_num_threads(), "cpu",
                                                                        grid["dtype"])}, indent=2) + "\n")
        return []
    failures = compare(saved, current)
    if speed is not None and base:
        log(f"speed: baseline machine {'matches' if same else 'differs'} ({why}): absolute speedups "
            f"{'compared' if same else 'not compared'}, efficiencies compared")
        failures += regress_speed.compare(base, speed, same, saved.get("speed_tolerance"))
    return failures


def check(baseline: Path, update: bool, log=print) -> list[str]:
    """`bpdbench regress`: the failures, each said on its own line (none: the check passed)."""
    if not update and not baseline.exists():
        raise FileNotFoundError(f"no baseline at {baseline}; create it with `bpdbench regress --update`")
    failures = regress(baseline, update, log=log)
    if update:
        log(f"baseline written to {baseline}")
    for f in failures:
        log(f"REGRESSION {f}")
    if not update and not failures:
        log("regression check passed")
    return failures
