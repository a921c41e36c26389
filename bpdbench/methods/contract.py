"""A method's contract: what its drafter takes from the decode loop, which artefacts it reads, what is checked before
the model loads and how `auto` sizes it, declared once on its registry entry (`MethodSpec`) and read through the
functions here by the session, replay, `auto`, the sweep, `bpdbench methods` and the tables.

Why: these facts used to be spread out as `family` strings that ten places switched on, a table of preflight checks
filled as a side effect of building the draft networks' entries, attributes read with `getattr` wherever a drafter
was driven, need strings parsed back by the sweep and chains of method names in the auto-shape code. Adding a
trained, auto-sized drafter meant touching eight to ten files, and forgetting one failed silently (a feature
drafter replayed without hidden states, a drafter never checked before the model loaded). Now a method says what it
needs in one place and nothing else names it.

- `Input`: what a drafter takes from the loop besides `propose`'s tokens. `inputs(method)` is what the parsed method
  declares (before anything is built or loaded); `takes(drafter, method)` is what a built drafter takes, the one
  place a drafter's optional attributes (`feedback_k`, `needs_reference`, `needs_hidden`, `needs_base_cache`,
  `hidden_layers`, `snapshot`) are read.
- `Kind`, `Reads`: the artefacts a method reads, as typed keys (`ArtefactKey`, artefacts/keys.py: `artefacts(method,
  cfg)`); the sweep builds them before the cells that use them, the preflight checks heads files, the tables pick
  draft networks. They are defined in the artefact layer that resolves them, below this one.
- `preflight(method, cfg)`: the method's own checks before the model loads (draft networks: folder, type, shape).
- `search(method)`: how `auto` sizes the method (methods/search.py), or None when it has no `auto` parameter.
"""
from __future__ import annotations

from enum import StrEnum
from typing import Any

# the key types live in the layer that resolves them; registry entries and readers of the contract find them here
from ..artefacts.keys import Kind, Reads, Requirement, inner, kinds  # noqa: F401
from ..config import RunConfig
from ..engine import state as drafter_state
from ..engine.types import layers_of

# A parsed method (methods/base.py: Method, which imports this module): its `spec`, `params` and `label` are read.
Method = Any


class Input(StrEnum):
    """What a drafter takes from the loop. The values are the words error messages use."""
    RESET = "reset"
    OBSERVE = "observe"
    FEEDBACK = "verify feedback"          # feedback_k > 0 and feedback(Feedback): the verify forward's top-k
    HIDDEN = "hidden states"              # DraftContext.hidden / accepted_hidden of every decided position
    LAYERS = "hidden states of chosen layers"   # hidden_layers (engine.Layers): DraftContext.accepted_layers
    REFERENCE = "greedy reference"        # needs_reference and use_reference(tokens) before each example
    STATE = "state across examples"       # snapshot() / restore(state)
    BASE_CACHE = "base's KV cache"        # needs_base_cache: DraftContext.base_cache, the base's keys and values


ALWAYS = frozenset({Input.RESET, Input.OBSERVE})    # every drafter gets these


def need_names(method: Method, cfg: RunConfig) -> list[str]:
    """The artefacts the method's `needs` lists for the run's model, by name (the default spelling's needs; a
    prerequisite of the machine, such as a library, is no artefact: nothing here builds it)."""
    return [r.what for r in method.spec.needs(cfg.model, cfg) if r.kind is not None] if method.spec.needs else []


# The default: the artefacts the method lists as needs, built by building the method once, as its first use would.
BUILT_ON_FIRST_USE = Reads(Kind.BUILT, need_names)
# The blockwise heads of the run's profile (--heads-profile).
RUN_HEADS = Reads(Kind.HEADS, lambda method, cfg: (cfg.heads_profile,))


# ---- reading the contract -------------------------------------------------------------------------------------

def inputs(method: Method) -> frozenset[Input]:
    """What the drafter of a parsed method will take from the loop, known before it is built (state across examples
    aside: it depends on values, and every wrapper forwards it)."""
    declared = method.spec.inputs
    return ALWAYS | frozenset(declared(method) if callable(declared) else declared)


def feedback_k(drafter: Any) -> int:
    """The top-k a built drafter asks of each verify forward (0: it learns nothing from it)."""
    return int(getattr(drafter, "feedback_k", 0) or 0)


def needs_scorer(drafter: Any) -> bool:
    """Whether replaying a built drafter needs the base run over its trees or context (engine.loop.TreeScorer):
    it learns from the verify forward, or drafts on the base's KV cache."""
    return feedback_k(drafter) > 0 or bool(getattr(drafter, "needs_base_cache", False))


def takes(drafter: Any, method: Method | None = None) -> frozenset[Input]:
    """What a built drafter takes from the loop: its own attributes, and the hidden states its method declares
    (lattice and draft networks read `ctx.hidden` without saying so on the instance)."""
    out = set(ALWAYS)
    if feedback_k(drafter) > 0:
        out.add(Input.FEEDBACK)
    if getattr(drafter, "needs_hidden", False) or (method is not None and Input.HIDDEN in inputs(method)):
        out.add(Input.HIDDEN)
    if layers_of(drafter) is not None:
        out.add(Input.LAYERS)
    if getattr(drafter, "needs_reference", False):
        out.add(Input.REFERENCE)
    if getattr(drafter, "needs_base_cache", False):
        out.add(Input.BASE_CACHE)
    if drafter_state.keeps_state(drafter):
        out.add(Input.STATE)
    return frozenset(out)


def reads_reference(drafter: Any) -> bool:
    """Whether a built drafter must be given the greedy reference before each example (the oracle, a wrapper of
    it)."""
    return bool(getattr(drafter, "needs_reference", False))


def preflight(method: Method, cfg: RunConfig) -> None:
    """The method's own checks before the model loads (MethodError, one line)."""
    if method.spec.preflight is not None:
        method.spec.preflight(method, cfg)


def search(method: Method) -> Any:
    """How `auto` sizes this spelling (a methods/search.py `Search`), None when the method declares none."""
    declared = method.spec.shapes
    return None if declared is None else declared.of(method)
