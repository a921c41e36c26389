"""Draft shapes sized to the hardware: the shape that maximises predicted tokens per second.

One decode step of the target is the unit of time. On a given machine one forward that scores n tokens costs
c(n) steps (c(1) = 1; measured per machine by hardware/calibration.py), and drafting costs some more. A shape with
E expected tokens per step (accepted draft tokens + the bonus token) therefore decodes at E / (c(verify) + draft)
times the speed of autoregressive decoding, and the best shape is the argmax of that over the shapes a method can
take. On an AVX2 CPU in float32 c(16) = 2.2, so long drafts rarely pay; on an AVX512-BF16 CPU in bfloat16
c(16) = 1.14, so they do: the same method has a different best shape per machine.

Two optimisers, both pure (no model, no torch):
- `best_chain`: one draft of n tokens. From the acceptance curve a[i] = P(the first i draft tokens are all
  accepted), E(n) = 1 + sum_{i<=n} a[i]; n = 0 is autoregressive decoding (E = 1, cost 1).
- `best_tree`: a token tree over a top-k lattice, as Medusa / Sequoia / EAGLE-2 verify. With p[d][r] = P(the rank-r
  candidate at depth d is the accepted one | its parent was accepted), a node's probability of being accepted is
  the product of p along its path, and E(tree) = 1 + the sum of those over the tree's nodes. Every node's value is
  at most its parent's (p <= 1), so the m most valuable nodes form a tree (prefix-closed), and adding nodes best
  first gives the optimal tree of every size m at once (what Sequoia's dynamic program computes for its
  position-wise acceptance model; Medusa's greedy tree search does the same). The size m is then chosen by
  E / (c(m + 1, tree=True) + draft), as EAGLE-2's `total_token` would be if it were set per machine.

Where no shape beats autoregressive decoding the result is "draft nothing" (`draft_nothing`, n = 0 / empty tree).
"""
from __future__ import annotations

import bisect
import heapq
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable, Protocol


class CostModel(Protocol):
    """What the optimisers need from a machine: decode steps of one forward scoring n tokens (cost(1) = 1)."""
    step_ms: float

    def cost(self, n: int, tree: bool = False, rows: int | None = None) -> float: ...

    def unfitted(self, n: int) -> float:
        """A chain forward over n tokens as measured, dips kept (padded decode rows, `cheapest_rows`)."""
        ...


@dataclass
class TableCost:
    """A cost model from a few measured points, linear in between and beyond the last two (tests, fallbacks)."""
    points: dict[int, float]
    step_ms: float = 1.0
    tree_factor: float = 1.0        # a tree-masked forward relative to a causal one of the same size

    def cost(self, n: int, tree: bool = False, context: int | None = None, rows: int | None = None) -> float:
        pts = sorted({1: 1.0, **self.points}.items())
        xs = [x for x, _ in pts]
        if n <= xs[0]:
            c = pts[0][1]
        else:
            i = min(max(bisect.bisect_left(xs, n), 1), len(xs) - 1)
            (x0, y0), (x1, y1) = pts[i - 1], pts[i]
            c = y0 + (y1 - y0) * (n - x0) / (x1 - x0)
        return c * (self.tree_factor if tree and n > 1 else 1.0)

    def unfitted(self, n: int) -> float:
        return self.cost(n)                    # the points as given: never fitted


@dataclass
class Shape:
    """The chosen shape and what it is predicted to give (all times in decode steps of the target)."""
    params: dict                      # the method's parameter values, e.g. {"heads": 3}
    tokens_per_step: float            # E: predicted tokens decided per verify step
    verify: float                     # tokens scored by one verify forward (mean over steps where it varies)
    verify_cost: float                # c(verify): decode steps of that forward
    draft_cost: float                 # decode steps spent drafting per step
    draft_nothing: bool = False       # no shape beats autoregressive decoding: draft nothing
    curve: list[dict] = field(default_factory=list)   # every shape considered: params, E, cost, speedup
    tree: list[list[int]] | None = None               # a tree's paths of rank indices (Medusa's choices format)

    @property
    def cost(self) -> float:
        return self.verify_cost + self.draft_cost

    @property
    def speedup(self) -> float:
        """Predicted speed over autoregressive decoding: E / (c(verify) + draft)."""
        return self.tokens_per_step / self.cost

    @property
    def break_even(self) -> float:
        """The block efficiency this shape needs to match autoregressive decoding."""
        return self.cost

    def to_dict(self) -> dict:
        return {**asdict(self), "cost": self.cost, "speedup": self.speedup, "break_even": self.break_even}

    @classmethod
    def from_dict(cls, d: dict) -> "Shape":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})

    def describe(self, label: str) -> str:
        """`bpd:heads=auto -> heads=3 (predicted 1.21x AR; E=1.9 tokens/step at c(4)=1.6; break-even 1.6)`."""
        chosen = ",".join(f"{k}={v}" for k, v in self.params.items())
        if self.tree is not None:
            chosen = ",".join(filter(None, [chosen, f"{len(self.tree)}-node tree"]))
        if self.draft_nothing:
            return (f"{label} -> draft nothing (no shape beats autoregressive decoding on this machine; best: "
                    f"{_best_other(self.curve)})")
        draft = f" + draft {self.draft_cost:.2g}" if self.draft_cost >= 0.005 else ""
        return (f"{label} -> {chosen} (predicted {self.speedup:.2f}x AR; E={self.tokens_per_step:.2f} tokens/step "
                f"at c({self.verify:.3g})={self.verify_cost:.2f}{draft}; break-even {self.break_even:.2f})")


