"""`bpdbench speed`: wall-clock speed of our decoders and of transformers' `generate`, on identical outputs.

Protocol (as scripts/bench_step.py): load once, warm every method up on the first prompt, then for each prompt run
the methods interleaved in a fixed order `repeats` times (so drifts in machine load hit every method alike) and keep
the median. Every method must reproduce `ar`'s tokens: a (prompt, method) pair that does not is reported and left
out of that method's speedup, because a different output is a different amount of work.
Speedup = sum of ar median seconds / sum of method median seconds over the prompts where the method is identical.
"""
from __future__ import annotations

import json
import statistics
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pandas as pd
import torch

import rescorers
import tasks as task_registry
from . import decoding, models, runner
from .config import RunConfig, environment
from .results import resumable

HF_METHODS = ("hf-greedy", "hf-pld", "hf-assisted")
OUR_METHODS = ("ar", "bpd")
DEFAULT_ASSISTANT = "qwen2.5-coder-0.5b"
# The default target is the smallest Qwen we have, so it has no smaller same-tokenizer assistant; SmolLM2-135M drafts
# for it through transformers' universal assisted decoding (different tokenizers, re-tokenised drafts).
FALLBACK_ASSISTANT = "smollm2-135m"
PLD_TOKENS = 10
UNUSED = ("method", "rescorer", "alpha", "resume", "check_lossless")  # RunConfig fields `--methods` replaces
Log = Callable[[str], None]


@dataclass
class Output:
    tokens: list[int]
    serial_calls: int       # forwards of the target model, prefill included


Decoder = Callable[[list[int]], Output]


def check_methods(methods: list[str]) -> list[str]:
    """Validate names up front (a typo must not surface after an hour of timing); `ar` always runs, first."""
    for m in methods:
        if m.startswith("bpd-t"):
            _threshold(m)
        elif m not in OUR_METHODS + HF_METHODS:
            try:
                rescorers.get_rescorer(m)
            except ValueError:
                raise ValueError(f"unknown method '{m}'; valid: {', '.join(OUR_METHODS + HF_METHODS)} or a "
                                 f"rescorer ({', '.join(rescorers.RESCORERS)}, hf:<model>)") from None
    return ["ar"] + [m for m in dict.fromkeys(methods) if m != "ar"]


def _threshold(method: str) -> float:
    """`bpd-t0.3`: BPD verifying only draft tokens whose head is at least 30% sure (see decoding.draft)."""
    try:
        value = float(method[len("bpd-t"):])
    except ValueError:
        value = -1.0
    if not 0.0 < value < 1.0:
        raise ValueError(f"bad method '{method}': write bpd-t<threshold> with 0 < threshold < 1, e.g. bpd-t0.3")
    return value


def ours(model, eos: set[int], max_new: int, heads=None, n_heads: int = 0, rescorer=None, k: int = 1,
         threshold: float = 0.0) -> Decoder:
    def run(prompt: list[int]) -> Output:
        g = decoding.generate(model, prompt, max_new, eos, heads=heads, n_heads=n_heads, rescorer=rescorer, k=k,
                              threshold=threshold)
        return Output(g.tokens, g.counters.serial_calls)
    return run


def count_forwards(model) -> list[int]:
    """Target forwards during HF generate (our loop calls model.model, so it never fires this hook)."""
    calls = [0]
    model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def hf(model, eos: set[int], max_new: int, pad_id: int, calls: list[int], assistant=None, tokenizers=None,
       **extra) -> Decoder:
    """transformers greedy `generate`; the output is cut exactly like ours so token ids are comparable.
    `tokenizers` = (target, assistant) when they differ (universal assisted decoding)."""
    budget = assistant.generation_config.num_assistant_tokens if assistant is not None else None
    if assistant is not None:
        extra["assistant_model"] = assistant
    if tokenizers is not None:
        extra["tokenizer"], extra["assistant_tokenizer"] = tokenizers

    def run(prompt: list[int]) -> Output:
        if assistant is not None:  # under a 'heuristic' schedule HF writes the adapted draft length back: reset
            assistant.generation_config.num_assistant_tokens = budget
        x = torch.tensor([prompt], device=model.device)
        calls[0] = 0
        out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=max_new,
                             eos_token_id=sorted(eos), pad_token_id=pad_id, temperature=None, top_p=None,
                             top_k=None, **extra)
        return Output(decoding._truncate(out[0, len(prompt):].tolist(), max_new, eos), calls[0])
    return run


