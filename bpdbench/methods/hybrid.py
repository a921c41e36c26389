"""`hybrid`: one token tree from a retrieval source and a model source, every token weighed by a calibrated
confidence: the measured probability that the target accepts it, given that the tokens before it were accepted.

Why: retrieval (SAM, hierarchy, pld) drafts long and free continuations where the text repeats itself and nothing
elsewhere; a model draft (qdraft, layerskip, heads, drafters) drafts anywhere, at a price per token.
`sam:fallback=qdraft` switches between them on SAM's match-length rule alone, so a weak match is verified instead of
a good model draft, and a model draft is paid for even where a long match would have done. Here each candidate
token carries a raw confidence (its source, its draft position, and its draft probability where the source gives
one); a table measured on the task's **tune** split maps it to the rate at which the target accepted such tokens.
At each step:
1. the retrieval source proposes (free); its chain's expected accepted length is E_r = sum_j prod_{i<=j} c_i;
2. the model source drafts only when E_r is below `skip`, the expected length of the model's own drafts on the
   tune split (its tokens cost time; a retrieval draft expected to do as well makes them waste);
3. both chains merge into one token trie (shared prefixes once) and the `nodes` most probable nodes are verified:
   EAGLE-2's dynamic-tree rule (a node is worth its path's probability), across sources.
Under sampling (T > 0) it proposes one chain, the source with the larger expected length, with that source's own
draft probabilities: a tree mixing point masses and draft distributions is not something the acceptance rule can
correct exactly, and each source's chain is (each is certified on its own).

The calibration (`resolved.<label>.calibration`): per source, draft position and probability bin, the tokens that
were reached (all before them accepted) and accepted, and the rate (Laplace-smoothed), from replaying each source
alone over the target's greedy continuations of the tune prompts; cached per machine (methods/selfdraft.cached).

`length` sets the model source's draft length, `nodes` the tree's budget; `auto` sizes them on this machine, one
replay per (length, budget) pair (methods/search.py `Combos`: a budget of one chain and of two for each length 2-6),
priced on this machine's cost of a forward. Why: the default shape (6 model tokens, 12 nodes) is what paid on an
Intel Xeon with AMX, where a verify of 13 rows costs about 1.1 decode steps; where bfloat16 lacks AMX about 2,
and the default hybrid fell behind its model source alone (results/leaderboard-1c87efb94143/spec_bench).
"""
from __future__ import annotations

import hashlib
import json
from functools import cache
from pathlib import Path
from typing import Any

from ..engine import (DraftContext, Limits, Proposal, TreeScorer, generate, layers_of, replay, teacher_forced,
                      teacher_forced_layers)
from ..engine import state as drafter_state
from .base import AUTO, Method, MethodError, MethodSpec, Param, inner_text
from .compose import HIDDEN, OBSERVE, RESET, Wrapper, check_inner, consumes, declared
from .contract import Requirement, needs_scorer
from .env import Env
from .search import Combos
from .selfdraft import cached, tune_prompts

# the model source: the int4 copy on the target's cache, 6 tokens (results/frontier-length: 1.70x AR alone on 8
# MT-Bench prompts, Intel Xeon with AMX, bfloat16; the int8 copy on its own cache drafted at 0.67 of a step)
RETRIEVAL, MODEL, NODES = "sam:fallback=none", "qdraft:length=6;cache=base", 12
POSITIONS = 8                         # draft positions calibrated apart; deeper ones share the last bin
EDGES = (0.5, 0.8, 0.95)              # draft-probability bins: [0, .5), [.5, .8), [.8, .95), [.95, 1]
CAL_TOKENS = 48                       # greedy tokens continued from each tune prompt for the calibration
SOURCES = ("retrieval", "model")
# auto: the model's draft length and the node budget are one shape (a longer model draft is worth verifying only
# with room for it beside the retrieval draft); one replay per pair, priced on this machine's cost of a forward
LENGTHS = (2, 3, 4, 5, 6)
BUDGETS = (4, 6, 8, 12, 16)           # nodes=auto with a given length: one replay per budget