def _best_other(curve: list[dict]) -> str:
    rest = [c for c in curve if c["params"]]
    if not rest:
        return "none"
    b = max(rest, key=lambda c: c["speedup"])
    return f"{','.join(f'{k}={v}' for k, v in b['params'].items())} at {b['speedup']:.2f}x"


Steps = float | Callable[[int], float]


def _steps(draft: Steps, n: int) -> float:
    if n == 0:
        return 0.0
    return float(draft(n) if callable(draft) else draft)


@dataclass(frozen=True)
class Option:
    """One shape a method can take, with its predicted tokens per step and costs."""
    params: dict
    tokens: float
    verify: float
    verify_cost: float
    draft_cost: float = 0.0
    tree: list[list[int]] | None = None

    @property
    def speedup(self) -> float:
        return self.tokens / (self.verify_cost + self.draft_cost)


AR = Option({}, 1.0, 1.0, 1.0)


def pick(options: Iterable[Option]) -> Shape:
    """The option with the highest predicted speed; autoregressive decoding (drafting nothing) is always one of
    them, and it wins ties, so a shape is chosen only where it is predicted to pay."""
    opts = [AR] + [o for o in options if o.params or o.tree]
    best = max(opts, key=lambda o: (round(o.speedup, 12), o is AR))
    curve = [{"params": o.params, "tokens_per_step": o.tokens, "verify": o.verify, "cost": o.verify_cost +
              o.draft_cost, "speedup": o.speedup, **({"nodes": len(o.tree)} if o.tree is not None else {})}
             for o in opts]
    return Shape(dict(best.params), best.tokens, best.verify, best.verify_cost, best.draft_cost,
                 draft_nothing=best is AR, curve=curve, tree=[list(p) for p in best.tree] if best.tree else
                 ([] if best is AR and any(o.tree for o in opts) else None))


ROW_TIE = 0.01     # row counts whose forwards cost within 1% of the cheapest are a tie (the smaller wins)


def cheapest_rows(costs: dict[int, float], param: str = "rows", tie: float = ROW_TIE) -> Shape:
    """The row count n whose decode forward costs least (`costs`: n -> c(n); c(1) = 1 is plain decoding), as a
    Shape whose E is 1 token per step: padding rows are priced for what they save, never for what they might be
    accepted. A count within `tie` of the cheapest is a tie and the smaller count wins: a percent is below what a
    calibration resolves, and a row that costs as much saves nothing. n = 1 is `draft_nothing`."""
    costs = {**{n: float(c) for n, c in costs.items() if n > 1}, 1: 1.0}
    low = min(costs.values())
    n = min(k for k, c in costs.items() if c <= low * (1 + tie))
    curve = [{"params": {param: k} if k > 1 else {}, "tokens_per_step": 1.0, "verify": k, "cost": c,
              "speedup": 1.0 / c} for k, c in sorted(costs.items())]
    return Shape({param: n} if n > 1 else {}, 1.0, n, costs[n], 0.0, draft_nothing=n == 1, curve=curve)


def expected_tokens(accept: list[float], n: int) -> float:
    """E[tokens per step | a chain of n draft tokens] = 1 + sum_{i<=n} a[i] (accept[i-1] is a[i])."""
    return 1.0 + sum(accept[:n])


def best_chain(accept: list[float], cost: CostModel, param: str = "n", draft: Steps = 0.0,
               verify: Callable[[int], float] | None = None, lengths: Iterable[int] | None = None,
               tree: bool = False, fixed: dict | None = None, steps: list[list[int]] | None = None) -> Shape:
    """The best chain length n in `lengths` (default 1..len(accept); 0, drafting nothing, is always considered).

    `accept[i-1]` = P(the first i draft tokens are all accepted), non-increasing; `draft`: decode steps of drafting
    n tokens (a constant or a function of n); `verify`: tokens one verify forward scores with n draft tokens
    (default n + 1). `steps` (measured, per step: draft nodes at depth 1, 2, ...) replaces both for drafters whose
    verified size varies from step to step (a lookup that finds nothing verifies 1 token, several candidates
    verify a trie): the cost is then the mean of c over the steps, not c at the mean size."""
    return pick(chain_options(accept, cost, param, draft, verify, lengths, tree, fixed, steps))