def build_decoders(cfg: RunConfig, methods: list[str], model, tok, eos: set[int], max_new: int,
                   assistant: str | None, log: Log) -> tuple[dict[str, Decoder], dict]:
    """One decoder per method, plus what was resolved for config.json (alphas, assistant, skipped methods)."""
    resolved: dict = {"alpha": {}, "assistant": None, "skipped": {}}
    heads = None
    if any(m not in ("ar",) + HF_METHODS for m in methods):
        heads = runner.resolve_heads(cfg.replace(method="bpd"), model, tok, log)
        resolved["heads"] = getattr(heads, "meta", None)
    calls = count_forwards(model)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else min(eos)
    decoders: dict[str, Decoder] = {}
    for m in methods:
        if m == "ar":
            decoders[m] = ours(model, eos, max_new)
        elif m == "bpd":
            decoders[m] = ours(model, eos, max_new, heads, cfg.heads)
        elif m.startswith("bpd-t"):
            decoders[m] = ours(model, eos, max_new, heads, cfg.heads, threshold=_threshold(m))
        elif m == "hf-greedy":
            decoders[m] = hf(model, eos, max_new, pad_id, calls)
        elif m == "hf-pld":
            decoders[m] = hf(model, eos, max_new, pad_id, calls, prompt_lookup_num_tokens=PLD_TOKENS)
        elif m == "hf-assisted":
            name = assistant or (DEFAULT_ASSISTANT if cfg.model != DEFAULT_ASSISTANT else FALLBACK_ASSISTANT)
            try:
                draft_model, draft_tok = models.load(name, cfg.dtype, cfg.device)  # own instance: generate mutates it
            except (models.ModelError, ModuleNotFoundError) as e:
                if assistant is not None:
                    raise
                resolved["skipped"][m] = reason = f"assistant {name} unavailable ({e}); pass --assistant"
                log(f"skipping hf-assisted: {reason}")
                continue
            same = draft_tok.get_vocab() == tok.get_vocab()
            resolved["assistant"] = name
            resolved["assistant_tokenizer"] = "same" if same else "different (universal assisted decoding)"
            decoders[m] = hf(model, eos, max_new, pad_id, calls, assistant=draft_model,
                             tokenizers=None if same else (tok, draft_tok))
        else:
            spec = rescorers.get_rescorer(m)
            alpha = rescorers.tuned_alpha(cfg.task, spec.name, cfg.model)
            if spec.interpolates:  # the others have no interpolation weight
                resolved["alpha"][m] = spec.default_alpha if alpha is None else alpha
            rescorer = rescorers.build(spec, cfg.model, alpha, cfg.k, str(model.device), log,
                                       heads_meta=getattr(heads, "meta", None), dtype=cfg.dtype)
            decoders[m] = ours(model, eos, max_new, heads, cfg.heads, rescorer, cfg.k)
    return decoders, resolved


def select_examples(cfg: RunConfig, per_category: int | None) -> list:
    """The evaluated slice; with per_category, the first N of each category (Spec-Bench starts with 80 MT-Bench)."""
    task = task_registry.get_task(cfg.task)
    data_dir = Path(cfg.data_dir) if cfg.data_dir else task_registry.default_data_dir()
    examples = task_registry.load_examples(task, data_dir, Path(cfg.data_file) if cfg.data_file else None)
    examples = task_registry.split(task, examples)[0]
    if per_category is None:
        return task_registry.select(examples, cfg.offset, cfg.limit)
    chosen, seen = [], {}
    for ex in examples:
        seen[ex.category] = seen.get(ex.category, 0) + 1
        if seen[ex.category] <= per_category:
            chosen.append(ex)
    return chosen


def timed(fn: Decoder, prompt: list[int]) -> tuple[float, Output]:
    t0 = time.perf_counter()
    out = fn(prompt)
    return time.perf_counter() - t0, out


def measure(decoders: dict[str, Decoder], ex, prompt: list[int], repeats: int) -> list[dict]:
    """All methods on one prompt, interleaved; one record per method with the time of every repeat."""
    runs: dict[str, list[tuple[float, Output]]] = {m: [] for m in decoders}
    for _ in range(repeats):
        for m, fn in decoders.items():
            runs[m].append(timed(fn, prompt))
    ref = runs["ar"][0][1].tokens
    records = []
    for m, rs in runs.items():
        times = [t for t, _ in rs]
        wrong = next((o.tokens for _, o in rs if o.tokens != ref), None)
        med = statistics.median(times)
        records.append({"id": ex.id, "category": ex.category, "method": m, "prompt_tokens": len(prompt),
                        "tokens": len(rs[0][1].tokens), "serial_calls": rs[0][1].serial_calls, "times": times,
                        "median_s": med, "spread": (max(times) - min(times)) / med if med else 0.0,
                        "identical": wrong is None,
                        "first_divergence": None if wrong is None else runner.first_divergence(wrong, ref)})
    return records


