"""Top-k "sausage" lattices from the draft heads, and the searches over them that the refine stage uses.

A lattice has h draft positions with k candidate tokens each (best head score first), so k**h paths. Heads are
scored independently, so the best paths by head score alone need no LM (`kbest_paths`); the n-gram rescoring of the
paper (global rescoring, p-best) needs a search over LM states (`pbest_rescored`). All functions are pure: they
read the lattice and return Python lists, so a decoding loop can call them once per step.
"""
from __future__ import annotations

import heapq
import operator
from typing import Hashable, Protocol, Sequence

import torch

from .base import Lattice


# 32 states: about 3-4 ms per call at h=8, k=16, p=16 with a 4-gram on a loaded 2-core CPU, and it matched
# exhaustive search on 38-40 of 40 lattices at alpha 0.3 (64 states: 2x the time, 39-40/40; see the docstring).
DEFAULT_BEAM = 32


class StateLM(Protocol):
    """What `pbest_rescored` needs from a language model: a context-determined start state, then one token at a
    time. States must be hashable and equal exactly when the model's future scores are equal (an n-gram state),
    because the search merges paths that reach the same state."""

    def initial_state(self, context: list[int]) -> Hashable: ...

    def score(self, state: Hashable, token: int) -> tuple[float, Hashable]: ...


def build_lattice(head_logits: torch.Tensor, k: int, vocab_ids: torch.Tensor | None = None) -> Lattice:
    """Turn head logits [h, V'] into a top-k lattice of natural-log probabilities.

    log_softmax runs over the columns given, so with a vocabulary shortlist the probabilities are normalised over
    the shortlist (that is what the heads saw). `vocab_ids` [V'] maps a shortlist column back to the real token id;
    without it the column index is the token id. Rows come out sorted best first, as `Lattice` requires.
    """
    if head_logits.dim() != 2:
        raise ValueError(f"head_logits must be [h, V'], got shape {tuple(head_logits.shape)}")
    logprobs = torch.log_softmax(head_logits.float(), dim=-1)
    k = min(int(k), logprobs.shape[-1])
    top_lp, top_idx = torch.topk(logprobs, k, dim=-1, largest=True, sorted=True)
    if vocab_ids is not None:
        top_idx = vocab_ids.to(device=top_idx.device, dtype=torch.long)[top_idx]
    return Lattice(ids=top_idx.to(torch.int64).cpu(), logprobs=top_lp.to(torch.float32).cpu())


def top1_draft(lat: Lattice) -> list[int]:
    """The heads' own draft (plain BPD): the first column, since rows are best first."""
    return [int(t) for t in lat.ids[:, 0].tolist()]


def _sorted_rows(lat: Lattice) -> tuple[list[list[int]], list[list[float]]]:
    """Rows as Python lists (float64 scores), sorted best first. Sorting again is cheap insurance: both searches
    rely on it (kbest for monotone successors, pbest for stopping a row at the first token below the bound)."""
    order = torch.argsort(lat.logprobs, dim=-1, descending=True, stable=True)
    ids = torch.gather(lat.ids, 1, order).tolist()
    lps = torch.gather(lat.logprobs.double(), 1, order).tolist()
    return ids, lps


def kbest_paths(lat: Lattice, p: int) -> list[tuple[float, list[int]]]:
    """The p best paths by summed head log-prob, exact, best first, no duplicates ("16-best 0-gram").

    A path is an index vector (one column per position); its score is a sum of independent sorted lists, so
    bumping one index never raises the score and a max-heap over index vectors pops paths in exact score order.
    Each vector is generated once: a child may only bump a position >= the position its parent bumped last
    (every vector has exactly one such chain from all-zeros), so no visited set is needed.
    """
    ids, lps = _sorted_rows(lat)
    h = len(ids)
    k = len(ids[0]) if h else 0
    if k == 0 or p <= 0:
        return []
    start = tuple([0] * h)
    heap = [(-sum(row[0] for row in lps), start, 0)]
    out: list[tuple[float, list[int]]] = []
    while heap and len(out) < p:
        neg, vec, last = heapq.heappop(heap)
        out.append((-neg, [ids[i][j] for i, j in enumerate(vec)]))
        for i in range(last, h):
            j = vec[i] + 1
            if j < k:
                child = vec[:i] + (j,) + vec[i + 1:]
                heapq.heappush(heap, (neg + lps[i][vec[i]] - lps[i][j], child, i))
    return out


def _best_of(item) -> float:
    return item[1][0][0]


_first = operator.itemgetter(0)


def _merge_top(edges: list, states: dict, p: int, T: float) -> list:
    """Top p paths (score >= T) over several incoming edges (v, s, t) (v = best path score through the edge; the
    path lists of the states s are sorted). Back-off makes many edges share one short state, so visit edges best
    first and stop as soon as none can enter the top p."""
    edges.sort(key=_first, reverse=True)
    cands: list = []  # (score, prefix path, token), the best p so far once trimmed
    floor = T
    for v, s, t in edges:
        if v < floor:
            break
        plist = states[s]
        g = v - plist[0][0]
        for sc, path in plist:
            x = sc + g
            if x < floor:
                break
            cands.append((x, path, t))
        if len(cands) >= p:
            cands.sort(key=_first, reverse=True)
            del cands[p:]
            floor = max(T, cands[-1][0])
    cands.sort(key=_first, reverse=True)
    return [(x, path + (t,)) for x, path, t in cands[:p]]


