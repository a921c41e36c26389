"""SAM-Decoding (Hu et al. 2024, github hyx1999/SAM-Decoding): draft the continuation of the longest suffix match
in a suffix automaton over the text so far and in a static one over a corpus; below a match length, another drafter.

What the published code does (`samd/draft.py`, `samd/sam/dyn_sam.py`, `static_sam.py`, `samd_config.py`): a dynamic
automaton over prompt + generated tokens and a static one over a dataset each track the longest suffix of the text
they hold (matching state moved along suffix links, amortised O(1) per token). At each step the static match length
is lowered by `len_bias` = 4 and the longer match wins (the dynamic one on ties); if it is >= `len_threshold` = 4 the
draft is the `n_predicts` - 1 = 9 tokens after the match's earliest occurrence (min_endpos), verified as a chain,
else the auxiliary drafter's tree (Token Recycling or EAGLE) is verified instead. Both automata and the auxiliary
drafter are updated with every decided token whichever drafted.

What bpdbench does and why it differs:
- The static side is a suffix array over the rescorers' corpus (suffix_store.py; a 5M-token automaton in Python
  would take minutes and GBs), queried for the longest suffix of the context (up to 32 tokens) that occurs: the same
  match length as the authors' static automaton, capped at 32. The draft is the earliest occurrence's continuation.
- A dynamic draft that runs past the end of the text is copied forward LZ77-style (methods/lookup.continuation)
  instead of the authors' zero padding, so a loop the model is in is drafted as a loop.
- The auxiliary drafter is any method (`fallback=<spelling>`, its parameters separated by ';'); without one, a
  match below the threshold is a plain decode step. The fallback sees every reset and observe, and the hidden states
  of the steps SAM drafted are handed to it at its next proposal (DraftContext.accepted_hidden concatenated), so
  feature drafters (EAGLE, Hydra++) keep their caches in sync without running when SAM drafts.
- `tokens` caps every draft, the fallback's too (so a shorter `tokens=auto` shape is a truncation of a longer one).
Speculative sampling (T > 0): SAM's drafts are deterministic, so q is a point mass on each proposed token; the
fallback's proposals carry its own q.
"""
from __future__ import annotations

import torch

from ..engine import DraftContext, Proposal
from .base import Method, MethodError, MethodSpec, Param
from .env import Env
from .lookup import continuation, cut_after_eos
from .suffix_store import SuffixAutomaton, SuffixIndex

HIDDEN_FAMILIES = ("heads", "cascade", "drafter")     # fallbacks that draft from the base's hidden states


def fallback_spelling(raw: str) -> str:
    """`hydra;tree=4` -> the inner method's canonical label with ';' between its parameters (a MethodError from the
    inner spelling passes through as it is: it names what is wrong)."""
    from .spelling import parse
    text = _inner(raw)
    if text.partition(":")[0].strip() == "sam":
        raise MethodError(f"sam: fallback={raw} is sam itself; name another method (e.g. fallback=hierarchy)")
    return parse(text).label.replace(":", ";", 1).replace(",", ";")


def _inner(raw: str) -> str:
    """`hydra;tree=4;k=2` (or `hydra:tree=4;k=2`) -> `hydra:tree=4,k=2`, the inner method's own spelling."""
    text = raw if ":" in raw else raw.replace(";", ":", 1)
    return text.replace(";", ",")


fallback_spelling.__name__ = "method spelling"


