"""Cost of one BPD step in decode steps, and wall-clock speedup, AR and BPD interleaved in one process.

Same prompts, same token counts on both sides (outputs must be identical), warm-up first, R repeats per prompt with
the median kept, speedup = sum of AR time / sum of BPD time. Prints the environment stamp and writes a JSON file.

    python scripts/bench_step.py --task mt_bench --limit 8 --repeats 3 --max-new-tokens 64
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
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default="results/bench_step.json")
    args = ap.parse_args()

    cfg = RunConfig(task=args.task, model=args.model, heads=args.heads, heads_profile=args.heads_profile,
                    dtype=args.dtype, threads=args.threads, limit=args.limit)
    threads = runner.setup_torch(cfg)
    task = tasks.get_task(args.task)
    examples = tasks.select(tasks.split(task, tasks.load_examples(task, tasks.default_data_dir()))[0], 0, args.limit)
    model, tok = models.load(args.model, args.dtype)
    heads = runner.resolve_heads(cfg, model, tok, print)
    eos = runner.eos_ids(model, tok)
    prompts = [runner.encode_prompt(tok, task, ex, cfg.max_prompt_tokens) for ex in examples]

    def once(prompt, use_heads: bool):
        t0 = time.perf_counter()
        g = decoding.generate(model, prompt, args.max_new_tokens, eos, heads=heads if use_heads else None,
                              n_heads=args.heads if use_heads else 0)
        return time.perf_counter() - t0, g

    once(prompts[0], False), once(prompts[0], True)  # warm-up (allocator, oneDNN kernels)
    rows = []
    for i, prompt in enumerate(prompts):
        ar_t, bpd_t = [], []
        for _ in range(args.repeats):  # interleaved so drifts in machine load hit both sides alike
            t, ar = once(prompt, False)
            ar_t.append((t, ar))
            t, bpd = once(prompt, True)
            bpd_t.append((t, bpd))
        ar_med = statistics.median(t for t, _ in ar_t)
        bpd_med = statistics.median(t for t, _ in bpd_t)
        ar, bpd = ar_t[0][1], bpd_t[0][1]
        same = ar.tokens == bpd.tokens
        rows.append({"id": examples[i].id, "tokens": len(ar.tokens), "identical": same, "ar_s": ar_med,
                     "bpd_s": bpd_med, "ar_steps": ar.counters.steps, "bpd_steps": bpd.counters.steps,
                     "ar_step_s": _median_step(ar_t), "bpd_step_s": _median_step(bpd_t),
                     "bpd_draft_s": statistics.median(g.seconds["draft"] for _, g in bpd_t),
                     "bpd_calls": bpd.counters.serial_calls, "spread_ar": _spread(ar_t), "spread_bpd": _spread(bpd_t)})
        print(f"{examples[i].id}: {len(ar.tokens)} tok, AR {ar_med:.2f}s, BPD {bpd_med:.2f}s, "
              f"block eff {len(bpd.tokens) / bpd.counters.serial_calls:.2f}, identical={same}", flush=True)

    ar_step = sum(r["ar_step_s"] * r["ar_steps"] for r in rows) / sum(r["ar_steps"] for r in rows)
    bpd_step = sum(r["bpd_step_s"] * r["bpd_steps"] for r in rows) / sum(r["bpd_steps"] for r in rows)
    draft = sum(r["bpd_draft_s"] for r in rows) / sum(r["bpd_steps"] for r in rows)
    report = train_heads.heads_dir(args.model, args.heads_profile) / "report.json"
    summary = {
        "bpd_step_in_decode_steps": bpd_step / ar_step, "ar_step_ms": 1000 * ar_step, "bpd_step_ms": 1000 * bpd_step,
        "draft_ms_per_step": 1000 * draft,
        "speedup": sum(r["ar_s"] for r in rows) / sum(r["bpd_s"] for r in rows),
        "block_efficiency": sum(r["tokens"] for r in rows) / sum(r["bpd_calls"] for r in rows),
        "identical_outputs": all(r["identical"] for r in rows), "n_prompts": len(rows), "repeats": args.repeats,
        "heads_training_seconds": json.loads(report.read_text())["seconds"] if report.exists() else None,
        "args": vars(args), "environment": environment(threads, "cpu", args.dtype)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"summary": summary, "prompts": rows}, indent=2))
    print(f"\nBPD step = {summary['bpd_step_in_decode_steps']:.3f} decode steps "
          f"({summary['bpd_step_ms']:.1f} ms vs {summary['ar_step_ms']:.1f} ms; drafting {draft * 1000:.1f} ms)")
    print(f"speedup (sum AR / sum BPD) = {summary['speedup']:.3f}x at block efficiency "
          f"{summary['block_efficiency']:.3f}; identical outputs: {summary['identical_outputs']}")
    print(f"heads training time ({args.heads_profile}): {summary['heads_training_seconds']} s")
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
