"""The numbers of `bpdbench speed`: ratios of sums over the prompts where a method reproduced its baseline.

Why its own module: the board's conventions live here once, for speed.csv and every table read from it.
- speedup: sum of AR's median seconds / the method's, end to end (prefill included);
- decode speedup: the same with each prompt's prefill seconds taken out (every method pays the prefill alike, so
  a long RAG prompt no longer dilutes what drafting changes);
- #MAT (`mat`): Spec-Bench's mean accepted tokens per verify step, decode steps only, bonus included:
  1 + accepted draft tokens / verify steps, so 1 + sum(a_j) = mat on the same counters; block efficiency instead
  counts the prefill call (tokens / serial calls);
- intervals: 95% bootstrap over questions (a question's turns resampled together), paired: each resample sums
  AR's and the method's seconds over the same questions.
"""
from __future__ import annotations

import pandas as pd

from ..stats import bootstrap_ratio
from . import drift, prediction


def summarize(records: list[dict], keys: tuple[str, ...] = ("method",), cal=None) -> pd.DataFrame:
    """Ratios of sums over the prompts where a method reproduced ar; excluded pairs are counted, not hidden. With a
    calibration, each row also has its predicted speedup and engine efficiency (experiments/prediction.py); every
    ratio has a bootstrap 95% interval over prompts. `repeat_drift` checks that repeats did the same work
    (experiments/drift.py); `accept_per_position` is a_1..a_k over the counted prompts."""
    df = pd.DataFrame(prediction.annotate([dict(r) for r in records], cal))
    if "predicted_s" in df:
        df["ar_pred_s"] = df["id"].map(df[df.method == "ar"].set_index("id")["predicted_s"])
    ar = df[df.method == "ar"].set_index("id")
    df["ar_s"] = df["id"].map(ar["median_s"])
    df["ar_calls"] = df["id"].map(ar["serial_calls"])
    df["ar_tokens"] = df["id"].map(ar["tokens"])
    if "prefill_s" in df:
        df["ar_prefill_s"] = df["id"].map(ar["prefill_s"])
    sampled = "sampled" in df.columns and bool(df["sampled"].fillna(False).any())
    rows = []
    for key, g in df.groupby(list(keys), sort=False, dropna=False):
        ok = g[counted(g)]
        tokens, seconds, calls = int(ok.tokens.sum()), float(ok.median_s.sum()), ok.serial_calls
        known = len(ok) > 0 and calls.notna().all() and calls.sum() > 0
        ar_step = float(ok.ar_s.sum()) / float(ok.ar_calls.sum()) if len(ok) else float("nan")
        speedup = _speedup(ok, seconds, tokens, sampled)
        ar_pred = float(ok.ar_pred_s.sum()) if "ar_pred_s" in ok and len(ok) else 0.0
        near = g[_kind(g) == "near_tie"]
        rows.append({**dict(zip(keys, key if isinstance(key, tuple) else (key,))), "n_prompts": len(g),
                     "n_identical": int(g.identical.astype(bool).sum()), "n_counted": len(ok),
                     "n_near_tie": len(near), "near_tie_tokens": int(near.diverged_tokens.sum()) if len(near) else 0,
                     "tokens": tokens, "seconds": seconds,
                     "tokens_per_s": tokens / seconds if seconds else float("nan"),
                     "speedup_vs_ar": speedup, **_intervals(ok, sampled, known), **_decode(ok, sampled),
                     "mat": _mat(ok, known), "ms_per_token": 1000 * seconds / tokens if tokens else float("nan"),
                     **prediction.summary_columns(ok, ar_pred, speedup),
                     "load_average_max": float(g.load_average.max()) if "load_average" in g else float("nan"),
                     "others_cores_max": float(g.others_cores.max()) if "others_cores" in g else float("nan"),
                     "block_efficiency": tokens / float(calls.sum()) if known else float("nan"),
                     "step_cost": seconds / float(calls.sum()) / ar_step if known and ar_step else float("nan"),
                     **_drafting(ok, ar_step),
                     "median_spread": float(g.spread.median()),
                     "accept_per_position": drift.acceptance_per_position(ok)})
    return drift.with_drift(pd.DataFrame(rows), df, keys)


def _kind(g: pd.DataFrame) -> pd.Series:
    return g["certificate"] if "certificate" in g else pd.Series([None] * len(g), index=g.index)


