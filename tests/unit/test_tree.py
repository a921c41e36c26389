"""Multi-draft verification in one forward (token trie + 4D mask) agrees with verifying each draft alone."""
from __future__ import annotations

import copy

import torch
from transformers import DynamicCache

from bpdbench.engine import GREEDY, Limits, Proposal, loop
from bpdbench.engine.tree import ancestors_mask, build_tree
from tests.conftest import decode, random_heads

PROMPT = [5, 17, 3, 42, 8, 11]


def test_trie_merges_shared_prefixes():
    tree = build_tree(7, [[1, 2, 3], [1, 2, 4], [5]])
    assert tree.tokens == [7, 1, 2, 3, 4, 5]
    assert tree.parents == [-1, 0, 1, 2, 2, 0]
    assert tree.paths == [[1, 2, 3], [1, 2, 4], [5]]
    mask = ancestors_mask(tree)
    assert mask[4].tolist() == [True, True, True, False, True, False]
    assert build_tree(7, [[1, 2]]).is_chain and not tree.is_chain


def _chain_result(model, state, draft):
    st = copy.deepcopy(state)
    proposal = Proposal([draft])
    v = loop.verify(model, st, proposal)
    d = loop.step_decision(v.tree, v.targets, proposal, Limits(100), GREEDY)
    new = loop.advance(st, v, d)
    return d.accepted, new, st


def test_tree_verify_equals_best_single_draft(tiny_model):
    ref = decode(tiny_model, PROMPT, 12, eos_ids=set()).tokens
    base = loop.prefill(tiny_model, PROMPT)
    # Drafts with different correct prefixes: 0, 2 and 3 tokens right, sharing prefixes.
    drafts = [[ref[1] + 1, 0, 0, 0], ref[1:3] + [0, 0], ref[1:4] + [(ref[4] + 1) % 96], [ref[1], 0, 0, 0]]
    singles = [_chain_result(tiny_model, base, d) for d in drafts]
    st = copy.deepcopy(base)
    proposal = Proposal(drafts)
    v = loop.verify(tiny_model, st, proposal)
    d = loop.step_decision(v.tree, v.targets, proposal, Limits(100), GREEDY)
    new = loop.advance(st, v, d)
    assert (d.path, d.accepted) == (2, 3)
    assert new == singles[2][1] == ref[1:5]
    assert torch.allclose(st.hidden, singles[2][2].hidden, atol=1e-5)
    # The compacted cache continues exactly like a fresh prefill of the accepted tokens.
    fresh = DynamicCache()
    ctx = st.context[:-1]
    h = tiny_model.model(input_ids=torch.tensor([ctx]), past_key_values=fresh).last_hidden_state[0, -1]
    assert st.cache.get_seq_length() == len(ctx)
    assert torch.allclose(h, st.hidden, atol=1e-5)


class ManyDrafts:
    """A rescorer returning the heads' top-1 draft plus corrupted copies, to exercise tree decoding end to end."""
    name, p = "many", 3

    def reset(self, prompt_ids):
        pass

    def refine(self, lattice, context):
        top = lattice.ids[:, 0].tolist()
        alt = lattice.ids[:, 1].tolist()
        return [alt, top[:2] + alt[2:], top]


def test_multi_draft_decoding_is_lossless(tiny_model):
    heads = random_heads(tiny_model.lm_head, 4, seed=3, std=0.5)
    ref = decode(tiny_model, PROMPT, 30, eos_ids=set()).tokens
    gen = decode(tiny_model, PROMPT, 30, set(), heads=heads, n_heads=4, rescorer=ManyDrafts(), k=2)
    assert gen.tokens == ref


def test_medusa_tree_paths_and_lossless_decoding(tiny_model):
    from bpdbench.refine.medusa import MC_SIM_7B_63, MedusaTree, auto_tree
    assert len(MC_SIM_7B_63) == 63 and max(map(len, MC_SIM_7B_63)) == 4
    tree = auto_tree([[0.6, 0.1, 0.05], [0.4, 0.1], [0.3]], nodes=6)
    assert tree[0] == [0] and len(tree) == 6 and all(p[:-1] in tree for p in tree if len(p) > 1)
    heads = random_heads(tiny_model.lm_head, 4, seed=5, std=0.3)
    ref = decode(tiny_model, PROMPT, 30, eos_ids=set()).tokens
    gen = decode(tiny_model, PROMPT, 30, set(), heads=heads, n_heads=4, rescorer=MedusaTree("medusa"),
                            k=10)
    assert gen.tokens == ref
    plain = decode(tiny_model, PROMPT, 30, set(), heads=heads, n_heads=4)
    assert gen.counters.serial_calls <= plain.counters.serial_calls


def test_auto_tree_from_heads_report_measured_or_estimated():
    import pytest
    from bpdbench.refine.medusa import rank_accuracy, tree_from_report
    est = rank_accuracy({"top1": [0.3, 0.1], "top16": [0.7, 0.4]})
    assert est[0][0] == 0.3 and len(est[0]) == 10 and est[0][1] > est[0][2] > est[0][9] > 0
    assert abs(sum(est[0][1:]) + sum(0.4 / r for r in range(11, 17)) / sum(1 / r for r in range(2, 17)) - 0.4) < 1e-9
    measured = [[0.5] + [0.01] * 15, [0.2] + [0.02] * 15]
    assert rank_accuracy({"top1": [0.5, 0.2], "top16": [0.65, 0.5], "rank": measured})[1] == measured[1][:10]
    tree = tree_from_report({"heldout": {"top1": [0.3, 0.1, 0.05], "top16": [0.7, 0.4, 0.3]}}, nodes=20)
    assert len(tree) == 20 and tree[0] == [0] and [0, 0] in tree and all(p[:-1] in tree for p in tree if len(p) > 1)
    with pytest.raises(ValueError, match="held-out agreement report"):
        tree_from_report({"path": "x"})