def source_method(raw: str) -> Method:
    """`qdraft;bits=8;length=6` -> the inner method, parsed here, once, with the hybrid's spelling (the hybrid
    forwards every input, so only whole decoders are refused)."""
    from .spelling import parse
    text = inner_text(raw)
    if text.partition(":")[0].strip() in ("hybrid", "ar", "null"):
        raise MethodError(f"hybrid: {raw} cannot be a source (name a drafting method other than hybrid)")
    inner = parse(text)
    check_inner("hybrid", "source", inner)
    return inner


source_method.__name__ = "method spelling"


@cache
def _default(spelling: str) -> Method:
    """A source the spelling leaves out: its default, parsed once for the process."""
    from .spelling import parse
    return parse(inner_text(spelling))


def _retrieval(method: Method) -> Method:
    return method.get("retrieval") or _default(RETRIEVAL)


def bin_of(position: int, prob: float | None) -> str:
    """The calibration cell of a draft token: its position (capped) and its draft-probability bin."""
    p = 1.0 if prob is None else prob
    return f"{min(position, POSITIONS - 1)}:{sum(p >= e for e in EDGES)}"


class SourceCalibration:
    """Per source and cell: [reached, accepted]; `rate` is the Laplace-smoothed acceptance, the confidence."""

    def __init__(self, counts: dict[str, dict[str, list[int]]] | None = None):
        self.counts = counts or {s: {} for s in SOURCES}

    def add(self, source: str, path: list[int], probs: list[float] | None, matched: int) -> None:
        for j in range(min(len(path), matched + 1)):
            cell = self.counts[source].setdefault(bin_of(j, probs[j] if probs else None), [0, 0])
            cell[0] += 1
            cell[1] += int(j < matched)

    def rate(self, source: str, position: int, prob: float | None) -> float:
        reached, accepted = self.counts[source].get(bin_of(position, prob), (0, 0))
        return (accepted + 1) / (reached + 2)

    def confidences(self, source: str, path: list[int], probs: list[float] | None) -> list[float]:
        """Each token's path probability: the product of the calibrated rates up to it."""
        out, acc = [], 1.0
        for j in range(len(path)):
            acc *= self.rate(source, j, probs[j] if probs else None)
            out.append(acc)
        return out

    def to_dict(self) -> dict:
        return {s: {c: {"reached": n, "accepted": a, "rate": round((a + 1) / (n + 2), 4)}
                    for c, (n, a) in sorted(cells.items())} for s, cells in self.counts.items()}

    @classmethod
    def from_dict(cls, d: dict) -> "SourceCalibration":
        return cls({s: {c: [v["reached"], v["accepted"]] for c, v in d.get(s, {}).items()} for s in SOURCES})


def merge(chains: list[tuple[list[int], list[float]]], nodes: int) -> list[list[int]]:
    """The `nodes` most probable prefixes of the chains (a prefix drafted by both: its larger probability), as the
    paths to their leaves, best first. Probabilities fall along a path, so the kept set is closed under prefixes."""
    value: dict[tuple[int, ...], float] = {}
    for path, conf in chains:
        for j in range(len(path)):
            key = tuple(path[: j + 1])
            value[key] = max(value.get(key, 0.0), conf[j])
    kept = sorted(value, key=lambda k: (-value[k], len(k)))[:nodes]
    chosen = set(kept)
    leaves = [k for k in kept if not any(k + (t,) in chosen for t in _children(k, chosen))]
    return [list(k) for k in leaves] or [[]]


def _children(prefix: tuple[int, ...], chosen: set) -> list[int]:
    return [c[-1] for c in chosen if len(c) == len(prefix) + 1 and c[:-1] == prefix]


def expected_length(conf: list[float]) -> float:
    return float(sum(conf))


