"""Lookahead decoding: lossless, replay == real decoding for every counter, the Jacobi window is scored (flagged,
after the draft nodes, never accepted) and advances one level per step, a stub with fixed successors is drafted
perfectly once the pool fills, wrong n-grams accept nothing, and bad parameters are one-line errors."""
from __future__ import annotations

import re

import pytest
import torch
from test_recycling import PROMPTS, Spy, first_order_stub
from test_sampling import PROMPT

from bpdbench.engine import DraftContext, Limits, TreeScorer, generate, replay
from bpdbench.methods import parse
from bpdbench.methods.lookahead import LookaheadDrafter
from tests.helpers import assert_wrong_drafts_accept_nothing, parse_error


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.mark.parametrize("window,ngram,guesses", [(7, 5, 7), (3, 2, 2), (4, 3, 1), (1, 4, 3)])
def test_lossless_and_replay_equals_real(tiny_model, window, ngram, guesses):
    limits = Limits(48)
    scorer = TreeScorer(tiny_model)
    accepted = 0
    for prompt in PROMPTS:
        greedy = generate(tiny_model, None, prompt, limits)
        ours = generate(tiny_model, LookaheadDrafter("l", window, ngram, guesses), prompt, limits)
        assert ours.tokens == greedy.tokens
        again = LookaheadDrafter("l", window, ngram, guesses)
        assert replay(again, prompt, greedy.tokens, None, limits, scorer=scorer) == ours.counters
        accepted += ours.counters.accepted
        # every forward scores the window: at least `window` nodes per step beyond the root
        assert ours.counters.verified >= ours.counters.steps * (1 + window)
    assert accepted > 0 or window == 1


def test_window_is_scored_never_accepted_and_advances(tiny_model):
    w, n, g = 4, 4, 3
    spy = Spy(LookaheadDrafter("l", w, n, g))
    assert spy.feedback_k == 1
    generate(tiny_model, spy, PROMPTS[0], Limits(30))
    for step, (context, proposal, fb) in enumerate(spy.log):
        tree = fb.tree
        levels = min(step + 1, n - 1)                    # level 0, then one more per step up to n - 1
        drafts = len(tree.tokens) - len(tree.scored)
        assert tree.scored == tuple(range(drafts, len(tree.tokens)))
        # w x levels window tokens; a column's tokens that repeat level 0's (a converged diagonal) are one node,
        # since the same token after the same ancestors is the same computation
        assert w + (levels > 1) <= len(tree.scored) <= w * levels or levels == 1 and len(tree.scored) == w
        assert all(node < drafts for path in tree.paths for node in path)
        assert len(proposal.paths) <= g and all(len(p) <= n - 1 for p in proposal.paths)
        assert all(len(p) == i + levels for i, p in enumerate(proposal.scored))
    assert len(spy.inner.levels) == n - 1
    assert all(len(v) <= g and all(len(gram) == n - 1 for gram in v) for v in spy.inner.pool.values())


def test_pool_keeps_the_most_recent_grams_per_key():
    d = LookaheadDrafter("l", 2, 3, 2)
    for gram in [(1, 2), (3, 4), (1, 2), (5, 6)]:
        d._add(9, gram)
    assert d.pool[9] == [(1, 2), (5, 6)]
    d.reset([9, 8])
    d.pool[9] = [(1, 2), (5, 6)]
    p = d.propose(DraftContext([9], None, 10))
    assert p.paths == [[5, 6], [1, 2]] and p.probs == [[1.0, 1.0], [1.0, 1.0]]
    assert len(p.scored) == 2


def test_fixed_successors_are_drafted_perfectly_once_the_pool_fills():
    stub = first_order_stub()
    n = 4
    with torch.inference_mode():
        gen = generate(stub, LookaheadDrafter("l", 5, n, 5), list(PROMPT), Limits(60))
    log = gen.step_log
    assert gen.counters.accepted > 0
    late = log[len(log) // 2: -1]                       # after warm-up, before the budget cuts the drafts
    assert late and all(a == n - 1 for _, a in late), log


class WrongPool(LookaheadDrafter):
    """Every key's pool holds one n-gram of a token the base never outputs here, and never learns."""

    def __init__(self, wrong: int):
        super().__init__("w", 3, 3, 2)
        self.wrong = wrong

    def propose(self, ctx):
        self.pool = {ctx.tokens[-1]: [(self.wrong, self.wrong)]}
        return super().propose(ctx)


def test_wrong_grams_accept_nothing_and_stay_lossless(tiny_model):
    assert_wrong_drafts_accept_nothing(tiny_model, WrongPool, PROMPTS[0], Limits(30))


@pytest.mark.parametrize("spelling,match", [("lookahead:ngram=1", "ngram must be >= 2"),
                                            ("lookahead:window=0", "window must be >= 1"),
                                            ("lookahead:guesses=0", "guesses must be >= 1"),
                                            ("lookahead:guesses=some", "not a int or auto"),
                                            ("lookahead:window=auto", "not a int"),
                                            ("lookahead:level=3", "unknown parameter")])
def test_bad_parameters_are_one_line_errors(spelling, match):
    assert re.search(match, parse_error(spelling))
    assert parse("lookahead:guesses=auto").auto == ["guesses"]


def test_a_tree_without_its_window_leaves_the_window_as_it_was():
    """As a wrapper's fallback (sam, methods/compose.py) lookahead is handed the feedback of forwards it did not
    propose for: a tree without its window moves nothing (and does not fail); its own window steps once."""
    import torch
    from bpdbench.engine import Feedback
    from bpdbench.engine.tree import build_tree
    d = LookaheadDrafter("l", 2, 4, 2)
    d.reset([1, 2, 3, 4])
    ctx = DraftContext([1, 2, 3, 4], None, 10)

    def fed(paths, scored):
        tree = build_tree(4, paths, scored)
        d.feedback(Feedback(tree, torch.arange(len(tree.tokens))[:, None] + 50))
    p = d.propose(ctx)
    fed([[5, 6]], None)                              # another drafter's chain: no window in the tree
    assert len(d.levels) == 1 and not d.pool
    fed([[5, 6]], p.scored)                          # the window was this proposal's: already handed back once
    assert len(d.levels) == 1
    p = d.propose(ctx)
    fed([[5, 6]], p.scored)                          # its own window: one Jacobi step
    assert len(d.levels) == 2
    fed([[5, 6]], p.scored)                          # the same tree again: the window is stepped once
    assert len(d.levels) == 2
