"""Cost of one BPD step in decode steps, and wall-clock speedup: a thin caller of `bpdbench speed`.

`speed` already times AR and every method interleaved on the same prompts (warm-up, median of repeats, device
synchronised, identical outputs only) and reports `step_cost` = method seconds per serial call / AR seconds per
serial call. This script picks BPD at several draft thresholds and writes the summary as one JSON file.

    python scripts/bench_step.py --task mt_bench --limit 8 --repeats 3 --max-new-tokens 64 --thresholds 0,0.3
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd  # noqa: E402

from bpdbench.config import RunConfig  # noqa: E402
from bpdbench.experiments import speed  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="mt_bench")
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--heads-profile", default="quick")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--thresholds", default="0", help="comma-separated draft thresholds (0 = full block)")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default="results/bench_step.json")
    args = ap.parse_args()
    methods = ["ar"] + [f"bpd:threshold={t}" if float(t) > 0 else "bpd" for t in args.thresholds.split(",")]
    out = Path(args.out)
    cfg = RunConfig(task=args.task, model=args.model, heads=args.heads, heads_profile=args.heads_profile,
                    limit=args.limit, max_new_tokens=args.max_new_tokens, dtype=args.dtype, threads=args.threads,
                    out=str(out.with_suffix("")))
    folder = speed.run(cfg, methods, repeats=args.repeats)
    summary = pd.read_csv(folder / "speed.csv")
    print(summary[["method", "n_identical", "block_efficiency", "step_cost", "speedup_vs_ar"]].to_string(index=False))
    config = json.loads((folder / "config.json").read_text())
    out.write_text(json.dumps({"summary": summary.to_dict(orient="records"), "speed_dir": str(folder),
                               "environment": config["environment"]}, indent=2))
    print(f"written to {out} (per-prompt records in {folder})")


if __name__ == "__main__":
    main()
