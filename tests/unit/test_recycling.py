"""Token Recycling and the verify-forward feedback it runs on: lossless, replay == real decoding for every counter
(the matrix carried across examples in both), the feedback reports the tree just verified with the base's top-k at
every node, a stub whose successor is fixed per token is drafted perfectly, wrong rows accept nothing, bad
parameters are one-line errors, and at T = 1 the output follows the target (a control that must fail)."""
from __future__ import annotations

import re

import pytest
import torch
from test_sampling import N_CONTROL, PARAMS, PROMPT, TARGET, V, MarkovLM, exact_joint
from test_shapes import session_for  # noqa: F401  (the tiny-model session fixture)

from bpdbench.engine import (EmptyDrafter, Feedback, Limits, SpeculativeSampling, TreeScorer,
                             generate, replay)
from bpdbench.engine.tree import build_tree
from bpdbench.methods import parse
from bpdbench.methods.recycling import MAX_NODES, TEMPLATE, RecyclingDrafter
from bpdbench.stats import goodness_of_fit
from tests.helpers import assert_wrong_drafts_accept_nothing, parse_error

PROMPTS = ([5, 6, 7, 8, 5, 6, 7, 9, 5, 6, 7, 8, 5, 6], [11, 12, 13, 11, 12, 14, 40, 41], [3, 90, 3, 90, 3])


def first_order_stub(seed: int = 3) -> MarkovLM:
    """A target whose next token depends on the last token only, through a fixed permutation: its greedy text is a
    cycle, and a token's successors never change, so recycled rows are always right."""
    perm = torch.randperm(V, generator=torch.Generator().manual_seed(seed))
    rows = torch.randn(V, V, generator=torch.Generator().manual_seed(seed + 1))
    rows[torch.arange(V), perm] += 8.0
    return MarkovLM(rows[None].expand(V + 1, V, V).clone())


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.mark.parametrize("nodes,k,persist", [(MAX_NODES, 8, 1), (8, 8, 0), (24, 2, 1), (1, 1, 0)])
def test_lossless_and_replay_equals_real_across_examples(tiny_model, nodes, k, persist):
    limits = Limits(40)
    real, again = RecyclingDrafter("r", nodes, k, bool(persist)), RecyclingDrafter("r", nodes, k, bool(persist))
    scorer = TreeScorer(tiny_model)
    drafted = 0
    for prompt in PROMPTS:            # in order, one drafter each: the matrix carries over when persist=1
        greedy = generate(tiny_model, None, prompt, limits)
        ours = generate(tiny_model, real, prompt, limits)
        assert ours.tokens == greedy.tokens
        assert replay(again, prompt, greedy.tokens, None, limits, scorer=scorer) == ours.counters
        drafted += ours.counters.drafted
        assert ours.counters.verified <= ours.counters.steps * (1 + nodes)
    assert drafted > 0
    assert real.rows == again.rows


def test_replay_without_a_scorer_is_refused(tiny_model):
    with pytest.raises(ValueError, match="scorer"):
        replay(RecyclingDrafter("r"), PROMPTS[0], [1, 2, 3], None, Limits(3))


class Spy:
    """Records each proposal and the feedback handed to the drafter."""

    def __init__(self, inner):
        self.inner, self.name, self.log = inner, inner.name, []
        self.feedback_k = inner.feedback_k
        self.feedback = self._feedback

    def reset(self, prompt_ids):
        self.inner.reset(prompt_ids)

    def propose(self, ctx):
        p = self.inner.propose(ctx).clip(ctx.budget)
        self.log.append([list(ctx.tokens), p, None])
        return p

    def _feedback(self, fb: Feedback):
        self.log[-1][2] = fb
        self.inner.feedback(fb)

    def observe(self, tokens):
        self.inner.observe(tokens)


def test_feedback_reports_the_verified_tree_and_the_base_topk(tiny_model):
    spy = Spy(RecyclingDrafter("r", k=4))
    assert spy.feedback_k == 4
    prompt = PROMPTS[0]
    generate(tiny_model, spy, prompt, Limits(24))
    assert spy.log and all(fb is not None for _, _, fb in spy.log)
    checked = 0
    for context, proposal, fb in spy.log:
        tree = build_tree(context[-1], proposal.paths, proposal.scored)
        assert fb.tree == tree and fb.topk.shape == (len(tree.tokens), 4)
        for n in range(len(tree.tokens)):        # the base's top-k after node n, from a plain forward
            seq, j = [], n
            while j >= 0:
                seq.insert(0, tree.tokens[j])
                j = tree.parents[j]
            logits = tiny_model(torch.tensor([context[:-1] + seq])).logits[0, -1]
            assert fb.topk[n].tolist() == logits.topk(4).indices.tolist()
            checked += 1
    assert checked > len(spy.log)               # trees with more than their root were checked


