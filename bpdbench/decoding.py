"""Greedy autoregressive and blockwise parallel decoding, as one loop of pure stages.

    draft -> refine -> verify -> accept -> advance (keep the accepted path in the KV cache)

Autoregressive decoding is the same loop with an empty draft, so both methods share prefill, stopping and
counting, and "BPD output == greedy output" compares two runs of one code path that differ only in the draft.
Following Stern et al., the verify forward of step n also yields the hidden state the heads draft step n+1 from,
so each step is exactly one serial call of the base model.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch
from transformers import DynamicCache

from .heads import Heads
from .metrics import Counters
from .tree import Tree, build_tree, compact_cache, model_inputs
from .tree import accept as tree_accept
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
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(("prefill", "draft", "verify"), 0.0))


def _greedy(model, hidden: torch.Tensor) -> list[int]:
    return model.lm_head(hidden).argmax(-1).tolist()


def prefill(model, prompt_ids: list[int]) -> State:
    cache = DynamicCache()
    x = torch.tensor([prompt_ids], device=model.device)
    hidden = model.model(input_ids=x, past_key_values=cache, use_cache=True).last_hidden_state[0]
    nxt = _greedy(model, hidden[-1:])[0]
    return State(cache, hidden[-1], nxt, list(prompt_ids) + [nxt])


# ---- stages -------------------------------------------------------------------------------------------------

def draft(heads: Heads | None, state: State, n_heads: int, lm_head, k: int, threshold: float = 0.0
          ) -> Lattice | None:
    """Top-k candidates of each head at the current position (k=1 is plain BPD's draft).

    `threshold` > 0 truncates the draft before the first head whose top-1 probability is below it. Why: on a CPU
    the verify forward's cost grows with the block (a 9-token block costs ~1.35 decode steps in bf16, a 2-token one
    barely more than one), while heads far out rarely hit; so verifying only confident positions keeps most of the
    accepted tokens for a fraction of the cost. All heads are still scored in one call: drafting is bound by reading
    the shortlisted projection (59 MB), which one head costs as much as eight (scoring head 1 first, then the rest
    when it is sure, measured 8.9 vs 7.7 ms per step). Output stays lossless whatever is drafted."""
    if heads is None or n_heads == 0:
        return None
    logits = heads.draft_logits(state.hidden, n_heads, lm_head, context=state.context).float()
    logp, idx = torch.log_softmax(logits, -1).topk(k, dim=-1)
    if threshold > 0:
        unsure = (logp[:, 0].exp() < threshold).nonzero()
        if len(unsure):
            n = int(unsure[0])
            if n == 0:
                return None
            logp, idx = logp[:n], idx[:n]
    return Lattice(heads.to_token_ids(idx), logp)


def refine(lattice: Lattice | None, rescorer: Rescorer | None, context: list[int]) -> list[list[int]]:
    """Pick the draft(s) to verify; without a rescorer, the heads' top-1 path."""
    if lattice is None:
        return [[]]
    if rescorer is None:
        return [lattice.ids[:, 0].tolist()]
    return rescorer.refine(lattice, context)


@dataclass
class Verified:
    tree: Tree
    hidden: torch.Tensor        # [n_nodes, d] final hidden states
    greedy: list[int]           # base greedy token after each node
    past: int                   # cache length before the verify forward


def verify(model, state: State, drafts: list[list[int]]) -> Verified:
    """One serial call: the base scores [next_token] + every draft (a chain, or a trie for several drafts)."""
    tree = build_tree(state.next_token, drafts)
    past = state.cache.get_seq_length()
    out = model.model(**model_inputs(tree, past, model.device), past_key_values=state.cache, use_cache=True)
    hidden = out.last_hidden_state[0]
    return Verified(tree, hidden, _greedy(model, hidden), past)


def accept(v: Verified) -> tuple[int, int]:
    """(index of the winning draft, number of its tokens equal to the base's greedy choice)."""
    return tree_accept(v.tree, v.greedy)


def advance(state: State, v: Verified, best: int, a: int) -> list[int]:
    """Keep the root and the accepted nodes in the KV cache; the bonus token becomes next_token."""
    path = v.tree.paths[best][:a]
    keep = [0] + path
    compact_cache(state.cache, v.past, len(v.tree.tokens), keep)
    last = keep[-1]
    new = [v.tree.tokens[n] for n in path] + [v.greedy[last]]
    state.hidden, state.next_token = v.hidden[last], v.greedy[last]
    state.context.extend(new)
    return new


# ---- the loop -----------------------------------------------------------------------------------------------

@torch.inference_mode()
def generate(model, prompt_ids: list[int], max_new_tokens: int, eos_ids: set[int], heads: Heads | None = None,
             n_heads: int = 0, rescorer: Rescorer | None = None, k: int = 1, threshold: float = 0.0,
             on_step: Callable[[int], None] | None = None) -> Generation:
    """Greedy decoding; with heads, blockwise parallel. Stops at EOS (kept) or max_new_tokens, identically."""
    counters = Counters()
    gen = Generation([], counters)
    clock = time.perf_counter()
    state = prefill(model, prompt_ids)
    counters.serial_calls += 1
    gen.seconds["prefill"], clock = _lap(clock)
    out = [state.next_token]
    if rescorer is not None:
        rescorer.reset(list(prompt_ids))
    while not _done(out, max_new_tokens, eos_ids):
        lattice = draft(heads, state, n_heads, model.lm_head, k if rescorer is not None else 1, threshold)
        drafts = refine(lattice, rescorer, state.context)
        t_draft, clock = _lap(clock)
        verified = verify(model, state, drafts)
        best, a = accept(verified)
        out.extend(advance(state, verified, best, a))
        counters.record_step(len(drafts[best]), a, len(verified.tree.tokens))
        gen.step_log.append((len(drafts[best]), a))
        t_verify, clock = _lap(clock)
        gen.seconds["draft"] += t_draft
        gen.seconds["verify"] += t_verify
        if on_step:
            on_step(len(out))
    gen.tokens = _truncate(out, max_new_tokens, eos_ids)
    counters.new_tokens = len(gen.tokens)
    return gen


def _lap(since: float) -> tuple[float, float]:
    now = time.perf_counter()
    return now - since, now


def _done(out: list[int], max_new_tokens: int, eos_ids: set[int]) -> bool:
    return len(out) >= max_new_tokens or any(t in eos_ids for t in out)


def _truncate(out: list[int], max_new_tokens: int, eos_ids: set[int]) -> list[int]:
    for i, t in enumerate(out):
        if t in eos_ids:
            out = out[: i + 1]
            break
    return out[:max_new_tokens]
