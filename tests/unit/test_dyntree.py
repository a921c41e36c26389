"""EAGLE-2 dynamic draft trees (methods/dynamic.py, `tree=dynamic`): the expansion/rerank against a brute force on
a toy distribution, losslessness (EOS inside the tree included) and replay == real decoding on tiny trained
drafters of every autoregressive family, point-mass q at T > 0, one-line errors, nodes=auto's budget choice."""
from __future__ import annotations

import itertools
import math
import random

import pytest
import torch

from bpdbench import models
from bpdbench.config import RunConfig
from bpdbench.engine import Limits, SamplingParams, SpeculativeSampling, generate, ratios
from bpdbench.experiments import autoshape
from bpdbench.methods import bind, Env, parse
from bpdbench.methods.base import Method, MethodError
from bpdbench.methods.dynamic import dynamic_tree, generate as expand_all, leaves, rerank
from tests.drafter_fixtures import copy_drafters
from tests.helpers import decode_and_replay, eos_limits
from tests.unit.test_drafters import PROMPTS, scripted_drafter

FAMILIES = ("eagle", "eagle3", "hydra", "hydra++", "amphista", "koala")


def toy(vocab: int, seed: int):
    """A deterministic next-token distribution per path (a toy autoregressive drafter) and its expansion."""
    def probs(path: tuple[int, ...]) -> list[float]:
        rng = random.Random(hash((seed,) + path))
        w = [rng.random() ** 3 for _ in range(vocab)]
        return [x / sum(w) for x in w]

    def expand(paths, k):
        lps, ids = [], []
        for p in paths:
            q = probs(tuple(p))
            top = sorted(range(vocab), key=lambda t: (-q[t], t))[:k]
            lps.append([math.log(q[t]) for t in top])
            ids.append(top)
        return lps, ids
    return probs, expand


@pytest.mark.parametrize("seed", range(6))
def test_rerank_keeps_the_top_nodes_by_cumulative_probability(seed):
    vocab, depth, nodes = 3, 3, 1 + seed * 3
    probs, expand = toy(vocab, seed)
    # brute force: every path up to `depth` (topk >= vocab ** (depth - 1) prunes nothing), scored by its product
    score = {}
    for d in range(1, depth + 1):
        for path in itertools.product(range(vocab), repeat=d):
            score[path] = math.prod(probs(path[:i])[path[i]] for i in range(d))
    best = sorted(score, key=lambda p: -score[p])[:nodes]
    kept = dict(rerank(expand_all(expand, depth, vocab ** (depth - 1)), nodes))
    assert set(kept) == set(best)
    assert all(p[:-1] in kept for p in kept if len(p) > 1)                       # closed under ancestors
    tree = dynamic_tree(expand, depth, vocab ** (depth - 1), nodes)
    prefixes = {tuple(p[:i]) for p in tree for i in range(1, len(p) + 1)}
    assert prefixes == set(best)


@pytest.mark.parametrize("seed", range(4))
def test_expansion_follows_the_frontier_rule(seed):
    """With pruning: depth d+1's nodes are exactly the top-k children of depth d's top-k nodes (brute force)."""
    vocab, depth, topk, nodes = 6, 4, 3, 10
    probs, expand = toy(vocab, seed)
    gen = dict(expand_all(expand, depth, topk))
    frontier, expect = [()], {}
    for _ in range(depth):
        children = {}
        for p in frontier:
            q = probs(p)
            for t in sorted(range(vocab), key=lambda t: -q[t])[:topk]:
                children[p + (t,)] = math.prod(probs(p[:i] + ())[(p + (t,))[i]] for i in range(len(p))) * q[t]
        expect.update(children)
        frontier = sorted(children, key=lambda c: -children[c])[:topk]
    assert set(gen) == set(expect)
    assert all(math.isclose(math.exp(gen[p]), expect[p], rel_tol=1e-9) for p in gen)
    kept = dict(rerank(list(gen.items()), nodes))
    closed = [p for p in expect if all(p[:i] in expect for i in range(1, len(p)))]
    assert set(kept) == set(sorted(closed, key=lambda c: -expect[c])[:nodes])
    assert leaves(list(kept.items()))


@pytest.fixture(scope="module")
def tiny(tiny_model_dir, tmp_path_factory, trained_drafters):
    torch.set_num_threads(1)
    model, tok = models.load(str(tiny_model_dir), "float32")
    cache = tmp_path_factory.mktemp("dyntree-cache")
    assert set(FAMILIES) <= set(copy_drafters(trained_drafters, cache))
    return model, tok, str(tiny_model_dir), cache