class HybridDrafter(Wrapper):
    """`source` (last step: retrieval, model, both or none) and `steps` per source, for analyses and tests."""

    def __init__(self, name: str, retrieval: Any, model: Any, calibration: SourceCalibration, skip: float, nodes: int):
        super().__init__()
        self.name, self.retrieval, self.model = name, retrieval, model
        self.cal, self.skip, self.nodes = calibration, skip, nodes
        self.source = ""
        self.steps = {"retrieval": 0, "model": 0, "both": 0, "none": 0}

    def inner_drafters(self) -> list:
        return [self.retrieval, self.model]

    def propose(self, ctx: DraftContext) -> Proposal:
        r = self.retrieval.propose(self.context_for(self.retrieval, ctx)).clip(ctx.budget)
        r_path = r.paths[0]
        r_conf = self.cal.confidences("retrieval", r_path, None)     # retrieval's own probs are point masses
        if r_path and expected_length(r_conf) >= self.skip:
            self.hold(self.model, ctx)
            return self._chosen("retrieval", r)
        m = self.model.propose(self.context_for(self.model, ctx)).clip(ctx.budget)
        m_path, m_probs = m.paths[0], (m.probs[0] if m.probs else None)
        m_conf = self.cal.confidences("model", m_path, m_probs)
        if ctx.sampler is not None or not r_path or not m_path:       # one chain: the longer expected one
            if not r_path and not m_path:
                return self._chosen("none", Proposal())
            better = m if expected_length(m_conf) >= expected_length(r_conf) or not r_path else r
            return self._chosen("model" if better is m else "retrieval", better)
        paths = merge([(r_path, r_conf), (m_path, m_conf)], self.nodes)
        self.source = "both"
        self.steps["both"] += 1
        return Proposal(paths)

    def _chosen(self, source: str, p: Proposal) -> Proposal:
        self.source = source
        self.steps[source] += 1
        return p


def calibrate(env: Env, retrieval: Any, model: Any, rm: Method, mm: Method) -> dict:
    """Replay each source alone over the target's greedy continuations of the tune prompts (their states put back
    afterwards): the acceptance of its tokens per cell, and `skip`, the model's mean expected draft length."""
    def measure() -> dict:
        prompts, why = tune_prompts(env)
        cal = SourceCalibration()
        model_lengths: list[float] = []
        limits = Limits(CAL_TOKENS, env.limits.eos_ids)
        for source, drafter, method in (("retrieval", retrieval, rm), ("model", model, mm)):
            before = drafter_state.snapshot(drafter)
            needs_hidden = HIDDEN in declared(method) or HIDDEN in consumes(drafter, method)
            scorer = TreeScorer(env.model) if needs_scorer(drafter) else None
            steps: list[tuple[list[int], list[float] | None, int]] = []
            for prompt in prompts:
                greedy = generate(env.model, None, list(prompt), limits).tokens
                hidden = teacher_forced(env.model, list(prompt), greedy, with_prompt=True) if needs_hidden else None
                layers = layers_of(drafter)               # a drafter that reads chosen layers gets them too
                chosen = None if layers is None else \
                    teacher_forced_layers(env.model, list(prompt), greedy, layers.indices, with_prompt=True)[1]

                def on_step(ev, prompt=prompt, greedy=greedy) -> None:
                    path = ev.proposal.paths[0]
                    ref = greedy[len(ev.context.tokens) - len(prompt):]
                    matched = next((j for j, (a, b) in enumerate(zip(path, ref)) if a != b), min(len(path), len(ref)))
                    steps.append((path, ev.proposal.probs[0] if ev.proposal.probs else None, matched))
                replay(drafter, list(prompt), greedy, hidden, limits, scorer=scorer, on_step=on_step,
                       layer_states=chosen)
            for path, probs, matched in steps:
                cal.add(source, path, None if source == "retrieval" else probs, matched)
            if before is not None:
                drafter_state.restore(drafter, before)
            if source == "model":
                model_lengths = [expected_length(cal.confidences("model", p, q)) for p, q, _ in steps if p]
        skip = sum(model_lengths) / len(model_lengths) if model_lengths else 1.0
        out = {"split": "tune", "prompts": len(prompts), "greedy_tokens": CAL_TOKENS, "skip": round(skip, 4),
               "table": cal.to_dict()}
        if why:
            out["why"] = why
        return out
    code = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()      # a changed rule measures again
    key = hashlib.sha256(json.dumps([rm.label, mm.label, code]).encode()).hexdigest()[:16]
    return cached(env, f"hybrid-{key}", "hybrid calibration", measure, timed=False)   # acceptance only


