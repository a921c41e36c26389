"""Cost of one BPD step in decode steps, and wall-clock speedup, AR and BPD interleaved in one process.

Same prompts, same token counts on both sides (outputs must be identical), warm-up first, R repeats per prompt with
the median kept, speedup = sum of AR time / sum of BPD time. Prints the environment stamp and writes a JSON file.

    python scripts/bench_step.py --task mt_bench --limit 8 --repeats 3 --max-new-tokens 64 --thresholds 0,0.3
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

import tasks  # noqa: E402
from bpdbench import decoding, models, runner, train_heads  # noqa: E402
from bpdbench.config import RunConfig, environment  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="mt_bench")
    ap.add_argument("--model", default=models.DEFAULT_MODEL)
    ap.add_argument("--heads-profile", default="quick")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--thresholds", default="0",
                    help="comma-separated draft thresholds, one BPD variant each (0 = full block)")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default="results/bench_step.json")
    args = ap.parse_args()
    thresholds = [float(t) for t in args.thresholds.split(",")]

    cfg = RunConfig(task=args.task, model=args.model, heads=args.heads, heads_profile=args.heads_profile,
                    dtype=args.dtype, threads=args.threads, limit=args.limit)
    threads = runner.setup_torch(cfg)
    task = tasks.get_task(args.task)
    examples = runner.select_examples(cfg, task)
    model, tok = models.load(args.model, args.dtype)
    heads = runner.resolve_heads(cfg, model, tok, print)
    eos = runner.eos_ids(model, tok)
    prompts = [runner.encode_prompt(tok, task, ex, cfg.max_prompt_tokens) for ex in examples]
    variants = {"ar": None, **{f"bpd-t{t:g}": t for t in thresholds}}

    def once(prompt, threshold):
        t0 = time.perf_counter()
        g = decoding.generate(model, prompt, args.max_new_tokens, eos, heads=heads if threshold is not None else None,
                              n_heads=args.heads if threshold is not None else 0, threshold=threshold or 0.0)
        return time.perf_counter() - t0, g

    for th in variants.values():
        once(prompts[0], th)  # warm-up (allocator, oneDNN kernels)
    rows = []
    for i, prompt in enumerate(prompts):
        runs: dict[str, list] = {v: [] for v in variants}
        for _ in range(args.repeats):  # interleaved so drifts in machine load hit every variant alike
            for v, th in variants.items():
                runs[v].append(once(prompt, th))
        ar = runs["ar"][0][1]
        row = {"id": examples[i].id, "tokens": len(ar.tokens), "ar_s": statistics.median(t for t, _ in runs["ar"]),
               "ar_steps": ar.counters.steps, "ar_step_s": _median_step(runs["ar"]), "spread_ar": _spread(runs["ar"])}
        for v in variants:
            if v == "ar":
                continue
            g = runs[v][0][1]
            row[v] = {"identical": g.tokens == ar.tokens, "s": statistics.median(t for t, _ in runs[v]),
                      "steps": g.counters.steps, "step_s": _median_step(runs[v]), "calls": g.counters.serial_calls,
                      "drafted": g.counters.drafted, "draft_s": statistics.median(x.seconds["draft"] for _, x in runs[v]),
                      "spread": _spread(runs[v])}
        rows.append(row)
        print(f"{examples[i].id}: {len(ar.tokens)} tok, AR {row['ar_s']:.2f}s, " + ", ".join(
            f"{v} {row[v]['s']:.2f}s eff {len(ar.tokens) / row[v]['calls']:.2f}" + ("" if row[v]["identical"] else " DIFF")
            for v in variants if v != "ar"), flush=True)

    ar_step = sum(r["ar_step_s"] * r["ar_steps"] for r in rows) / sum(r["ar_steps"] for r in rows)
    report = train_heads.heads_dir(args.model, args.heads_profile) / "report.json"
    summary = {"ar_step_ms": 1000 * ar_step, "n_prompts": len(rows), "repeats": args.repeats,
               "heads_training_seconds": json.loads(report.read_text())["seconds"] if report.exists() else None,
               "args": vars(args), "environment": environment(threads, "cpu", args.dtype), "variants": {}}
    for v in variants:
        if v == "ar":
            continue
        steps = sum(r[v]["steps"] for r in rows)
        step = sum(r[v]["step_s"] * r[v]["steps"] for r in rows) / steps
        summary["variants"][v] = {
            "bpd_step_in_decode_steps": step / ar_step, "bpd_step_ms": 1000 * step,
            "draft_ms_per_step": 1000 * sum(r[v]["draft_s"] for r in rows) / steps,
            "drafted_per_step": sum(r[v]["drafted"] for r in rows) / steps,
            "speedup": sum(r["ar_s"] for r in rows) / sum(r[v]["s"] for r in rows),
            "block_efficiency": sum(r["tokens"] for r in rows) / sum(r[v]["calls"] for r in rows),
            "identical_outputs": all(r[v]["identical"] for r in rows)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"summary": summary, "prompts": rows}, indent=2))
    print(f"\nAR decode step {summary['ar_step_ms']:.1f} ms; heads training time ({args.heads_profile}): "
          f"{summary['heads_training_seconds']} s")
    for v, s in summary["variants"].items():
        print(f"{v}: step = {s['bpd_step_in_decode_steps']:.3f} decode steps ({s['bpd_step_ms']:.1f} ms, drafting "
              f"{s['draft_ms_per_step']:.1f} ms, {s['drafted_per_step']:.2f} drafted/step); block efficiency "
              f"{s['block_efficiency']:.3f}; speedup (sum AR / sum BPD) {s['speedup']:.3f}x; identical outputs: "
              f"{s['identical_outputs']}")
    print(f"written to {args.out}")


def _median_step(runs) -> float:
    """Median over repeats of (time after the prefill) / steps: the per-step cost without prompt processing."""
    return statistics.median((t - g.seconds["prefill"]) / max(g.counters.steps, 1) for t, g in runs)


def _spread(runs) -> float:
    ts = [t for t, _ in runs]
    return (max(ts) - min(ts)) / statistics.median(ts)


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main()