def _env(model, tok, name, limits) -> Env:
    return Env(model, tok, RunConfig(model=name, k=4), limits, log=lambda m: None)


@pytest.mark.parametrize("eos_at,max_new", [(None, 24), (5, 24), (None, 9)])
def test_lossless_and_replay_equals_real(tiny, monkeypatch, eos_at, max_new):
    model, tok, name, cache = tiny
    monkeypatch.setenv("BPDBENCH_CACHE", str(cache))
    limits = eos_limits(model, PROMPTS[0], eos_at, max_new)
    env = _env(model, tok, name, limits)
    # greedy decoding depends only on the prompt and the limits: one decode per prompt serves every drafter
    greedies = {tuple(p): generate(model, None, list(p), limits).tokens for p in PROMPTS}
    for family in FAMILIES:
        spelling = f"{family}:tree=dynamic,nodes=12,topk=3"
        method = parse(spelling)
        drafter = env.build(method)
        accepted = 0
        for prompt in PROMPTS:
            real = decode_and_replay(model, drafter, prompt, limits, list(greedies[tuple(prompt)]), features=True,
                                     label=spelling, memo={})
            accepted += real.counters.accepted
        assert accepted > 0, spelling
        assert env.resolved[bind(method, env.cfg).label]["nodes"] == 12 and env.resolved[bind(method, env.cfg).label]["topk"] == 3


@pytest.mark.parametrize("kind", ["sequential", "parallel"])
def test_perfect_drafter_accepts_everything_wrong_one_nothing_and_eos_stops(tiny, kind):
    model = tiny[0]
    prompt, limits = list(PROMPTS[0]), Limits(41)
    greedy = generate(model, None, prompt, limits).tokens
    for shift, accept_all in ((0, True), (1, False)):
        drafter = scripted_drafter(greedy, prompt, shift, kind, tree="dynamic", nodes=10, topk=3)
        c = decode_and_replay(model, drafter, prompt, limits, greedy, features=True).counters
        if accept_all:
            assert c.accepted == 32 and ratios(c)["block_efficiency"] == 41 / 9
        else:
            assert c.accepted == 0 and c.serial_calls == 41
    # an EOS inside an accepted tree path: decoding stops right after it, nothing drafted past it is kept
    eos_at_6 = Limits(41, frozenset({greedy[6]}))
    drafter = scripted_drafter(greedy, prompt, 0, kind, tree="dynamic", nodes=10, topk=3)
    out = generate(model, drafter, prompt, eos_at_6)
    assert out.tokens == generate(model, None, prompt, eos_at_6).tokens == greedy[: greedy.index(greedy[6]) + 1]


def test_point_mass_q_runs_at_positive_temperature(tiny, monkeypatch):
    model, tok, name, cache = tiny
    monkeypatch.setenv("BPDBENCH_CACHE", str(cache))
    env = _env(model, tok, name, Limits(12))
    method = parse("hydra:tree=dynamic,nodes=8,topk=4")       # a small tree: the tiny drafters' test is for q
    drafter = env.build(method)
    seen = []
    propose = drafter.propose
    drafter.propose = lambda ctx: seen.append(propose(ctx)) or seen[-1]
    gen = generate(model, drafter, list(PROMPTS[0]), Limits(12),
                   SpeculativeSampling(SamplingParams(temperature=0.8), 0, "exact"))
    assert len(gen.tokens) == 12
    assert seen and all(p.probs is not None and [len(q) for q in p.probs] == [len(x) for x in p.paths]
                        and all(v == 1.0 for q in p.probs for v in q) for p in seen if p.paths != [[]])


def test_defaults_are_eagle2s_published_shape(tiny, monkeypatch):
    """tree=dynamic unspelled is EAGLE-2's gen_ea_answer_vicuna.py shape: 59 draft nodes, top-10, 6 levels where the
    drafter can draft them (EAGLE is autoregressive); heads with one network per depth keep their trained depth."""
    from bpdbench.methods.dynamic import DYNAMIC_LEVELS, DYNAMIC_NODES, DYNAMIC_TOPK
    assert (DYNAMIC_NODES, DYNAMIC_TOPK, DYNAMIC_LEVELS) == (59, 10, 6)
    model, tok, name, cache = tiny
    monkeypatch.setenv("BPDBENCH_CACHE", str(cache))
    env = _env(model, tok, name, Limits(12))
    for spelling, depth in (("eagle:tree=dynamic", 6), ("eagle:depth=2,tree=dynamic", 2), ("hydra:tree=dynamic", None)):
        method = parse(spelling)
        drafter = env.build(method)
        rec = env.resolved[bind(method, env.cfg).label]
        assert method.label == spelling and (rec["nodes"], rec["topk"]) == (59, 10), rec
        assert (drafter.nodes, drafter.topk) == (59, 10)
        assert drafter.depth == rec["depth"] == (depth or drafter.model.depth), spelling


