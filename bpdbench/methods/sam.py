"""SAM-Decoding (Hu et al. 2024, github hyx1999/SAM-Decoding): draft the continuation of the longest suffix match
in a suffix automaton over the text so far and in a static index over a corpus; below a match length, an auxiliary
drafter (Token Recycling by default).

What the published code does (`samd/draft.py`, `samd/sam/dyn_sam.py`, `static_sam.py`, `samd_config.py` as of its
last commit, Dec 2024): a dynamic automaton over prompt + generated tokens and a static one over a dataset (prompts
of alpaca-clean, GSM8K and python-instruction with the target's own responses, `tools/gen_response.py`) each track
the longest suffix of the text they hold (amortised O(1) per token). At each step the static match length is
lowered by `len_bias` and the longer match wins (the dynamic one on ties); if it is >= `len_threshold` the draft is
the `n_predicts` - 1 tokens after the match's earliest occurrence, verified as a chain, else the auxiliary drafter's
tree is verified instead (`tree_method`: token_recycle, the training-free SAM[TR]; eagle or eagle2 when trained).
Both automata are updated with every decided token, and the auxiliary drafter with every verify forward's tokens
and logits (`DraftModel.update`), whichever drafted: Token Recycling's matrix learns from SAM's chains too.
Published configuration: n_predicts = 40 (39 draft tokens), len_threshold = 5, len_bias = 5, token_recycle. Our
defaults are these: `tokens=39`, `threshold=5`, `bias=5`, `fallback=recycling` (an earlier revision of that file,
Nov 2024, had 10 / 4 / 4 and no tree model; `sam:tokens=9,threshold=4,bias=4,fallback=none` is that shape).
`tokens=auto` is ours: the draft length fastest on this machine (experiments/autoshape.py).

What bpdbench does and why it differs:
- The static side is a suffix array over the rescorers' corpus (C4 + WikiText, artefacts/suffix.py), not an automaton
  over a dataset with the target's responses: we have no such dataset for our models, and a 5M-token automaton in
  Python would take minutes and GBs. It is queried for the longest suffix of the context (up to 32 tokens) that
  occurs: the same match length as an automaton's, capped at 32. The draft is the earliest occurrence's continuation.
- A dynamic draft that runs past the end of the text is copied forward LZ77-style (methods/lookup.continuation)
  where the authors step to a shorter match with room for a full draft (`to_anc`) and pad with zeros, so a loop the
  model is in is drafted as a loop.
- The auxiliary drafter is any drafting method (`fallback=<spelling>`, its parameters separated by ';';
  `fallback=none`: a match below the threshold is a plain decode step). SAM wraps it through methods/compose.py,
  so every input the loop gives reaches it: every reset and observe; every verify forward's top-k (`feedback_k` is
  the fallback's), whoever drafted, so SAM[TR]'s matrix learns from SAM's chains as the authors' does (their
  prefill also fills it from the prompt's logits; ours does not, methods/recycling.py); the hidden states of the
  steps SAM drafted, at its next proposal (accepted_hidden concatenated), so feature drafters (EAGLE, Hydra++)
  keep their caches in sync without running; the greedy reference (`fallback=oracle`); state across examples
  (`snapshot`: SAM's own, None, then the fallback's). Fallbacks that cannot be driven so are refused when the
  spelling is parsed: a whole decoder (hf-*), `ar` (drafts nothing: write `none`) and sam itself.
- Lookahead as the fallback: its Jacobi window is scored only on the steps it drafts, so the window advances on
  those steps and waits while SAM drafts (its feedback ignores a tree without its window). We do not add the
  window to SAM's chains: that would keep it moving but score up to window x (ngram - 1) more tokens on every step
  SAM drafts, and on a CPU a forward's cost grows with the tokens it scores (docs/hardware.md); the authors' code,
  too, asks the auxiliary drafter for a draft only on the steps it drafts.
- `tokens` caps every draft, the fallback's too (so a shorter `tokens=auto` shape is a truncation of a longer one;
  Token Recycling's tree is 6 deep, never cut by the default 39).
Speculative sampling (T > 0): SAM's drafts are deterministic, so q is a point mass on each proposed token; the
fallback's proposals carry its own q.
"""
from __future__ import annotations

from functools import cache

from ..engine import DraftContext, Proposal
from .base import Method, MethodError, MethodSpec, Param, inner_text
from .compose import HIDDEN, OBSERVE, RESET, Wrapper, check_inner, consumes, declared
from .contract import Input, Requirement
from .env import Env
from .lookup import continuation, cut_after_eos
from .search import Chain
from ..artefacts.suffix import SuffixAutomaton, SuffixIndex

TOKENS, THRESHOLD, BIAS = 39, 5, 5      # the published n_predicts - 1, len_threshold, len_bias
FALLBACK = "recycling"                  # the published training-free auxiliary drafter (SAM[TR])
NONE = "none"                           # fallback=none: below the threshold, a plain decode step
TOKENS_AUTO = 16                        # tokens=auto: one replay at 16; `tokens` caps the fallback's drafts too,
                                        # so every shorter draft is a truncation of it


