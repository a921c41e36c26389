"""Draft shapes sized to the hardware: the pure optimisers (fake cost tables) and `auto` method parameters."""
from __future__ import annotations

import pytest

from bpdbench.experiments.plan import prepare
from bpdbench.hardware.shapes import (TableCost, best_chain, best_tree, chain_value, expected_tokens, tree_nodes,
                                      tree_value)
from tests.helpers import FREE_DRAFTING

FLAT = TableCost({64: 1.0})
AVX2 = TableCost({8: 1.9, 16: 2.2, 64: 4.6})            # float32 on this CPU
BF16 = TableCost({16: 1.14, 64: 1.6})                   # AVX512-BF16 in bfloat16
ACCEPT = [0.7, 0.5, 0.35, 0.25, 0.18, 0.12, 0.08, 0.05]  # a[i] = P(first i accepted)


def test_expected_tokens():
    assert expected_tokens(ACCEPT, 0) == 1.0
    assert expected_tokens(ACCEPT, 2) == pytest.approx(2.2)


def test_flat_costs_pick_the_longest_chain():
    s = best_chain(ACCEPT, FLAT, "heads")
    assert s.params == {"heads": 8} and not s.draft_nothing
    assert s.tokens_per_step == pytest.approx(1 + sum(ACCEPT)) and s.speedup == pytest.approx(s.tokens_per_step)
    assert len(s.curve) == 9 and s.curve[0]["params"] == {}           # AR, then n = 1..8


def test_steep_costs_pick_shorter_chains():
    fast = best_chain(ACCEPT, BF16, "heads")
    slow = best_chain(ACCEPT, AVX2, "heads")
    assert 1 <= slow.params["heads"] < fast.params["heads"] <= 8
    assert slow.verify == slow.params["heads"] + 1
    assert slow.break_even == pytest.approx(AVX2.cost(slow.params["heads"] + 1))
    assert "predicted" in slow.describe("bpd:heads=auto") and "heads=" in slow.describe("bpd:heads=auto")


def test_nothing_pays_is_draft_nothing():
    s = best_chain(ACCEPT, TableCost({2: 3.0, 64: 20.0}), "heads")
    assert s.draft_nothing and s.params == {} and s.tokens_per_step == 1.0 and s.speedup == 1.0
    assert "draft nothing" in s.describe("bpd:heads=auto")
    # a drafting cost that eats the gain also draws nothing
    assert best_chain(ACCEPT, FLAT, "heads", draft=5.0).draft_nothing


def test_drafting_cost_per_token_shortens_the_chain():
    free = best_chain(ACCEPT, FLAT, "gamma")
    paid = best_chain(ACCEPT, FLAT, "gamma", draft=lambda n: 0.15 * n)
    assert paid.params["gamma"] < free.params["gamma"] and paid.draft_cost == pytest.approx(0.15 * paid.params["gamma"])


def test_mean_verify_size_for_lookups():
    """A lookup drafter that often finds nothing verifies fewer tokens on average than n + 1."""
    s = best_chain(ACCEPT, AVX2, "tokens", verify=lambda n: 1 + 0.3 * n)
    assert s.params["tokens"] >= best_chain(ACCEPT, AVX2, "tokens").params["tokens"]
    assert s.verify == pytest.approx(1 + 0.3 * s.params["tokens"])


P = [[0.6, 0.25, 0.1, 0.03], [0.55, 0.2, 0.1, 0.05], [0.5, 0.2, 0.1, 0.05], [0.45, 0.2, 0.1, 0.05]]


def test_tree_nodes_are_prefix_closed_and_nested():
    nodes = tree_nodes(P, 30)
    paths = [tuple(p) for p, _ in nodes]
    for i, path in enumerate(paths):
        assert len(path) == 1 or path[:-1] in paths[:i]              # parent came first
    values = [v for _, v in nodes]
    assert values == sorted(values, reverse=True)


def test_tree_beats_or_equals_chain_at_equal_nodes():
    for m in (1, 2, 3, 4, 8, 16):
        paths = [p for p, _ in tree_nodes(P, m)]
        assert tree_value(P, paths) >= chain_value(P, m) - 1e-12
    # informative rank 2: strictly better at 4 nodes than the rank-0 chain
    assert tree_value(P, [p for p, _ in tree_nodes(P, 4)]) > chain_value(P, 4)