@pytest.mark.parametrize("spelling,words", [
    ("hydra:nodes=8", ["tree=dynamic"]),
    ("hydra:tree=dynamic,topk=0", ["topk must be >= 1"]),
    ("hydra:tree=dynamic,nodes=0", ["nodes must be >= 1"]),
    ("hydra:tree=dynamc", ["not a int", "dynamic"]),
    ("eagle:tree=dynamic,depth=auto", ["depth=auto"]),
])
def test_bad_parameters_are_one_line_errors(spelling, words, tmp_path):
    with pytest.raises(MethodError) as e:
        m = parse(spelling)
        from bpdbench.methods.trained import check
        check(m, RunConfig(model="none"), m.name, m.name)
    text = str(e.value)
    assert "\n" not in text and all(w in text for w in words), text


def test_nodes_auto_plans_each_budget_and_picks_by_measured_speed():
    m = parse("hydra:tree=dynamic,nodes=auto,depth=3")
    assert m.auto == ["nodes"]
    plans = autoshape._plans(None, m)
    assert [f for _, f in plans] == [{"nodes": b} for b in (4, 8, 16, 32, 64)]
    assert all(p.get("tree") == "dynamic" and p.get("depth") == 3 for p, _ in plans)
    medusa = autoshape._plans(None, parse("medusa:tree=dynamic,nodes=auto"))
    assert [p.get("nodes") for p, _ in medusa] == [4, 8, 16, 32, 64]

    class Cost:
        step_ms = 0.0

        def cost(self, n, tree=False, rows=None):
            return 1.0 + 0.05 * n

    def meas(accept, size):
        return autoshape.Replayed(accept, [[size // 3, size // 3, size - 2 * (size // 3)]] * 4, 4, 0.0, 0.0, True)
    runs = [({"nodes": 4}, meas([0.6, 0.3, 0.1], 4)), ({"nodes": 16}, meas([0.9, 0.7, 0.5], 16)),
            ({"nodes": 64}, meas([0.92, 0.75, 0.55], 64))]
    shape = autoshape.choose(m, runs, Cost())
    assert shape.params == {"nodes": 16}           # 3.1 tokens at cost 1.85 beats 2.0/1.25 and 3.22/4.25


def test_lattice_tree_is_the_top_lattice_prefixes_by_summed_log_probs():
    from bpdbench.engine import Lattice
    from bpdbench.methods.dynamic import LatticeTree
    torch.manual_seed(0)
    h, k = 4, 3
    lps = torch.log_softmax(torch.randn(h, 8), -1).topk(k)
    lat = Lattice(lps.indices + 100, lps.values)
    score = {}
    for d in range(1, h + 1):
        for ranks in itertools.product(range(k), repeat=d):
            score[tuple(int(lat.ids[i, r]) for i, r in enumerate(ranks))] = sum(float(lat.logprobs[i, r])
                                                                               for i, r in enumerate(ranks))
    for nodes in (1, 5, 17, 40):
        paths = LatticeTree(nodes).refine(lat, [1, 2])
        prefixes = {tuple(p[:i]) for p in paths for i in range(1, len(p) + 1)}
        assert prefixes == set(sorted(score, key=lambda c: -score[c])[:nodes]), nodes


def test_medusa_dynamic_is_lossless_and_replays(tiny_model_dir):
    torch.set_num_threads(1)
    model, tok = models.load(str(tiny_model_dir), "float32")
    limits = Limits(16)
    env = Env(model, tok, RunConfig(model=str(tiny_model_dir), k=4, heads=4, heads_profile="init"), limits,
              log=lambda m: None)
    default = parse("medusa:tree=dynamic")
    env.build(default)
    assert env.resolved[bind(default, env.cfg).label]["nodes"] == 59                  # EAGLE-2's published total
    method = parse("medusa:tree=dynamic,nodes=10")
    drafter = env.build(method)
    assert env.resolved[bind(method, env.cfg).label]["nodes"] == 10
    for prompt in PROMPTS:
        decode_and_replay(model, drafter, prompt, limits, features=True, memo={})
