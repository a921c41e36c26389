"""The contract between the decode loop and every drafting method.

A drafter is three calls: `reset(prompt_ids)` once per example, `propose(ctx) -> Proposal` before each verify
forward, and `observe(tokens)` after it with the tokens the step decided. The loop never asks what kind of drafter it
is: heads, prompt lookup, a draft model and plain autoregressive decoding (the empty drafter) all run the same
prefill -> propose -> verify -> accept -> advance code, so "method output == greedy output" compares two runs of one
code path that differ only in what was proposed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch


@dataclass(frozen=True)
class Lattice:
    """Top-k candidates per draft position, best first: what independent heads give and lattice rescorers search."""
    ids: torch.Tensor       # [h, k] int64 token ids per draft position
    logprobs: torch.Tensor  # [h, k] float32 natural-log probabilities of those ids


@dataclass
class Proposal:
    """Candidate continuations of the context, best first; the verifier merges them into one token tree.

    A chain is a proposal with one path. Paths are token ids *after* the context's last token (which the base has
    already decided). `probs` (per path, the draft probability of each proposed token) and `dists` (per path, the
    draft distribution [len(path), V] at each position) are optional: greedy acceptance ignores them, speculative
    sampling needs them. `lattice` is kept for analyses that look at the candidates behind the paths.
    `scored`: extra paths from the context's last token that the drafter wants the verify forward to *score* (its
    logits come back through `Drafter.feedback`) but that are never candidates: Lookahead decoding's Jacobi window.
    They become tree nodes flagged scored-only (`Tree.scored`), placed after every draft node, so acceptance, KV
    compaction and the draft nodes' indices are exactly what they would be without them; they do count in
    `Counters.verified`, since the forward pays for them."""
    paths: list[list[int]] = field(default_factory=lambda: [[]])
    probs: list[list[float]] | None = None
    dists: list[torch.Tensor] | None = None
    lattice: Lattice | None = None
    scored: list[list[int]] | None = None   # paths the forward scores but that can never be accepted (see below)

    def __post_init__(self) -> None:
        if not self.paths:
            self.paths = [[]]

    def clip(self, budget: int) -> "Proposal":
        """Paths cut to `budget` tokens: a token past the generation budget can never be kept, so verifying it is
        waste, and cutting it here makes real decoding and replay count the same drafted tokens."""
        if all(len(p) <= budget for p in self.paths):
            return self
        cut = max(budget, 0)
        return Proposal([p[:cut] for p in self.paths],
                        None if self.probs is None else [q[:cut] for q in self.probs],
                        None if self.dists is None else [d[:cut] for d in self.dists], self.lattice, self.scored)


EMPTY = Proposal()


@dataclass(frozen=True)
class Feedback:
    """What a verify forward computed anyway, handed to drafters that learn from it (`feedback_k` > 0): the token
    tree just verified (draft and scored-only nodes) and the base's top-k token ids after every node, best first.
    Token Recycling refreshes its successor matrix from it; Lookahead reads its Jacobi window's next guesses."""
    tree: Any               # engine.tree.Tree
    topk: torch.Tensor      # [n_nodes, k] int64


@dataclass
class DraftContext:
    """What a drafter may look at: the decided tokens and the base model's last hidden state.

    `tokens` = prompt + decided tokens, ending with the base's next token, which is certain and precedes draft
    position 0. `hidden` [d] is the final hidden state that produced that token (heads draft from it; Stern et al.:
    the verify forward of step n yields the state step n+1 drafts from). `budget` is the most draft tokens that can
    still be kept (the loop clips longer proposals anyway). `memo` is scratch space shared by every drafter that
    replays the same example (None in real decoding): a drafter may keep there what depends only on the position,
    such as the heads' lattice, so fourteen methods replayed on one trajectory compute it once, not fourteen times.
    `sampler` is None when decoding greedily; at T > 0 it is the acceptance rule's `engine.sampling.Sampler`
    (warpers + the example's generator): a drafter that samples its drafts (sps) draws from it and reports its full
    draft distributions in `Proposal.dists`; a deterministic drafter ignores it and proposes point masses.
    `accepted_hidden` [m, d] are the final hidden states of the positions decided since the previous proposal, in
    order, ending with `hidden`: at an example's first proposal every prompt position's, then the verify forward's
    rows of the root and the accepted nodes. Row j of all of them together is the state that produced tokens[j + 1],
    which is what drafters that run over the base's features (EAGLE, Hydra++'s prefix layer) keep a cache of; the
    verify forward computes them anyway, so passing them costs nothing. None where the caller has not got them.
    `accepted_layers` [m, k, d] are, row for row with `accepted_hidden`, the hidden states of the k layers the drafter
    declares (`hidden_layers`, a `Layers`), in its order; given only to such a drafter (None otherwise).
    `base_cache` is the base's KV cache of tokens[:-1], given only to a drafter with `needs_base_cache` (a copy of
    the base with other weights drafts on it instead of prefilling a cache of its own: QSpec); read it, never write
    it (`engine.cache.draft_view` copies it into a cache the drafter may extend). Replay gives a teacher-forced
    one."""
    tokens: list[int]
    hidden: torch.Tensor | None
    budget: int
    memo: dict | None = None
    sampler: Any = None
    accepted_hidden: torch.Tensor | None = None
    base_cache: Any = None
    accepted_layers: torch.Tensor | None = None


