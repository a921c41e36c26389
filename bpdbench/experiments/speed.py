"""`bpdbench speed`: wall-clock speed of every method, ours and transformers', on identical outputs.

Protocol: load once, warm every method up on the first prompt, then for each prompt run the methods interleaved,
`repeats` times in an order rotated each round (timing.interleaved), and keep the median. Every repeat sees the same drafter state: a
drafter that keeps state across examples (engine/state.py: Token Recycling's matrix) is snapshotted before each
prompt and restored, untimed, before each repeat, and the warm-up is undone the same way, so it never changes what a
measured prompt sees; the state a prompt hands on is its last repeat's, which for greedy decoding is an uninterrupted
run's (saved per prompt for --resume, experiments/carry.py). Each run checks this (experiments/drift.py):
`repeat_drift` in speed.csv compares how much faster later repeats are than the first with AR's, and a method whose
repeats speed up is warned about. Every method must reproduce `ar`'s tokens (another engine's speculative mode: that
engine's greedy, experiments/engines.py): a
(prompt, method) pair that does not is reported and left out of that method's speedup, because a different output
is a different amount of work. Speedup = sum of ar median seconds / sum of method median seconds over the prompts
where the method is identical; step cost = (method seconds per serial call) / (ar seconds per serial call), the
cost of one verify forward in decode steps.

At T > 0 (`--temperature`) outputs are draws, so "identical to ar" does not apply: every method (ar included)
samples prompt i with the generator seeded seed + offset + i, the same in every repeat (so repeats time the same
work), and the speedup is per token: (ar seconds / ar tokens) / (method seconds / method tokens) over all prompts.
transformers' own loops (hf-*) are timed greedy only and are skipped at T > 0.
"""
from __future__ import annotations

import json
import os
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pandas as pd

import tasks as task_registry

from ..config import RunConfig
from ..paths import portable_tree
from ..engine import Counters
from ..engine.state import restore, snapshot
from ..hardware import contention
from ..methods import Method, MethodUnavailable, Output
from ..store import PROMPT_HASH, AppendOnlyJsonl, OutputLock, resumable, settings_and_heads, write_atomic
from . import drift, engines, prediction
from .carry import CarriedState
from .draw import subtask
from .examples import prompt_sha256
from .speed_summary import counted, summarize  # noqa: F401 (callers read them here)
from .reference import first_divergence
from .command import Plan
from .session import Log
from .timing import interleaved, median

MACHINE_AND_CODE = ("fingerprint", "git_commit")      # a resumed speed run must share both
RETIME_BUSY, RETIME_PAUSE_S = 2, 20.0     # a prompt timed on a busy machine: at most 2 more tries, 20 s apart
RETIME_CALL, RETIME_CALL_PAUSE_S = 3, 5.0  # one call timed on a busy machine: at most 3 more tries, 5 s apart
UNUSED = ("method", "rescorer", "alpha", "resume", "check_lossless")  # RunConfig fields `--methods` replaces


@dataclass
class Timed(Output):
    """Our loop's output with the counters of that very decode (acceptance per draft position) and its prefill's
    seconds (the decode speedup leaves out the prefill, which every method pays alike)."""
    counters: Counters | None = None
    prefill_seconds: float | None = None


@dataclass
class Decoder:
    """One of our methods in speed: its drafter is kept beside it, so its cross-example state can be put back."""
    session: Any
    drafter: Any

    def __call__(self, prompt: list[int], index: int) -> Timed:
        s = self.session
        s.with_reference(self.drafter, prompt)
        g = s.decode(self.drafter, prompt, s.acceptance(index))
        sizes = Counter(prediction.size_key(n, tree, rows) for n, tree, rows in g.verify_log)
        return Timed(g.tokens, g.counters.serial_calls, g.seconds["draft"], g.counters.verified, dict(sizes),
                     g.counters, g.seconds["prefill"])