def test_best_tree_size_follows_the_cost():
    flat, steep = best_tree(P, FLAT, 40), best_tree(P, AVX2, 40)
    assert flat.params["nodes"] == 40 and len(flat.tree) == 40
    assert 1 <= steep.params["nodes"] < flat.params["nodes"]
    assert all(isinstance(r, int) for path in steep.tree for r in path)
    assert steep.tree == sorted(steep.tree, key=lambda q: (len(q), q))
    assert steep.tokens_per_step == pytest.approx(tree_value(P, steep.tree))
    none = best_tree(P, TableCost({2: 5.0}), 40)
    assert none.draft_nothing and none.tree == []


def test_tree_paths_drive_medusa():
    import torch
    from bpdbench.refine.base import Lattice
    from bpdbench.refine.medusa import MedusaTree
    s = best_tree(P, BF16, 20)
    lat = Lattice(torch.arange(16).view(4, 4), torch.zeros(4, 4))
    drafts = MedusaTree("t", s.tree).refine(lat, [])
    assert len(drafts) == len(s.tree) and drafts[0] == [0]


def test_per_step_sizes_cost_the_mean_of_c():
    """Half the steps find nothing (1 token verified): the cost is the mean of c, which is below c at the mean."""
    steps = [[1] * 8, [0] * 8] * 10
    s = best_chain(ACCEPT, AVX2, "tokens", steps=steps, lengths=[8])
    assert s.verify == pytest.approx(5.0)
    assert s.verify_cost == pytest.approx((AVX2.cost(9) + 1.0) / 2)


# ---- `auto` parameters: parsing, resolution in the session, the held-out slice ----------------------------------

def test_auto_parses_and_keeps_its_label():
    from bpdbench.methods import parse
    for spelling, auto in [("bpd:heads=auto", ["heads"]), ("pld:tokens=auto", ["tokens"]),
                           ("sps:gamma=auto", ["gamma"]), ("cascade:length=auto", ["length"]),
                           ("hierarchy:candidates=auto,length=auto", ["candidates", "length"]),
                           ("medusa:nodes=auto", ["nodes"]), ("ngram4:heads=auto", ["heads"])]:
        m = parse(spelling)
        assert m.label == spelling and m.auto == auto
    assert parse("medusa:tree=auto").auto == [] and parse("medusa-auto").label == "medusa:tree=auto"
    concrete = parse("bpd:heads=auto,threshold=0.4").resolved({"heads": 3})
    assert concrete.label == "bpd:heads=auto,threshold=0.4" and concrete.params == {"heads": 3, "threshold": 0.4}


@pytest.mark.parametrize("spelling,needle", [
    ("bpd:heads=foo", "heads='foo' is not a int or auto"),
    ("pld:ngram=auto", "ngram='auto' is not a int"),
    ("16best-0gram:heads=auto", "heads='auto' is not a int"),          # a tree's size is not its head count
    ("sps:gamma=auto,schedule=heuristic", "schedule=fixed"),
    ("cascade:length=auto,split=20", "split=20 exceeds length=16"),
])
def test_bad_auto_spellings_are_one_line_errors(spelling, needle):
    from bpdbench.methods import MethodError, parse
    with pytest.raises(MethodError) as e:
        parse(spelling)
    assert needle in str(e.value) and "\n" not in str(e.value)


@pytest.fixture
def session_for(tiny_model_dir, tmp_path, monkeypatch):
    from conftest import write_prompts
    from bpdbench.config import RunConfig
    from bpdbench.experiments import autoshape, session
    from bpdbench.methods import parse_list
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path / "cache"))
    costs = {"cost": TableCost({64: 1.0}, step_ms=1e9)}       # flat, drafting free; tests swap it
    monkeypatch.setattr(autoshape, "cost_model", lambda s: costs["cost"])
    monkeypatch.setattr(autoshape, "step_clock", lambda s, context=64: FREE_DRAFTING)     # drafting free
    monkeypatch.setattr(autoshape, "N_EXAMPLES", 3)
    prompts = write_prompts(tmp_path, 12)

    def make(methods: str, **cfg):
        logs: list[str] = []
        run = RunConfig(task="prompts", data_file=str(prompts), model=str(tiny_model_dir), dtype="float32",
                        max_new_tokens=24, heads_profile="init", limit=4, **cfg)
        ms = parse_list(methods)
        return session.open_session(prepare(run, "replay", ms, log=logs.append), logs.append), ms, logs, costs
    return make