def _model(method: Method) -> Method:
    """The model source, its draft length set by the hybrid's `length` where given."""
    mm = method.get("model") or _default(MODEL)
    length = method.concrete("length")
    return mm if length is None else Method(mm.spec, {**mm.params, "length": length})


def _check(method: Method) -> None:
    """`length=` sets the model source's draft length: the source must have one, spelled in one place."""
    if "length" not in method.params:
        return
    mm = method.get("model") or _default(MODEL)
    if not mm.takes("length"):
        raise MethodError(f"{method.label}: length= sets the model source's draft length and {mm.name} has none; "
                          f"drop length= and give {mm.name}'s own shape in model=")
    if "model" in method.params and "length" in mm.params:
        raise MethodError(f"{method.label}: the model source's length is given twice (in model= and length=); "
                          "keep one")


def _combos(method: Method) -> list[dict]:
    """The shapes `auto` replays: (length, nodes) pairs, each length with a budget of one chain and of two."""
    lengths = LENGTHS if method.get("length") == AUTO else (method.get("length"),)
    if method.get("nodes") != AUTO:
        return [{"length": n} for n in lengths]
    if lengths == (None,):
        return [{"nodes": b} for b in BUDGETS]
    return [{**({"length": n} if method.get("length") == AUTO else {}), "nodes": b}
            for n in lengths for b in sorted({n, 2 * n})]


def build(env: Env, method: Method) -> HybridDrafter:
    rm, mm = _retrieval(method), _model(method)
    nodes = method.get("nodes", NODES)
    retrieval, model = env.build(rm), env.build(mm)
    record = calibrate(env, retrieval, model, rm, mm)
    skip = method.get("skip", record["skip"])
    env.resolved[method.label] = {"retrieval": rm.label, "model": mm.label, "nodes": nodes, "skip": skip,
                                  **({"length": mm.get("length")} if "length" in method.params else {}),
                                  "calibration": record}
    d = HybridDrafter(method.label, retrieval, model, SourceCalibration.from_dict(record["table"]), skip, nodes)
    d.needs_hidden = any(HIDDEN in declared(m) or HIDDEN in consumes(x, m) for m, x in ((rm, retrieval), (mm, model)))
    return d


def _inputs(method: Method) -> frozenset[str]:
    """What the hybrid takes from the loop: what its sources take."""
    sources = (_retrieval(method), _model(method))
    return frozenset().union(*(declared(m) for m in sources)) - {RESET, OBSERVE}


def _needs(model: str, cfg) -> list[Requirement]:
    from ..artefacts.suffix import needs
    return needs(model, ("corpus",))      # the default retrieval source's; a spelled source needs what it needs


SPECS = [MethodSpec("hybrid", "one token tree from a retrieval and a model source, each token weighed by its "
                    "acceptance rate measured on the tune split; the model drafts only when the retrieval draft "
                    f"is expected to add less than the model's (defaults: retrieval={RETRIEVAL}, "
                    f"model={MODEL}, nodes={NODES})", build,
                    (Param("retrieval", source_method, f"the free source, parameters separated by ';' (default "
                           f"{RETRIEVAL})"),
                     Param("model", source_method, f"the paid source (default {MODEL})"),
                     Param("length", int, "the model source's draft length (default: the source's own; auto: sized "
                           "with nodes on this machine)", low=1, auto=True),
                     Param("nodes", int, f"most draft nodes verified (default {NODES}; auto: the budget fastest on "
                           "this machine)", low=1, auto=True),
                     Param("skip", float, "the model drafts only while the retrieval draft's expected length is "
                           "below this (default: the model's own mean, measured on the tune split)", low=0.0)),
                    _needs, check=_check, inputs=_inputs, shapes=Combos(_combos),
                    inner=lambda m: (_retrieval(m), _model(m)))]