def summarize(records: list[dict], keys: tuple[str, ...] = ("method",)) -> pd.DataFrame:
    """Ratios of sums over the prompts where a method reproduced ar; excluded pairs are counted, not hidden."""
    df = pd.DataFrame(records)
    df["ar_s"] = df["id"].map(df[df.method == "ar"].set_index("id")["median_s"])
    rows = []
    for key, g in df.groupby(list(keys), sort=False, dropna=False):
        ok = g[g.identical.astype(bool)]
        tokens, seconds, calls = int(ok.tokens.sum()), float(ok.median_s.sum()), ok.serial_calls
        known = len(ok) > 0 and calls.notna().all() and calls.sum() > 0
        rows.append({**dict(zip(keys, key)), "n_prompts": len(g), "n_identical": len(ok), "tokens": tokens,
                     "seconds": seconds, "tokens_per_s": tokens / seconds if seconds else float("nan"),
                     "speedup_vs_ar": float(ok.ar_s.sum()) / seconds if seconds else float("nan"),
                     "block_efficiency": tokens / float(calls.sum()) if known else float("nan"),
                     "median_spread": float(g.spread.median())})
    return pd.DataFrame(rows)


def report_divergence(summary: pd.DataFrame, records: list[dict], log: Log) -> None:
    for row in summary.itertuples():
        if row.n_identical < row.n_prompts:
            firsts = [f"{r['id']}@{r['first_divergence']}" for r in records
                      if r["method"] == row.method and not r["identical"]]
            log(f"NOT IDENTICAL: {row.method} diverges from ar on {row.n_prompts - row.n_identical}/{row.n_prompts} "
                f"prompts (prompt@token: {', '.join(firsts)}); excluded from its speedup, tokens and seconds")


def _resumable(out: Path, config: dict, resume: bool) -> list[dict]:
    """Records of prompts an interrupted run with the same settings and heads measured with every method."""
    key = lambda m: {**{k: m.get(k) for k in ("config", "methods", "repeats", "per_category")},  # noqa: E731
                     "heads": m.get("resolved", {}).get("heads")}
    records = resumable(out, "speed.jsonl", config, key, resume)
    per_id = Counter(r["id"] for r in records)
    return [r for r in records if per_id[r["id"]] == len(config["methods"])]


def run(cfg: RunConfig, methods: list[str], repeats: int = 3, assistant: str | None = None,
        per_category: int | None = None, log: Log = print, resume: bool = False) -> Path:
    """Measure, write speed.jsonl / speed.csv / speed_by_category.csv / config.json, return the directory.
    Records are appended per prompt, so an interrupted run loses only the prompt in flight (`resume`)."""
    cfg, methods = cfg.validate(), check_methods(methods)
    if repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {repeats}")
    threads = runner.setup_torch(cfg)
    task = task_registry.get_task(cfg.task)
    examples = select_examples(cfg, per_category)
    model, tok = models.load(cfg.model, cfg.dtype, cfg.device)
    eos, max_new = runner.eos_ids(model, tok), cfg.max_new_tokens or task.max_new_tokens
    decoders, resolved = build_decoders(cfg, methods, model, tok, eos, max_new, assistant, log)
    out = Path(cfg.out or Path("results") / "speed" / cfg.task)
    out.mkdir(parents=True, exist_ok=True)
    args = {k: v for k, v in cfg.to_dict().items() if k not in UNUSED}
    config = {"config": args, "methods": list(decoders), "repeats": repeats, "per_category": per_category,
              "resolved": {**resolved, "max_new_tokens": max_new, "eos_ids": sorted(eos), "n_prompts": len(examples),
                           "model_id": models.model_id(cfg.model), "pld_tokens": PLD_TOKENS},
              "environment": environment(threads, str(model.device), cfg.dtype)}
    config = json.loads(json.dumps(config, default=str))
    records = _resumable(out, config, resume)
    if records:
        log(f"resuming: {len({r['id'] for r in records})} prompts already measured in {out}")
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "speed.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    prompts = [runner.encode_prompt(tok, task, ex, cfg.max_prompt_tokens) for ex in examples]
    for fn in decoders.values():  # warm-up: allocator, oneDNN kernels, HF's first-call setup
        fn(prompts[0])
    done = {r["id"] for r in records}
    with open(out / "speed.jsonl", "a") as f:
        for i, (ex, prompt) in enumerate(zip(examples, prompts)):
            if ex.id in done:
                continue
            recs = measure(decoders, ex, prompt, repeats)
            f.write("".join(json.dumps(r) + "\n" for r in recs))
            f.flush()
            records += recs
            log(f"[{i + 1}/{len(prompts)}] {ex.id}: " + ", ".join(
                f"{r['method']} {r['median_s']:.2f}s" + ("" if r["identical"] else " (DIFFERS)") for r in recs))
    summary = summarize(records)
    summary.to_csv(out / "speed.csv", index=False)
    if any(r["category"] for r in records):
        summarize(records, ("category", "method")).to_csv(out / "speed_by_category.csv", index=False)
    report_divergence(summary, records, log)
    return out
