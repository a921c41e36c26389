"""Per-step cost of each draft rescorer relative to one base decode step (ms and %), measured in one process.

Lattices come from real greedy trajectories of the default model and its heads; every rescorer refines the same
lattices in the same order (contexts grow as in decoding, so KV-cached rescorers behave as they would in a run).
A decode step is timed on the same prompts. Neural rescorers that are not trained yet are timed with random weights
(labelled as such): cost barely depends on the weights, except how often the LM overrides the heads' top-1.

    python scripts/bench_rescorers.py --task xsum --limit 4 --rescorers ngram2,ngram4,16best-ngram4,neural-s,neural-m
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bpdbench.config import RunConfig  # noqa: E402
from bpdbench.engine import DraftContext, Proposal, loop  # noqa: E402
from bpdbench.experiments.replay import trajectories  # noqa: E402
from bpdbench.experiments.session import open_session  # noqa: E402
from bpdbench.methods import parse  # noqa: E402


def build(name: str, s):
    """The method's drafter; an untrained neural rescorer gets random weights (cost does not depend on them)."""
    try:
        return s.drafter(parse(name)), "trained"
    except Exception:  # noqa: BLE001 - only neural rescorers can be timed without their artefact
        from bpdbench.methods.lattice import HeadsSource, LatticeDrafter
        from bpdbench.nets.small_lm import SmallLM, make_config
        from bpdbench.refine.neural import NeuralRescorer
        if not name.startswith("neural-"):
            raise
        heads, _ = s.env.heads()
        lm = SmallLM(make_config(name[-1], len(heads.shortlist)), heads.shortlist).eval()
        return LatticeDrafter(name, HeadsSource(heads, s.model.lm_head), s.cfg.heads, s.cfg.k,
                              rescorer=NeuralRescorer(name, lm, alpha=0.5, k=s.cfg.k)), "random weights"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="xsum")
    ap.add_argument("--limit", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--rescorers", default="ngram2,ngram4,16best-0gram,16best-ngram4,neural-s,neural-m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--out", default="results/bench_rescorers.json")
    args = ap.parse_args()
    cfg = RunConfig(task=args.task, limit=args.limit, max_new_tokens=args.max_new_tokens, threads=args.threads,
                    dtype=args.dtype)
    s = open_session(cfg)
    trajs = list(trajectories(s))

    decode = []  # one decode step (1-token forward with a KV cache), on the same prompts
    with torch.inference_mode():
        for _, prompt, greedy, _ in trajs:
            state = loop.prefill(s.model, prompt)
            for _ in greedy[:16]:
                t0 = time.perf_counter()
                v = loop.verify(s.model, state, Proposal())
                loop.advance(state, v, loop.Decision(0, 0, v.targets[0]))
                decode.append(time.perf_counter() - t0)
    step_ms = 1000 * statistics.median(decode)

    rows = []
    for name in args.rescorers.split(","):
        drafter, weights = build(name, s)
        times = []
        for _, prompt, greedy, hidden in trajs:
            drafter.reset(prompt)
            for m in range(len(greedy) - 1):
                ctx = DraftContext(prompt + greedy[: m + 1], hidden[m], s.cfg.heads)
                lat = drafter.lattice(ctx)
                t0 = time.perf_counter()
                drafter.rescorer.refine(lat, ctx.tokens)
                times.append(time.perf_counter() - t0)
        ms = 1000 * statistics.median(times)
        rows.append({"rescorer": name, "weights": weights, "median_ms": round(ms, 3),
                     "p90_ms": round(1000 * sorted(times)[int(0.9 * (len(times) - 1))], 3),
                     "pct_of_decode_step": round(100 * ms / step_ms, 2), "calls": len(times)})
        print(f"{name:14s} {weights:15s} {ms:7.2f} ms/step (p90 {rows[-1]['p90_ms']:.2f}) = "
              f"{rows[-1]['pct_of_decode_step']:.1f}% of a {step_ms:.1f} ms decode step", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"decode_step_ms": step_ms, "rescorers": rows, "args": vars(args),
                                          "environment": s.meta()["environment"]}, indent=2))
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
