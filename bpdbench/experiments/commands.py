"""One function per CLI command: config in, result files out, a table on stdout (replay: terminal.py's)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..store import OutputLock, read_table
from .summary import to_markdown
from .terminal import replay_table, show
from . import analysis, regress as regress_lib, replay as replay_lib, speed as speed_lib
from .plan import Plan
from .session import Log, open_session


def oracle(plan: Plan, k: int, log: Log) -> pd.DataFrame:
    ks = tuple(sorted({x for x in replay_lib.KS if x <= k} | {k}))
    with OutputLock(plan.out) as lock:  # one writer per folder, before the model loads
        s = open_session(plan, log)
        df = replay_lib.oracle_table(s, plan.out, ks=ks, resume=plan.resume, lock=lock)
    print(to_markdown(df))
    return df


def analyze(plan: Plan, log: Log) -> dict:
    with OutputLock(plan.out):
        s = open_session(plan, log)
        res = analysis.analyze(s, plan.out)
    print(to_markdown(res["repetition"]))
    print(to_markdown(res["entropy"]))
    return res


def replay(plan: Plan, log: Log) -> pd.DataFrame:
    with OutputLock(plan.out) as lock:
        s = open_session(plan, log)
        df = replay_lib.replay_methods(s, list(plan.methods), plan.out, resume=plan.resume,
                                       per_category=plan.per_category, lock=lock)
    show(replay_table(df), f"replayed on greedy trajectories (outputs greedy's by construction, not timed); every "
         f"column in {plan.out / 'replay.csv'}")
    return df


def tune(plan: Plan, log: Log) -> dict:
    s = open_session(plan, log)
    rescorer = plan.method.label
    res = analysis.tune(s, rescorer)
    log(f"{plan.cfg.task}/{rescorer}: alpha = {res['alpha']} on {res['n_examples']} tune-split examples "
        f"(stored in {res['file']})")
    return res


def regress(baseline: Path, update: bool, log: Log) -> list[str]:
    if not update and not baseline.exists():
        raise FileNotFoundError(f"no baseline at {baseline}; create it with `bpdbench regress --update`")
    failures = regress_lib.regress(baseline, update, log=log)
    if update:
        log(f"baseline written to {baseline}")
    for f in failures:
        log(f"REGRESSION {f}")
    if not update and not failures:
        log("regression check passed")
    return failures


def speed(plan: Plan, repeats: int, log: Log) -> Path:
    out = speed_lib.run(plan, repeats, log=log)
    print(to_markdown(read_table(out / "speed.csv")))
    if (out / "speed_by_category.csv").exists():
        print(to_markdown(read_table(out / "speed_by_category.csv")))
    log(f"results in {out}")
    return out