def chain_options(accept: list[float], cost: CostModel, param: str = "n", draft: Steps = 0.0,
                  verify: Callable[[int], float] | None = None, lengths: Iterable[int] | None = None,
                  tree: bool = False, fixed: dict | None = None, steps: list[list[int]] | None = None
                  ) -> list[Option]:
    """Every chain length of `best_chain` as an Option (to pick jointly with other parameters' options)."""
    accept = [min(max(float(a), 0.0), 1.0) for a in accept]
    lengths = range(1, len(accept) + 1) if lengths is None else lengths
    memo: dict[int, float] = {}

    def c(size: int) -> float:
        if size not in memo:
            memo[size] = float(cost.cost(size, tree=tree))
        return memo[size]

    opts = []
    for n in lengths:
        if not 1 <= n <= len(accept):
            continue
        if steps:
            sizes = [1 + sum(s[:n]) for s in steps]
            size, verify_cost = sum(sizes) / len(sizes), sum(map(c, sizes)) / len(sizes)
        else:
            size = verify(n) if verify is not None else n + 1
            verify_cost = _cost(cost, size, tree)
        opts.append(Option({**(fixed or {}), param: n}, expected_tokens(accept, n), size, verify_cost,
                           _steps(draft, n)))
    return opts


def _cost(cost: CostModel, size: float, tree: bool) -> float:
    """c at a possibly fractional mean size: interpolated between the neighbouring integers."""
    lo = int(size)
    if size == lo:
        return float(cost.cost(lo, tree=tree))
    f = size - lo
    return (1 - f) * float(cost.cost(max(lo, 1), tree=tree)) + f * float(cost.cost(lo + 1, tree=tree))


def tree_nodes(p: list[list[float]], max_nodes: int) -> list[tuple[list[int], float]]:
    """The nodes of the optimal trees, best first: the first m of them are the best tree of m nodes.

    `p[d][r]`: P(the rank-r candidate at depth d is accepted | its parent was). A node's value (probability of
    being accepted) is the product of p along its path; children are worth at most their parent, so taking the
    most valuable frontier node each time keeps the set prefix-closed and optimal for every size."""
    out: list[tuple[list[int], float]] = []
    if not p:
        return out
    frontier = [(-float(v), (r,)) for r, v in enumerate(p[0]) if v > 0]
    heapq.heapify(frontier)
    while frontier and len(out) < max_nodes:
        neg, path = heapq.heappop(frontier)
        out.append((list(path), -neg))
        d = len(path)
        if d < len(p):
            for r, v in enumerate(p[d]):
                if v > 0:
                    heapq.heappush(frontier, (neg * float(v), path + (r,)))
    return out


def best_tree(p: list[list[float]], cost: CostModel, max_nodes: int = 64, draft: Steps = 0.0,
              param: str = "nodes", sizes: Iterable[int] | None = None) -> Shape:
    """The best tree size m (1..max_nodes, or `sizes`) by E(m) / (c(m + 1, tree=True) + draft(m)); the tree is
    returned as paths of rank indices sorted by (depth, ranks), Medusa's `mc_sim_7b_63` format."""
    nodes = tree_nodes(p, max_nodes)
    total, running = [0.0], 0.0
    for _, v in nodes:
        running += v
        total.append(running)
    opts = []
    for m in (range(1, len(nodes) + 1) if sizes is None else sizes):
        if 1 <= m <= len(nodes):
            paths = sorted((path for path, _ in nodes[:m]), key=lambda q: (len(q), q))
            c = float(cost.cost(m + 1, tree=True, rows=projected(paths)))
            opts.append(Option({param: m}, 1.0 + total[m], m + 1, c, _steps(draft, m), tree=paths))
    return pick(opts)


def projected(paths: list[list[int]]) -> int | None:
    """Rows a greedy verify of this tree (rank paths, root excluded) projects onto the vocabulary, None for all:
    the engine projects only the inner nodes of a tree with enough leaves (engine.loop.lazy_inner). The rank paths'
    trie has the shape of the token tree they draft."""
    from ..engine.loop import lazy_inner
    from ..engine.tree import build_tree
    inner = lazy_inner(build_tree(0, paths).parents)
    return None if inner is None else len(inner)


def chain_value(p: list[list[float]], m: int) -> float:
    """E of the rank-0 chain of m nodes under the same per-rank acceptance (for comparisons with trees)."""
    e, v = 1.0, 1.0
    for d in range(min(m, len(p))):
        v *= p[d][0]
        e += v
    return e


def tree_value(p: list[list[float]], paths: list[list[int]]) -> float:
    """E of a tree given as rank paths: 1 + the sum over nodes of the product of p along the path."""
    total = 1.0
    for path in paths:
        v = 1.0
        for d, r in enumerate(path):
            v *= p[d][r] if d < len(p) and r < len(p[d]) else 0.0
        total += v
    return total