@dataclass(frozen=True)
class Layers:
    """The hidden states of chosen layers of the base: a drafter's input beside the final state (EAGLE-3 fuses a low,
    a middle and a high layer). Index i is entry i of the transformers forward's `hidden_states`: 0 the embeddings,
    i the output of decoder layer i, the number of layers the final (normed) state. A drafter declares them as its
    `hidden_layers`; the loop, replay and the training data then collect these layers and no others (a forward
    given `output_hidden_states=[...]` keeps only the selected ones), so drafters that declare none cost nothing."""
    indices: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "indices", tuple(int(i) for i in self.indices))
        if not self.indices or any(i < 0 for i in self.indices):
            raise ValueError(f"hidden layers must be one or more indices >= 0, got {list(self.indices)}")

    @classmethod
    def low_mid_high(cls, n_layers: int) -> "Layers":
        """EAGLE-3's choice (SafeAILab/EAGLE, modeling_llama_kv.py): the inputs of layers 2, n/2 and n-3, clamped
        into a small model's range."""
        return cls((min(2, n_layers), n_layers // 2, max(n_layers - 3, 0)))

    def check(self, n_layers: int) -> None:
        """A one-line ValueError when an index is past the base's `n_layers` decoder layers."""
        if max(self.indices) > n_layers:
            raise ValueError(f"hidden layers {list(self.indices)}: the base has {n_layers} layers, so indices run "
                             f"0..{n_layers}; retrain the drafter for this model")


def layers_of(drafter: Any) -> Layers | None:
    """The layers a drafter declares (`hidden_layers`), None when it reads no layer but the last."""
    return getattr(drafter, "hidden_layers", None) or None


def select_layers(hidden_states: tuple, layers: Layers | None, batch: int = 0) -> torch.Tensor | None:
    """[n, k, d]: the declared layers of one row of a forward's `hidden_states` (None when none are declared)."""
    if layers is None:
        return None
    return torch.stack([hidden_states[i][batch] for i in layers.indices], 1)


@runtime_checkable
class Drafter(Protocol):
    name: str

    def reset(self, prompt_ids: list[int]) -> None:
        """A new example starts: drop per-example state (caches, n-gram tables)."""

    def propose(self, ctx: DraftContext) -> Proposal:
        """Candidate continuations for the next verify forward."""

    def observe(self, tokens: list[int]) -> None:
        """The tokens the last step decided (accepted draft tokens, then the base's bonus token)."""

    # Optional: `feedback_k: int` > 0 and `feedback(fb: Feedback)`, called after every verify forward and before
    # `observe` with the verified tree and the base's top-k ids at each node. Replay (engine.replay) then needs a
    # scorer (engine.loop.TreeScorer) to compute what the verify forward would have computed off the greedy path.
    #
    # Optional: `snapshot() -> state` and `restore(state) -> None`, for a drafter that keeps state across examples
    # (what `reset` does not clear: Token Recycling's successor matrix with persist=1). `snapshot` returns that
    # state, or None when there is none (persist=0); the state must survive a JSON round trip, and what the drafter
    # learns after `restore` must never reach the state (one snapshot is restored many times). `speed` restores the
    # snapshot taken before a prompt before each of its repeats and after the warm-up, so every repeat does the same
    # work; `replay` and `speed` save it after each example so that `--resume` continues exactly
    # (experiments/carry.py). A composite drafter forwards both to its inner drafters (methods/compose.py: Wrapper).
    # Call them through engine.state.snapshot / restore, which do nothing for drafters without them.


class EmptyDrafter:
    """Autoregressive decoding: nothing proposed, every step decides exactly the base's next token."""
    name = "ar"

    def reset(self, prompt_ids: list[int]) -> None:
        pass

    def propose(self, ctx: DraftContext) -> Proposal:
        return EMPTY

    def observe(self, tokens: list[int]) -> None:
        pass
