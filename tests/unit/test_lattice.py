"""Lattice searches against brute-force enumeration of all k**h paths (pure Python LMs; KenLM in test_ngram)."""
from __future__ import annotations

import itertools
import math
import random

import pytest
import torch

from bpdbench.refine.lattice import build_lattice, kbest_paths, pbest_rescored, top1_draft
from bpdbench.refine.base import Lattice
from bpdbench.refine.kbest import KBestRescorer


class FakeNgramLM:
    """An order-n LM with random (deterministic) log-probs; the state is the last n-1 tokens."""

    def __init__(self, order: int = 2, vocab: int = 12, seed: int = 0):
        self.n = order - 1
        self.vocab = vocab
        self.seed = seed
        self._table: dict = {}

    def initial_state(self, context):
        return tuple(context[-self.n:]) if self.n > 0 else ()

    def score(self, state, token):
        key = (state, token)
        if key not in self._table:
            rng = random.Random(hash((self.seed,) + key))  # tuples of ints hash deterministically
            self._table[key] = math.log(rng.uniform(0.01, 1.0))
        return self._table[key], (state + (token,))[-self.n:] if self.n > 0 else ()


def random_lattice(h: int, k: int, seed: int, vocab: int = 12) -> Lattice:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(h, vocab, generator=g) * 2.0
    return build_lattice(logits, k)


def brute_force(lat: Lattice, alpha: float = 0.0, lm=None, context=()):
    ids, lps = lat.ids.tolist(), lat.logprobs.double().tolist()
    out = []
    for cols in itertools.product(range(len(ids[0])), repeat=len(ids)):
        path = [ids[i][j] for i, j in enumerate(cols)]
        s = sum(lps[i][j] for i, j in enumerate(cols))
        if lm is not None:
            st = lm.initial_state(list(context))
            for t in path:
                lp, st = lm.score(st, t)
                s += alpha * lp
        out.append((s, path))
    out.sort(key=lambda e: e[0], reverse=True)
    return out


def assert_same(got, want, p):
    assert len(got) == min(p, len(want))
    assert [g[1] for g in got] == [w[1] for w in want[:p]]
    for (gs, _), (ws, _) in zip(got, want):
        assert gs == pytest.approx(ws, abs=1e-9)


def test_build_lattice_sorted_logprobs():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0], [5.0, 1.0, 1.5, -1.0]])
    lat = build_lattice(logits, 3)
    assert lat.ids.tolist() == [[1, 3, 2], [0, 2, 1]]
    assert lat.ids.dtype == torch.int64 and lat.logprobs.dtype == torch.float32
    assert torch.allclose(lat.logprobs, torch.log_softmax(logits, -1).gather(1, lat.ids))
    assert top1_draft(lat) == [1, 0]
    assert build_lattice(logits, 10).ids.shape == (2, 4)  # k clipped to the vocabulary


def test_build_lattice_shortlist_maps_ids():
    shortlist = torch.tensor([100, 7, 4242, 31])
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0], [5.0, 1.0, 1.5, -1.0]])
    lat = build_lattice(logits, 2, vocab_ids=shortlist)
    assert lat.ids.tolist() == [[7, 31], [100, 4242]]
    # normalised over the shortlist columns
    assert torch.allclose(lat.logprobs, torch.log_softmax(logits, -1).topk(2).values)


@pytest.mark.parametrize("h,k,seed", [(3, 3, 0), (4, 3, 1), (4, 2, 2), (2, 5, 3), (1, 4, 4)])
def test_kbest_paths_matches_brute_force(h, k, seed):
    lat = random_lattice(h, k, seed)
    want = brute_force(lat)
    for p in (1, 5, k ** h, k ** h + 3):
        got = kbest_paths(lat, p)
        assert_same(got, want, p)
        assert len({tuple(x[1]) for x in got}) == len(got)  # no duplicates


def test_kbest_rescorer_interface():
    lat = random_lattice(4, 3, 7)
    r = KBestRescorer("16best-0gram", p=16)
    r.reset([1, 2])
    drafts = r.refine(lat, [1, 2, 3])
    assert len(drafts) == 16 and all(len(d) == 4 for d in drafts)
    assert drafts[0] == top1_draft(lat)


@pytest.mark.parametrize("order", [2, 3])
@pytest.mark.parametrize("h,k,seed", [(3, 3, 0), (4, 3, 1), (4, 3, 5)])
def test_pbest_rescored_exact_with_full_beam(order, h, k, seed):
    lat = random_lattice(h, k, seed)
    lm = FakeNgramLM(order=order, seed=seed)
    context = [3, 5, 9]
    for alpha in (0.3, 1.0, 2.5):
        want = brute_force(lat, alpha, lm, context)
        for p in (1, 4, 16, k ** h):
            got = pbest_rescored(lat, p, alpha, lm, context, beam=10 ** 6)
            assert_same(got, want, p)


