"""Hierarchy Drafting (Cho et al. 2025, github zomss/Hierarchy_Drafting): several short candidates from three
n-gram databases probed from the highest locality down, verified together in one tree-masked forward.

What the published code does (`model/hierachy/decoding.py` `get_draft_tokens`, `scripts/construct_model_DB.py`):
the databases are probed in the order "WSL" with the last decided token as the key, concatenating what each
returns until 7 candidates of LEVEL-1 = 4 tokens are collected: W, the context (n-grams of the prompt and of the
generated tokens, plus the n-grams its Lookahead/Jacobi branch produces; a per-key LRU list of up to 60); S, the
model's own history (the 100k most frequent 5-grams of the target's greedy outputs on OASST prompts, keyed by the
first token); L, a static corpus (REST's suffix array over ShareGPT, queried with the last 2 and 1 tokens). The 7
candidates are verified with the Lookahead window in one forward; the longest greedy-matching one wins.

What bpdbench does and why it differs:
- No Lookahead/Jacobi branch: its window adds ~35 verified tokens per forward, which on a CPU costs more than a
  decode step (a 32-token verify ~1.5 steps, measured); so W holds prompt + decided tokens only.
- Keys are the longest n-gram that matched (up to `ngram` tokens, then shorter), not only the last token: a
  1-token key proposes whatever followed that token last time, a 3-gram key is far more often right, and with
  few candidates affordable the best ones must come first. Within a database, longer keys are probed first.
- Few, short candidates by default (`candidates=3,length=5`): they are merged into one token trie (engine/tree.py),
  so shared prefixes cost one node, and the verify stays under ~16 tokens, where it costs ~1.14 decode steps.
- W is a `ContextIndex` updated as tokens are decided, most recent occurrence first (HD's LRU order), with the
  continuation copied forward LZ77-style so a loop the model is in is drafted as a loop.
- S is built from greedy continuations of the target on the heads' held-out prompt pool (train/history.py),
  counted per continuation (first 3 tokens) for 1-, 2- and 3-gram keys, best 4 per key.
- L is the rescorers' corpus (C4 + WikiText), 2- and 3-gram keys seen at least twice, best 4 continuations.
- Greedy acceptance only: the output equals greedy decoding token for token.
Order (`order=csl`: c context, s self/model history, l static corpus), the number and length of candidates, the
context key length and the history profile are options. When fewer candidates are found, fewer are verified;
none found is a plain decode step.
"""
from __future__ import annotations

from itertools import permutations

from ..engine import DraftContext, Proposal
from .base import Method, MethodError, MethodSpec, Param
from .contract import Requirement
from .env import Env
from ..artefacts.history import PROFILES
from ..artefacts.formats import FrequencyTable
from .lookup import ContextIndex, continuation, cut_after_eos
from .search import Chain, Grid

# candidates and length are chosen jointly: one replay per candidate count at the longest length (8), every
# shorter length a truncation of it
SHAPE_SEARCH = Chain("length", longest=8, default=5, grid=Grid("candidates", (1, 2, 3, 4, 6, 8), default=3,
                                                                joint=True))

ORDERS = tuple("".join(p) for r in (1, 2, 3) for p in permutations("csl", r))
SCAN = 16          # occurrences of one context key looked at per step (most recent first)


class HierarchyDrafter:
    def __init__(self, name: str, order: str = "csl", candidates: int = 3, length: int = 5, ngram: int = 3,
                 history: FrequencyTable | None = None, static: FrequencyTable | None = None,
                 eos: frozenset[int] = frozenset()):
        if not order or any(c not in "csl" for c in order) or len(set(order)) != len(order):
            raise ValueError(f"order must be letters of c, s, l without repeats, got {order!r}")
        if ("s" in order and history is None) or ("l" in order and static is None):
            raise ValueError("order names a database that was not given")
        self.name, self.order, self.candidates, self.length, self.ngram = name, order, candidates, length, ngram
        self.history, self.static, self.eos = history, static, eos
        self.index = ContextIndex(ngram)
        self.sources: list[str] = []       # which database each candidate of the last proposal came from

    def reset(self, prompt_ids: list[int]) -> None:
        self.index.reset(prompt_ids)

    def propose(self, ctx: DraftContext) -> Proposal:
        self.index.sync(ctx.tokens)
        length = min(self.length, ctx.budget)
        if length <= 0:
            return Proposal()
        found: list[list[int]] = []
        self.sources = []
        for db in self.order:
            for cand in self._probe(db, ctx.tokens, length):
                cand = cut_after_eos(cand, self.eos)
                if _add(found, cand):
                    self.sources.append(db)
                    if len(found) >= self.candidates:
                        return Proposal(found)
        return Proposal(found) if found else Proposal()

    def _probe(self, db: str, tokens: list[int], length: int):
        """Candidates of one database, best first: longer keys first, then the database's own order."""
        if db == "c":
            for size in range(min(self.ngram, len(tokens) - 1), 0, -1):
                for j, end in enumerate(self.index.ends(tokens, size, recent=True)):
                    if j >= SCAN:
                        break
                    yield continuation(self.index.tokens, (), end, length)
            return
        table = self.history if db == "s" else self.static
        for size in table.sizes:
            if size <= len(tokens):
                yield from table.lookup(tokens[len(tokens) - size:], length)

    def observe(self, tokens: list[int]) -> None:
        pass


def _add(found: list[list[int]], cand: list[int]) -> bool:
    """Add a candidate unless the trie already holds it; one that extends a candidate replaces it."""
    if not cand:
        return False
    for i, f in enumerate(found):
        if f[: len(cand)] == cand:
            return False
        if cand[: len(f)] == f:
            found[i] = cand
            return False
    found.append(cand)
    return True


def build(env: Env, method: Method) -> HierarchyDrafter:
    from ..artefacts import tables
    order = method.get("order", "csl")
    candidates, length = method.get("candidates", 3), method.get("length", 5)
    ngram, profile = method.get("ngram", 3), method.get("history", "quick")
    history = static = None
    resolved: dict = {"order": order, "candidates": candidates, "length": length, "ngram": ngram,
                      "width": candidates * length}                   # most draft tokens verified in a step
    try:
        if "s" in order:
            history, resolved["history"] = tables.history_table(env, profile)
        if "l" in order:
            static, resolved["static"] = tables.static_table(env)
    except FileNotFoundError as e:
        raise MethodError(f"{method.label}: {e}") from None
    env.resolved[method.label] = resolved
    return HierarchyDrafter(method.label, order, candidates, length, ngram, history, static, env.limits.eos_ids)


def _needs(model: str, cfg) -> list[Requirement]:
    from ..artefacts.tables import needs
    return needs(model, ("history", "static"))


SPECS = [MethodSpec("hierarchy", "Hierarchy Drafting: short candidates from the context, the model's own greedy "
                    "history and a corpus n-gram table, probed in that order, verified together as one trie", build,
                    (Param("order", str, "databases in probing order: c context, s model history, l static corpus",
                           choices=ORDERS),
                     Param("candidates", int, "most candidates verified per step (auto: with length, the shape "
                           "fastest on this machine)", low=1, auto=True),
                     Param("length", int, "tokens per candidate (auto: the length fastest on this machine)", low=1,
                           auto=True),
                     Param("ngram", int, "longest context n-gram used as a key", low=1),
                     Param("history", str, "model-history profile (train/history.py)", choices=tuple(PROFILES))),
                    _needs, shapes=SHAPE_SEARCH)]
