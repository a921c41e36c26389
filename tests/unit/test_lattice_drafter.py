"""The one lattice drafter of head-type networks and its one threshold rule: the same weights drafted as `Heads` and
as a parallel `MedusaHeads` give the same lattice and the same cut; the rule's extremes; a sequential chain stops
where the rule says, without computing the depths after it."""
from __future__ import annotations

import math

import pytest
import torch

from bpdbench.engine import DraftContext, Lattice
from bpdbench.methods.lattice import HeadsSource, LatticeDrafter, sure_depths
from bpdbench.methods.trained import TrainedDrafter, drafter_for
from bpdbench.nets.base import DraftModel
from bpdbench.nets.medusa import MedusaHeads
from tests.conftest import random_heads

pytestmark = pytest.mark.unit
THRESHOLDS = (0.0, 0.2, 0.5, 0.8, 0.95)


def leading_sure(probs: list[float], threshold: float) -> int:
    """The rule, spelled out independently: depths kept up to the first whose top-1 probability is below it."""
    return next((i for i, p in enumerate(probs) if p < threshold), len(probs))


def _ctx(hidden: torch.Tensor, budget: int = 100) -> DraftContext:
    return DraftContext([5, 17, 3], hidden, budget)


def test_rule_counts_leading_sure_depths_only():
    lp = torch.tensor([0.9, 0.6, 0.2, 0.8]).log()
    assert [sure_depths(lp, t) for t in (0.0, 0.5, 0.7, 0.95, 1.0)] == [4, 2, 1, 0, 0]
    assert sure_depths(torch.tensor([0.1, 0.99, 0.99]).log(), 0.5) == 0      # a sure depth after an unsure one
    assert sure_depths(torch.tensor([]), 0.5) == 0


def test_heads_and_medusa_heads_draft_the_same_lattice_and_cut(tiny_model):
    """One set of weights through the heads' packed path and through the parallel drafter's own path: the same
    top-k lattice, and under every threshold the same cut, where the rule says."""
    heads = random_heads(tiny_model.lm_head, 4, seed=1, std=0.5)
    medusa = MedusaHeads.from_heads(heads).bind(tiny_model.model.embed_tokens.weight, tiny_model.lm_head.weight,
                                                None)
    torch.manual_seed(0)
    cuts = set()
    for _ in range(12):
        hidden = torch.randn(32) * 2
        for t in THRESHOLDS:
            a = LatticeDrafter("heads", HeadsSource(heads, tiny_model.lm_head), 4, k=4, threshold=t)
            b = drafter_for("medusa", medusa, 4, k=4, threshold=t)
            assert isinstance(b, LatticeDrafter)
            la, lb = a.lattice(_ctx(hidden)), b.lattice(_ctx(hidden))
            full = LatticeDrafter("all", HeadsSource(heads, tiny_model.lm_head), 4, k=4).lattice(_ctx(hidden))
            probs = full.logprobs[:, 0].exp().tolist()
            if any(abs(p - t) < 1e-4 for p in probs):
                continue                            # too close to call for two float paths
            want = leading_sure(probs, t)
            cuts.add(want)
            if want == 0:
                assert la is None and lb is None
                assert a.propose(_ctx(hidden)).paths == b.propose(_ctx(hidden)).paths == [[]]
                continue
            assert la.ids.shape == lb.ids.shape == (want, 4)
            assert torch.equal(la.ids, lb.ids) and torch.equal(la.ids, full.ids[:want])
            assert torch.allclose(la.logprobs, lb.logprobs, atol=1e-5)
            assert a.propose(_ctx(hidden)).paths == b.propose(_ctx(hidden)).paths == [la.ids[:, 0].tolist()]
    assert {0, 4} < cuts             # no draft, every depth and a cut in between all happened


@pytest.mark.parametrize("std", [0.05, 0.5])
def test_threshold_one_drafts_nothing_and_zero_every_depth(tiny_model, std):
    heads = random_heads(tiny_model.lm_head, 4, seed=2, std=std)
    medusa = MedusaHeads.from_heads(heads).bind(tiny_model.model.embed_tokens.weight, tiny_model.lm_head.weight,
                                                None)
    torch.manual_seed(1)
    for _ in range(5):
        ctx = _ctx(torch.randn(32))
        for drafter in (LatticeDrafter("h", HeadsSource(heads, tiny_model.lm_head), 4, threshold=1.0),
                        drafter_for("m", medusa, 4, threshold=1.0)):
            p = drafter.propose(ctx)
            assert p.paths == [[]] and p.lattice is None
        for drafter in (LatticeDrafter("h", HeadsSource(heads, tiny_model.lm_head), 4, threshold=0.0),
                        drafter_for("m", medusa, 4, threshold=0.0)):
            p = drafter.propose(ctx)
            assert len(p.paths[0]) == 4 and p.lattice.ids.shape == (4, 1)


