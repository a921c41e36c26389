"""Drafting cost per step of each method, against the base's decode step, measured in the decode loop itself.

Why: on this CPU a drafter pays off only if drafting costs a small part of a decode step (the issue's target: the
best chain drafter within 15%). The loop already times each step's propose (draft) and verify forward separately
(`Generation.seconds`), so this script decodes the same prompts with `ar` and every method, interleaved per prompt
and repeated, and reports per method the median over prompts of draft ms per step, verify ms per step and the AR
decode step (AR seconds / serial calls), with the machine's load before and after (the CPU is shared).

    OMP_WAIT_POLICY=PASSIVE python scripts/bench_drafting.py --task mt_bench --limit 4 --repeats 2 \
        --methods eagle,eagle:tree=4,eagle:shortlist=8192 --threads 1 --out results/bench_drafting.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bpdbench.config import RunConfig  # noqa: E402
from bpdbench.experiments.session import open_session, resolve_methods  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="mt_bench")
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--methods", required=True, help="comma-separated method spellings (ar is always timed)")
    ap.add_argument("--heads-profile", default="quick")
    ap.add_argument("--heads-path", default=None, help="heads folder for the heads methods (bpd, ...)")
    ap.add_argument("--heads", type=int, default=8, help="heads the heads methods use")
    ap.add_argument("--limit", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default="results/bench_drafting.json")
    args = ap.parse_args()
    methods = [m for m in resolve_methods(args.methods) if m.label != "ar"]
    cfg = RunConfig(task=args.task, model=args.model, heads_profile=args.heads_profile, heads_path=args.heads_path, heads=args.heads,
                    limit=args.limit,
                    max_new_tokens=args.max_new_tokens, dtype=args.dtype, threads=args.threads)
    load0 = os.getloadavg()
    s = open_session(cfg, methods=resolve_methods(["ar"] + [m.label for m in methods]))
    drafters = {"ar": None, **{m.label: s.drafter(m) for m in methods}}
    prompts = [s.prompt(ex) for ex in s.examples]
    for d in drafters.values():                      # warm-up: kernels, caches, first-call setup
        s.decode(d, prompts[0])
    per = {label: [] for label in drafters}
    for prompt in prompts:
        for _ in range(args.repeats):
            for label, d in drafters.items():
                g = s.decode(d, prompt)
                steps = max(g.counters.serial_calls - 1, 1)
                per[label].append({"draft_ms": 1000 * g.seconds["draft"] / steps,
                                   "verify_ms": 1000 * g.seconds["verify"] / steps,
                                   "serial_calls": g.counters.serial_calls, "tokens": len(g.tokens)})
    ar_step = statistics.median(r["verify_ms"] for r in per["ar"])
    rows = []
    for label, rs in per.items():
        draft = statistics.median(r["draft_ms"] for r in rs)
        verify = statistics.median(r["verify_ms"] for r in rs)
        calls = sum(r["serial_calls"] for r in rs)
        rows.append({"method": label, "draft_ms_per_step": round(draft, 2), "verify_ms_per_step": round(verify, 2),
                     "ar_step_ms": round(ar_step, 2), "draft_share_of_ar_step": round(draft / ar_step, 4),
                     "verify_in_ar_steps": round(verify / ar_step, 3),
                     "block_efficiency": round(sum(r["tokens"] for r in rs) / calls, 3)})
        print(f"{label:40s} draft {draft:7.2f} ms/step ({draft / ar_step:6.1%} of an AR step)  verify "
              f"{verify:7.2f} ms/step ({verify / ar_step:.2f} AR steps)  block efficiency {rows[-1]['block_efficiency']}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = s.meta(methods, repeats=args.repeats, load_average={"start": load0, "end": os.getloadavg()},
                  command=" ".join(sys.argv))
    out.write_text(json.dumps({"summary": rows, "per_prompt": per, "config": meta}, indent=2, default=str))
    print(f"written to {out}")


if __name__ == "__main__":
    main()
