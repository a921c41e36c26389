"""Decoding logic on a tiny random model: losslessness at both extremes of head quality, cache, counters."""
from __future__ import annotations

import torch
from transformers import DynamicCache

from bpdbench.engine import loop
from bpdbench.nets.heads import Heads
from bpdbench.engine import Counters, Proposal, ratios
from tests.conftest import decode, random_heads

PROMPT = [5, 17, 3, 42, 8, 11]


class ScriptedHeads(Heads):
    """Drafts from a known greedy continuation: `shift=0` is a perfect drafter, `shift=1` is always wrong."""

    def __init__(self, reference: list[int], prompt_len: int, vocab: int, shift: int, n: int = 4,
                 confidence: list[float] | None = None):
        super().__init__(d=32, num_heads=n)
        self.reference, self.prompt_len, self.vocab, self.shift = reference, prompt_len, vocab, shift
        self.confidence = confidence or [10.0] * n  # logit of the drafted token (others 0): its probability

    def draft_logits(self, hidden, n, lm_head, context=None):
        m = len(context) - self.prompt_len  # decided tokens so far, next_token included
        logits = torch.zeros(n, self.vocab)
        for i in range(n):
            tok = self.reference[m + i] if m + i < len(self.reference) else 0
            logits[i, (tok + self.shift) % self.vocab] = self.confidence[i]
        return logits


def greedy_by_hand(model, prompt, n):
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


def test_ar_equals_uncached_greedy_and_hf_generate(tiny_model):
    gen = decode(tiny_model, PROMPT, 20, eos_ids=set())
    assert gen.tokens == greedy_by_hand(tiny_model, PROMPT, 20)
    hf = tiny_model.generate(torch.tensor([PROMPT]), max_new_tokens=20, do_sample=False, eos_token_id=None,
                             pad_token_id=0)[0, len(PROMPT):].tolist()
    assert gen.tokens == hf
    assert ratios(gen.counters)["block_efficiency"] == 1.0
    assert gen.counters.serial_calls == 20 and gen.counters.new_tokens == 20


def test_perfect_heads_accept_everything(tiny_model):
    ref = decode(tiny_model, PROMPT, 40, eos_ids=set()).tokens
    heads = ScriptedHeads(ref, len(PROMPT), 96, shift=0, n=4)
    gen = decode(tiny_model, PROMPT, 40, eos_ids=set(), heads=heads, n_heads=4)
    assert gen.tokens == ref
    c = gen.counters
    assert all(a == 4 for _, a in gen.step_log[:-1])
    assert gen.step_log[-1] == (3, 3)  # the last draft is clipped to the 3 tokens the budget can still keep
    # 1 token from the prefill, then 5 per verify call: ceil(39 / 5) = 8 calls.
    assert c.serial_calls == 1 + 8
    assert ratios(c)["block_efficiency"] == 40 / 9


def test_wrong_heads_accept_nothing(tiny_model):
    ref = decode(tiny_model, PROMPT, 30, eos_ids=set()).tokens
    heads = ScriptedHeads(ref, len(PROMPT), 96, shift=1, n=4)
    gen = decode(tiny_model, PROMPT, 30, eos_ids=set(), heads=heads, n_heads=4)
    assert gen.tokens == ref
    assert gen.counters.accepted == 0 and gen.counters.hist == [29, 0, 0, 0, 0]
    assert ratios(gen.counters)["block_efficiency"] == 1.0


