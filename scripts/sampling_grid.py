"""Block efficiency and speedup of methods at T = 0, 0.7 and 1.0 (the `sampling` table of `bpdbench tables`).

Each cell is one `bpdbench run` into results/sampling/<task>/<method>-T<t>/ with the same examples and token budget.
At T = 0 the greedy reference is decoded in the same process (a fresh private greedy folder per cell, so no cell
reuses another's reference and every cell times its own AR), so every temperature has an in-process AR baseline: greedy AR at T = 0 (same tokens), AR sampling with the same seed at T > 0 (per token).
Resumable: a finished cell is skipped. Usage:
    python scripts/sampling_grid.py --tasks mt_bench,xsum --methods bpd,medusa,pld,sps --limit 3 --max-new-tokens 48
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from bpdbench import paths
from bpdbench.config import RunConfig
from bpdbench.experiments.run import run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", default="mt_bench,xsum")
    ap.add_argument("--methods", default="bpd,medusa,pld,sps")
    ap.add_argument("--temperatures", default="0,0.7,1.0")
    ap.add_argument("--limit", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--results", default=None, help="results root (default: the checkout's results/)")
    a = ap.parse_args()
    root = Path(a.results) if a.results else paths.results_root()
    for task in a.tasks.split(","):
        for method in a.methods.split(","):
            for t in (float(x) for x in a.temperatures.split(",")):
                out = root / "sampling" / task / f"{method.replace(':', '-').replace(',', '-')}-T{t:g}"
                if (out / "summary.csv").exists():
                    print(f"skip {out} (done)")
                    continue
                cfg = RunConfig(task=task, method=method, limit=a.limit, max_new_tokens=a.max_new_tokens,
                                dtype=a.dtype, threads=a.threads, out=str(out), resume=(out / "examples.jsonl")
                                .exists(), temperature=t or None,
                                greedy_dir=tempfile.mkdtemp(prefix="bpdbench-greedy-"))
                row = run(cfg)
                print(f"{task} {method} T={t:g}: block efficiency {row['block_efficiency']:.3f}, "
                      f"speedup {row.get('speedup_vs_ar', float('nan')):.3f}")


if __name__ == "__main__":
    main()
