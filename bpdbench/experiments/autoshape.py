"""`auto` shape parameters: measured acceptance on held-out examples x this machine's cost of a forward.

A method spelled with `auto` (`bpd:heads=auto`, `pld:tokens=auto`, `sps:gamma=auto`, `cascade:length=auto`,
`hierarchy:candidates=auto,length=auto`, `medusa:nodes=auto`, `recycling:nodes=auto`, `lookahead:guesses=auto`,
`eagle:tree=auto`...) is resolved by `Session.drafter` before it is built. How it is sized is the method's own
declaration (`MethodSpec.shapes`, methods/search.py); this module runs it:
1. the search's plans (the method at its largest shape, or one plan per size the search replays) are built and
   replayed, through the engine's own replay, along the greedy output of up to 8 examples that neither this run
   evaluates nor a trained artefact has seen: the task's tune split (`heldout`); else another task's (mt_bench,
   then squad); else the task's examples outside this run's selection, else, said in the log and the record, the
   first evaluated examples (`overlaps_evaluated`). A drafter that reads hidden states is replayed with them, one
   that learns from the verify forward with a scorer, one that reads the greedy reference with it (its contract,
   methods/contract.py);
2. the replay gives the acceptance curve a[i] = P(the first i draft tokens are accepted) (counters'
   accepted_per_head / steps), per step the number of draft nodes at each depth (what a shorter shape verifies),
   the drafting time per step and per drafted token (after an untimed warm-up replay, with each example's first
   step apart: the draft's prefill, priced once per example), and for lattice methods the rank of the greedy token
   in each head's top-k (medusa's per-depth, per-rank acceptance);
3. the search picks the shape with the most predicted tokens per second on this machine's cost of a forward
   (hardware/shapes.py, hardware/calibration.py: measured once per machine fingerprint).
A search that `replays` nothing (`ar:rows=auto`: the cheapest forward, from the cost curve alone) skips 1 and 2.
The measurement is cached under `$BPDBENCH_CACHE/shapes/<fingerprint>/<model>-<dtype>-<task>-<label>.json` with
what it depends on (examples, heads, k, threshold, generation length, the method module's code); a cached one is
re-used and only the choice is recomputed (cheap) from the current calibration. The result keeps its `auto` label;
the chosen shape is logged once and recorded in config.json under `resolved.methods.<label>.auto`.
"""
from __future__ import annotations

import hashlib
import inspect
import itertools
import json
import re
import statistics
from pathlib import Path
from typing import Any

import tasks as task_registry
from .. import paths
from ..config import ConfigError
from ..engine import EmptyDrafter, StepEvent, TreeScorer, layers_of, replay, teacher_forced, teacher_forced_layers
from ..engine.state import restore, snapshot
from ..hardware import shapes
from ..hardware.timing import StepClock
from ..methods import Method, MethodError
from ..methods.contract import Input, needs_scorer, reads_reference, search, takes
from ..methods.search import Replayed, choose, declared, plans

N_EXAMPLES = 8
FALLBACK_TASKS = ("mt_bench", "squad")
VERSION = 5                # 2: drafting timed after a warm-up, each example's first step (prefill) apart;
                           # 4: and priced in the target's step timed between the examples (StepClock);
                           # 5: that step timed at the examples' own cache length, not 64 tokens


def cost_model(s) -> shapes.CostModel:
    """This machine's cost of a forward (hardware/calibration.py: cached per fingerprint, measured on first use)."""
    try:
        from ..hardware.calibration import ensure
    except ImportError:
        raise MethodError("auto shape parameters need this machine's calibration (bpdbench/hardware/calibration.py), "
                          "which this installation lacks; pass concrete values") from None
    return ensure(s.cfg.model, s.cfg.dtype, str(s.model.device), s.threads, model=s.model, log=s.log)


def step_clock(s, context: int = 64) -> StepClock:
    """The target's step timed between a replay's examples, over a `context`-token cache (tests swap in a free
    one)."""
    return StepClock(s.model, context)


