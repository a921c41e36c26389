"""REST, retrieval-based speculative decoding (He et al. 2024, github FasterDecoding/REST): the continuations of the
context's longest suffix found in a datastore, merged into a trie of the most frequent prefixes, verified as a tree.

What the published code does (`DraftRetriever/src/lib.rs` `Reader.search`, `llm_judge/gen_model_answer_rest.py`):
the datastore is a suffix array over a token corpus (ShareGPT / The Stack). Each step tries the last
`max_token_span` = 16 tokens of the context, then 15, ... down to 2 (`token_spans = range(2, 17)[::-1]`) and stops
at the first span that occurs; of its matches (the first k = 5000 in suffix-array order) it takes the next
`long` = 10 tokens, counts every prefix of every continuation, keeps the `choices` = 64 most frequent prefixes (a
trie: a prefix is at least as frequent as its extensions) and verifies them as one tree; no match is a plain step.

What bpdbench does and why it differs:
- The datastore is the shared corpus (the rescorers' C4 + WikiText) followed by the model's own greedy history (the
  `history` profile, train/history.py): the sources of the lookup tables (artefacts/tables.py), as one suffix array
  (artefacts/suffix.py), built on first use and cached.
- The longest occurring span is found by bisection on the span (a suffix occurs whenever a longer one does), which
  gives the span the authors' top-down scan stops at.
- Frequency ties are broken by depth (shorter first, so the kept set is always a trie) and then by the first match
  that produced the prefix, instead of a heap's arbitrary order, so drafts are reproducible.
- `nodes` (the trie's size, 4..64; auto: the budget fastest on this machine) replaces `choices`; continuations stop
  after an EOS and are cut to the step's budget.
Speculative sampling (T > 0): the trie is a deterministic function of the context, so q is a point mass on every
proposed token.
"""
from __future__ import annotations

import numpy as np

from ..engine import DraftContext, Proposal
from .base import Method, MethodError, MethodSpec, Param
from .env import Env
from ..artefacts.formats import SEP
from ..artefacts.keys import Requirement
from .search import Chain, Grid
from ..artefacts.suffix import SuffixIndex
from ..artefacts.history import PROFILES

# nodes=auto: one replay per trie budget, each priced at its own verify sizes; the depth read after a match stays as
# given (the trie's budget is what is chosen)
NODES_SEARCH = Chain("length", default=10, grid=Grid("nodes", (4, 8, 16, 32, 64), joint=True))

MATCHES = 5000          # matches read per step (REST's k)


class RestDrafter:
    def __init__(self, name: str, index: SuffixIndex, nodes: int = 64, span: int = 16, length: int = 10,
                 eos: frozenset[int] = frozenset()):
        self.name, self.index, self.nodes, self.span, self.length, self.eos = name, index, nodes, span, length, eos
        self.eos_arr = np.array(sorted(eos), dtype=np.int64)
        self.matched = 0                  # the span the last proposal was retrieved with (0: none)

    def reset(self, prompt_ids: list[int]) -> None:
        pass

    def propose(self, ctx: DraftContext) -> Proposal:
        length = min(self.length, ctx.budget)
        self.matched = 0
        if length <= 0 or len(ctx.tokens) < 2:
            return Proposal()
        n, lo, hi = self.index.longest(ctx.tokens, 2, self.span)
        if not n:
            return Proposal()
        self.matched = n
        starts = self.index.starts(lo, hi, n, MATCHES)
        paths = top_prefixes(self.index.padded[starts[:, None] + np.arange(length)], self.nodes, self.eos_arr)
        return Proposal(paths, probs=[[1.0] * len(p) for p in paths]) if paths else Proposal()

    def observe(self, tokens: list[int]) -> None:
        pass


def top_prefixes(rows: np.ndarray, nodes: int, eos: np.ndarray | None = None) -> list[list[int]]:
    """The `nodes` most frequent prefixes of the continuations `rows` [m, L] (ended at SEP, or after an EOS) as
    root-to-leaf paths, most frequent branch first. Ties: shorter first (so the set is prefix-closed), then the
    earliest row."""
    rows = np.asarray(rows, dtype=np.int64)
    m, depth = rows.shape
    valid = np.cumprod(rows != SEP, axis=1).astype(bool)
    if eos is not None and len(eos) and depth > 1:
        after = np.cumsum(np.isin(rows, eos), axis=1)[:, :-1] > 0     # past an EOS nothing can be kept
        valid[:, 1:] &= ~after
    # per depth: a node id for every row's prefix (parent id, token) -> unique
    node_tok, node_par, node_cnt, node_first, node_depth = [], [], [], [], []
    offset, parent = 0, np.full(m, -1, dtype=np.int64)
    for d in range(depth):
        ok = valid[:, d]
        if not ok.any():
            break
        rows_d = np.nonzero(ok)[0]
        key = parent[rows_d] * (1 << 32) + rows[rows_d, d]
        uniq, first, inv, cnt = np.unique(key, return_index=True, return_inverse=True, return_counts=True)
        node_tok.append(rows[rows_d[first], d])
        node_par.append(parent[rows_d[first]])
        node_cnt.append(cnt)
        node_first.append(rows_d[first])
        node_depth.append(np.full(len(uniq), d))
        parent = np.full(m, -2, dtype=np.int64)        # rows that ended have no node below
        parent[rows_d] = offset + inv
        offset += len(uniq)
    if not offset:
        return []
    tok, par = np.concatenate(node_tok), np.concatenate(node_par)
    cnt, first, dep = np.concatenate(node_cnt), np.concatenate(node_first), np.concatenate(node_depth)
    order = np.lexsort((first, dep, -cnt))[:nodes]
    keep = np.zeros(offset, dtype=bool)
    keep[order] = True
    rank = np.empty(offset, dtype=np.int64)
    rank[order] = np.arange(len(order))
    children: dict[int, list[int]] = {}
    for v in sorted(order.tolist(), key=lambda v: rank[v]):
        children.setdefault(int(par[v]), []).append(v)
    paths: list[list[int]] = []

    def walk(v: int, path: list[int]) -> None:
        kids = children.get(v, [])
        if not kids and path:
            paths.append(path)
        for c in kids:
            walk(c, path + [int(tok[c])])
    walk(-1, [])
    return paths


def build(env: Env, method: Method) -> RestDrafter:
    from ..artefacts import suffix
    nodes, span, length = method.get("nodes", 64), method.get("span", 16), method.get("length", 10)
    profile = method.get("history", "quick")
    try:
        index, info = suffix.datastore_index(env, profile)
    except FileNotFoundError as e:
        raise MethodError(f"{method.label}: {e}") from None
    env.resolved[method.label] = {"nodes": nodes, "span": span, "length": length, "datastore": info}
    return RestDrafter(method.label, index, nodes, span, length, env.limits.eos_ids)


def _needs(model: str, cfg) -> list[Requirement]:
    from ..artefacts.suffix import needs
    return needs(model, ("datastore",))


SPECS = [MethodSpec("rest", "REST: continuations of the context's longest suffix (16 tokens down to 2) in a suffix "
                    "array over the corpus and the model's greedy history, the most frequent prefixes verified as "
                    "one trie", build,
                    (Param("nodes", int, "draft tokens in the trie (auto: the budget fastest on this machine)", low=4,
                           high=65, auto=True),
                     Param("span", int, "longest context suffix searched", low=2, high=33),
                     Param("length", int, "tokens read after each match", low=1, high=33),
                     Param("history", str, "model-history profile (train/history.py)", choices=tuple(PROFILES))),
                    _needs, shapes=NODES_SEARCH)]
