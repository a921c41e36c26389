"""`hybrid`: a retrieval and a model source in one tree, weighed by acceptance rates measured on the tune split.

Logic on tiny models: every spelling decodes exactly the greedy output and replays to the same counters; the
calibration is recorded and is what the drafter weighs with; the merged tree keeps the most probable nodes of both
chains, closed under prefixes; `skip` decides whether the model drafts; at T > 0 it proposes one source's chain,
with that source's own draft distributions, and sampling stays exact while a lossy rule fails. What it is worth
on the real model is measured by `bpdbench speed`, never asserted here."""
from __future__ import annotations

import copy
import re
from collections import Counter

import pytest
import torch

from bpdbench.engine import DraftContext, Limits, TreeScorer, generate, replay
from bpdbench.methods import hybrid
from bpdbench.methods.env import Env
from bpdbench.methods.hybrid import SourceCalibration, HybridDrafter, merge
from bpdbench.methods.registry import parse
from tests.helpers import parse_error
from tests.unit.test_qdraft import PROMPTS, env  # noqa: F401 (env: the 6-layer tiny model, xsum's tune prompts)
from tests.unit.test_shapes import session_for  # noqa: F401 (a session on the tiny model, costs swapped by tests)

LIMITS = Limits(24)
RETRIEVAL = "retrieval=sam;static=none;fallback=none"      # no corpus index: the tiny tokenizer's would be slow


@pytest.fixture(scope="module", autouse=True)
def short_calibration():
    """A 16-token calibration: the logic is the same, in a third of the time."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(hybrid, "CAL_TOKENS", 16)
        yield


SPELLINGS = (f"hybrid:{RETRIEVAL}", f"hybrid:{RETRIEVAL},model=qdraft;bits=4;length=3,nodes=4",
             f"hybrid:{RETRIEVAL},skip=0", f"hybrid:{RETRIEVAL},skip=50", "hybrid:retrieval=pld")
REPEATS = [5, 6, 7, 5, 6, 7, 5, 6]     # a prompt that repeats itself: the suffix automaton matches


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_lossless_and_replay_equals_decoding(env, spelling):
    method = parse(spelling)
    for prompt in (*PROMPTS, REPEATS):
        ref = generate(env.model, None, list(prompt), LIMITS).tokens
        d = env.build(method)
        out = generate(env.model, d, list(prompt), LIMITS)
        assert out.tokens == ref, (spelling, prompt)
        again = replay(env.build(method), list(prompt), ref, None, LIMITS,
                       scorer=TreeScorer(env.model))     # the default model source drafts on the target's cache
        assert (again.steps, again.accepted, again.accepted_per_head) == \
            (out.counters.steps, out.counters.accepted, out.counters.accepted_per_head)
    rec = env.resolved[method.label]
    cal = rec["calibration"]
    assert cal["split"] == "tune" and cal["prompts"] > 0 and rec["skip"] >= 0
    reached = {s: sum(c["reached"] for c in cal["table"][s].values()) for s in ("retrieval", "model")}
    assert reached["model"] > 0, cal                 # the model source drafted on the tune prompts
    for cells in cal["table"].values():
        assert all(0 <= c["accepted"] <= c["reached"] and 0 < c["rate"] < 1 for c in cells.values())


class Stub:
    """A source that always proposes `chain` and counts its proposals."""
    def __init__(self, chain):
        self.chain, self.calls, self.name = chain, 0, "stub"

    def reset(self, prompt_ids):
        pass

    def observe(self, tokens):
        pass

    def propose(self, ctx):
        from bpdbench.engine import Proposal
        self.calls += 1
        return Proposal([list(self.chain)], probs=[[0.99] * len(self.chain)])


def test_skip_decides_whether_the_model_drafts():
    """The model drafts only while the retrieval draft's expected length is below `skip`; then both chains go
    into one tree (shared prefix once); with no retrieval draft the model's chain goes alone."""
    ctx = DraftContext([1, 2, 3], None, 8)
    cal = SourceCalibration()
    for _ in range(20):                       # retrieval's first two positions accepted at 21/22, the model's less
        cal.add("retrieval", [1, 2, 3], None, matched=2)
        cal.add("model", [1, 2], [0.99, 0.99], matched=1)
    e_r = sum(cal.confidences("retrieval", [7, 8, 9], None))
    for skip, model_runs in ((e_r, False), (e_r + 0.01, True)):
        r, m = Stub([7, 8, 9]), Stub([7, 5])
        d = HybridDrafter("hybrid", r, m, cal, skip=skip, nodes=8)
        p = d.propose(ctx)
        assert m.calls == int(model_runs) and d.source == ("both" if model_runs else "retrieval")
        assert sorted(map(tuple, p.paths)) == ([(7, 5), (7, 8, 9)] if model_runs else [(7, 8, 9)])
    d = HybridDrafter("hybrid", Stub([]), Stub([4, 4]), cal, skip=0.0, nodes=8)
    assert d.propose(ctx).paths == [[4, 4]] and d.source == "model"


def test_merge_keeps_the_most_probable_prefixes_of_both_chains():
    r, m = [1, 2, 3, 4], [1, 2, 9]
    paths = merge([(r, [0.9, 0.8, 0.3, 0.2]), (m, [0.95, 0.85, 0.7])], nodes=4)
    assert sorted(map(tuple, paths)) == [(1, 2, 3), (1, 2, 9)]         # 1, 12 shared; 129 (0.7) > 123 (0.3)
    assert merge([(r, [0.9, 0.8, 0.3, 0.2]), (m, [0.95, 0.85, 0.7])], nodes=3) == [[1, 2, 9]]
    assert merge([([], [])], nodes=4) == [[]]
    kept = merge([(r, [0.9, 0.8, 0.3, 0.2]), (m, [0.5, 0.4, 0.35])], nodes=10)
    assert sorted(map(tuple, kept)) == [(1, 2, 3, 4), (1, 2, 9)]        # everything, each prefix once


