"""What a drafter takes from the decode loop besides `propose`'s context, and one base for drafters that wrap
others, so that none of it is lost on the way to the inner drafter.

Why it exists: the loop talks to the outermost drafter only. Besides `propose` it calls `reset` and `observe`,
hands the verify forward's top-k to drafters with `feedback_k` > 0 (`feedback`), passes the base's hidden states of
the positions decided since the last proposal (`DraftContext.accepted_hidden`, which feature drafters keep a cache
of), gives the greedy reference to drafters with `needs_reference` (`use_reference`: the oracle), the base's KV cache
to drafters with `needs_base_cache` (`DraftContext.base_cache`) and takes and puts back state kept across examples
(`snapshot`/`restore`, engine/state.py). A wrapper that forgets one of these does not fail: its inner drafter runs
without it. SAM's Token Recycling fallback never received the verify logits, so its matrix stayed empty and it
never drafted, and a Lookahead fallback paid for a Jacobi window that never moved.

- `consumes(drafter)` and `declared(method)`: what a built drafter takes and what a parsed method declares
  (methods/contract.py: `takes`, `inputs`), so a wrapper refuses an inner method whose input it cannot pass on with
  one line (`check_inner`), at parse time.
- `Wrapper`: forwards every input to `inner_drafters()`; the subclass decides who drafts, and hands an inner
  drafter that sat steps out the hidden states of those steps (`hold`, `context_for`).
"""
from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import replace
from typing import Any

import torch

from ..engine import DraftContext, Feedback, Layers, layers_of
from ..engine import state as drafter_state
from .base import Method, MethodError
from .contract import Input, feedback_k, reads_reference
from .contract import inputs as declared
from .contract import takes as consumes

RESET, OBSERVE, FEEDBACK = Input.RESET, Input.OBSERVE, Input.FEEDBACK
HIDDEN, REFERENCE, STATE = Input.HIDDEN, Input.REFERENCE, Input.STATE
INPUTS = tuple(Input)

__all__ = ["FEEDBACK", "HIDDEN", "INPUTS", "OBSERVE", "REFERENCE", "RESET", "STATE", "Wrapper", "check_inner",
           "consumes", "declared", "feedback_k"]


def check_inner(outer: str, param: str, inner: Method, forwards: Collection[str] = INPUTS) -> None:
    """Refuse, at parse time, an inner method the wrapper cannot drive: a whole decoder of its own (transformers'
    loops), or one that needs an input the wrapper does not forward."""
    if inner.spec.external:
        raise MethodError(f"{outer}: {param}={inner.name} is a whole decoder (transformers' or llama.cpp's own loop, "
                          f"timed by `speed` only), not a drafter; name a drafting method (see `bpdbench methods`)")
    missing = sorted(declared(inner) - set(forwards))
    if missing:
        raise MethodError(f"{outer}: {param}={inner.label} needs the {' and the '.join(missing)}, which {outer} "
                          f"does not pass to its {param}; name a method that needs neither")


