"""One function per CLI command: config in, result files out, a Markdown table on stdout."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..config import ConfigError, RunConfig
from ..store import OutputLock
from .summary import to_markdown
from . import analysis, regress as regress_lib, replay as replay_lib, speed as speed_lib
from .session import Log, open_session, out_dir, resolve_methods


def oracle(cfg: RunConfig, k: int, resume: bool, log: Log) -> pd.DataFrame:
    ks = tuple(sorted({x for x in replay_lib.KS if x <= k} | {k}))
    with OutputLock(out_dir(cfg, "oracle")):          # one writer per folder, before the model loads
        s = open_session(cfg, log)
        df = replay_lib.oracle_table(s, out_dir(cfg, "oracle"), ks=ks, resume=resume)
    print(to_markdown(df))
    return df


def analyze(cfg: RunConfig, log: Log) -> dict:
    with OutputLock(out_dir(cfg, "analysis")):
        s = open_session(cfg, log)
        res = analysis.analyze(s, out_dir(cfg, "analysis"))
    print(to_markdown(res["repetition"]))
    print(to_markdown(res["entropy"]))
    return res


def replay(cfg: RunConfig, methods: str, resume: bool, log: Log,
           per_category: int | None = None) -> pd.DataFrame:
    if not cfg.sampling.greedy:
        raise ConfigError(f"replay walks each method along the greedy reference, but at --temperature "
                          f"{cfg.temperature:g} the trajectory depends on the draws, so there is none to replay; "
                          f"decode for real with `bpdbench run --temperature {cfg.temperature:g} --method M`")
    chosen = resolve_methods(methods)
    external = [m.label for m in chosen if m.spec.external]
    if external:
        raise ValueError(f"{', '.join(external)} run transformers' own loop and cannot be replayed; "
                         f"time them with `bpdbench speed`")
    with OutputLock(out_dir(cfg, "replay")):
        s = open_session(cfg, log, methods=chosen, per_category=per_category)
        df = replay_lib.replay_methods(s, chosen, out_dir(cfg, "replay"), resume=resume, per_category=per_category)
    print(to_markdown(df))
    return df


def tune(cfg: RunConfig, rescorer: str, log: Log) -> dict:
    resolve_methods(rescorer)
    s = open_session(cfg, log, heldout=True)
    res = analysis.tune(s, rescorer)
    log(f"{cfg.task}/{rescorer}: alpha = {res['alpha']} on {res['n_examples']} held-out examples "
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


def speed(cfg: RunConfig, methods: str, repeats: int, assistant: str | None, per_category: int | None,
          resume: bool, log: Log) -> Path:
    if assistant:
        methods = ",".join(f"hf-assisted:assistant={assistant}" if m == "hf-assisted" else m
                           for m in methods.split(","))
    out = speed_lib.run(cfg, methods, repeats, per_category, log=log, resume=resume)
    print(to_markdown(pd.read_csv(out / "speed.csv")))
    if (out / "speed_by_category.csv").exists():
        print(to_markdown(pd.read_csv(out / "speed_by_category.csv")))
    log(f"results in {out}")
    return out
