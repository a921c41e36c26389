"""Summaries of result files: one row per run, every ratio a ratio of summed counters; Markdown rendered from it."""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from ..engine.counters import Counters, ratios
from ..store import write_atomic

SUMMARY_CSV, SUMMARY_MD = "summary.csv", "summary.md"


def summarize(records: list[dict], config: dict, quality_metrics: tuple[str, ...]) -> dict:
    """One summary row; every ratio is a ratio of sums."""
    total = Counters()
    for r in records:
        total = total.add(Counters.from_dict(r))
    cfg, res = config["config"], config["resolved"]
    method = res.get("method", cfg["method"])
    seconds = sum(r["seconds"] for r in records)
    row = {"task": cfg["task"], "model": cfg["model"], "method": method, "rescorer": res.get("rescorer"),
           "heads": res.get("n_heads", 0) if method != "ar" else 0, "alpha": config["resolved"].get("alpha"),
           "k": config["resolved"].get("k"), "p": config["resolved"].get("p"), "dtype": cfg["dtype"],
           "n_examples": len(records),
           "new_tokens": total.new_tokens, "serial_calls": total.serial_calls,
           **{k: v for k, v in ratios(total).items() if not k.startswith("head")},
           "lossless_rate": _mean([r["lossless"] for r in records if r.get("lossless") is not None]),
           **certificate_counts(records),
           "seconds": round(seconds, 3), "tokens_per_s": total.new_tokens / seconds if seconds else float("nan")}
    ref = [r for r in records if r.get("ref_seconds") is not None]
    if any(r.get("certificate") == "statistical" for r in records):
        _sampled(row, records, config)
    elif ref and method != "ar":  # same examples, same tokens, in the same run: a like-for-like speed ratio
        row["speedup_vs_ar"] = sum(r["ref_seconds"] for r in ref) / sum(r["seconds"] for r in ref)
    for m in quality_metrics:
        row[m] = _mean([r["quality"].get(m) for r in records])
        if any("ref_quality" in r for r in records):   # T > 0: AR sampling's quality on the same examples
            row[f"ar_{m}"] = _mean([r["ref_quality"].get(m) for r in records if "ref_quality" in r])
    nll = [r["target_nll"] for r in records if r.get("target_nll") is not None]
    if nll:
        row["target_ppl"] = math.exp(sum(x for x, _ in nll) / sum(n for _, n in nll))
    row["accepted_per_head"] = " ".join(str(x) for x in total.accepted_per_head)
    row["quality_warning"] = quality_warning(res)
    return row


def quality_warning(resolved: dict) -> str:
    """The warnings of the heads or drafter a run used (train/pacing.py: below the quality floor, or short data),
    joined; empty when none: a number made with a flagged artefact never reads as a clean one."""
    found = [(resolved.get(k) or {}).get("quality_warning") for k in ("heads", "heads_files")]
    found.append(resolved.get("quality_warning"))
    return " | ".join(dict.fromkeys(w for w in found if w))


def _sampled(row: dict, records: list[dict], config: dict) -> None:
    """A T > 0 run: no lossless_rate or greedy certificate counts (outputs are draws), the sampling settings, the
    certificate that applies, the mean acceptance probability alpha where the drafter reported q, and a per-token
    speed ratio against AR sampling of the same examples in the same process (outputs differ in length)."""
    for k in ("lossless_rate", "n_exact", "n_near_tie", "n_lost", "n_uncertified"):
        row.pop(k, None)
    sampling = config["resolved"].get("sampling", {})
    row.update({k: sampling.get(k) for k in ("temperature", "top_p", "top_k", "seed")})
    row["certificate"] = sampling.get("certificate", "statistical")
    n = sum(r.get("alpha_n", 0) for r in records)
    row["alpha_mean"] = sum(r.get("alpha_sum", 0.0) for r in records) / n if n else float("nan")
    ref = [r for r in records if r.get("ref_new_tokens")]
    if ref:
        ar_per_token = sum(r["ref_seconds"] for r in ref) / sum(r["ref_new_tokens"] for r in ref)
        per_token = sum(r["seconds"] for r in ref) / sum(r["new_tokens"] for r in ref)
        row["speedup_vs_ar"] = ar_per_token / per_token


def certificate_counts(records: list[dict]) -> dict:
    """n_exact / n_near_tie / n_lost: a bfloat16 lossless_rate below 1 reads as exact + near-tie, never bare.
    Records written before certificates existed count as exact when lossless, else as uncertified."""
    counts = {"n_exact": 0, "n_near_tie": 0, "n_lost": 0, "n_uncertified": 0}
    for r in records:
        cert = r.get("certificate") or ("exact" if r.get("lossless") else None)
        counts[f"n_{cert}" if f"n_{cert}" in counts else "n_uncertified"] += 1
    if not counts["n_uncertified"]:
        del counts["n_uncertified"]
    return counts


def _mean(values: list) -> float:
    values = [float(v) for v in values if v is not None]
    return sum(values) / len(values) if values else float("nan")


def write_summary(out: Path, row: dict) -> pd.DataFrame:
    df = pd.DataFrame([row])
    write_atomic(out / SUMMARY_CSV, df.to_csv(index=False))
    write_atomic(out / SUMMARY_MD, to_markdown(df))
    return df


def to_markdown(df: pd.DataFrame) -> str:
    """GitHub table without the `tabulate` dependency."""
    def fmt(v) -> str:
        return f"{v:.3f}" if isinstance(v, float) else str(v)
    head = "| " + " | ".join(map(str, df.columns)) + " |\n|" + "---|" * len(df.columns) + "\n"
    return head + "".join("| " + " | ".join(fmt(v) for v in row) + " |\n" for row in df.itertuples(index=False))