class Wrapper:
    """A drafter that drafts with inner drafters: every loop input reaches each of them.

    Forwarded: `reset` and `observe` (every call, whoever drafted the step), `feedback` (every verify forward,
    whoever drafted it: Token Recycling refreshes its rows from any scored node, as its authors' SAM[TR] does; an
    inner drafter whose own nodes are not in the tree must ignore it, as Lookahead does), `feedback_k` (the largest
    inner one, each inner drafter getting its own first k columns), the greedy reference, and `snapshot`/`restore`
    (own state first, then each inner drafter's; None when none keeps any). Hidden states: a subclass calls
    `hold(inner, ctx)` on a step an inner drafter sits out and `context_for(inner, ctx)` when it asks it to propose,
    which then carries the held rows too, so a feature drafter's cache never misses a position. Layers
    (`hidden_layers`): the union of the inner drafters', each inner drafter given its own, in its order."""

    def __init__(self) -> None:
        self.needs_hidden = False     # set by the builder: some inner drafter reads hidden states
        # id(inner) -> (hidden rows, declared layers' rows) of the steps it sat out
        self.held: dict[int, list[tuple[torch.Tensor, torch.Tensor | None]]] = {}

    def inner_drafters(self) -> list[Any]:
        """The drafters wrapped, in a fixed order (snapshot's order)."""
        raise NotImplementedError

    # ---- reset, observe ------------------------------------------------------------------------------------
    def reset(self, prompt_ids: list[int]) -> None:
        self.held.clear()
        for d in self.inner_drafters():
            d.reset(list(prompt_ids))

    def observe(self, tokens: list[int]) -> None:
        for d in self.inner_drafters():
            d.observe(tokens)

    # ---- verify feedback -----------------------------------------------------------------------------------
    @property
    def feedback_k(self) -> int:
        return max([feedback_k(d) for d in self.inner_drafters()] + [0])

    def feedback(self, fb: Feedback) -> None:
        for d in self.inner_drafters():
            k = feedback_k(d)
            if k:
                d.feedback(fb if fb.topk.shape[-1] == k else Feedback(fb.tree, fb.topk[:, :k]))

    # ---- the base's KV cache (DraftContext.base_cache: passed on in the context itself) ------------------------
    @property
    def needs_base_cache(self) -> bool:
        return any(getattr(d, "needs_base_cache", False) for d in self.inner_drafters())

    # ---- the hidden states of chosen layers (DraftContext.accepted_layers) ---------------------------------------
    @property
    def hidden_layers(self) -> Layers | None:
        """Every layer some inner drafter reads, in order of first declaration (None: none reads any)."""
        seen: list[int] = []
        for d in self.inner_drafters():
            seen += [i for i in (layers_of(d).indices if layers_of(d) else ()) if i not in seen]
        return Layers(tuple(seen)) if seen else None

    # ---- the greedy reference ------------------------------------------------------------------------------
    @property
    def needs_reference(self) -> bool:
        return any(reads_reference(d) for d in self.inner_drafters())

    def use_reference(self, tokens: list[int]) -> None:
        for d in self.inner_drafters():
            if reads_reference(d):
                d.use_reference(tokens)

    # ---- state across examples -----------------------------------------------------------------------------
    def own_snapshot(self) -> Any:
        """The wrapper's own state kept across examples (None: it keeps none, the usual case)."""
        return None

    def own_restore(self, state: Any) -> None:
        """Put back what `own_snapshot` returned (only called with a state that is not None)."""

    def snapshot(self) -> tuple | None:
        parts = (self.own_snapshot(),) + tuple(drafter_state.snapshot(d) for d in self.inner_drafters())
        return None if all(p is None for p in parts) else parts

    def restore(self, state: Sequence[Any]) -> None:
        """`state` as `snapshot` gave it, or as JSON gives it back (a list)."""
        own, *inner = state
        if own is not None:
            self.own_restore(own)
        for d, s in zip(self.inner_drafters(), inner):
            drafter_state.restore(d, s)

    # ---- hidden states of the steps an inner drafter sat out -----------------------------------------------
    def hold(self, inner: Any, ctx: DraftContext) -> None:
        """`inner` does not propose this step: keep the step's new hidden rows for its next proposal."""
        if ctx.accepted_hidden is not None:
            self.held.setdefault(id(inner), []).append((ctx.accepted_hidden, ctx.accepted_layers))

    def context_for(self, inner: Any, ctx: DraftContext) -> DraftContext:
        """The context `inner` proposes from: `ctx`, its accepted_hidden (and accepted_layers) preceded by the rows
        held for it, the layers cut to those `inner` declares."""
        held = self.held.pop(id(inner), [])
        hidden, layers = ctx.accepted_hidden, ctx.accepted_layers
        if held and hidden is not None:
            hidden = torch.cat([h for h, _ in held] + [hidden])
            layers = None if layers is None else torch.cat([lay for _, lay in held] + [layers])
        if layers is not None:
            mine, union = layers_of(inner), self.hidden_layers
            layers = None if mine is None else layers[:, [union.indices.index(i) for i in mine.indices]]
        if hidden is ctx.accepted_hidden and layers is ctx.accepted_layers:
            return ctx
        return replace(ctx, accepted_hidden=hidden, accepted_layers=layers)
