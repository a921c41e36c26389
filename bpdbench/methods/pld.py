"""Prompt lookup decoding: draft the tokens that followed the latest earlier occurrence of the context's last n-gram.

Semantics of transformers' `prompt_lookup_num_tokens` (PromptLookupCandidateGenerator): try n-gram sizes from
`ngram` down to 1; for the first size with a match, take the earliest match in the whole context (prompt and
generated tokens) whose continuation is not empty, up to `tokens` tokens, cut before the first EOS. No match: an
empty draft (a plain decode step). Needs no model, heads or training: the n-grams are indexed as the context
grows (methods/lookup.py), so a step costs a few dict lookups, not a rescan of the context.
Speculative sampling (T > 0): the draft is a deterministic function of the context, so q is a point mass on each
proposed token (accept with probability r(x), else remove x from the residual; engine/sampling.py).
"""
from __future__ import annotations

from ..engine import DraftContext, Proposal
from .base import Method, MethodSpec, Param
from .env import Env
from .lookup import ContextIndex
from .search import Chain

TOKENS_AUTO = 16          # tokens=auto: one replay at 16 tokens, each shorter draft a prefix of it


class PromptLookupDrafter:
    """The n-gram positions live in a `ContextIndex` that catches up with the context each step (no rescan)."""

    def __init__(self, name: str, tokens: int = 10, ngram: int = 2, eos_ids: frozenset[int] = frozenset()):
        self.name, self.tokens, self.ngram, self.eos = name, tokens, ngram, eos_ids
        self.index = ContextIndex(ngram)

    def reset(self, prompt_ids: list[int]) -> None:
        self.index.reset(prompt_ids)

    def propose(self, ctx: DraftContext) -> Proposal:
        ids = ctx.tokens
        self.index.sync(ids)
        for size in range(min(self.ngram, len(ids) - 1), 0, -1):
            for end in self.index.ends(ids, size):    # the earliest earlier occurrence
                draft = ids[end + 1: end + 1 + self.tokens]
                for j, t in enumerate(draft):
                    if t in self.eos:
                        draft = draft[:j]
                        break
                return Proposal([draft]) if draft else Proposal()   # HF: an empty draft after the EOS cut ends
        return Proposal()

    def observe(self, tokens: list[int]) -> None:
        pass


def build(env: Env, method: Method) -> PromptLookupDrafter:
    tokens, ngram = method.get("tokens", 10), method.get("ngram", 2)
    env.resolved[method.label] = {"tokens": tokens, "ngram": ngram}
    return PromptLookupDrafter(method.label, tokens, ngram, env.limits.eos_ids)


SPECS = [MethodSpec("pld", "prompt lookup: copy what followed the last n-gram's earliest earlier occurrence "
                    "(transformers' prompt_lookup_num_tokens semantics, in our loop)", build,
                    (Param("tokens", int, "draft length (auto: the length fastest on this machine)", low=1, auto=True),
                     Param("ngram", int, "longest n-gram matched", low=1)),
                    artefacts=(), shapes=Chain("tokens", longest=TOKENS_AUTO))]