def decoders(s, methods: list[Method], log: Log) -> tuple[dict, dict]:
    """One decoder ((prompt, index) -> Output) per method label; unavailable peers that were not named are
    skipped, and at T > 0 transformers' loops are. Our methods' decoders carry their drafter (`Decoder`)."""
    out, skipped = {}, {}
    for m in methods:
        if m.spec.external:
            if not s.cfg.sampling.greedy:
                skipped[m.label] = "transformers' own loops are timed greedy only"
                log(f"skipping {m.label}: {skipped[m.label]} (T > 0)")
                continue
            try:
                external = m.spec.build(s.env, m)
                out[m.label] = lambda prompt, index, fn=external: fn(prompt)
            except MethodUnavailable as e:
                if m.params:
                    raise
                skipped[m.label] = str(e)
                log(f"skipping {m.label}: {e}")
            continue
        out[m.label] = Decoder(s, s.drafter(m))
    return out, skipped


def drafters_of(fns: dict) -> dict[str, Any]:
    """The drafters behind the decoders (None for transformers' loops, which keep nothing between calls)."""
    return {m: getattr(fn, "drafter", None) for m, fn in fns.items()}


def _work(rs: list) -> dict:
    """What each repeat did (equal across repeats unless state leaks) and the first repeat's acceptance per draft
    position, from the counters of the decode that produced the recorded tokens."""
    first = getattr(rs[0][1], "counters", None)
    out = {"repeat_serial_calls": [o.serial_calls for _, o in rs]}
    if first is not None:
        out.update(steps=first.steps, accepted_per_head=list(first.accepted_per_head),
                   repeat_accepted=[o.counters.accepted for _, o in rs])
    return out


def measure(fns: dict, ex, prompt: list[int], repeats: int, device, index: int = 0, sampled: bool = False,
            certify: Callable | None = None, log: Log = print, subtask: str | None = None,
            baselines: dict | None = None, engine_certify: Callable[[str], Callable] | None = None) -> list[dict]:
    """All methods on one prompt, interleaved; one record per method with the time of every repeat. A greedy
    output that differs from ar's gets its certificate (`certify(prompt, output, ref, width)`: near_tie or lost,
    experiments/certificate.py), so a bfloat16 near-tie is counted instead of dropping the prompt; a method whose
    `baselines` entry names another engine's greedy is compared with that one's tokens instead, and a divergence
    from it gets `engine_certify(baseline)`'s certificate (experiments/engines.py: llama.cpp's near-tie rule on its
    own logits; lost without it). A busy call is
    timed again (RETIME_CALL, hardware/timing.interleaved), a busy prompt again whole (RETIME_BUSY, then kept with its
    others_cores): a leaderboard accumulated over sittings must not keep what a test run beside it slowed."""
    load = _load()
    drafters = drafters_of(fns)
    states = {m: snapshot(d) for m, d in drafters.items()}     # the state every repeat of this prompt starts from
    for attempt in range(1 + RETIME_BUSY):
        if attempt:         # another process took the CPU: the same prompt again, from the same state
            log(f"{ex.id}: timed while {contention.describe(others.others_cores)}; timing it again "
                f"({attempt}/{RETIME_BUSY}) in {RETIME_PAUSE_S:g} s")
            time.sleep(RETIME_PAUSE_S)
        with contention.Meter() as others:
            runs = interleaved({m: (lambda fn=fn: fn(prompt, index)) for m, fn in fns.items()}, repeats, device,
                               before=lambda m: restore(drafters[m], states[m]), retimes=RETIME_CALL,
                               pause_s=RETIME_CALL_PAUSE_S, log=lambda msg: log(f"{ex.id}: {msg}"),
                               order_seed=index)
        if not contention.is_busy(others.others_cores):
            break
    load = max(load, _load())
    records = []
    for m, rs in runs.items():
        base = (baselines or {}).get(m, "ar")
        ref = runs[base][0][1].tokens
        times = [t for t, _ in rs]
        wrong = next((o.tokens for _, o in rs if o.tokens != ref), None)
        if sampled:        # draws: compared with the method's own first repeat (the seed makes them reproducible)
            wrong = next((o.tokens for _, o in rs if o.tokens != rs[0][1].tokens), None)
        med = median(times)
        prefills, turn = [getattr(o, "prefill_seconds", None) for _, o in rs], getattr(ex, "turn", 0)
        records.append({"id": ex.id, "category": ex.category, "subtask": subtask,
                        "question": task_registry.question_of(ex.id, turn), "turn": turn + 1,
                        "method": m, "prompt_tokens": len(prompt),
                        "prefill_s": None if None in prefills else median(prefills),
                        "tokens": len(rs[0][1].tokens), "serial_calls": rs[0][1].serial_calls, "times": times,
                        "median_s": med, "spread": (max(times) - min(times)) / med if med else 0.0,
                        "identical": wrong is None,
                        "draft_s": (median([o.draft_seconds for _, o in rs]) if rs[0][1].draft_seconds is not None
                                    else None),
                        "first_divergence": None if wrong is None else first_divergence(wrong, ref),
                        "verified": rs[0][1].verified, "verify_sizes": rs[0][1].verify_sizes,
                        "load_average": load, "others_cores": others.others_cores, **_work(rs),
                        **engines.compared(base, rs[0][1].tokens, runs["ar"][0][1].tokens),
                        **({"sampled": True} if sampled else _certificate(
                            certify if base == "ar" else (engine_certify or engines.lost_against)(base), prompt,
                            wrong, ref, rs))})
    return records


