"""`bpdbench replay | oracle`: many methods on the same greedy trajectories, through the engine's replay.

Per example: the greedy reference G (cached), one teacher-forced forward for the hidden states, then every method's
drafter walked along G by `engine.replay` (the loop's own propose/decide code). Records are appended per example;
with --resume, finished examples are kept. Block efficiency and every other ratio come from summed counters.
A drafter that keeps state across examples (Token Recycling's matrix) walks the examples in order with one state,
saved after each example (experiments/carry.py), so a resumed replay starts each remaining example from the state
the uninterrupted one had, or refuses in one line when that state cannot be rebuilt.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import pandas as pd

from ..engine import (Counters, OnStep, StepEvent, TreeScorer, layers_of, ratios, replay, teacher_forced,
                      teacher_forced_layers)
from ..methods import Method, bind
from ..methods.contract import needs_scorer, reads_reference
from ..store import PROMPT_HASH, AppendOnlyJsonl, OutputLock, resumable, settings_and_heads, write_atomic
from .carry import CarriedState
from .examples import prompt_sha256
from .session import Session

KS = (1, 2, 4, 8, 16)
RESUME_IGNORES = ("limit", "threads", "out", "resume")   # a resumed run may ask for more examples, on other threads


def trajectories(s: Session, skip: frozenset = frozenset(), need_hidden: bool = True, with_prompt: bool = False
                 ) -> Iterator[tuple]:
    """(example, prompt ids, greedy output, hidden states) for the selected examples with >= 2 output tokens;
    `with_prompt`: the hidden states of the prompt's positions too (feature drafters replay from them)."""
    for ex in s.examples:
        if ex.id in skip:
            continue
        prompt = s.prompt(ex)
        greedy, _ = s.reference.get(prompt, s.limits)
        if len(greedy) >= 2:
            yield ex, prompt, greedy, (teacher_forced(s.model, prompt, greedy, with_prompt) if need_hidden else None)


def replay_one(s: Session, drafter, prompt: list[int], greedy: list[int], hidden, memo: dict | None = None,
               on_step: OnStep | None = None, layer_states: dict | None = None) -> Counters:
    """`memo`: one dict per example, shared by every drafter replayed on it (engine.DraftContext.memo);
    `layer_states`: the declared layers' states (engine.teacher_forced_layers) for drafters that read them."""
    if reads_reference(drafter):
        drafter.use_reference(greedy)
    scorer = TreeScorer(s.model) if needs_scorer(drafter) else None
    return replay(drafter, prompt, greedy, hidden, s.limits, memo=memo, scorer=scorer, on_step=on_step,
                  layer_states=layer_states)


class DraftRepetition:
    """Counts adjacent identical tokens in the first path of every verified proposal (the paper's repetition
    analysis, for any method): independent heads repeat tokens that the base's text does not. A step observer
    (`engine.StepEvent`), so the drafter itself runs unwrapped."""

    def __init__(self):
        self.pairs = self.same = 0

    def __call__(self, ev: StepEvent) -> None:
        path = ev.proposal.paths[0]
        self.pairs += max(len(path) - 1, 0)
        self.same += sum(a == b for a, b in zip(path, path[1:]))

    def take(self) -> dict:
        out, self.pairs, self.same = {"draft_pairs": self.pairs, "draft_repeats": self.same}, 0, 0
        return out


def _share(records: list[dict], key: str) -> float:
    pairs = sum(r.get(key, {}).get("draft_pairs", 0) for r in records)
    same = sum(r.get(key, {}).get("draft_repeats", 0) for r in records)
    return same / pairs if pairs else float("nan")