def test_auto_resolves_records_and_caches(session_for):
    from bpdbench.engine import EmptyDrafter
    s, (pld, bpd), logs, costs = session_for("pld:tokens=auto,bpd:heads=auto")
    d = s.drafter(pld)
    rec = s.env.resolved["pld:tokens=auto"]
    chosen = rec["auto"]["params"]["tokens"]
    assert d.name == "pld:tokens=auto" and d.tokens == chosen == rec["tokens"] and 1 <= chosen <= 16
    assert rec["auto"]["speedup"] > 1 and rec["auto"]["heldout"]["overlaps_evaluated"] is False
    line = [m for m in logs if m.startswith("pld:tokens=auto -> ")]
    assert len(line) == 1 and f"tokens={chosen} (predicted" in line[0] and "break-even" in line[0]
    assert s.meta([pld])["resolved"]["methods"]["pld:tokens=auto"]["auto"]["params"] == {"tokens": chosen}
    # cached: no second measurement; steeper costs choose again from the cached curve
    costs["cost"] = TableCost({2: 1.6, 64: 40.0}, step_ms=1e9)
    n_measuring = sum("measuring" in m for m in logs)
    d2 = s.drafter(pld)
    assert sum("measuring" in m for m in logs) == n_measuring
    assert isinstance(d2, EmptyDrafter) or d2.tokens <= chosen
    costs["cost"] = TableCost({2: 5.0}, step_ms=1e9)                # nothing pays: draft nothing
    d3 = s.drafter(bpd)
    assert isinstance(d3, EmptyDrafter) and d3.name == "bpd:heads=auto"
    assert s.env.resolved["bpd:heads=auto"]["auto"]["draft_nothing"] is True
    assert any("bpd:heads=auto -> draft nothing" in m for m in logs)


def test_a_cached_shape_is_measured_again_when_a_profile_it_read_changed(session_for, tmp_path, monkeypatch):
    """A shape sized over a self-draft profile depends on the profile's numbers: re-measuring the profile (on an
    idle machine, after a busy reading) makes the shape stale, and a shape sized over an uncached busy profile is
    not cached at all."""
    from bpdbench.experiments import autoshape
    from bpdbench.methods import selfdraft
    s, (pld,), logs, _ = session_for("pld:tokens=auto")
    profile, read = tmp_path / "profile.json", [tmp_path / "profile.json"]
    profile.write_text('{"draft_ms": 20}')
    measure = autoshape.measure

    def reading_a_profile(*a, **k):
        selfdraft._READ.append(read[0])
        return measure(*a, **k)
    monkeypatch.setattr(autoshape, "measure", reading_a_profile)
    measured = lambda: sum("measuring" in m for m in logs)   # noqa: E731
    s.drafter(pld)
    s.drafter(pld)
    assert measured() == 1
    profile.write_text('{"draft_ms": 5}')                   # measured again on an idle machine
    s.drafter(pld)
    assert measured() == 2
    profile.write_text('{"draft_ms": 7}')                   # the profile changed once more, and then
    read[0] = None                                           # was read busy: used, not cached
    s.drafter(pld)
    s.drafter(pld)
    assert measured() == 4 and any("not cached" in m for m in logs)


def test_auto_decodes_losslessly(session_for):
    s, (m,), logs, _ = session_for("cascade:top=none,bottom=lookup,length=auto")
    d = s.drafter(m)
    prompt = s.prompt(s.examples[0])
    assert s.decode(d, prompt).tokens == s.reference.get(prompt, s.limits)[0]
    assert s.env.resolved[m.label]["length"] == s.env.resolved[m.label]["auto"]["params"]["length"]


class _Tok:
    """Enough of a tokenizer for the prompt pool's C4 part."""
    chat_template = None

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": ["c4"]}


