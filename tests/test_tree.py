"""Multi-draft verification in one forward (token trie + 4D mask) agrees with verifying each draft alone."""
from __future__ import annotations

import copy

import torch
from transformers import DynamicCache

from bpdbench import decoding
from bpdbench.tree import ancestors_mask, build_tree
from tests.conftest import random_heads

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
    v = decoding.verify(model, st, [draft])
    best, a = decoding.accept(v)
    new = decoding.advance(st, v, best, a)
    return a, new, st


def test_tree_verify_equals_best_single_draft(tiny_model):
    ref = decoding.generate(tiny_model, PROMPT, 12, eos_ids=set()).tokens
    base = decoding.prefill(tiny_model, PROMPT)
    # Drafts with different correct prefixes: 0, 2 and 3 tokens right, sharing prefixes.
    drafts = [[ref[1] + 1, 0, 0, 0], ref[1:3] + [0, 0], ref[1:4] + [(ref[4] + 1) % 96], [ref[1], 0, 0, 0]]
    singles = [_chain_result(tiny_model, base, d) for d in drafts]
    st = copy.deepcopy(base)
    v = decoding.verify(tiny_model, st, drafts)
    best, a = decoding.accept(v)
    new = decoding.advance(st, v, best, a)
    assert (best, a) == (2, 3)
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
    ref = decoding.generate(tiny_model, PROMPT, 30, eos_ids=set()).tokens
    gen = decoding.generate(tiny_model, PROMPT, 30, set(), heads=heads, n_heads=4, rescorer=ManyDrafts(), k=2)
    assert gen.tokens == ref


def test_medusa_tree_paths_and_lossless_decoding(tiny_model):
    from rescorers.medusa import MC_SIM_7B_63, MedusaTree, auto_tree
    assert len(MC_SIM_7B_63) == 63 and max(map(len, MC_SIM_7B_63)) == 4
    tree = auto_tree([[0.6, 0.1, 0.05], [0.4, 0.1], [0.3]], nodes=6)
    assert tree[0] == [0] and len(tree) == 6 and all(p[:-1] in tree for p in tree if len(p) > 1)
    heads = random_heads(tiny_model.lm_head, 4, seed=5, std=0.3)
    ref = decoding.generate(tiny_model, PROMPT, 30, eos_ids=set()).tokens
    gen = decoding.generate(tiny_model, PROMPT, 30, set(), heads=heads, n_heads=4, rescorer=MedusaTree("medusa"),
                            k=10)
    assert gen.tokens == ref
    plain = decoding.generate(tiny_model, PROMPT, 30, set(), heads=heads, n_heads=4)
    assert gen.counters.serial_calls <= plain.counters.serial_calls