class Confident(DraftModel):
    """A draft model whose depth j drafts token j + 1 with top-1 probability probs[j], sequential (one expansion
    call per depth, counted) or parallel (every depth in one call)."""

    def __init__(self, probs: list[float], drafting: str, vocab: int = 10):
        super().__init__(8, len(probs))
        self.probs, self.drafting, self.vocab, self.calls = probs, drafting, vocab, 0

    def _row(self, depth: int) -> torch.Tensor:
        p = self.probs[depth]
        row = torch.full((self.vocab,), math.log((1 - p) / (self.vocab - 1)))
        row[depth + 1] = math.log(p)
        return row

    def session(self):
        outer = self

        class Session:
            def sync(self, ctx):
                pass

            def expansion(self, bonus):
                class Expansion:
                    def logits(self, paths):
                        outer.calls += 1
                        return torch.stack([outer._row(len(p)) for p in paths])
                return Expansion()
        return Session()

    def parallel_logits(self, hidden, bonus, n):
        self.calls += 1
        return torch.stack([self._row(j) for j in range(n)])


@pytest.mark.parametrize("probs", [[0.9, 0.8, 0.3, 0.95], [0.99, 0.97, 0.96, 0.9], [0.4, 0.9, 0.9, 0.9]])
@pytest.mark.parametrize("threshold", [0.0, 0.5, 0.85, 0.95])
def test_sequential_chain_stops_where_the_rule_says(probs, threshold):
    """The chain drafts the depths the rule keeps, computes the first unsure one to know it, and never the rest;
    the parallel drafter over the same distributions cuts its lattice at the same depth."""
    want = leading_sure(probs, threshold)
    assert want == sure_depths(torch.tensor(probs).log(), threshold)
    seq = Confident(probs, "sequential")
    drafter = TrainedDrafter("seq", seq, 4, k=2, threshold=threshold)
    drafter.reset([5, 17, 3])
    p = drafter.propose(_ctx(None))
    assert p.paths == [list(range(1, want + 1))]
    assert seq.calls == min(want + 1, len(probs))
    par = drafter_for("par", Confident(probs, "parallel"), 4, k=2, threshold=threshold)
    q = par.propose(_ctx(None))
    assert q.paths == p.paths
    if want:
        assert isinstance(p.lattice, Lattice) and torch.equal(p.lattice.ids, q.lattice.ids)
        assert torch.allclose(p.lattice.logprobs, q.lattice.logprobs)
    else:
        assert p.lattice is None and q.lattice is None


def test_chains_keep_their_budget_rule(tiny_model):
    """Draft networks draft at most the budget left; the heads draft every depth (the loop clips the paths),
    since a rescorer's paths over the longer lattice differ from those over the cut one."""
    heads = random_heads(tiny_model.lm_head, 4, seed=1, std=0.5)
    medusa = MedusaHeads.from_heads(heads).bind(tiny_model.model.embed_tokens.weight, tiny_model.lm_head.weight,
                                                None)
    hidden = torch.randn(32)
    assert drafter_for("m", medusa, 4).lattice(_ctx(hidden, budget=2)).ids.shape == (2, 1)
    assert drafter_for("m", medusa, 4).propose(_ctx(hidden, budget=0)).paths == [[]]
    heads_drafter = LatticeDrafter("h", HeadsSource(heads, tiny_model.lm_head), 4)
    assert heads_drafter.lattice(_ctx(hidden, budget=2)).ids.shape == (4, 1)
    with pytest.raises(ValueError, match="drafter_for"):
        TrainedDrafter("m", medusa, 4)


def test_a_fixed_medusa_tree_computes_only_its_depths_and_drafts_the_same_paths(tiny_model_dir):
    """A fixed Medusa tree reads no lattice row past its deepest node, so those heads are not computed; every path
    and every computed row is what all heads give. The depth is read per proposal: medusa:nodes=auto swaps in a
    deeper measured tree after the drafter is built, and its paths must not be cut to the first tree's depth."""
    from bpdbench import models
    from bpdbench.config import RunConfig
    from bpdbench.engine.loop import Limits
    from bpdbench.methods import parse
    from bpdbench.methods.env import Env

    torch.set_num_threads(1)
    model, tok = models.load(str(tiny_model_dir), "float32")
    env = Env(model, tok, RunConfig(model=str(tiny_model_dir), k=4, heads=4, heads_profile="init"), Limits(16),
              log=lambda m: None)
    heads, _ = env.heads()
    torch.manual_seed(3)
    for blk in heads.blocks:                                 # zero-init heads draft nothing worth comparing
        blk[0].linear.weight.data.normal_(0, 0.5)
    heads.pack(model.lm_head)
    small = parse("medusa:nodes=3")
    cut = env.build(small)
    tree = cut.rescorer
    every = LatticeDrafter("all", cut.source, 4, cut.k)
    for shape in (None, [[0], [0, 0], [0, 0, 0]]):          # the first 3 nodes (depth 2), then a 3-deep chain
        if shape:
            tree.use(shape)
        for _ in range(6):
            ctx = _ctx(torch.randn(32) * 2)
            a = cut.propose(ctx)
            full = every.lattice(ctx)
            assert a.lattice.ids.shape[0] == tree.depth < 4
            assert torch.equal(a.lattice.ids, full.ids[: tree.depth])
            assert a.paths == tree.refine(full, ctx.tokens) and len(a.paths) == 3
    assert max(map(len, a.paths)) == 3