def test_rescored_tree_puts_the_local_pick_on_the_main_path(tiny_model):
    from bpdbench.refine.base import Lattice
    from bpdbench.refine.medusa import MC_SIM_7B_63, MedusaTree, RescoredTree

    class PickThird:
        def reset(self, prompt_ids):
            self.reset_with = prompt_ids

        def refine(self, lattice, context):
            return [lattice.ids[:, 2].tolist()]

    ids = torch.arange(40).view(4, 10)
    lat = Lattice(ids, torch.linspace(-1, -5, 10).expand(4, 10).clone())
    r = RescoredTree("medusa-x", MedusaTree("medusa"), PickThird())
    r.reset([1, 2])
    drafts = r.refine(lat, [1, 2, 3])
    assert len(drafts) == len(MC_SIM_7B_63) and r.local.reset_with == [1, 2]
    assert drafts[MC_SIM_7B_63.index([0, 0, 0, 0])] == [2, 12, 22, 32]      # rank 0 = the rescorer's pick
    assert drafts[MC_SIM_7B_63.index([1])] == [0] and drafts[MC_SIM_7B_63.index([2])] == [1]  # heads' order after it
    heads = random_heads(tiny_model.lm_head, 4, seed=5, std=0.3)
    ref = decode(tiny_model, PROMPT, 30, eos_ids=set()).tokens
    gen = decode(tiny_model, PROMPT, 30, set(), heads=heads, n_heads=4, k=10,
                            rescorer=RescoredTree("medusa-x", MedusaTree("medusa"), PickThird()))
    assert gen.tokens == ref


def _brute_mask(parents: list[int]) -> torch.Tensor:
    n = len(parents)
    m = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j >= 0:
            m[i, j] = True
            j = parents[j]
    return m


def test_the_vectorised_mask_equals_the_ancestor_walk_on_random_trees():
    import random

    from bpdbench.engine.tree import ancestors_mask, build_tree, model_inputs, tree_buffers
    rng = random.Random(0)
    for _ in range(50):
        drafts = [[rng.randrange(4) for _ in range(rng.randrange(1, 7))] for _ in range(rng.randrange(1, 9))]
        tree = build_tree(9, drafts)
        assert torch.equal(ancestors_mask(tree), _brute_mask(tree.parents))
        assert tree_buffers(tree, "cpu")[0] is tree_buffers(build_tree(9, drafts), "cpu")[0]   # one per topology
        if not tree.is_chain:      # the 4D mask: every cached position, then the tree's own ancestors
            past, n = rng.randrange(0, 5), len(tree.tokens)
            kw = model_inputs(tree, past, "cpu")
            want = torch.cat([torch.ones(n, past, dtype=torch.bool), _brute_mask(tree.parents)], dim=1)
            assert torch.equal(kw["attention_mask"][0, 0], want)
            assert kw["position_ids"][0].tolist() == [past + d for d in tree.depths]


def test_in_place_compaction_keeps_exactly_the_accepted_rows():
    from transformers import DynamicCache

    from bpdbench.engine.tree import compact_cache
    past, n, keep = 5, 7, [0, 2, 5]
    cache = DynamicCache()
    k = torch.randn(1, 2, past + n, 4)
    v = torch.randn(1, 2, past + n, 4)
    cache.update(k.clone(), v.clone(), 0)
    compact_cache(cache, past, n, keep)
    rows = list(range(past)) + [past + i for i in keep]
    assert cache.get_seq_length() == past + len(keep)
    assert torch.equal(cache.layers[0].keys, k[..., rows, :]) and torch.equal(cache.layers[0].values, v[..., rows, :])


def test_lazy_projection_equals_the_full_one_and_skips_the_leaves(tiny_model, monkeypatch):
    """A wide tree projects only its inner nodes (plus a leaf when the walk ends there): same targets, same output,
    same counters as the full projection, and fewer rows through the output matrix."""
    from bpdbench.refine.medusa import MedusaTree
    hidden = torch.randn(20, tiny_model.config.hidden_size)
    lazy = loop.LazyArgmax(tiny_model.lm_head, hidden, [0, 3, 7])
    assert list(lazy) == tiny_model.lm_head(hidden).argmax(-1).tolist() and lazy[-1] == lazy[19]

    rows = []
    real = tiny_model.lm_head.forward
    monkeypatch.setattr(tiny_model.lm_head, "forward", lambda x: (rows.append(x.shape[0]), real(x))[1])
    heads = random_heads(tiny_model.lm_head, 4, seed=5, std=0.3)
    run = lambda: decode(tiny_model, PROMPT, 30, set(), heads=heads, n_heads=4, rescorer=MedusaTree("medusa"), k=10)
    fast, fast_rows = run(), sum(rows)
    rows.clear()
    monkeypatch.setattr(loop, "LAZY_MIN_LEAVES", 10 ** 9)
    full, full_rows = run(), sum(rows)
    assert fast.tokens == full.tokens == decode(tiny_model, PROMPT, 30, eos_ids=set()).tokens
    assert vars(fast.counters) == vars(full.counters) and fast.counters.accepted > 0
    assert fast_rows < full_rows / 2, (fast_rows, full_rows)
