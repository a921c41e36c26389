"""Draft shapes sized to the hardware: the pure optimisers (fake cost tables) and `auto` method parameters."""
from __future__ import annotations

import pytest

from bpdbench.hardware.shapes import (TableCost, best_chain, best_tree, chain_value, expected_tokens, tree_nodes,
                                      tree_value)

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
    from rescorers.base import Lattice
    from rescorers.medusa import MedusaTree
    s = best_tree(P, BF16, 20)
    lat = Lattice(torch.arange(16).view(4, 4), torch.zeros(4, 4))
    drafts = MedusaTree("t", s.tree).refine(lat, [])
    assert len(drafts) == len(s.tree) and drafts[0] == [0]