def pbest_rescored(lat: Lattice, p: int, alpha: float, lm: StateLM, context: Sequence[int] = (),
                   beam: int = DEFAULT_BEAM) -> list[tuple[float, list[int]]]:
    """The p best paths under sum_i [head_logprob_i + alpha * lm_logprob(token_i | n-gram state)], best first.

    Search: left-to-right dynamic programming over LM states ("global n-gram rescoring"; the paper composes WFSTs,
    this is the same search on a sausage). After each position, paths that end in the same LM state are
    recombined: the LM treats them identically from then on, so only the top p of them can still be in the
    global top p, and each state keeps its top p. Then a beam of B = max(beam, p) states: when more than B states
    are alive, the B with the best path are kept, and in them only the paths scoring at least T = the best path
    of the first state left out (a path below T is worse than the best path of B+1 distinct states).

    Exactness: the result is exact (equal to enumerating all k**h paths) whenever at most B distinct LM states
    are alive at every position: recombination loses nothing and the beam then prunes nothing. For an order-n
    model that number is at most min(k**i, k**(n-1)) after position i (KenLM states are often shorter, hence
    fewer), so B >= k**(n-1) is always exact: k for a 2-gram, but k**3 = 4096 for a 4-gram at k=16, where the
    default beam is an approximation (tests check exactness on small lattices). Since B >= p and each kept
    state keeps its best path, the result always has min(p, k**h) paths.

    Speed: the beam rule is chosen so that it can be applied before scoring. With alpha >= 0 and LM log-probs
    <= 0 (any normalised LM), best(state) + head_logprob(token) bounds every path through that edge, so edges
    are visited best-bound first and skipped once the bound falls below a running lower bound of T (a third to
    a half of the B*k LM lookups per position, measured on a 4-gram). The result is the same as scoring every
    edge and then applying the rule (a test checks this). Lookups go through a per-call cache keyed by state then token,
    since a state can recur across positions (back-off, repeated tokens).
    """
    ids, lps = _sorted_rows(lat)
    if not ids or not ids[0] or p <= 0:
        return []
    alpha = float(alpha)
    B = max(int(beam), p)
    prune = alpha >= 0.0
    neg_inf = float("-inf")
    cache: dict = {}
    score = lm.score
    heappush, heapreplace = heapq.heappush, heapq.heapreplace
    # state -> list of (score, path tuple), sorted best first, at most p long
    states: dict = {lm.initial_state(list(context)): [(0.0, ())]}
    for toks, row_lp in zip(ids, lps):
        # Phase 1: score edges best bound first. nxt[next state] = [best path score, incoming edges...], an edge
        # being (v, s, t): v = best path score through it, so its gain is v - best(s).
        nxt: dict = {}
        firsts: list = []     # min-heap of the first value seen per new state; its min once B+1 long <= final T
        bound = neg_inf
        lp0 = row_lp[0]
        for s, plist in sorted(states.items(), key=_best_of, reverse=True):
            top = plist[0][0]
            if top + lp0 < bound:
                break
            sc = cache.get(s)
            if sc is None:
                sc = cache[s] = {}
            for t, lp in zip(toks, row_lp):
                u = top + lp
                if u < bound:
                    break
                r = sc.get(t)
                if r is None:
                    r = sc[t] = score(s, t)
                v = u + alpha * r[0]
                ns = r[1]
                e = nxt.get(ns)
                if e is None:
                    nxt[ns] = [v, (v, s, t)]
                    if prune:
                        if len(firsts) <= B:
                            heappush(firsts, v)
                            if len(firsts) == B + 1:
                                bound = firsts[0]
                        elif v > firsts[0]:
                            heapreplace(firsts, v)
                            bound = firsts[0]
                else:
                    e.append((v, s, t))
                    if v > e[0]:
                        e[0] = v
        # Phase 2: the beam, then materialise the top p paths (>= T) of the kept states only.
        if len(nxt) > B:
            alive = [(e[0], i, ns) for i, (ns, e) in enumerate(nxt.items()) if e[0] >= bound]  # the rest can't rank
            ranked = heapq.nlargest(B + 1, alive)
            # Scores are rebuilt as a + (v - a) below, which can round just under v: compare with a hair of slack,
            # or a kept state tied with the cut (common with alpha = 0) would lose even its best path.
            T = ranked[B][0] - 1e-9 * (1.0 + abs(ranked[B][0]))
            keep = [ns for _, _, ns in ranked[:B]]
        else:
            T = neg_inf
            keep = nxt
        new_states: dict = {}
        for ns in keep:
            e = nxt[ns]
            if len(e) == 2:
                v, s, t = e[1]
                plist = states[s]
                g = v - plist[0][0]
                new_states[ns] = [(sc + g, path + (t,)) for sc, path in plist if sc + g >= T]
            else:
                new_states[ns] = _merge_top(e[1:], states, p, T)
        states = {ns: plist for ns, plist in new_states.items() if plist}
    finals = [e for plist in states.values() for e in plist]
    finals.sort(key=lambda e: e[0], reverse=True)
    return [(sc, list(path)) for sc, path in finals[:p]]
