"""Tables of the draft networks, from result files only, all under `results/drafters/`: training reports
(`training/*.json`, written by `bpdbench train-network`), replays (`replay/<task>/replay.csv`: block efficiency and
draft repetition, `bpdbench replay --out results/drafters/replay/<task>`) and float32 certificates (`runs/*/
summary.csv`, `bpdbench run --dtype float32 --out results/drafters/runs/...`). Drafting cost per step is in the
speed tables (`results/speed/<task>/speed.csv`: draft_ms_per_step, draft_vs_ar_step)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..methods import contract
from ..methods.base import Method
from . import load


def is_network(method: Method) -> bool:
    """A draft network (eagle, hydra:tree=4, koala:base=hydra, ...); the tables set bpd (the Medusa-1 baseline)
    beside them by its label."""
    return contract.Kind.NETWORK in contract.kinds(method) and not contract.inner(method)  # sam:fallback=hydra is not


def training_table(results: Path) -> pd.DataFrame:
    rows = []
    for r in load.reports(results, "drafters/training"):
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


SEQUENTIAL = ("unrolled", "prefix")     # objectives whose fit samples are whole sequences (train/objectives.py)


def _positions_per_sample(r: dict) -> float | None:
    """Positions one fit sample covers: recorded by newer trainings; for older reports a sequence's mean length where
    the objective trains on sequences (EAGLE, Hydra++), else one row."""
    if r.get("positions_per_sample"):
        return float(r["positions_per_sample"])
    data, family = r.get("data") or {}, r.get("family") or {}
    # older reports name no objective: their sequential fits batch a few sequences (8), positional ones 512 rows
    objective = family.get("objective") or ("unrolled" if (r.get("fit_config") or {}).get("batch", 512) < 64
                                            else "positional")
    if objective not in SEQUENTIAL:
        return 1.0
    rows, seqs = data.get("rows"), data.get("sequences")
    return rows / seqs if rows and seqs else None


def learning_curve(results: Path) -> pd.DataFrame:
    """Held-out top-1 at depth 1 against the positions the fit had seen, per trained network and profile: each
    checkpoint the training recorded (newer trainings record it) and the weights it kept (the report's held-out
    numbers). Why: a trained row measures its method only where its curve has flattened; before that it measures
    its training budget. `distinct_positions`: the greedy positions in its data (what a second epoch repeats)."""
    rows = []
    for r in load.reports(results, "drafters/training"):
        fit, data = r.get("fit") or {}, r.get("data") or {}
        batch, per = (r.get("fit_config") or {}).get("batch"), _positions_per_sample(r)
        base = {"network": r.get("name"), "profile": r.get("profile"),
                "distinct_positions": data.get("greedy_positions") or data.get("positions")}

        def seen(samples: float | None) -> float | None:
            return round(samples * per) if samples is not None and per else None
        for c in fit.get("validation") or []:
            if c.get("heldout_top1"):
                samples = c.get("samples_seen", c["step"] * batch if batch else None)
                rows.append(base | {"point": "checkpoint", "step": c["step"], "positions_seen": seen(samples),
                                    "top1_d1": c["heldout_top1"][0]})
        top1 = (r.get("heldout") or {}).get("top1")
        kept = fit.get("kept_step", fit.get("steps"))
        if top1:
            rows.append(base | {"point": "kept", "step": kept,
                                "positions_seen": seen(kept * batch if kept is not None and batch else None),
                                "top1_d1": top1[0]})
    return pd.DataFrame(rows)


def collect_replays(results: Path) -> load.Rows:
    """Every `replay/<dir>/replay.csv` under results/drafters, with the training profile its drafters were read at
    (the run's --heads-profile, from its config.json; quick where none is recorded): quick and full drafters
    replayed on the same task are different rows, never averaged together."""
    return load.rows(results, "drafters/replay", "replay.csv",
                     per_folder=lambda f, df: df.assign(profile=f.heads_profile or "quick"))


def efficiency_table(replay: load.Rows) -> pd.DataFrame:
    """Block efficiency per task and profile (rows) and drafter spelling (columns), with bpd (Medusa-1 heads of the
    same profile) beside them."""
    if replay.empty:
        return replay.frame
    keep = _profiled(replay.frame[replay.where(is_network) | (replay.frame.method == "bpd")])
    if keep.empty:
        return keep
    wide = keep.pivot_table(index=["task", "profile"], columns="method", values="block_efficiency", aggfunc="last")
    n = keep.groupby(["task", "profile"]).n_examples.max()
    return wide.round(3).assign(n_examples=n).reset_index()


def _profiled(df: pd.DataFrame) -> pd.DataFrame:
    return df if "profile" in df else df.assign(profile="quick")


def certificate_table(runs: load.Rows) -> pd.DataFrame:
    """float32 runs of drafters: lossless_rate (1.0 required) per task and method."""
    if runs.empty or "method" not in runs.frame:
        return pd.DataFrame()
    keep = runs.frame[runs.where(is_network) & (runs.frame.dtype == "float32")]
    cols = [c for c in ("task", "method", "n_examples", "new_tokens", "block_efficiency", "lossless_rate",
                        "n_exact", "n_near_tie", "n_lost") if c in keep]
    return keep[cols].reset_index(drop=True)


def repetition_table(replay: load.Rows) -> pd.DataFrame:
    """Share of adjacent identical tokens in each method's drafts (first path per step), beside the greedy text's
    own share: drafts that repeat more than the text does waste verified tokens (the paper's repetition analysis)."""
    if replay.empty or "draft_repeat_share" not in replay.frame:
        return pd.DataFrame()
    keep = replay.frame[replay.where(is_network) | (replay.frame.method == "bpd")]
    keep = keep.dropna(subset=["draft_repeat_share"])
    keep = _profiled(keep)
    if keep.empty:
        return keep
    wide = keep.pivot_table(index=["task", "profile"], columns="method", values="draft_repeat_share",
                            aggfunc="last")
    text = keep.groupby(["task", "profile"]).text_repeat_share.last()
    return wide.round(4).assign(greedy_text=text.round(4)).reset_index()
