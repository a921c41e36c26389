"""Result files: per-example JSONL (appended as each example finishes), then summary CSV/Markdown from it.

The JSONL is the source of truth: summaries, tables and plots are rendered from files, never from stdout, and an
interrupted run resumes by skipping ids already in the JSONL (losing at most the example in flight).
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Callable

import pandas as pd

from ..engine.counters import Counters, ratios

EXAMPLES, SUMMARY_CSV, SUMMARY_MD, CONFIG = "examples.jsonl", "summary.csv", "summary.md", "config.json"


class ResultWriter:
    def __init__(self, out: Path, config: dict, resume: bool):
        self.out = out
        self.path = out / EXAMPLES
        if self.path.exists() and not resume:
            raise FileExistsError(f"{self.path} exists; pass --resume to continue it or --out to write elsewhere")
        out.mkdir(parents=True, exist_ok=True)
        self.records = resumable(out, EXAMPLES, config, lambda m: {"config": m.get("config", {})}, resume,
                                 ignore=("resume", "limit", "offset", "out"))
        (out / CONFIG).write_text(json.dumps(config, indent=2, default=str))

    def done_ids(self) -> set[str]:
        return {r["id"] for r in self.records}

    def append(self, record: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(record, default=_json_default) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.records.append(record)


def _json_default(o):
    if isinstance(o, float) and math.isnan(o):
        return None
    return str(o)


def resumable(out: Path, jsonl: str, config: dict, key: Callable[[dict], dict], resume: bool,
              ignore: tuple[str, ...] = ()) -> list[dict]:
    """Records an interrupted run in `out` already wrote, when `key` of its config.json equals `key(config)` (fields
    in `ignore`, e.g. limit or threads, may change). One check for run, replay and speed, so every --resume refuses
    to mix results made with other settings or heads in the same words."""
    path = out / jsonl
    if not resume or not path.exists():
        return []
    old = json.loads((out / CONFIG).read_text()) if (out / CONFIG).exists() else {}
    changed = _differences(key(old), key(json.loads(json.dumps(config, default=str))), ignore)
    if changed:
        raise ValueError(f"cannot resume {out}: its config.json differs in {', '.join(changed)}; "
                         f"pass a new --out or drop --resume")
    return read_examples(path)   # tolerates the torn last line a crash leaves


def _differences(a: dict, b: dict, ignore: tuple[str, ...]) -> list[str]:
    """Keys whose values differ, one level deep (`config.dtype`), so the error names what to change."""
    out = []
    for k in sorted(set(a) | set(b)):
        x, y = a.get(k), b.get(k)
        if isinstance(x, dict) and isinstance(y, dict):
            out += [f"{k}.{f}" for f in sorted(set(x) | set(y)) if f not in ignore and x.get(f) != y.get(f)]
        elif k not in ignore and x != y:
            out.append(k)
    return out


def read_examples(path: Path) -> list[dict]:
    """Read the JSONL, ignoring a torn last line left by a crash mid-write."""
    records = []
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if i != len(lines) - 1:
                raise ValueError(f"{path}:{i + 1}: corrupt JSON line; delete it and rerun with --resume") from None
    return records


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
           "seconds": round(seconds, 3), "tokens_per_s": total.new_tokens / seconds if seconds else float("nan")}
    ref = [r for r in records if r.get("ref_seconds") is not None]
    if ref and method != "ar":  # same examples, same tokens, in the same run: a like-for-like speed ratio
        row["speedup_vs_ar"] = sum(r["ref_seconds"] for r in ref) / sum(r["seconds"] for r in ref)
    for m in quality_metrics:
        row[m] = _mean([r["quality"].get(m) for r in records])
    nll = [r["target_nll"] for r in records if r.get("target_nll") is not None]
    if nll:
        row["target_ppl"] = math.exp(sum(x for x, _ in nll) / sum(n for _, n in nll))
    row["accepted_per_head"] = " ".join(str(x) for x in total.accepted_per_head)
    return row


def _mean(values: list) -> float:
    values = [float(v) for v in values if v is not None]
    return sum(values) / len(values) if values else float("nan")


def write_summary(out: Path, row: dict) -> pd.DataFrame:
    df = pd.DataFrame([row])
    df.to_csv(out / SUMMARY_CSV, index=False)
    (out / SUMMARY_MD).write_text(to_markdown(df))
    return df


def to_markdown(df: pd.DataFrame) -> str:
    """GitHub table without the `tabulate` dependency."""
    def fmt(v) -> str:
        return f"{v:.3f}" if isinstance(v, float) else str(v)
    head = "| " + " | ".join(map(str, df.columns)) + " |\n|" + "---|" * len(df.columns) + "\n"
    return head + "".join("| " + " | ".join(fmt(v) for v in row) + " |\n" for row in df.itertuples(index=False))