def test_calibration_weighs_by_the_measured_rate():
    cal = SourceCalibration()
    for _ in range(8):
        cal.add("model", [1, 2, 3], [0.99, 0.99, 0.3], matched=2)     # the third never accepted
    conf = cal.confidences("model", [1, 2, 3], [0.99, 0.99, 0.3])
    assert conf[0] == pytest.approx(0.9) and conf[1] == pytest.approx(0.81) and conf[2] == pytest.approx(0.081)
    assert cal.rate("retrieval", 0, None) == 0.5                       # no data: the uniform prior
    again = SourceCalibration.from_dict(cal.to_dict())
    assert again.confidences("model", [1, 2, 3], [0.99, 0.99, 0.3]) == conf


@pytest.mark.parametrize("spelling,expect", [("hybrid:model=hybrid", "cannot be a source"),
                                             ("hybrid:model=hf-pld", "whole decoder"),
                                             ("hybrid:nodes=0", "nodes must be >= 1"),
                                             ("hybrid:model=pld,length=3", "pld has none"),
                                             ("hybrid:model=qdraft;length=3,length=auto", "given twice"),
                                             ("hybrid:length=two", "not a int or auto")])
def test_bad_spellings_are_one_line_errors(spelling, expect):
    assert re.search(expect, parse_error(spelling))


def test_length_and_nodes_auto_replay_each_pair_and_choose_by_this_machine_s_costs(session_for):
    """`hybrid:length=auto,nodes=auto` replays one hybrid per (model length, node budget) pair and takes the fastest
    on this machine's cost of a forward: with flat costs and free drafting a longest shape, with a verify of more
    than a few rows costing many steps a short one (chosen again from the cached replays); the length reaches the
    model source and the decoding stays the target's greedy output."""
    from bpdbench.hardware.shapes import TableCost
    s, (m,), logs, costs = session_for(f"hybrid:{RETRIEVAL},model=qdraft;cache=base,length=auto,nodes=auto")
    assert m.auto == ["length", "nodes"]
    d = s.drafter(m)
    rec = s.env.resolved[m.label]
    chosen = rec["auto"]["params"]
    pairs = [c["params"] for c in rec["auto"]["curve"] if c["params"]]
    assert len(pairs) == 2 * len(hybrid.LENGTHS) and all(set(p) == {"length", "nodes"} for p in pairs)
    assert (rec["length"], rec["nodes"]) == (chosen["length"], chosen["nodes"]) == (d.model.gamma, d.nodes)
    assert rec["model"] == f"qdraft:length={chosen['length']},cache=base"
    assert chosen["length"] >= 4                      # flat costs, free drafting: a long draft pays
    for ex in s.examples:
        prompt = s.prompt(ex)
        assert s.decode(d, prompt).tokens == s.reference.get(prompt, s.limits)[0]
    measured = sum("measuring" in line for line in logs)
    costs["cost"] = TableCost({1: 1.0, 3: 1.05, 4: 9.0, 64: 200.0}, step_ms=1e9)    # more than 3 rows: expensive
    short = s.drafter(m)
    assert sum("measuring" in line for line in logs) == measured
    assert s.env.resolved[m.label]["nodes"] <= 2 and short.model.gamma == s.env.resolved[m.label]["length"]


def test_sampling_with_both_sources_is_exact_and_a_lossy_rule_fails():
    """T > 0 on tests/unit/test_sampling.py's Markov target: retrieval (prompt lookup: point masses) and an int4 copy
    of the target (its own q) as sources; one chain per step; the first three tokens follow the target
    (chi-square, false alarm 1e-3), and the same drafts accepted always fail at p < 1e-6."""
    from tests.unit.test_sampling import PARAMS, PROMPT, TARGET, exact_joint
    from bpdbench.engine.sampling import SpeculativeSampling
    from bpdbench.methods.pld import PromptLookupDrafter
    from bpdbench.methods.sps import DraftModelDrafter
    from bpdbench.nets.quant import QuantLinear
    from bpdbench.stats import goodness_of_fit
    torch.set_num_threads(1)
    draft = copy.copy(TARGET)
    draft.lm_head = QuantLinear(TARGET.lm_head.weight, None, 4, 110)

    def sample(n: int, rule: str, seed: int) -> Counter:
        counts: Counter = Counter()
        d = HybridDrafter("hybrid", PromptLookupDrafter("pld", 3, 1), DraftModelDrafter("qdraft", draft, gamma=3),
                          SourceCalibration(), skip=1.0, nodes=8)
        for i in range(n):
            with torch.inference_mode():
                gen = generate(TARGET, d, list(PROMPT), Limits(4), SpeculativeSampling(PARAMS, seed + i, rule))
            counts[tuple(gen.tokens[:3])] += 1
        assert d.steps["both"] == 0 and d.steps["model"] > n // 2, d.steps      # one chain per step
        return counts
    fit = goodness_of_fit(sample(2500, "exact", 10**5), exact_joint())
    assert fit.cells > 30 and fit.p_value > 1e-3, fit
    control = goodness_of_fit(sample(2000, "always-accept", 10**6), exact_joint())
    assert control.p_value < 1e-6, control

