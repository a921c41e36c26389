"""Our prompt-lookup drafter (`pld`) against transformers' PromptLookupCandidateGenerator: same candidates on the
same contexts, lossless in our loop, and as many target calls as transformers' own `generate` with
`prompt_lookup_num_tokens`."""
from __future__ import annotations

import random

import pytest
import torch
from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

from bpdbench.engine import DraftContext, Limits, generate
from bpdbench.methods.pld import PromptLookupDrafter


def hf_candidates(context: list[int], tokens: int, ngram: int, eos: int | None) -> list[int]:
    gen = PromptLookupCandidateGenerator(eos_token_id=None if eos is None else torch.tensor([eos]),
                                         num_output_tokens=tokens, max_matching_ngram_size=ngram, max_length=10_000)
    out, _ = gen.get_candidates(torch.tensor([context]))
    return out[0, len(context):].tolist()


@pytest.mark.parametrize("seed", range(40))
def test_same_candidates_as_transformers(seed):
    rng = random.Random(seed)
    context = [rng.randrange(6) for _ in range(rng.randrange(2, 40))]   # a small alphabet: many repeated n-grams
    tokens, ngram = rng.choice([(10, 2), (3, 1), (5, 3)])
    eos = rng.choice([None, 2])
    ours = PromptLookupDrafter("pld", tokens, ngram, frozenset() if eos is None else frozenset({eos}))
    proposal = ours.propose(DraftContext(context, None, 100))
    assert proposal.paths[0] == hf_candidates(context, tokens, ngram, eos), context


def test_lossless_and_same_calls_as_transformers_pld(tiny_model):
    prompt = [5, 6, 7, 8, 5, 6, 7, 9, 5, 6, 7, 8, 5, 6]
    limits = Limits(30)
    greedy = generate(tiny_model, None, prompt, limits)
    ours = generate(tiny_model, PromptLookupDrafter("pld", 10, 2), prompt, limits)
    assert ours.tokens == greedy.tokens
    calls = [0]
    hook = tiny_model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    try:
        hf = tiny_model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=30,
                                 prompt_lookup_num_tokens=10, pad_token_id=0, eos_token_id=None)
    finally:
        hook.remove()
    assert hf[0, len(prompt):].tolist() == greedy.tokens
    assert ours.counters.serial_calls == calls[0] < 30, (ours.counters.serial_calls, calls[0])