def counted(g: pd.DataFrame) -> pd.Series:
    """The prompts a ratio sums over: identical to ar, or a certified bfloat16 near-tie (a different but equally
    greedy continuation, timed over the same budget); a lost divergence never counts (and fails the run)."""
    return g.identical.astype(bool) | (_kind(g) == "near_tie")


def by_question(ok: pd.DataFrame, columns: dict[str, pd.Series]) -> pd.DataFrame:
    """`columns` summed per question (a question's turns together; a prompt without one is its own question): the
    unit a bootstrap resamples, since two turns of one question are not independent draws."""
    unit = ok["question"].where(ok["question"].notna(), ok["id"]) if "question" in ok else ok["id"]
    return pd.DataFrame(columns).groupby(unit.astype(str).to_numpy(), sort=False).sum()


def _ratio_ci(ok: pd.DataFrame, num: pd.Series, den: pd.Series) -> tuple[float, float]:
    q = by_question(ok, {"num": num, "den": den})
    return bootstrap_ratio(q["num"].tolist(), q["den"].tolist())


def _intervals(ok: pd.DataFrame, sampled: bool, known: bool) -> dict:
    """Bootstrap 95% intervals over questions of the speedup (greedy: ar seconds / method seconds; sampled: per
    token) and of block efficiency."""
    lo, hi = _ratio_ci(ok, ok.ar_s / ok.ar_tokens * ok.tokens if sampled else ok.ar_s, ok.median_s)
    blo, bhi = _ratio_ci(ok, ok.tokens, ok.serial_calls) if known else (float("nan"), float("nan"))
    return {"speedup_ci_low": lo, "speedup_ci_high": hi, "block_efficiency_ci_low": blo,
            "block_efficiency_ci_high": bhi}


def _decode(ok: pd.DataFrame, sampled: bool) -> dict:
    """The speedup with each prompt's prefill taken out (median seconds less median prefill seconds, both sides);
    nan where a row's loop does not report its prefill (transformers' loops) or at T > 0."""
    nan = {"decode_speedup_vs_ar": float("nan"), "decode_speedup_ci_low": float("nan"),
           "decode_speedup_ci_high": float("nan")}
    if sampled or not len(ok) or "prefill_s" not in ok or ok[["prefill_s", "ar_prefill_s"]].isna().any().any():
        return nan
    mine, ars = ok.median_s - ok.prefill_s, ok.ar_s - ok.ar_prefill_s
    if float(mine.sum()) <= 0:
        return nan
    lo, hi = _ratio_ci(ok, ars, mine)
    return {"decode_speedup_vs_ar": float(ars.sum()) / float(mine.sum()), "decode_speedup_ci_low": lo,
            "decode_speedup_ci_high": hi}


def _mat(ok: pd.DataFrame, known: bool) -> float:
    """#MAT: 1 + accepted draft tokens / verify steps from the decode's counters (so 1 + sum(a_j) on the same
    page); for loops without counters (transformers'), new tokens after the prefill's one per later call."""
    if "steps" in ok and len(ok) and not ok["steps"].isna().any() and float(ok["steps"].sum()) > 0:
        accepted = sum(sum(r) for r in ok["accepted_per_head"] if isinstance(r, list))
        return 1 + accepted / float(ok["steps"].sum())
    later = float((ok.serial_calls - 1).sum()) if known else 0.0
    return float((ok.tokens - 1).sum()) / later if later > 0 else float("nan")


def _speedup(ok: pd.DataFrame, seconds: float, tokens: int, sampled: bool) -> float:
    """Greedy: the same tokens, so a ratio of seconds. Sampled: outputs differ in length, so per token."""
    if not seconds:
        return float("nan")
    if not sampled:
        return float(ok.ar_s.sum()) / seconds
    return (float(ok.ar_s.sum()) / float(ok.ar_tokens.sum())) / (seconds / tokens) if tokens else float("nan")


def _drafting(ok: pd.DataFrame, ar_step: float) -> dict:
    """Drafting cost per decode step (proposals only: prefill and verify excluded), in ms and in AR decode steps."""
    if "draft_s" not in ok or not len(ok) or ok.draft_s.isna().any():
        return {"draft_ms_per_step": float("nan"), "draft_vs_ar_step": float("nan")}
    steps = float((ok.serial_calls - 1).sum())
    ms = 1000 * float(ok.draft_s.sum()) / steps if steps else float("nan")
    return {"draft_ms_per_step": ms, "draft_vs_ar_step": ms / (1000 * ar_step) if ar_step else float("nan")}
