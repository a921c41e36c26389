"""`bpdbench certify`: a statistical certificate that a method samples what AR sampling samples, on the real model.

At T > 0 there is no per-example reference to compare with: a method is right when its outputs are distributed as
the target's. So, per prompt, S outputs of AR sampling and S outputs of the method (distinct seeds, every one a run
of the real decode loop with the real acceptance rule) are compared position by position: for each of the first P
generated positions, a chi-square test of homogeneity on the token counts (rare tokens pooled; a position after an
EOS counts as the token "end"). Holm's step-down over the prompts x positions of a method keeps its family-wise
false-alarm rate at `level`; the method passes when no test rejects.

A test that never fails certifies nothing, so the same command runs deliberately wrong samplers (`--rules
exact,always-accept,no-residual`: lossy variants of the rule, engine/sampling.py) against the same AR samples; they
should be rejected. Both sides run in the same dtype on the same model, so bfloat16 is a fair setting: the test asks
whether the two *samplers* agree, not whether bf16 equals fp32.

Cost: the prompt's forward is computed once per prompt and its cache copied per sample (engine.loop.prefill memo);
each sample then costs its P - 1 decode steps (AR) or fewer verify steps (methods).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd

from ..engine import Limits, generate
from ..engine.sampling import LOSSY
from ..store import write_atomic
from ..stats import holm, homogeneity
from .command import Plan
from .session import Log

END = -1             # the "token" at a position after EOS
SEED_STRIDE = 1_000_000


def sample_and_test(s, plan: Plan, log: Log = print) -> dict:
    """The samples and the tests, written to certify.json / certify.csv / certify_summary.csv / samples.jsonl (the
    folder's lock is held: experiments/execute.py; the options were checked when the Plan was made)."""
    o = plan.options
    cfg, chosen, out = plan.cfg, list(plan.methods), plan.out
    rule_list, samples, positions, level = list(o.rules), o.samples, o.positions, o.level
    drafters = {m.label: s.drafter(m) for m in chosen}
    limits = Limits(cfg.max_new_tokens or positions, s.limits.eos_ids)
    families = [("ar", None, "exact")] + [(m, d, r) for m, d in drafters.items() for r in rule_list]
    draws: dict[str, list] = {f"{m}|{r}": [] for m, _, r in families}
    alphas: dict[str, list[float]] = {k: [] for k in draws}
    for i, ex in enumerate(s.examples):
        prompt, memo = s.prompt(ex), {}
        for side, (label, drafter, rule) in enumerate(families):
            t0, key = time.perf_counter(), f"{label}|{rule}"
            outs = []
            for j in range(samples):
                seed = (cfg.seed or 0) + SEED_STRIDE * (cfg.offset + i) + len(families) * j + side
                acc = s.acceptance(i, rule, seed=seed)
                if drafter is not None:
                    s.with_reference(drafter, prompt)
                gen = generate(s.model, drafter, prompt, limits, acc, memo=memo)
                outs.append((gen.tokens + [END] * positions)[:positions])
                alphas[key] += acc.alphas
            draws[key].append({"id": ex.id, "tokens": outs})
            log(f"[{i + 1}/{len(s.examples)}] {ex.id} {key}: {samples} samples in {time.perf_counter() - t0:.0f}s")
    result = _tests(draws, alphas, families, positions, level)
    meta = s.meta(chosen, samples=samples, positions=positions, level=level, rules=rule_list,
                  seeds=f"seed + {SEED_STRIDE} x example index + {len(families)} x sample + side")
    _write(out, meta, result, draws)
    return result


def _tests(draws: dict, alphas: dict, families: list, positions: int, level: float) -> dict:
    rows, verdicts = [], []
    ar = draws["ar|exact"]
    for label, _, rule in families[1:]:
        key = f"{label}|{rule}"
        tests = []
        for ref, mine in zip(ar, draws[key]):
            for pos in range(positions):
                t = homogeneity([o[pos] for o in ref["tokens"]], [o[pos] for o in mine["tokens"]])
                tests.append({"method": label, "rule": rule, "id": ref["id"], "position": pos + 1,
                              "statistic": t.statistic, "df": t.df, "cells": t.cells, "p_value": t.p_value})
        rejected = holm([t["p_value"] for t in tests], level)
        for t, r in zip(tests, rejected):
            t["rejected"] = r
        rows += tests
        n_alpha = len(alphas[key])
        verdicts.append({"method": label, "rule": rule, "lossy": rule in LOSSY, "n_tests": len(tests),
                         "rejections": sum(rejected), "min_p": min(t["p_value"] for t in tests),
                         "passed": not any(rejected),
                         "alpha_mean": sum(alphas[key]) / n_alpha if n_alpha else None})
    return {"level": level, "correction": "Holm over prompts x positions, per method and rule",
            "families": verdicts, "tests": rows}


def _write(out: Path, meta: dict, result: dict, draws: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "certify.json", json.dumps({**meta, **result}, indent=2, default=str))
    write_atomic(out / "certify.csv", pd.DataFrame(result["tests"]).to_csv(index=False))
    write_atomic(out / "certify_summary.csv", pd.DataFrame(result["families"]).to_csv(index=False))
    lines = [json.dumps({"side": k, **d}) for k, v in draws.items() for d in v]
    write_atomic(out / "samples.jsonl", "\n".join(lines) + "\n")
