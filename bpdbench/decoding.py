"""Greedy autoregressive and blockwise parallel decoding, as one loop of pure stages.

    draft -> refine -> verify -> accept -> advance (crop the KV cache)

Autoregressive decoding is the same loop with an empty draft, so both methods share prefill, stopping and
counting, and "BPD output == greedy output" compares two runs of one code path that differ only in the draft.
Following Stern et al., the verify forward of step n also yields the hidden state the heads draft step n+1 from,
so each step is exactly one serial call of the base model.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from transformers import DynamicCache

from .heads import Heads
from .metrics import Counters
from rescorers.base import Lattice, Rescorer


@dataclass
class State:
    """Decoding state between steps. `next_token` is decided (base greedy) but not yet in the KV cache."""
    cache: DynamicCache
    hidden: torch.Tensor        # [d] final hidden state that produced next_token
    next_token: int
    context: list[int]          # prompt + decided tokens, ending with next_token


@dataclass
class Generation:
    tokens: list[int]
    counters: Counters
    step_log: list[tuple[int, int]] = field(default_factory=list)  # (drafted, accepted) per step


def _forward(model, ids: list[int], cache: DynamicCache) -> torch.Tensor:
    """One serial call of the base model over `ids` appended to the cache; returns final hidden states [T, d]."""
    x = torch.tensor([ids], device=model.device)
    out = model.model(input_ids=x, past_key_values=cache, use_cache=True)
    return out.last_hidden_state[0]


def _greedy(model, hidden: torch.Tensor) -> list[int]:
    return model.lm_head(hidden).argmax(-1).tolist()


def prefill(model, prompt_ids: list[int]) -> State:
    cache = DynamicCache()
    hidden = _forward(model, prompt_ids, cache)
    nxt = _greedy(model, hidden[-1:])[0]
    return State(cache, hidden[-1], nxt, list(prompt_ids) + [nxt])


# ---- stages -------------------------------------------------------------------------------------------------

def draft(heads: Heads | None, state: State, n_heads: int, lm_head, k: int) -> Lattice | None:
    """Top-k candidates of each head at the current position (k=1 is plain BPD's draft)."""
    if heads is None or n_heads == 0:
        return None
    logits = heads.draft_logits(state.hidden, n_heads, lm_head, context=state.context).float()
    logp, idx = torch.log_softmax(logits, -1).topk(k, dim=-1)
    return Lattice(heads.to_token_ids(idx), logp)


def refine(lattice: Lattice | None, rescorer: Rescorer | None, context: list[int]) -> list[list[int]]:
    """Pick the draft(s) to verify; without a rescorer, the heads' top-1 path."""
    if lattice is None:
        return [[]]
    if rescorer is None:
        return [lattice.ids[:, 0].tolist()]
    return rescorer.refine(lattice, context)


def verify(model, state: State, drafts: list[list[int]]) -> tuple[torch.Tensor, list[list[int]]]:
    """One forward over [next_token] + draft; returns hidden states and the base's greedy token at each position."""
    if len(drafts) != 1:
        raise NotImplementedError("multi-draft verification is provided by verify_tree")
    hidden = _forward(model, [state.next_token] + drafts[0], state.cache)
    return hidden, [_greedy(model, hidden)]


def accept(draft_ids: list[int], greedy: list[int]) -> int:
    """Length of the longest draft prefix equal to the base's greedy choice (greedy[j] follows position j)."""
    a = 0
    while a < len(draft_ids) and draft_ids[a] == greedy[a]:
        a += 1
    return a


def advance(state: State, hidden: torch.Tensor, draft_ids: list[int], greedy: list[int], a: int) -> list[int]:
    """Keep next_token + a accepted drafts in the cache, drop the rest; the bonus token becomes next_token."""
    remove = len(draft_ids) - a
    if remove:
        state.cache.crop(-remove)  # negative = tokens to remove, in both old and new transformers conventions
    new = draft_ids[:a] + [greedy[a]]
    state.hidden, state.next_token = hidden[a], greedy[a]
    state.context.extend(new)
    return new


# ---- the loop -----------------------------------------------------------------------------------------------

@torch.inference_mode()
def generate(model, prompt_ids: list[int], max_new_tokens: int, eos_ids: set[int], heads: Heads | None = None,
             n_heads: int = 0, rescorer: Rescorer | None = None, k: int = 1,
             on_step: Callable[[int], None] | None = None) -> Generation:
    """Greedy decoding; with heads, blockwise parallel. Stops at EOS (kept) or max_new_tokens, identically."""
    counters = Counters()
    gen = Generation([], counters)
    state = prefill(model, prompt_ids)
    counters.serial_calls += 1
    out = [state.next_token]
    if rescorer is not None:
        rescorer.reset(list(prompt_ids))
    while not _done(out, max_new_tokens, eos_ids):
        lattice = draft(heads, state, n_heads, model.lm_head, k if rescorer is not None else 1)
        drafts = refine(lattice, rescorer, state.context)
        hidden, greedy = verify(model, state, drafts)
        a = accept(drafts[0], greedy[0])
        out.extend(advance(state, hidden, drafts[0], greedy[0], a))
        counters.record_step(len(drafts[0]), a)
        gen.step_log.append((len(drafts[0]), a))
        if on_step:
            on_step(len(out))
    gen.tokens = _truncate(out, max_new_tokens, eos_ids)
    counters.new_tokens = len(gen.tokens)
    return gen


def _done(out: list[int], max_new_tokens: int, eos_ids: set[int]) -> bool:
    return len(out) >= max_new_tokens or any(t in eos_ids for t in out)


def _truncate(out: list[int], max_new_tokens: int, eos_ids: set[int]) -> list[int]:
    for i, t in enumerate(out):
        if t in eos_ids:
            out = out[: i + 1]
            break
    return out[:max_new_tokens]