def replay_methods(s: Session, methods: list[Method], out: Path, resume: bool = False,
                   per_category: int | None = None, lock: OutputLock | None = None) -> pd.DataFrame:
    """Block efficiency of each method on the same trajectories (the first method is the baseline).
    Records are keyed by each method's canonical label (the run's options bound: a plan's methods already are)."""
    methods = [bind(m, s.cfg) for m in methods]
    drafters = {m.label: s.drafter(m) for m in methods}
    repeats = {label: DraftRepetition() for label in drafters}
    labels = list(drafters)
    meta = s.meta(methods, rescorer_dtype=s.cfg.dtype,   # neural rescorers follow the run's dtype
                  **({"per_category": per_category} if per_category else {}))
    key = lambda m: {**settings_and_heads(m), "methods": m.get("methods")}  # noqa: E731
    ids = {ex.id for ex in s.examples}
    with AppendOnlyJsonl(out, "replay.jsonl", log=s.log, lock=lock) as jsonl:
        # kept whole: records of examples outside this selection stay in the file (never rewritten away), except a
        # record the saved drafter state does not follow (written just before a crash: carry.py), replayed again
        kept = resumable(out, "replay.jsonl", meta, key, resume, ignore=RESUME_IGNORES, file=jsonl)
        carried = CarriedState.beside(out, "replay.jsonl", drafters, s.log)
        selection = [ex.id for ex in s.examples]
        if not resume:
            jsonl.start_fresh()
        skip, kept = carried.open(resume, selection, kept, jsonl)
        done = [r for r in kept if r["id"] in ids]
        if done:
            s.log(f"resuming: {len(done)} examples already replayed in {out}")
        write_atomic(out / "config.json", json.dumps(meta, indent=2, default=str))
        totals = {m: Counters() for m in labels}
        for r in done:
            totals = {m: totals[m].add(Counters.from_dict(r[m])) for m in labels}
        n_examples = len(done)
        recorded = {r["id"] for r in kept}
        # the layers any drafter declares (engine.Layers), from the same teacher-forced forward; none: as before
        wanted = sorted({i for d in drafters.values() if (chosen := layers_of(d)) for i in chosen.indices})
        for ex, prompt, greedy, hidden in trajectories(s, frozenset(skip | recorded), need_hidden=not wanted,
                                                       with_prompt=True):
            layer_states = None
            if wanted:
                hidden, layer_states = teacher_forced_layers(s.model, prompt, greedy, wanted, with_prompt=True)
            n_examples += 1
            rec = {"id": ex.id, PROMPT_HASH: prompt_sha256(ex), "new_tokens": len(greedy)}
            memo: dict = {}
            rec["text_pairs"] = len(greedy) - 1
            rec["text_repeats"] = sum(a == b for a, b in zip(greedy, greedy[1:]))
            for m, drafter in drafters.items():
                c = replay_one(s, drafter, prompt, greedy, hidden, memo, on_step=repeats[m], layer_states=layer_states)
                totals[m] = totals[m].add(c)
                rec[m] = {**c.to_dict(), **repeats[m].take()}
            jsonl.append([rec])
            done.append(rec)
            recorded.add(ex.id)     # then the state the example hands on (a crash between the two: replayed again)
            visited = selection[:selection.index(ex.id) + 1]
            carried.save(visited, recorded & set(visited))
    rows = []
    text_pairs = sum(r.get("text_pairs", 0) for r in done)
    text_share = sum(r.get("text_repeats", 0) for r in done) / text_pairs if text_pairs else float("nan")
    base = ratios(totals[labels[0]])["block_efficiency"]
    for m in labels:
        r = ratios(totals[m])
        rows.append({"task": s.cfg.task, "method": m, "n_examples": n_examples,
                     "new_tokens": totals[m].new_tokens, "serial_calls": totals[m].serial_calls,
                     "block_efficiency": r["block_efficiency"], "acceptance_rate": r["acceptance_rate"],
                     "relative_change_pct": 100 * (r["block_efficiency"] / base - 1),
                     "draft_repeat_share": _share(done, m), "text_repeat_share": text_share})
    df = pd.DataFrame(rows)
    write_atomic(out / "replay.csv", df.to_csv(index=False))
    return df


def oracle_table(s: Session, out: Path, methods: list[Method], ks: tuple[int, ...], resume: bool = False,
                 lock: OutputLock | None = None) -> pd.DataFrame:
    """`methods`: the heads' plain drafts, then the oracle at each of `ks` (the plan's, experiments/commands.py)."""
    from .figures import plot_oracle
    df = replay_methods(s, methods, out, resume=resume, lock=lock)
    df = df[df.method != methods[0].label].assign(k=list(ks))
    df["relative_gain_pct"] = 100 * (df.block_efficiency / df.block_efficiency.iloc[0] - 1)
    write_atomic(out / "oracle.csv", df.to_csv(index=False))
    plot_oracle(df, out / "oracle.png", s.cfg.task, s.cfg)
    return df