def _certificate(certify: Callable | None, prompt: list[int], wrong: list[int] | None, ref: list[int], rs) -> dict:
    """exact, or the divergence's certificate with the number of output tokens from the divergence on."""
    if wrong is None:
        return {"certificate": "exact", "diverged_tokens": 0}
    if certify is None:
        return {"certificate": None, "diverged_tokens": len(ref) - (first_divergence(wrong, ref) or 0)}
    sizes = [int(str(k).split(":")[0]) for k in (rs[0][1].verify_sizes or {})]
    cert = certify(prompt, wrong, ref, max(sizes, default=9) - 1)
    return {"certificate": cert.certificate, "certificate_reason": cert.reason,
            "diverged_tokens": len(ref) - cert.divergence if cert.divergence is not None else 0}


def _load() -> float:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return float("nan")


def report_divergence(summary: pd.DataFrame, records: list[dict], log: Log,
                      peers: frozenset = frozenset()) -> list[str]:
    """Logs every divergence; returns our methods' lost ones (prompt@token), which fail the run. A peer's (an
    external `generate` loop: its own prefill and attention path) is logged and left out of its counts, but is not
    a fault of this engine, so it does not fail the run (seen: hf-pld's first token on one Spec-Bench prompt)."""
    lost = []
    for row in summary.itertuples():
        if row.n_identical < row.n_prompts:
            mine = [r for r in records if r["method"] == row.method and not r["identical"]]
            firsts = [f"{r['id']}@{r['first_divergence']}" for r in mine]
            if any(r.get("sampled") for r in records):
                log(f"NOT IDENTICAL: {row.method} is not reproducible across repeats with one seed on "
                    f"{len(mine)}/{row.n_prompts} prompts (prompt@token: {', '.join(firsts)}); excluded")
                continue
            near = [r for r in mine if r.get("certificate") == "near_tie"]
            if near:
                log(f"near-tie: {row.method} diverges from ar on {len(near)}/{row.n_prompts} prompts within "
                    f"rounding ({near[0].get('certificate_reason', '')}); counted, {row.near_tie_tokens} tokens "
                    f"after the divergences")
            bad = [f"{r['id']}@{r['first_divergence']} ({r.get('certificate_reason') or 'not certified'})"
                   for r in mine if r.get("certificate") != "near_tie"]
            if row.method in peers:
                for b in bad:
                    log(f"PEER DIVERGED: {row.method} {b}; not counted in its numbers (not this engine's output)")
                continue
            lost += [f"{row.method} {b}" for b in bad]
    for b in lost:
        log(f"LOST: {b}")
    return lost


