"""Tables of the trained drafters, from result files only, all under `results/drafters/`: training reports
(`training/*.json`, written by `bpdbench train-drafter`), replays (`replay/<task>/replay.csv`: block efficiency and
draft repetition, `bpdbench replay --out results/drafters/replay/<task>`) and float32 certificates (`runs/*/
summary.csv`, `bpdbench run --dtype float32 --out results/drafters/runs/...`). Drafting cost per step is in the
speed tables (`results/speed/<task>/speed.csv`: draft_ms_per_step, draft_vs_ar_step)."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ..methods.registry import REGISTRY, canonical


def is_drafter(method: str) -> bool:
    """A trained drafter's label (eagle, hydra:tree=4, koala:base=hydra, ...), or bpd (the Medusa-1 baseline)."""
    name = canonical(method).split(":")[0]
    return name in REGISTRY and REGISTRY[name].family == "drafter"


def training_table(results: Path) -> pd.DataFrame:
    rows = []
    for path in sorted((results / "drafters" / "training").glob("*.json")):
        r = json.loads(path.read_text())
        held, fit = r.get("heldout", {}), r.get("fit", {})
        row = {"drafter": r.get("name"), "profile": r.get("profile"), "type": r.get("drafter"),
               "trainable_parameters": r.get("trainable_parameters"), "shortlist": r.get("shortlist"),
               "steps": fit.get("steps"), "fit_cpu_seconds": fit.get("fit_cpu_seconds"),
               "seconds": r.get("seconds"), "seconds_with_data": r.get("seconds_with_data"),
               "load_start": (r.get("load_average") or {}).get("start"),
               "greedy_positions": (r.get("data") or {}).get("greedy_positions"),
               "expected_tokens_per_step": held.get("expected_tokens_per_step")}
        row.update({f"top1_d{i + 1}": v for i, v in enumerate(held.get("top1", []))})
        row.update({f"top16_d{i + 1}": v for i, v in enumerate(held.get("top16", []))})
        rows.append(row)
    return pd.DataFrame(rows)


def collect_replays(results: Path) -> pd.DataFrame:
    """Every `replay/<dir>/replay.csv` under results/drafters, with the training profile its drafters were read at
    (the run's --heads-profile, from its config.json): quick and full drafters replayed on the same task are
    different rows, never averaged together."""
    frames = []
    for path in sorted((results / "drafters" / "replay").glob("*/replay.csv")):
        df = pd.read_csv(path)
        config = path.parent / "config.json"
        profile = json.loads(config.read_text())["config"].get("heads_profile") if config.exists() else None
        frames.append(df.assign(profile=profile or "quick"))
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if "method" in df:
        df["method"] = df.method.map(canonical)
    return df


def efficiency_table(replay: pd.DataFrame) -> pd.DataFrame:
    """Block efficiency per task and profile (rows) and drafter spelling (columns), with bpd (Medusa-1 heads of the
    same profile) beside them."""
    if replay.empty:
        return replay
    keep = _profiled(replay[replay.method.map(is_drafter) | (replay.method == "bpd")])
    if keep.empty:
        return keep
    wide = keep.pivot_table(index=["task", "profile"], columns="method", values="block_efficiency", aggfunc="last")
    n = keep.groupby(["task", "profile"]).n_examples.max()
    return wide.round(3).assign(n_examples=n).reset_index()


def _profiled(df: pd.DataFrame) -> pd.DataFrame:
    return df if "profile" in df else df.assign(profile="quick")


def certificate_table(runs: pd.DataFrame) -> pd.DataFrame:
    """float32 runs of drafters: lossless_rate (1.0 required) per task and method."""
    if runs.empty or "method" not in runs:
        return pd.DataFrame()
    keep = runs[runs.method.map(is_drafter) & (runs.dtype == "float32")]
    cols = [c for c in ("task", "method", "n_examples", "new_tokens", "block_efficiency", "lossless_rate",
                        "n_exact", "n_near_tie", "n_lost") if c in keep]
    return keep[cols].reset_index(drop=True)


def repetition_table(replay: pd.DataFrame) -> pd.DataFrame:
    """Share of adjacent identical tokens in each method's drafts (first path per step), beside the greedy text's
    own share: drafts that repeat more than the text does waste verified tokens (the paper's repetition analysis)."""
    if replay.empty or "draft_repeat_share" not in replay:
        return pd.DataFrame()
    keep = replay[replay.method.map(is_drafter) | (replay.method == "bpd")].dropna(subset=["draft_repeat_share"])
    keep = _profiled(keep)
    if keep.empty:
        return keep
    wide = keep.pivot_table(index=["task", "profile"], columns="method", values="draft_repeat_share",
                            aggfunc="last")
    text = keep.groupby(["task", "profile"]).text_repeat_share.last()
    return wide.round(4).assign(greedy_text=text.round(4)).reset_index()
