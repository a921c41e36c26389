"""Predicted beside measured: what a method's speedup should be on this machine, from its counters and the
calibrated cost of the forwards it actually ran, and how much of that the engine delivered.

Why: a method with high block efficiency can still be slower than AR, and the measured speedup alone cannot say
whether drafting, verification (the machine's c(n)) or per-step overhead cost it. With the calibration
(hardware/calibration.py) each prompt's time is predicted as

    prefill (prompt tokens / prefill throughput) + sum over verify forwards of step(context) x c(tokens scored)
    + drafting

(drafting: the seconds the run itself measured in `propose`, counted at the calibration's speed by AR's timing of
the same prompt: `annotate`), and AR's as prefill + tokens x step(context). The
predicted speedup is the ratio of the sums, and engine efficiency = measured / predicted speedup: 1.0 means the
method's loop costs what AR's does beyond the forwards, relative to them. Time efficiency = predicted / measured
seconds (AR too) is the share of the time the calibrated forwards and drafting explain: a per-step cost the
calibration does not know lowers it for every method. Both are ratios of this machine's own times, so CI checks them
on any CPU (experiments/regress.py). The breakdown shares are of the measured time.
"""
from __future__ import annotations

from typing import Protocol


class Costs(Protocol):
    step_ms: float
    prefill_tok_per_s: float

    def seconds_for(self, n: float, tree: bool = False, context: int | None = None, rows: int | None = None
                    ) -> float: ...


def size_key(n: int, tree: bool, rows: int | None = None) -> str:
    """A verify forward's size in `verify_sizes`: "n", "n:tree", or "n:tree:rows" when fewer than n rows went
    through the output projection (a wide tree's lazy projection)."""
    key = f"{n}:tree" if tree else str(n)
    return f"{key}:{rows}" if rows is not None and rows < n else key


def parse_size(key: str) -> tuple[int, bool, int | None]:
    parts = key.split(":")
    return int(parts[0]), len(parts) > 1 and parts[1] == "tree", int(parts[2]) if len(parts) > 2 else None


def predict_record(rec: dict, cal: Costs) -> dict:
    """Predicted seconds of one (prompt, method) record and its parts; empty for transformers' own loops, which
    report no per-step counts."""
    steps = (rec.get("serial_calls") or 0) - 1
    verified = rec.get("verified")
    if steps <= 0 or verified is None:
        return {}
    context = int(rec["prompt_tokens"] + rec["tokens"] / 2)     # the cache grows from the prompt to the end
    per_step = verified / steps
    prefill = rec["prompt_tokens"] / cal.prefill_tok_per_s if cal.prefill_tok_per_s else 0.0
    sizes = rec.get("verify_sizes")
    if sizes:   # every forward at its own size: c is far from linear (c(1) = 1, c(2) = 2 on some CPUs)
        verify = 0.0
        for key, count in sizes.items():
            n, tree, rows = parse_size(key)
            verify += count * cal.seconds_for(n, tree=tree, context=context, rows=rows)
    else:       # records written before per-step sizes: the mean size
        verify = steps * cal.seconds_for(per_step, context=context)
    draft = rec.get("draft_s") or 0.0
    return {"predicted_s": prefill + verify + draft, "predicted_verify_s": verify, "predicted_prefill_s": prefill,
            "verify_tokens_per_step": per_step}


def annotate(records: list[dict], cal: Costs | None) -> list[dict]:
    """Each record gains its prediction (in place; also returned), its drafting priced at the calibration's speed.

    Why: the verify forwards are predicted at the speed the calibration was measured at, while drafting is the
    seconds this run measured, at the host's speed now. A shared host ran this VM's step at 63 ms when the curve
    was measured and at 110-130 ms during the leaderboard, so the drafting of a self-draft (60% of its time) counted
    twice as dear as its forwards: qdraft measured 1.55x AR and was predicted 1.13x. AR's record of the same prompt
    (timed interleaved with the method's) gives the ratio, `host_factor` = AR's predicted / measured seconds, and
    the drafting is counted at that speed. The factor also holds AR's per-step loop overhead (a few percent on an
    idle host), which then lowers the drafting's price by as much."""
    if cal is None:
        return records
    for rec in records:
        rec.update(predict_record(rec, cal))
    host = {rec.get("id"): rec["predicted_s"] / rec["median_s"] for rec in records
            if rec.get("method") == "ar" and rec.get("predicted_s") and rec.get("median_s")}
    for rec in records:
        factor = host.get(rec.get("id"))
        if factor is None or "predicted_s" not in rec:
            continue
        drafting = (rec.get("draft_s") or 0.0) * factor
        rec.update(host_factor=factor, predicted_draft_s=drafting,
                   predicted_s=rec["predicted_prefill_s"] + rec["predicted_verify_s"] + drafting)
    return records


def summary_columns(ok, ar_pred_s: float, measured_speedup: float) -> dict:
    """Columns of one speed.csv row from its records that count (a DataFrame with the record fields)."""
    nan = float("nan")
    if "predicted_s" not in ok or not len(ok) or ok.predicted_s.isna().any():
        return {"predicted_speedup": nan, "engine_efficiency": nan, "time_efficiency": nan,
                "verify_tokens_per_step": nan, "share_draft": nan, "share_verify": nan, "share_prefill": nan,
                "share_overhead": nan}
    predicted = ar_pred_s / float(ok.predicted_s.sum()) if ar_pred_s else nan
    measured = float(ok.median_s.sum())
    draft = float(ok.draft_s.fillna(0).sum()) / measured
    verify = float(ok.predicted_verify_s.sum()) / measured
    prefill = float(ok.predicted_prefill_s.sum()) / measured
    steps = float((ok.serial_calls - 1).sum())
    return {"predicted_speedup": predicted,
            "engine_efficiency": measured_speedup / predicted if predicted == predicted and predicted else nan,
            # predicted / measured seconds, AR included: a per-step cost the calibration does not know (a slower
            # loop) lowers it for every method, while it can leave the ratio of two speedups unchanged or raise it
            "time_efficiency": float(ok.predicted_s.sum()) / measured if measured else nan,
            "verify_tokens_per_step": float((ok.verify_tokens_per_step * (ok.serial_calls - 1)).sum()) / steps
            if steps else nan,
            "share_draft": draft, "share_verify": verify, "share_prefill": prefill,
            "share_overhead": 1.0 - draft - verify - prefill}