def _record_drafting(cal, summary: pd.DataFrame) -> None:
    """Each method's measured drafting ms per step into the machine's calibration (`bpdbench calibrate --show`
    lists them), where later predictions of the same method read it."""
    if cal is None:
        return
    from ..hardware.calibration import record_drafting
    for row in summary.itertuples():
        if row.method != "ar" and row.draft_ms_per_step == row.draft_ms_per_step:
            cal.drafting_ms[row.method] = round(float(row.draft_ms_per_step), 3)
    if cal.drafting_ms:
        record_drafting(cal, next(iter(cal.drafting_ms)), next(iter(cal.drafting_ms.values())))


def by_prompt_method(record: dict) -> tuple:
    return record.get("id"), record.get("method")


def _resumable(out: Path, config: dict, resume: bool, jsonl: AppendOnlyJsonl) -> list[dict]:
    """Records of prompts an interrupted run with the same settings and heads measured with every method, on this
    machine with this code: a timing is the machine's and the code's, so a leaderboard accumulated over sittings
    never mixes two of either in one folder."""
    key = lambda m: {**settings_and_heads(m),  # noqa: E731
                     **{k: m.get(k) for k in ("methods", "repeats", "per_category")},
                     **{f"environment.{k}": (m.get("environment") or {}).get(k) for k in MACHINE_AND_CODE}}
    records = resumable(out, "speed.jsonl", config, key, resume, ignore=("threads",), file=jsonl)
    per_id = Counter(r["id"] for r in records)
    complete = [r for r in records if per_id[r["id"]] == len(config["methods"])]
    if len(complete) < len(records):      # a prompt measured by only some methods is measured again, whole
        jsonl.rewrite(complete)
    return complete


def _summaries(records: list[dict], cal, out: Path) -> pd.DataFrame:
    """speed.csv, speed_by_category.csv and speed_by_subtask.csv of `records`, each replaced atomically (a reader
    never sees half)."""
    summary = summarize(records, cal=cal)
    write_atomic(out / "speed.csv", summary.to_csv(index=False))
    if any(r["category"] for r in records):
        write_atomic(out / "speed_by_category.csv",
                     summarize(records, ("category", "method"), cal).to_csv(index=False))
    if any(r.get("subtask") for r in records):      # Spec-Bench's six tasks: the board's columns
        write_atomic(out / "speed_by_subtask.csv",
                     summarize(records, ("subtask", "method"), cal).to_csv(index=False))
    return summary


def run_speed(s, plan: Plan, lock: OutputLock, log: Log = print) -> Path:
    """Measure, write speed.jsonl / speed.csv / speed_by_category.csv / config.json, return the directory.
    Records are appended per prompt, so an interrupted run loses only the prompt in flight (`resume`).
    `recalibrate` (SpeedOptions): measure this machine's forward costs again now instead of reading the cached
    curve. The folder's lock is held (experiments/execute.py)."""
    o = plan.options
    chosen = list(plan.methods)                # ar first: `prepare` put the baseline there
    with AppendOnlyJsonl(plan.out, "speed.jsonl", by_prompt_method, log, lock) as jsonl:
        return _measure_all(s, plan.cfg, chosen, o.repeats, plan.per_category, plan.resume, plan.out, jsonl, log,
                            o.recalibrate)


