"""Every speed run checks itself for state leaking between its repeats, and reports acceptance per draft position.

Why the check: `speed` times each prompt `repeats` times with the same drafter and keeps the median. A drafter that
carries anything from one repeat to the next (a cache, a learned table, Token Recycling's matrix before speed put
it back per repeat) does less work from the second repeat on, and the median then times a prompt it has already
seen. Machine effects (caches, clocks) hit AR alike, so a method's own drift is divided by AR's:

    repeat_ratio = median over prompts of (median of repeats 2..n) / (repeat 1)
    repeat_drift = method's repeat_ratio / AR's repeat_ratio        (NaN when repeats < 2)

A drift below 0.95 (later repeats 5% faster than the first beyond what AR's are) is logged as a warning. The
deterministic twin of the check is in the records: `repeat_serial_calls` and `repeat_accepted` per repeat, equal
in every repeat when nothing leaks (greedy, or T > 0 with the seeded generator); `repeat_same_decisions` is the
share of prompts where they are, and the warning says which of the two it is.
"""
from __future__ import annotations

from typing import Callable

import pandas as pd

from .timing import median

THRESHOLD = 0.95


def repeat_ratio(times) -> float:
    """One prompt's (median of repeats 2..n) / (repeat 1); NaN with fewer than two repeats."""
    if not isinstance(times, (list, tuple)) or len(times) < 2 or not times[0]:
        return float("nan")
    return median(list(times[1:])) / times[0]


def same_decisions(record) -> float:
    """1.0 when every repeat of one prompt made the same decisions (serial calls and tokens accepted per repeat),
    0.0 when one differed, NaN where the record does not say (transformers' loops, older records)."""
    calls, accepted = record.get("repeat_serial_calls"), record.get("repeat_accepted")
    if not isinstance(calls, list) or len(calls) < 2:
        return float("nan")
    same = len(set(calls)) == 1 and (not isinstance(accepted, list) or len({str(a) for a in accepted}) == 1)
    return float(same)


def with_drift(summary: pd.DataFrame, records: pd.DataFrame, keys: tuple[str, ...]) -> pd.DataFrame:
    """`repeat_ratio` and `repeat_drift` columns on a summary grouped by `keys` (AR's ratio from AR's row in the
    same group of the other keys, e.g. the same category), and `repeat_same_decisions`: the share of prompts whose
    repeats decided alike, which tells a drafter's state reaching its decisions from a timing effect."""
    ratios = (records["times"].map(repeat_ratio) if "times" in records
              else pd.Series(float("nan"), index=records.index))
    same = pd.Series([same_decisions(r) for r in records.to_dict("records")], index=records.index, dtype=float)
    grouped = records.assign(_ratio=ratios.astype(float), _same=same).groupby(list(keys), sort=False, dropna=False)
    table, agree = grouped["_ratio"].median(), grouped["_same"].mean()
    out = summary.copy()
    at = [tuple(r) if len(keys) > 1 else r[0] for r in out[list(keys)].itertuples(index=False)]
    out["repeat_ratio"] = [float(table.get(k, float("nan"))) for k in at]
    out["repeat_same_decisions"] = [float(agree.get(k, float("nan"))) for k in at]
    ar = out["repeat_ratio"].where(out["method"] == "ar")
    other = [k for k in keys if k != "method"]
    if other:
        base = ar.groupby([out[k] for k in other], sort=False, dropna=False).transform("max")
    else:
        base = pd.Series(ar.max(), index=out.index)
    out["repeat_drift"] = out["repeat_ratio"] / base
    return out


def warn_drift(summary: pd.DataFrame, log: Callable[[str], None], threshold: float = THRESHOLD) -> list[str]:
    """One warning line per method whose repeats get faster than AR's; returns the methods warned about."""
    warned = []
    ar = summary.loc[summary.method == "ar", "repeat_ratio"]
    ar_ratio = float(ar.iloc[0]) if len(ar) else float("nan")
    for row in summary.itertuples():
        if row.method != "ar" and row.repeat_drift < threshold:
            warned.append(row.method)
            same = getattr(row, "repeat_same_decisions", float("nan"))
            why = ("its repeats decided alike on every prompt (serial calls and tokens accepted), so no drafter state "
                   "reached its decisions: a timing effect (warm caches, or a machine whose speed varies: see "
                   "median_spread)" if same == 1.0 else
                   "state kept between repeats makes its median time a prompt it has already seen"
                   + (f" (repeats decided alike on {same:.0%} of prompts)" if same == same else ""))
            log(f"WARNING: {row.method} gets faster with repeats: repeats 2..n take {row.repeat_ratio:.3f} of the "
                f"first (median over prompts), ar's {ar_ratio:.3f} (repeat_drift {row.repeat_drift:.3f}); {why}")
    return warned


def acceptance_per_position(ok: pd.DataFrame) -> str:
    """a_1..a_k over the counted prompts as space-separated rates (steps accepting draft position j / steps, a
    ratio of sums); empty for methods that report no steps (transformers' loops)."""
    if "steps" not in ok or not len(ok) or ok["steps"].isna().any():
        return ""
    steps = float(ok["steps"].sum())
    heads: list[float] = []
    for row in ok["accepted_per_head"]:
        row = row if isinstance(row, list) else []
        heads += [0.0] * (len(row) - len(heads))
        for j, n in enumerate(row):
            heads[j] += n
    return " ".join(f"{n / steps:.3f}" for n in heads) if steps else ""