def test_pbest_rescored_bigram_exact_with_beam_k():
    """A 2-gram has at most k states per position, so beam=k is already exact."""
    lat = random_lattice(4, 3, 11)
    lm = FakeNgramLM(order=2, seed=11)
    want = brute_force(lat, 0.7, lm, [4])
    assert_same(pbest_rescored(lat, 16, 0.7, lm, [4], beam=3), want, 16)


def test_pbest_rescored_alpha_zero_is_kbest():
    lat = random_lattice(4, 3, 3)
    lm = FakeNgramLM(order=3, seed=3)
    for p in (1, 7, 16):
        got = pbest_rescored(lat, p, 0.0, lm, [1, 2], beam=10 ** 6)
        assert_same(got, kbest_paths(lat, p), p)


def test_pbest_rescored_small_beam_gives_valid_distinct_paths():
    lat = random_lattice(5, 4, 9)
    lm = FakeNgramLM(order=3, seed=9)
    got = pbest_rescored(lat, 16, 1.0, lm, [2], beam=2)
    assert len(got) == 16
    assert len({tuple(x[1]) for x in got}) == 16
    allowed = [set(row) for row in lat.ids.tolist()]
    assert all(all(t in allowed[i] for i, t in enumerate(path)) for _, path in got)
    assert [s for s, _ in got] == sorted((s for s, _ in got), reverse=True)
    # the beam only loses paths: the best found is never better than the exact best
    exact = pbest_rescored(lat, 1, 1.0, lm, [2], beam=10 ** 6)[0][0]
    assert got[0][0] <= exact + 1e-12


def beam_rule_reference(lat: Lattice, p: int, alpha: float, lm, context, beam: int):
    """The documented beam rule, applied after scoring every edge (no lazy skipping): per state top p; if more
    than B = max(beam, p) states, keep the B best states and, in them, the paths >= the best of state B+1."""
    ids, lps = lat.ids.tolist(), lat.logprobs.double().tolist()
    B = max(beam, p)
    states = {lm.initial_state(list(context)): [(0.0, ())]}
    for toks, row in zip(ids, lps):
        nxt: dict = {}
        for s, plist in states.items():
            for t, lp in zip(toks, row):
                lm_lp, ns = lm.score(s, t)
                nxt.setdefault(ns, []).extend((sc + lp + alpha * lm_lp, path + (t,)) for sc, path in plist)
        for ns in nxt:
            nxt[ns] = sorted(nxt[ns], reverse=True)[:p]
        T = float("-inf")
        if len(nxt) > B:
            ranked = sorted(nxt, key=lambda ns: nxt[ns][0][0], reverse=True)
            T = nxt[ranked[B]][0][0]
            nxt = {ns: nxt[ns] for ns in ranked[:B]}
        states = {ns: [e for e in plist if e[0] >= T] for ns, plist in nxt.items()}
    return sorted((e for plist in states.values() for e in plist), reverse=True)[:p]


@pytest.mark.parametrize("beam", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pbest_rescored_lazy_equals_beam_rule(beam, seed):
    """Skipping edges by the head-score bound gives exactly the beam rule applied after full scoring."""
    lat = random_lattice(5, 4, 100 + seed, vocab=9)
    lm = FakeNgramLM(order=3, vocab=9, seed=seed)
    for alpha in (0.4, 1.5):
        for p in (1, 3, 6):
            want = beam_rule_reference(lat, p, alpha, lm, [1, 2], beam)
            got = pbest_rescored(lat, p, alpha, lm, [1, 2], beam=beam)
            assert [g[1] for g in got] == [list(w[1]) for w in want]
            assert [g[0] for g in got] == pytest.approx([w[0] for w in want], abs=1e-9)


def test_pbest_with_alpha_zero_and_many_ties_keeps_p_paths():
    """alpha = 0 makes every LM state tie with its siblings: the beam cut must not empty a kept state."""
    import torch as _torch

    class FlatLM:
        def initial_state(self, context):
            return ()

        def score(self, state, token):
            return -1.0, (state + (token,))[-3:]

    h, k = 8, 16
    ids = _torch.arange(h * k).view(h, k)
    lps = _torch.full((h, k), -2.0)
    lps[:, 0] = -0.5
    lat = Lattice(ids, lps)
    paths = pbest_rescored(lat, 16, 0.0, FlatLM(), beam=4)
    assert len(paths) == 16 and paths[0][1] == ids[:, 0].tolist()
    assert [s for s, _ in paths] == sorted((s for s, _ in paths), reverse=True)