def test_the_topk_and_the_update_from_it_count_as_drafting_in_decoding_and_in_replay(tiny_model):
    """The top-k over every verified node and the matrix update are the drafter's work: counted as drafting, so a
    prediction from the calibrated forwards prices them (the published 80-node tree's top-k alone took 25 ms, a
    fifth of a step, on a shared Intel Xeon with AMX; left in verify, recycling was predicted 16% faster than it ran)."""
    import time

    class Slow(RecyclingDrafter):
        def feedback(self, fb):
            time.sleep(0.02)
            super().feedback(fb)

    prompt = PROMPTS[0]
    g = generate(tiny_model, Slow("r", k=4), prompt, Limits(12))
    steps = g.counters.serial_calls - 1
    assert steps >= 2 and g.seconds["draft"] >= 0.02 * steps
    seen = []
    c = replay(Slow("r", k=4), prompt, g.tokens, None, Limits(12), scorer=TreeScorer(tiny_model),
               on_step=lambda ev: seen.append(ev.draft_seconds))
    assert len(seen) == c.serial_calls - 1 and all(s >= 0.02 for s in seen)


def test_rows_are_the_last_scored_topk_and_the_tree_follows_the_template():
    d = RecyclingDrafter("r", k=2)
    tree = build_tree(5, [[6, 7]])
    d.feedback(Feedback(tree, torch.tensor([[6, 1], [7, 2], [3, 4]])))
    assert d.rows == {5: [6, 1], 6: [7, 2], 7: [3, 4]}
    from bpdbench.engine import DraftContext
    p = d.propose(DraftContext([9, 5], None, 10))
    kept = [e for e in TEMPLATE if max(e) < 2]
    assert all(max(e) < 2 for e in kept) and len(TEMPLATE) == 80
    # 5 -> (6, 1); 6 -> (7, 2); 7 -> (3, 4); 1, 2, 3, 4 have no row yet: their subtrees are left out
    assert sorted(map(tuple, p.paths)) == [(1,), (6, 2), (6, 7, 3), (6, 7, 4)]
    assert p.probs == [[1.0] * len(q) for q in p.paths]


def test_fixed_successors_are_drafted_perfectly():
    stub = first_order_stub()
    d = RecyclingDrafter("r", persist=True)
    with torch.inference_mode():
        warm = generate(stub, d, list(PROMPT), Limits(30))
        again = generate(stub, d, list(PROMPT), Limits(30))
    c = again.counters
    assert again.tokens == warm.tokens
    assert c.accepted == c.drafted and c.steps == 5              # 30 tokens = 6 steps of 6 accepted draft tokens...
    assert c.hist[6] == 4 and c.new_tokens == 30                 # ... less the budget at the end


class WrongRows(RecyclingDrafter):
    """Every row holds one token the base never outputs here, and never learns: every draft is rejected."""

    def __init__(self, wrong: int):
        super().__init__("w", k=1)
        self.rows = {t: [wrong] for t in range(96)}

    def feedback(self, fb):
        pass


def test_wrong_rows_accept_nothing_and_stay_lossless(tiny_model):
    assert_wrong_drafts_accept_nothing(tiny_model, WrongRows, PROMPTS[0], Limits(30))


@pytest.mark.parametrize("spelling,match", [("recycling:nodes=0", "nodes must be >= 1"),
                                            ("recycling:nodes=81", "nodes must be < 81"),
                                            ("recycling:k=9", "k must be < 9"),
                                            ("recycling:persist=2", "persist must be < 2"),
                                            ("recycling:nodes=many", "not a int or auto"),
                                            ("recycling:width=3", "unknown parameter")])
def test_bad_parameters_are_one_line_errors(spelling, match):
    assert re.search(match, parse_error(spelling))
    assert parse("recycling:nodes=auto").auto == ["nodes"]