def fallback_method(raw: str) -> Method | str:
    """`hydra;tree=4` -> the inner method, parsed here, once, with the outer spelling; `none` as it is. A fallback SAM
    cannot drive is refused here (a MethodError from the inner spelling passes through as it is: it names what is
    wrong)."""
    from .spelling import parse
    text = inner_text(raw)
    name = text.partition(":")[0].strip()
    if name == NONE:                    # not the `none` alias of bpd
        if text.strip() != NONE:
            raise MethodError(f"sam: fallback={raw}: none takes no parameters")
        return NONE
    if name == "sam":
        raise MethodError(f"sam: fallback={raw} is sam itself; name another method (e.g. fallback=hierarchy)")
    if name in ("ar", "null"):
        raise MethodError(f"sam: fallback={raw} drafts nothing; write fallback=none for plain decode steps below "
                          f"the threshold")
    inner = parse(text)
    check_inner("sam", "fallback", inner)
    return inner


fallback_method.__name__ = "method spelling"


class SamDrafter(Wrapper):
    """`source`: who drafted the last proposal (dyn, static, fallback or none), for analyses and tests."""

    def __init__(self, name: str, tokens: int = TOKENS, threshold: int = THRESHOLD, bias: int = BIAS,
                 static: SuffixIndex | None = None, fallback=None, eos: frozenset[int] = frozenset()):
        super().__init__()
        self.name, self.tokens, self.threshold, self.bias = name, tokens, threshold, bias
        self.static, self.fallback, self.eos = static, fallback, eos
        self.dyn = SuffixAutomaton()
        self.source = ""

    def inner_drafters(self) -> list:
        return [] if self.fallback is None else [self.fallback]

    def reset(self, prompt_ids: list[int]) -> None:
        self.dyn.reset(prompt_ids)
        super().reset(prompt_ids)

    def propose(self, ctx: DraftContext) -> Proposal:
        self.dyn.sync(ctx.tokens)
        length = min(self.tokens, ctx.budget)
        if length > 0:
            draft = self._sam(ctx.tokens, length)
            if draft:
                if self.fallback is not None:
                    self.hold(self.fallback, ctx)
                return Proposal([draft], probs=[[1.0] * len(draft)])
        if self.fallback is None:
            self.source = "none"
            return Proposal()
        self.source = "fallback"
        ctx = self.context_for(self.fallback, ctx)
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


def _fallback(method: Method) -> Method | None:
    """The fallback method: the spelled one (parsed with sam's spelling), recycling when none is spelled, None for
    `fallback=none`."""
    inner = method.get("fallback")
    if inner == NONE:
        return None
    return inner if inner is not None else default_fallback()


@cache
def default_fallback() -> Method:
    from .spelling import parse
    return parse(FALLBACK)


def _inputs(method: Method) -> frozenset[Input]:
    """What SAM takes from the loop beyond reset and observe: what its fallback takes (the automata need nothing
    else)."""
    inner = _fallback(method)
    return frozenset() if inner is None else declared(inner) - {RESET, OBSERVE}


def build(env: Env, method: Method) -> SamDrafter:
    from ..artefacts import suffix
    tokens = method.get("tokens", TOKENS)
    threshold, bias = method.get("threshold", THRESHOLD), method.get("bias", BIAS)
    use_static = method.get("static", "corpus") == "corpus"
    resolved: dict = {"tokens": tokens, "threshold": threshold, "bias": bias}
    static = None
    if use_static:
        static, resolved["static"] = suffix.corpus_index(env)
    inner = _fallback(method)
    fallback = None if inner is None else env.build(inner)
    resolved["fallback"] = NONE if inner is None else inner.label
    env.resolved[method.label] = resolved
    d = SamDrafter(method.label, tokens, threshold, bias, static, fallback, env.limits.eos_ids)
    d.needs_hidden = inner is not None and HIDDEN in consumes(fallback, inner)
    return d


def _needs(model: str, cfg) -> list[Requirement]:
    from ..artefacts.suffix import needs
    return needs(model, ("corpus",))              # a fallback needs what its own method needs


SPECS = [MethodSpec("sam", "SAM-Decoding: the continuation of the longest suffix match in a suffix automaton over "
                    "the text so far and a suffix array over the corpus; below `threshold`, another method drafts "
                    f"(fallback=<method>, default {FALLBACK}: SAM[TR], the published training-free setup; it needs "
                    "what that method needs)",
                    build,
                    (Param("tokens", int, f"draft length (default {TOKENS}, the published; auto: the length fastest "
                           "on this machine)", low=1, auto=True),
                     Param("threshold", int, f"shortest match drafted from (default {THRESHOLD}); shorter ones go "
                           "to the fallback", low=1),
                     Param("bias", int, f"the static match must be this much longer to win over the dynamic one "
                           f"(default {BIAS})", low=0),
                     Param("static", str, "static side: the corpus suffix array or none", choices=("corpus", "none")),
                     Param("fallback", fallback_method, f"the method that drafts below the threshold, parameters "
                           f"separated by ';' (default {FALLBACK}; none: a plain decode step; e.g. "
                           "fallback=hydra;tree=4)")),
                    _needs, inputs=_inputs, shapes=Chain("tokens", longest=TOKENS_AUTO),
                    inner=lambda m: tuple(x for x in (_fallback(m),) if x is not None))]