def test_auto_measures_on_examples_neither_evaluated_nor_trained_on(session_for, tmp_path, monkeypatch):
    """The tune split: never the evaluated examples, never the train split, which the trainers' prompt pool draws
    on (so the heads were fitted on those very prompts)."""
    from types import SimpleNamespace

    import tasks
    from bpdbench.config import RunConfig
    from bpdbench.experiments import autoshape
    from bpdbench.experiments.examples import select_examples
    from bpdbench.train.greedy import prompt_pool
    cfg = RunConfig(task="spec_bench")
    try:
        evaluated = select_examples(cfg, per_category=2)
    except Exception as e:                                      # no shared data here
        pytest.skip(f"spec_bench data unavailable: {e}")
    s = SimpleNamespace(cfg=cfg, examples=evaluated, prompt=lambda ex: [1], log=print, tok=None)
    chosen, source = autoshape.heldout(s)
    ids = {ex.id for ex, _ in chosen}
    train = {ex.id for ex in select_examples(cfg.replace(limit=None), "train")}
    every_eval = {ex.id for ex in select_examples(cfg.replace(limit=None))}
    assert len(chosen) == autoshape.N_EXAMPLES and not ids & every_eval and not ids & train
    assert ids <= {ex.id for ex in select_examples(cfg.replace(limit=None), "tune")}
    assert len({ex.category for ex, _ in chosen}) > 1                    # across the task's categories
    assert source == {"source": "spec_bench tune split", "split": "tune", "overlaps_evaluated": False,
                      "overlaps_training": False}
    # the control: the quick heads' prompt pool holds train examples (what the first rule measured on), none of these
    monkeypatch.setattr(tasks, "encode_prompt", lambda tok, task, ex, m: [(task.name, ex.id)])
    pooled = {p[0] for p, _ in prompt_pool(_Tok(), 1024, 64, 0, 128)} - {"c4"}
    first = {ex.id for ex in select_examples(cfg.replace(limit=autoshape.N_EXAMPLES), "train")}
    assert first <= {i for name, i in pooled if name == "spec_bench"}
    assert not ids & {i for name, i in pooled if name == "spec_bench"}
    # a task with no tune split and no other task's data: its examples outside the run; with none of those, the
    # evaluated ones, said and recorded
    from conftest import write_prompts
    prompts = str(write_prompts(tmp_path, 12))
    empty = tmp_path / "no-data"
    empty.mkdir()
    cfg = RunConfig(task="prompts", data_file=prompts, data_dir=str(empty), limit=4)
    s = SimpleNamespace(cfg=cfg, examples=select_examples(cfg), prompt=lambda ex: [1], log=print, tok=None)
    chosen, source = autoshape.heldout(s)
    assert not {ex.id for ex, _ in chosen} & {ex.id for ex in s.examples} and not source["overlaps_evaluated"]
    cfg = cfg.replace(limit=None)
    logs: list[str] = []
    s = SimpleNamespace(cfg=cfg, examples=select_examples(cfg), prompt=lambda ex: [1], log=logs.append, tok=None)
    chosen, source = autoshape.heldout(s)
    assert source["overlaps_evaluated"] and logs and "overlaps_evaluated" in logs[0]


def test_auto_for_hierarchy_sps_and_medusa_trees(session_for, tiny_model_dir):
    s, methods, logs, costs = session_for(f"hierarchy:order=c,candidates=auto,length=auto,"
                                          f"sps:model={tiny_model_dir},gamma=auto,medusa:nodes=auto")
    prompt = s.prompt(s.examples[0])
    greedy = s.reference.get(prompt, s.limits)[0]
    for m in methods:
        d = s.drafter(m)
        auto = s.env.resolved[m.label]["auto"]
        assert d.name == m.label and s.decode(d, prompt).tokens == greedy, m.label
        assert not auto["draft_nothing"], m.label                     # flat costs: drafting always pays
    h = s.env.resolved["hierarchy:order=c,candidates=auto,length=auto"]
    assert {"candidates", "length"} <= set(h["auto"]["params"]) and h["candidates"] == h["auto"]["params"]["candidates"]
    sps = s.env.resolved[f"sps:model={tiny_model_dir},gamma=auto"]
    assert sps["gamma"] == 8                                           # the draft model is the target: all accepted
    med = s.env.resolved["medusa:nodes=auto"]
    assert med["nodes"] == med["auto"]["params"]["nodes"] == len(med["auto"]["tree"])
    costs["cost"] = TableCost({8: 1.9, 16: 2.2, 64: 4.6}, step_ms=1e9)
    s.drafter(methods[2])
    steep = s.env.resolved["medusa:nodes=auto"]["auto"]
    assert steep["draft_nothing"] or len(steep["tree"]) < len(med["auto"]["tree"])    # AVX2 costs: a smaller tree


def test_medusa_nodes_takes_the_trees_first_nodes(session_for):
    from bpdbench.refine.medusa import MC_SIM_7B_63
    s, (m,), logs, _ = session_for("medusa:nodes=5")
    d = s.drafter(m)
    assert d.rescorer.choices == MC_SIM_7B_63[:5] and s.env.resolved["medusa:nodes=5"]["nodes"] == 5
    prompt = s.prompt(s.examples[0])
    assert s.decode(d, prompt).tokens == s.reference.get(prompt, s.limits)[0]