def _counts(n: int, rule: str, seed: int):
    from collections import Counter
    counts: Counter = Counter()
    d = RecyclingDrafter("r")            # one matrix across the runs, as across a run's examples
    drafted = 0
    for i in range(n):
        acc = SpeculativeSampling(PARAMS, seed + i, rule)
        with torch.inference_mode():
            gen = generate(TARGET, d, list(PROMPT), Limits(4), acc)
        counts[tuple(gen.tokens[:3])] += 1
        drafted += gen.counters.drafted
    return counts, drafted


def test_t1_certificate_and_a_control_that_fails():
    """First three tokens at T = 0.9, top-k 8 (test_sampling's target and table) over 5,000 seeded runs: exact at
    false-alarm 1e-3; the always-accept control must fail at p < 1e-6 with 2,000 runs."""
    counts, drafted = _counts(5_000, "exact", 0)
    fit = goodness_of_fit(counts, exact_joint())
    assert drafted > 5_000 and fit.cells > 30
    assert fit.p_value > 1e-3, fit
    counts, _ = _counts(N_CONTROL, "always-accept", 2 * 10**6)
    assert goodness_of_fit(counts, exact_joint()).p_value < 1e-6


def test_auto_sizes_recycling_and_lookahead(session_for):
    """`recycling:nodes=auto` and `lookahead:guesses=auto` go through the replay-measure-choose path: one replay per
    size, flat costs pick a drafting shape, and the resolved drafter decodes losslessly."""
    from bpdbench.hardware.shapes import TableCost
    s, methods, logs, costs = session_for("recycling:nodes=auto,lookahead:guesses=auto")
    prompt = s.prompt(s.examples[0])
    greedy = s.reference.get(prompt, s.limits)[0]
    for m, param in zip(methods, ("nodes", "guesses")):
        d = s.drafter(m)
        auto = s.env.resolved[m.label]["auto"]
        assert d.name == m.label and s.decode(d, prompt).tokens == greedy, m.label
        assert len(auto["curve"]) > 4 and all(param in c["params"] for c in auto["curve"] if c["params"])
        if not auto["draft_nothing"]:
            assert s.env.resolved[m.label][param] == auto["params"][param]
    costs["cost"] = TableCost({2: 50.0}, step_ms=1e9)                   # nothing pays: draft nothing
    assert isinstance(s.drafter(methods[0]), EmptyDrafter)


def test_replay_command_matches_real_decoding(session_for, tmp_path):
    """`bpdbench replay`'s path (its recording wrapper, a scorer per example, one drafter across the examples in
    order) gives each example the counters a run decoding the same examples in order gets."""
    import json
    from bpdbench.experiments.replay import replay_methods
    s, methods, _, _ = session_for("pld,recycling:nodes=16,lookahead:window=3,ngram=3,guesses=3")
    replay_methods(s, methods, tmp_path / "out")
    records = [json.loads(line) for line in (tmp_path / "out" / "replay.jsonl").read_text().splitlines()]
    assert len(records) == len(s.examples)
    for m in methods[1:]:
        assert sum(r[m.label]["drafted"] for r in records) > 0, m.label
        d = s.env.build(m)
        for ex, rec in zip(s.examples, records):
            assert rec["id"] == ex.id
            real = s.decode(d, s.prompt(ex)).counters.to_dict()
            assert {k: rec[m.label][k] for k in real} == real, m.label


def test_the_snapshot_is_all_the_state_a_drafter_carries_to_the_next_example(tiny_model):
    """A fresh drafter given the snapshot (through JSON, as replay --resume reads it) decodes the next example as
    the drafter that made it does; with persist=0 there is nothing to carry."""
    import json
    from bpdbench.engine.state import restore, snapshot
    limits = Limits(40)
    going = RecyclingDrafter("r")
    generate(tiny_model, going, PROMPTS[0], limits)
    resumed, cold = RecyclingDrafter("r"), RecyclingDrafter("r")
    restore(resumed, json.loads(json.dumps(snapshot(going))))
    expected = generate(tiny_model, going, PROMPTS[1], limits).counters
    assert generate(tiny_model, resumed, PROMPTS[1], limits).counters == expected
    assert generate(tiny_model, cold, PROMPTS[1], limits).counters != expected     # the state matters here
    assert snapshot(RecyclingDrafter("r", persist=False)) is None