def mean_context(outputs: list[tuple[Any, list[int], list[int]]]) -> int:
    """The median over examples of the cache length a decode step sees on average (the prompt and half the output).
    Why: drafting is timed at the examples' own contexts (a draft on the target's cache attends over all of it), so
    the step it is priced in is timed at theirs too, not over 64 tokens. The difference is small on this model (a
    step over 640 tokens took 6% more than over 64, Intel Xeon with AMX, bfloat16), but grows with the context."""
    return int(statistics.median(len(prompt) + len(greedy) // 2 for _, prompt, greedy in outputs))


class _Recorder:
    """A replay seen step by step (an `engine.StepEvent` observer): the draft trie's nodes per depth, drafting
    time, and the greedy token's rank per depth in the lattice. Each example's first step is timed apart: it holds
    the draft's prefill of the prompt, paid once per example (methods/search.py prices it so)."""

    def __init__(self):
        self.nodes: list[list[int]] = []
        self.ranks: list[tuple[list[int], int]] = []      # (rank of the greedy token per depth, k)
        self.seconds, self.drafted, self.truth, self.start = 0.0, 0, None, 0     # after each example's first step
        self.first_seconds, self.first_drafted, self.steps = 0.0, 0, 0
        self.examples, self.tokens, self.first = 0, 0, False

    def begin(self, prompt: list[int], greedy: list[int]) -> None:
        self.start, self.truth = len(prompt), greedy
        self.first, self.examples, self.tokens = True, self.examples + 1, self.tokens + len(greedy)

    def __call__(self, ev: StepEvent) -> None:
        p = ev.proposal
        if self.first:
            self.first_seconds += ev.draft_seconds
            self.first_drafted += len(p.paths[0])
            self.first = False
        else:
            self.seconds += ev.draft_seconds
            self.steps += 1
            self.drafted += len(p.paths[0])
        prefixes = {tuple(q[: i + 1]) for q in p.paths for i in range(len(q))}
        scored = {tuple(q[: i + 1]) for q in p.scored or [] for i in range(len(q))}   # their own trie, also paid
        depth = [0] * max(map(len, [*p.paths, *(p.scored or [])]), default=0)
        for pre in [*prefixes, *scored]:
            depth[len(pre) - 1] += 1
        self.nodes.append(depth)
        if p.lattice is not None and self.truth is not None:
            m = len(ev.context.tokens) - self.start        # the next greedy token is truth[m]
            ids = p.lattice.ids.tolist()
            truth = self.truth[m: m + len(ids)]
            self.ranks.append(([row.index(t) if t in row else len(row) for row, t in zip(ids, truth)],
                               len(ids[0])))

    def times(self, per_token: bool) -> dict:
        """Drafting ms per step and per drafted token after each example's first step; the first step's excess
        over them (the draft's prefill) per example; new tokens per example."""
        if not self.steps:                # every example took one step: no later step to tell the prefill from
            n = max(self.examples, 1)
            return {"draft_ms_step": 1000 * self.first_seconds / n,
                    "draft_ms_token": 1000 * self.first_seconds / max(self.first_drafted, 1),
                    "prefill_ms": 0.0, "new_tokens": self.tokens / n}
        step, token = 1000 * self.seconds / self.steps, 1000 * self.seconds / max(self.drafted, 1)
        usual = token * self.first_drafted if per_token else step * self.examples
        return {"draft_ms_step": step, "draft_ms_token": token, "new_tokens": self.tokens / self.examples,
                "prefill_ms": max(0.0, 1000 * self.first_seconds - usual) / self.examples}


def rank_acceptance(ranks: list[tuple[list[int], int]]) -> list[list[float]]:
    """p[d][r]: among steps whose greedy tokens at depths < d were all in the lattice, the share whose greedy token
    at depth d is rank r (the probability that a tree node of rank r is accepted given its parent was)."""
    if not ranks:
        return []
    depth, k = max(len(r) for r, _ in ranks), max(k for _, k in ranks)
    hits = [[0] * k for _ in range(depth)]
    seen = [0] * depth
    for row, width in ranks:
        for d, r in enumerate(row):
            seen[d] += 1
            if r >= width:
                break
            hits[d][r] += 1
    return [[h / seen[d] if seen[d] else 0.0 for h in hits[d]] for d in range(depth)]


def heldout(s, n: int | None = None) -> tuple[list[tuple[Any, list[int]]], dict]:
    """(example, prompt ids) pairs to measure on, and a record of where they came from: the task's tune split
    (tasks.splits), which no run evaluates and no trained artefact has seen. Why not the train split: the trainers'
    prompt pool (train/greedy.prompt_pool) draws on it, so acceptance measured there is acceptance on training data
    (the quick heads on MT-Bench: a[4] 0.214 there against 0.007 on unseen prompts), which sizes drafts too large.
    A task without a tune split (your own prompts) borrows another task's, then its own examples outside the run."""
    n = n or N_EXAMPLES
    from .examples import select_examples
    task = s.cfg.task
    try:
        tune = select_examples(s.cfg.replace(offset=0, limit=None), "tune")
    except ConfigError:
        tune = []
    if tune:
        return [(ex, s.prompt(ex)) for ex in _spread_tail(tune, n)], {
            "source": f"{task} tune split", "split": "tune", "overlaps_evaluated": False, "overlaps_training": False}
    for name in FALLBACK_TASKS:
        if name == task:
            continue
        try:
            chosen = _spread_tail(select_examples(s.cfg.replace(task=name, data_file=None, offset=0, limit=None),
                                                  "tune"), n)
        except Exception:                 # no data for that task here: try the next
            continue
        other = task_registry.get_task(name)
        enc = [(ex, task_registry.encode_prompt_checked(s.tok, other, ex, s.cfg.max_prompt_tokens)[0])
               for ex in chosen]
        return enc, {"source": f"{name} tune split ({task} has none)", "split": "tune", "overlaps_evaluated": False,
                     "overlaps_training": False}
    evaluated = {ex.id for ex in s.examples}
    outside = [ex for ex in select_examples(s.cfg.replace(offset=0, limit=None)) if ex.id not in evaluated]
    if outside:
        return [(ex, s.prompt(ex)) for ex in _spread_tail(outside, n)], {
            "source": f"{task} examples outside this run's selection", "split": "eval", "overlaps_evaluated": False,
            "overlaps_training": False}
    first = s.examples[:n]
    s.log(f"warning: auto shapes measured on {len(first)} of the evaluated examples ({task} has no tune split, no "
          f"other task's data is here and every example is evaluated); recorded as overlaps_evaluated")
    return [(ex, s.prompt(ex)) for ex in first], {"source": f"the first {len(first)} evaluated examples of {task}",
                                                  "split": "eval", "overlaps_evaluated": True,
                                                  "overlaps_training": False}


def _spread_tail(pool: list, n: int) -> list:
    """Up to n examples of `pool` from its end, one category at a time in turn: a multi-category task (spec_bench)
    is measured across its categories, and runs, which select from the front, leave the choice (and its cache) as it
    is."""
    by_category: dict = {}
    for ex in reversed(pool):
        by_category.setdefault(ex.category, []).append(ex)
    spread = [ex for row in itertools.zip_longest(*by_category.values()) for ex in row if ex is not None]
    return spread[:n]


def measure(s, method: Method, examples: list[tuple[Any, list[int]]], hidden: dict) -> Replayed:
    """Replay `method` (concrete: a plan) along the greedy output of each example. Its contract says what the replay
    gives it (hidden states, the verify feedback, the reference) and whether drafting time grows with the draft.
    Drafting is timed after an untimed replay of the first example, as `speed` times after a warm-up: a drafter's
    one-time costs (a quantized copy dequantizing its weights at its first prefill, first kernel calls) are no
    part of a step's. The drafter's cross-example state is put back after it (engine/state.py). The target's step
    is timed after every example (`StepClock`), the unit drafting is priced in."""
    drafter = method.spec.build(s.env, method)
    found = search(method)
    per_token = found is not None and found.per_token(drafter)
    inputs = takes(drafter, method)

    def one(ex: Any, prompt: list[int], greedy: list[int], on_step: Any):
        if Input.HIDDEN in inputs and ex.id not in hidden:
            hidden[ex.id] = teacher_forced(s.model, prompt, greedy, with_prompt=True)
        layers, chosen = layers_of(drafter), None         # the layers it declares, from one more forward per example
        if layers is not None:
            if (ex.id, layers) not in hidden:
                hidden[(ex.id, layers)] = teacher_forced_layers(s.model, prompt, greedy, layers.indices, True)[1]
            chosen = hidden[(ex.id, layers)]
        if reads_reference(drafter):
            drafter.use_reference(greedy)
        return replay(drafter, prompt, greedy, hidden.get(ex.id), s.limits, on_step=on_step,
                      scorer=TreeScorer(s.model) if needs_scorer(drafter) else None, layer_states=chosen)

    outputs = [(ex, prompt, s.reference.get(prompt, s.limits)[0]) for ex, prompt in examples]
    outputs = [(ex, prompt, greedy) for ex, prompt, greedy in outputs if len(greedy) >= 2]
    if not outputs:
        raise MethodError(f"{method.label}: no held-out example gave two or more tokens to measure acceptance on")
    kept = snapshot(drafter)
    one(*outputs[0], None)                                   # the warm-up
    restore(drafter, kept)
    rec, clock = _Recorder(), step_clock(s, mean_context(outputs))
    total = None
    for ex, prompt, greedy in outputs:
        rec.begin(prompt, greedy)
        c = one(ex, prompt, greedy, rec)
        clock.tick()
        total = c if total is None else total.add(c)
    if not total.steps:
        raise MethodError(f"{method.label}: no held-out example gave two or more tokens to measure acceptance on")
    accept = [a / total.steps for a in total.accepted_per_head]
    return Replayed(accept, rec.nodes, total.steps, tree=any(max(d, default=0) > 1 for d in rec.nodes),
                    per_token=per_token, ranks=rank_acceptance(rec.ranks), target_ms=clock.ms(),
                    **rec.times(per_token))


def _plans(s, method: Method) -> list[tuple[Method, dict]]:
    """The concrete methods the method's search replays, each with the parameters its replay fixes."""
    return plans(None if s is None else s.env, method)


def _code(method: Method) -> str:
    """A hash of the module that builds the method (its code and its defaults) and of the sibling modules it imports
    (`from .sps import ...`): the cache was once keyed by the spelling alone, and a changed default (qdraft's window)
    silently reused a measurement of the old drafter; then keyed by the module alone, and a change in the drafter
    class it builds (methods/sps.py's window) did the same."""
    src = inspect.getsourcefile(method.spec.build)
    if not src or not Path(src).exists():
        return ""
    text = Path(src).read_bytes()
    digest = hashlib.sha256(text)
    for name in sorted(set(re.findall(rb"^from \.(\w+) import", text, flags=re.M))):
        sibling = Path(src).with_name(name.decode() + ".py")
        if sibling.exists():
            digest.update(sibling.read_bytes())
    return digest.hexdigest()[:16]


def _inputs(s, method: Method, examples) -> dict:
    c = s.cfg
    return {"version": VERSION, "label": method.label, "code": _code(method), "model": c.model, "dtype": c.dtype, "task": c.task,
            "heads_profile": c.heads_profile, "heads_path": c.heads_path, "k": c.k, "heads": c.heads,
            "draft_threshold": c.draft_threshold, "max_new_tokens": s.limits.max_new_tokens,
            "examples": [str(ex.id) for ex, _ in examples]}


def cache_file(s, method: Method) -> Path:
    from ..hardware.fingerprint import current
    key = current(s.threads, str(s.model.device)).key()
    safe = lambda t: str(t).replace("/", "_")      # noqa: E731
    return paths.machine_file("shapes", key,
                              f"{safe(s.cfg.model)}-{s.cfg.dtype}-{safe(s.cfg.task)}-{safe(method.label)}.json")


def _digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    except OSError:
        return None


def _profiles_unchanged(recorded: dict) -> bool:
    """The self-draft profiles a cached shape was measured with still hold the same numbers (one re-measured on an
    idle machine makes the shapes measured over its busy reading stale)."""
    return all(_digest(Path(p)) == h for p, h in recorded.items())


def shape_for(s, method: Method) -> tuple[shapes.Shape, dict]:
    """The chosen shape and its record (held-out source, cache file), measuring only when nothing is cached. The
    cache records the self-draft profiles read while measuring (methods/selfdraft.py) and is measured again when one
    of them changed; a measurement over a profile timed on a busy machine is used but not cached."""
    from ..methods import selfdraft
    if not declared(method).replays:      # sized from the cost curve alone (search.Cheapest): nothing to measure
        return choose(method, [], cost_model(s)), {"source": "this machine's calibration, nothing replayed"}
    examples, source = heldout(s)
    inputs = _inputs(s, method, examples)
    path = cache_file(s, method)
    runs = None
    if path.exists():
        try:
            cached = json.loads(path.read_text())
            if cached.get("inputs") == inputs and _profiles_unchanged(cached.get("profiles", {})):
                runs = [(fixed, Replayed(**m)) for fixed, m in cached["runs"]]
        except (ValueError, KeyError, TypeError, AttributeError):
            runs = None
    cost = cost_model(s)
    if runs is not None:
        return choose(method, runs, cost), {**source, "examples": inputs["examples"], "cache": str(path)}
    s.log(f"{method.label}: measuring acceptance on {len(examples)} examples ({source['source']}) to size the "
          f"draft for this machine (cached in {path.parent})")
    memo: dict = {}
    mark = len(selfdraft.reads_since(0))
    runs = [(fixed, measure(s, m, examples, memo)) for m, fixed in _plans(s, method)]
    read = selfdraft.reads_since(mark)
    shape = choose(method, runs, cost)
    if None in read:
        s.log(f"{method.label}: sized over a self-draft profile timed on a busy machine: this shape is used for "
              f"this run and not cached")
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"inputs": inputs, "source": source, "runs": [(f, m.to_dict()) for f, m in runs],
                                   "profiles": {str(p): _digest(p) for p in read if p is not None},
                                   "shape": shape.to_dict()}))
        tmp.replace(path)
    return shape, {**source, "examples": inputs["examples"], "cache": str(path)}


def resolve(s, method: Method):
    """The drafter of a method with `auto` parameters: resolved for this machine, built, recorded, logged once."""
    shape, record = shape_for(s, method)
    label = method.label
    if shape.draft_nothing:
        drafter = EmptyDrafter()
        drafter.name = label
        s.env.resolved[label] = {"draft_nothing": True}
    else:
        drafter = method.spec.build(s.env, method.resolved(shape.params))
        if shape.tree:                                      # medusa:nodes=auto: the measured tree, this size
            tree = getattr(drafter.rescorer, "tree", drafter.rescorer)
            tree.use(shape.tree)
            s.env.resolved[label].update(nodes=tree.p)
    s.env.resolved.setdefault(label, {})["auto"] = {**shape.to_dict(), "heldout": record}
    line = shape.describe(label) + f" [{record['source']}]"
    if s.env.cache.get(("auto-shape", label)) != line:     # once per session and choice
        s.env.cache[("auto-shape", label)] = line
        s.log(line)
    return drafter