def test_each_examples_first_step_is_timed_apart_as_the_drafts_prefill():
    """A draft model prefills the prompt in its first step: that time is paid once per example, so it is neither a
    drafted token's cost nor a step's."""
    from types import SimpleNamespace
    from bpdbench.engine import Proposal
    from bpdbench.experiments.autoshape import _Recorder
    rec = _Recorder()
    for _ in range(2):
        rec.begin([1, 2, 3], list(range(20)))
        for seconds in (1.0, 0.1, 0.1, 0.1):               # the first step: 0.9 s of prefill, then 4 tokens
            rec(SimpleNamespace(proposal=Proposal([[5, 6, 7, 8]]), draft_seconds=seconds,
                                context=SimpleNamespace(tokens=[1, 2, 3])))
    t = rec.times(per_token=True)
    assert t["draft_ms_token"] == pytest.approx(25) and t["draft_ms_step"] == pytest.approx(100)
    assert t["prefill_ms"] == pytest.approx(900) and t["new_tokens"] == 20
    assert rec.times(per_token=False)["prefill_ms"] == pytest.approx(900)
    assert len(rec.nodes) == 8                              # every step still counts for acceptance


def test_the_drafts_prefill_is_priced_per_example_not_per_drafted_token():
    from bpdbench.methods import parse
    from bpdbench.methods.search import Replayed, choose
    accept = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2]
    cost = TableCost({64: 1.0}, step_ms=100.0)
    method = parse("qdraft:length=auto")
    plain = Replayed(accept, [[1] * 8] * 10, 10, 200.0, 25.0, False, per_token=True)
    shape = choose(method, [({}, plain)], cost)
    n = shape.params["length"]
    assert shape.draft_cost == pytest.approx(0.25 * n)
    # a prefill of 640 ms per 64-token example: 0.1 decode steps per new token, E(n) new tokens per step
    paid = Replayed(accept, [[1] * 8] * 10, 10, 200.0, 25.0, False, per_token=True, prefill_ms=640.0,
                    new_tokens=64.0)
    shape = choose(method, [({}, paid)], cost)
    n = shape.params["length"]
    assert shape.draft_cost == pytest.approx(0.25 * n + 0.1 * expected_tokens(accept, n))
    # timed beside a 200 ms step (a host slower than when the cost curve was measured): priced in that step
    slow = Replayed(accept, [[1] * 8] * 10, 10, 200.0, 25.0, False, per_token=True, target_ms=200.0)
    shape = choose(method, [({}, slow)], cost)
    assert shape.draft_cost == pytest.approx(0.125 * shape.params["length"])


def test_drafting_is_timed_after_a_warm_up_that_leaves_the_drafters_state_as_it_was(session_for, monkeypatch):
    """One untimed replay first (one-time costs: a quantized copy's first prefill), and a drafter that learns across
    examples (Token Recycling's matrix) measured exactly as without it; the step it is priced in is timed at the
    examples' own cache length."""
    from bpdbench.engine import TreeScorer, replay
    from bpdbench.experiments import autoshape
    s, (m,), logs, _ = session_for("recycling:nodes=8")
    examples = autoshape.heldout(s)[0]
    calls, contexts = [], []

    def counted(*a, **k):
        calls.append(k.get("on_step"))
        return replay(*a, **k)
    monkeypatch.setattr(autoshape, "step_clock", lambda s, context=64: contexts.append(context) or FREE_DRAFTING)
    monkeypatch.setattr(autoshape, "replay", counted)
    measured = autoshape.measure(s, m, examples, {})
    assert calls[0] is None and len(calls) == len(examples) + 1 and all(c is not None for c in calls[1:])
    drafter, total = s.env.build(m), None          # the same replays, cold, without a warm-up
    for _, prompt in examples:
        c = replay(drafter, prompt, s.reference.get(prompt, s.limits)[0], None, s.limits,
                   scorer=TreeScorer(s.model))
        total = c if total is None else total.add(c)
    assert measured.accept == [a / total.steps for a in total.accepted_per_head] and measured.steps == total.steps
    assert measured.target_ms == FREE_DRAFTING.ms()          # priced in the step the clock timed beside it
    assert contexts == [autoshape.mean_context([(ex, p, s.reference.get(p, s.limits)[0]) for ex, p in examples])]
    clock = autoshape.StepClock(s.model)                     # the real clock: the target's steps after a replay
    clock.tick(2)
    assert len(clock.times) == 2 and clock.ms() > 0