def _measure_all(s, cfg: RunConfig, chosen: list[Method], repeats: int, per_category: int | None, resume: bool,
                 out: Path, jsonl: AppendOnlyJsonl, log: Log, recalibrate: bool = False) -> Path:
    fns, skipped = decoders(s, chosen, log)
    from ..hardware.calibration import ensure     # the predictions' costs: measured once per machine, said first
    cal = ensure(cfg.model, cfg.dtype, str(s.model.device), s.threads, model=s.model, log=log, force=recalibrate)
    args = {k: v for k, v in cfg.to_dict().items() if k not in UNUSED}
    config = s.meta(chosen, repeats=repeats, per_category=per_category)
    config["config"], config["methods"] = args, list(fns)
    config["resolved"]["skipped"] = skipped
    config["prompts"] = [ex.id for ex in s.examples]     # what "finished" means: the sweep checks the JSONL has all
    if cfg.prompts:
        from .draw import record
        config["draw"] = record(cfg.prompts, cfg.task)
    if (curves := engines.verify_curves(s, cal, chosen, fns, log)) is not None:
        config["verify_curves"] = curves                  # llama.cpp's and ours, for the board's engines section
    config = portable_tree(json.loads(json.dumps(config, default=str)))
    records = _resumable(out, config, resume, jsonl)
    if not resume:
        jsonl.start_fresh()
    write_atomic(out / "config.json", json.dumps(config, indent=2))
    prompts, ids = [s.prompt(ex) for ex in s.examples], [ex.id for ex in s.examples]
    drafters = drafters_of(fns)
    carried = CarriedState.beside(out, "speed.jsonl", drafters, log)     # state kept across prompts, for --resume
    done, records = carried.open(resume, ids, records, jsonl)
    if records:
        log(f"resuming: {len({r['id'] for r in records})} prompts already measured in {out}")
    before = {m: snapshot(d) for m, d in drafters.items()}
    for fn in fns.values():  # warm-up: allocator, oneDNN kernels, HF's first-call setup
        fn(prompts[0], 0)
    for m, d in drafters.items():       # ... and nothing else: what it taught a drafter is forgotten
        restore(d, before[m])

    def certify(prompt: list[int], output: list[int], ref: list[int], width: int):
        from .certificate import certify_output as cert
        return cert(s.model, prompt, output, ref, cfg.dtype, width)

    engine_certify = engines.certifiers(s)     # one per run: llama.cpp's certifying context loads once, not per prompt
    for i, (ex, prompt) in enumerate(zip(s.examples, prompts)):
        if ex.id in done:
            continue
        recs = measure(fns, ex, prompt, repeats, s.model.device, i, not cfg.sampling.greedy, certify, log,
                       subtask(s.task, ex), engines.baselines(chosen), engine_certify)
        recs = [{**r, PROMPT_HASH: prompt_sha256(ex)} for r in recs]     # what a resume checks the prompt by
        records += jsonl.append(recs)     # one fsynced write per prompt; a pair already in the file is not doubled
        carried.save(ids[:i + 1], set(ids[:i + 1]))   # then the state it hands on (a crash between: redone)
        log(f"[{i + 1}/{len(prompts)}] {ex.id}: " + ", ".join(
            f"{r['method']} {r['median_s']:.2f}s" + ("" if r["identical"] else " (DIFFERS)") for r in recs))
        _summaries(records, cal, out)       # the prompts so far: a run stopped in its 10th hour still reports
    summary = _summaries(records, cal, out)
    lost = report_divergence(summary, records, log, frozenset(m.label for m in chosen if m.spec.external))
    drift.warn_drift(summary, log)
    _record_drafting(cal, summary)
    busy = summary.others_cores_max.max()
    if contention.is_busy(busy):
        log(f"WARNING: while timing, {contention.describe(busy)}: these timings are slower and noisier than this "
            f"machine's own (recorded per prompt: others_cores)")
    for row in summary.itertuples():
        if row.engine_efficiency == row.engine_efficiency:
            log(f"{row.method}: measured {row.speedup_vs_ar:.2f}x [{row.speedup_ci_low:.2f}, "
                f"{row.speedup_ci_high:.2f}], predicted {row.predicted_speedup:.2f}x (engine efficiency "
                f"{row.engine_efficiency:.2f}); time: draft {row.share_draft:.0%}, verify {row.share_verify:.0%}, "
                f"prefill {row.share_prefill:.0%}, overhead {row.share_overhead:.0%}")
    if lost:
        from .certificate import LostExamples
        raise LostExamples(f"{len(lost)} output(s) differ from ar beyond {cfg.dtype} rounding (first: {lost[0]}); "
                         f"results kept in {out}, but the run fails: a lossless method lost tokens")
    return out