def test_draft_threshold_verifies_only_confident_heads(tiny_model):
    ref = decode(tiny_model, PROMPT, 30, eos_ids=set()).tokens
    # heads 1-2 sure (p ~ 0.996), heads 3-4 unsure (p ~ 0.017): only two tokens are drafted, and both are right
    heads = ScriptedHeads(ref, len(PROMPT), 96, shift=0, n=4, confidence=[10.0, 10.0, 0.5, 0.5])
    gen = decode(tiny_model, PROMPT, 30, eos_ids=set(), heads=heads, n_heads=4, threshold=0.5)
    assert gen.tokens == ref
    assert all(d == 2 and a == 2 for d, a in gen.step_log[:-1])
    full = decode(tiny_model, PROMPT, 30, eos_ids=set(), heads=heads, n_heads=4)
    assert full.tokens == ref and full.counters.drafted > gen.counters.drafted
    # head 1 unsure: nothing is drafted and the loop is plain greedy decoding
    unsure = ScriptedHeads(ref, len(PROMPT), 96, shift=1, n=4, confidence=[0.5, 10.0, 10.0, 10.0])
    gen = decode(tiny_model, PROMPT, 30, eos_ids=set(), heads=unsure, n_heads=4, threshold=0.5)
    assert gen.tokens == ref and gen.counters.drafted == 0 and gen.counters.serial_calls == 30


def test_random_real_heads_are_lossless(tiny_model):
    heads = random_heads(tiny_model.lm_head, 6, seed=1, std=0.5)
    ref = decode(tiny_model, PROMPT, 25, eos_ids=set()).tokens
    for n in (1, 3, 6):
        assert decode(tiny_model, PROMPT, 25, set(), heads=heads, n_heads=n).tokens == ref


def test_packed_heads_match_unpacked(tiny_model):
    torch.manual_seed(2)
    heads = Heads(32, 3)
    for p in heads.parameters():
        torch.nn.init.normal_(p, std=0.3)
    h = torch.randn(32)
    plain = heads.draft_logits(h, 3, tiny_model.lm_head)
    heads.shortlist = torch.arange(0, 96, 2)
    heads.pack(tiny_model.lm_head)
    packed = heads.draft_logits(h, 3, tiny_model.lm_head)
    assert torch.allclose(packed, plain[:, ::2], atol=1e-5)
    assert heads.to_token_ids(torch.tensor([3])).item() == 6


def test_eos_and_max_new_tokens_stop_both_methods_identically(tiny_model):
    ref = decode(tiny_model, PROMPT, 30, eos_ids=set()).tokens
    eos = ref[9]
    first = ref.index(eos)
    heads = ScriptedHeads(ref, len(PROMPT), 96, shift=0, n=4)
    for max_new in (1, 7, 30):
        ar = decode(tiny_model, PROMPT, max_new, {eos})
        bpd = decode(tiny_model, PROMPT, max_new, {eos}, heads=heads, n_heads=4)
        assert ar.tokens == bpd.tokens == ref[: min(max_new, first + 1)]
        assert bpd.counters.new_tokens == len(bpd.tokens)


def test_cache_is_cropped_to_accepted_prefix(tiny_model):
    state = loop.prefill(tiny_model, PROMPT)
    assert state.cache.get_seq_length() == len(PROMPT)
    draft = [1, 2, 3, 4]
    verified = loop.verify(tiny_model, state, Proposal([draft]))
    assert state.cache.get_seq_length() == len(PROMPT) + 5
    loop.advance(state, verified, loop.Decision(0, 1, verified.targets[1]))
    assert state.cache.get_seq_length() == len(PROMPT) + 2
    # The cropped cache continues exactly like a fresh prefill of the same tokens.
    fresh = DynamicCache()
    ctx = state.context[:-1]
    h_fresh = tiny_model.model(input_ids=torch.tensor([ctx]), past_key_values=fresh).last_hidden_state[0, -1]
    assert torch.allclose(h_fresh, state.hidden, atol=1e-5)


def test_counters_are_ratios_of_sums():
    a, b = Counters(), Counters()
    a.serial_calls, a.new_tokens = 1, 1
    a.record_step(4, 4)
    a.new_tokens += 5
    b.serial_calls, b.new_tokens = 1, 1
    for _ in range(9):
        b.record_step(4, 0)
        b.new_tokens += 1
    total = a.add(b)
    assert total.serial_calls == 12 and total.new_tokens == 16
    assert ratios(total)["block_efficiency"] == 16 / 12
    assert total.hist == [9, 0, 0, 0, 1] and total.accepted_per_head == [1, 1, 1, 1]
    assert ratios(total)["acceptance_rate"] == 4 / 40