class SamDrafter:
    def __init__(self, name: str, tokens: int = 9, threshold: int = 4, bias: int = 4,
                 static: SuffixIndex | None = None, fallback=None, eos: frozenset[int] = frozenset()):
        self.name, self.tokens, self.threshold, self.bias = name, tokens, threshold, bias
        self.static, self.fallback, self.eos = static, fallback, eos
        self.dyn = SuffixAutomaton()
        self.pending: list[torch.Tensor] = []         # hidden states the fallback has not been shown yet
        self.source = ""                              # who drafted the last proposal: dyn, static, fallback or none
        self.needs_hidden = False

    def reset(self, prompt_ids: list[int]) -> None:
        self.dyn.reset(prompt_ids)
        self.pending = []
        if self.fallback is not None:
            self.fallback.reset(prompt_ids)

    def propose(self, ctx: DraftContext) -> Proposal:
        self.dyn.sync(ctx.tokens)
        length = min(self.tokens, ctx.budget)
        if length > 0:
            draft = self._sam(ctx.tokens, length)
            if draft:
                if ctx.accepted_hidden is not None and self.fallback is not None:
                    self.pending.append(ctx.accepted_hidden)
                return Proposal([draft], probs=[[1.0] * len(draft)])
        if self.fallback is None:
            self.source = "none"
            return Proposal()
        self.source = "fallback"
        if self.pending and ctx.accepted_hidden is not None:
            ctx = DraftContext(ctx.tokens, ctx.hidden, ctx.budget, ctx.memo, ctx.sampler,
                               torch.cat(self.pending + [ctx.accepted_hidden]))
        self.pending = []
        return self.fallback.propose(ctx).clip(min(self.tokens, ctx.budget))

    def _sam(self, tokens: list[int], length: int) -> list[int]:
        """The draft of the longer match (the static one lowered by `bias`), [] below the threshold."""
        n_dyn, end = self.dyn.match()
        best, source = n_dyn, "dyn"
        n_static = lo = hi = 0
        if self.static is not None:
            n_static, lo, hi = self.static.longest(tokens, max(n_dyn + self.bias + 1, 1))
            if n_static - self.bias > n_dyn:
                best, source = n_static - self.bias, "static"
        if best < self.threshold or best <= 0:
            return []
        self.source = source
        if source == "dyn":
            draft = continuation(self.dyn.tokens, (), end, length)
        else:
            draft = self.static.read(self.static.earliest(lo, hi) + n_static, length)
        return cut_after_eos(draft, self.eos)

    def observe(self, tokens: list[int]) -> None:
        if self.fallback is not None:
            self.fallback.observe(tokens)


def _fallback(method: Method) -> Method | None:
    spelling = method.get("fallback")
    if spelling is None:
        return None
    from .spelling import parse
    return parse(_inner(spelling))


def build(env: Env, method: Method) -> SamDrafter:
    from . import suffix_store
    tokens, threshold, bias = method.get("tokens", 9), method.get("threshold", 4), method.get("bias", 4)
    use_static = method.get("static", "corpus") == "corpus"
    resolved: dict = {"tokens": tokens, "threshold": threshold, "bias": bias}
    static = None
    if use_static:
        static, resolved["static"] = suffix_store.corpus_index(env)
    inner = _fallback(method)
    fallback = None
    if inner is not None:
        fallback = env.build(inner)
        resolved["fallback"] = inner.label
    env.resolved[method.label] = resolved
    d = SamDrafter(method.label, tokens, threshold, bias, static, fallback, env.limits.eos_ids)
    d.needs_hidden = inner is not None and (inner.spec.family in HIDDEN_FAMILIES or
                                            getattr(fallback, "needs_hidden", False))
    return d


def _needs(model: str, cfg) -> list[tuple[str, bool]]:
    from .suffix_store import needs
    return needs(model, ("corpus",))              # a fallback needs what its own method needs


SPECS = [MethodSpec("sam", "SAM-Decoding: the continuation of the longest suffix match in a suffix automaton over "
                    "the text so far and a suffix array over the corpus; below `threshold`, another method drafts "
                    "(fallback=<method>, which needs what that method needs)",
                    build,
                    (Param("tokens", int, "draft length (auto: the length fastest on this machine)", low=1, auto=True),
                     Param("threshold", int, "shortest match drafted from; shorter ones go to the fallback", low=1),
                     Param("bias", int, "the static match must be this much longer to win over the dynamic one",
                           low=0),
                     Param("static", str, "static side: the corpus suffix array or none", choices=("corpus", "none")),
                     Param("fallback", fallback_spelling, "the method that drafts below the threshold, parameters "
                           "separated by ';' (e.g. fallback=hydra;tree=4)")),
                    _needs, family="lookup")]
