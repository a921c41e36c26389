"""How `auto` sizes a method: which shapes to replay, and how to choose among them from what the replays measured.

A method declares its search on its registry entry (`MethodSpec.shapes`); experiments/autoshape.py replays the
plans a search gives along held-out greedy outputs (`Replayed`), then asks the search to choose with this machine's
cost of a forward (hardware/shapes.py). Nothing else knows which method is sized how.

Why declared: the auto-shape code used to hold a chain of `if name == "pld" / "sps" / ...` in two functions, so
adding an auto-sized drafter meant editing it, and a draft network's search lived apart from the drafter. The kinds:
- `Chain`: a draft length sized by truncation: one replay at the longest length (per value of an optional `Grid`
  parameter replayed alongside: hierarchy's candidates, REST's trie budget, a draft network's tree width), every
  shorter length read from it (exact for chains, whose shorter drafts are prefixes; an estimate for candidates and
  trees, whose trajectories would differ slightly).
- `Sizes`: one replay per size, compared by measured tokens per step against the mean cost of the forwards it
  verified (drafters that learn from their own verify forwards: Token Recycling's matrix, Lookahead's pool).
- `RankTree`: the best token tree of every size from per-depth, per-rank acceptance (medusa:nodes=auto).
- `Budgets`: one replay per node budget of a dynamic tree (EAGLE-2's, tree=dynamic,nodes=auto).
- `Combos`: one replay per combination of several parameters, none a truncation of another (a hybrid's model
  length and node budget).
- `Either`: one search or another by the spelling (a dynamic tree or a chain).
- `Cheapest`: the row count of a decode step's forward, from the cost curve alone, nothing replayed (`ar:rows=auto`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

from ..hardware import shapes
from .base import AUTO, Method, MethodError
from .contract import search

Runs = list[tuple[dict, "Replayed"]]
PerStep = Callable[..., Any]          # (Replayed, per_token=False) -> drafting cost per step, in decode steps
Value = Callable[[Any, Method], Any]   # (env, method) -> a value that needs the loaded model or artefacts


@dataclass
class Replayed:
    """What one replay at a large shape tells about its shorter ones."""
    accept: list[float]                   # a[i-1] = P(first i draft tokens accepted)
    nodes: list[list[int]]                # per step: draft nodes at depth 1, 2, ...
    steps: int
    draft_ms_step: float                  # drafting time per step
    draft_ms_token: float                 # drafting time per drafted token (first path)
    tree: bool                            # some step verified more than one path
    per_token: bool = False               # drafting time grows with the draft (a draft model, sequential drafter)
    ranks: list[list[float]] = field(default_factory=list)   # p[d][r] for lattice methods
    prefill_ms: float = 0.0               # per example: the first step's drafting beyond a later step's (the
    new_tokens: float = 0.0               # draft's own prefill), paid once per this many new tokens
    target_ms: float = 0.0                # the target's one-token step timed beside the replay (0: not timed)

    def to_dict(self) -> dict:
        return self.__dict__.copy()


def with_values(method: Method, **values) -> Method:
    """The method with these values (a plan to replay: labelled by what it is, not by the `auto` spelling)."""
    return Method(method.spec, {**method.params, **values})


def given(method: Method) -> Method:
    """The method without its `auto` parameters (their defaults apply until a plan sets them)."""
    return Method(method.spec, {k: v for k, v in method.params.items() if v != AUTO})


class Search:
    """One way of sizing a method. `plans` are the concrete methods to replay, each with the parameters its
    replay fixes; `choose` picks the shape from their measurements (pure given them: it is re-run on a cached
    measurement with today's costs); `per_token` says whether drafting time grows with the draft; `replays`:
    False for a search that needs no measurement but the cost curve (nothing is replayed or cached for it)."""
    replays = True

    def of(self, method: Method) -> "Search | None":
        return self

    def plans(self, env: Any, method: Method) -> list[tuple[Method, dict]]:
        raise NotImplementedError

    def choose(self, method: Method, runs: Runs, cost: shapes.CostModel, per_step: PerStep) -> shapes.Shape:
        raise NotImplementedError

    def per_token(self, drafter: Any) -> bool:
        return False


@dataclass(frozen=True)
class Either(Search):
    """`then` where `when(method)`, else `otherwise`."""
    when: Callable[[Method], bool]
    then: Search | None
    otherwise: Search | None

    def of(self, method: Method) -> Search | None:
        return self.then if self.when(method) else self.otherwise


@dataclass(frozen=True)
class Grid:
    """A parameter replayed once per value beside a Chain's length: all of `values` when it is `auto`, else the
    given one (or `default`). `joint`: the value is part of every shape, given or not (hierarchy's candidates and
    length are one shape); otherwise only when it was `auto`."""
    param: str
    values: tuple | Value
    default: Any = None
    joint: bool = False


@dataclass(frozen=True)
class Chain(Search):
    """The draft length `param`, sized by truncation: replayed at `longest` (an int or `(env, method) -> int`; None:
    as spelled) and every length from `shortest(method)` up priced from that replay. `chosen(method)`: whether the
    length is being chosen (default: it is `auto`); otherwise it stays the given one or `default`. `per_token`: the
    drafting time grows with the draft (a bool, or a function of the built drafter)."""
    param: str
    longest: int | Value | None = None
    default: Any = None
    grid: Grid | None = None
    shortest: Callable[[Method], int] | None = None
    chosen: Callable[[Method], bool] | None = None
    drafts_per_token: bool | Callable[[Any], bool] = False

    def is_chosen(self, method: Method) -> bool:
        return self.chosen(method) if self.chosen is not None else self.param in method.auto

    def plans(self, env: Any, method: Method) -> list[tuple[Method, dict]]:
        base, length = given(method), {}
        if self.is_chosen(method):
            length = {self.param: self.longest(env, method) if callable(self.longest) else self.longest}
        elif self.longest is not None:
            length = {self.param: method.get(self.param, self.default)}
        if self.grid is None:
            return [(with_values(base, **length), {})]
        g = self.grid
        auto = g.param in method.auto
        values = (g.values(env, method) if callable(g.values) else g.values) if auto else \
            (method.get(g.param, g.default),)
        return [(with_values(base, **{g.param: v}, **length), {g.param: v} if auto or g.joint else {})
                for v in values]

    def choose(self, method: Method, runs: Runs, cost: shapes.CostModel, per_step: PerStep) -> shapes.Shape:
        opts = []
        for fixed, meas in runs:
            n = max([len(meas.accept)] + [len(d) for d in meas.nodes])
            if self.is_chosen(method):
                lengths = list(range(self.shortest(method) if self.shortest else 1, n + 1))
            else:
                lengths = [method.get(self.param, self.default)]
            top = max(lengths + [n])
            accept = meas.accept + [0.0] * (top - len(meas.accept))
            opts += shapes.chain_options(accept, cost, self.param, per_step(meas, meas.per_token), lengths=lengths,
                                         tree=meas.tree, fixed=fixed, steps=meas.nodes)
        return shapes.pick(opts)

    def per_token(self, drafter: Any) -> bool:
        d = self.drafts_per_token
        return bool(d(drafter) if callable(d) else d)


@dataclass(frozen=True)
class Sizes(Search):
    """One replay per size of `param`: what such a drafter learns depends on its size (Token Recycling's matrix,
    Lookahead's pool), so a smaller size is not a truncation of a larger one."""
    param: str
    sizes: tuple[int, ...]

    def plans(self, env: Any, method: Method) -> list[tuple[Method, dict]]:
        return [(with_values(given(method), **{self.param: n}), {self.param: n}) for n in self.sizes]

    def choose(self, method: Method, runs: Runs, cost: shapes.CostModel, per_step: PerStep) -> shapes.Shape:
        return shapes.pick(sized_options(runs, cost, per_step))


@dataclass(frozen=True)
class RankTree(Search):
    """A token tree of up to `most` nodes built from per-depth, per-rank acceptance of one replay with `param`
    dropped (the method's own full tree); the tree replaces the method's own (experiments/autoshape.resolve)."""
    param: str
    most: int

    def plans(self, env: Any, method: Method) -> list[tuple[Method, dict]]:
        return [(Method(method.spec, {k: v for k, v in method.params.items() if k != self.param}), {})]

    def choose(self, method: Method, runs: Runs, cost: shapes.CostModel, per_step: PerStep) -> shapes.Shape:
        (_, meas), = runs
        if not meas.ranks:
            raise MethodError(f"{method.label}: no lattice was drafted on the held-out examples")
        return shapes.best_tree(meas.ranks, cost, self.most, per_step(meas), self.param)


@dataclass(frozen=True)
class Budgets(Search):
    """One replay per node budget of a dynamic tree (a smaller budget is not a prefix of a larger one)."""
    param: str
    budgets: tuple[int, ...]

    def plans(self, env: Any, method: Method) -> list[tuple[Method, dict]]:
        return [(with_values(given(method), **{self.param: b}), {self.param: b}) for b in self.budgets]

    def choose(self, method: Method, runs: Runs, cost: shapes.CostModel, per_step: PerStep) -> shapes.Shape:
        return shapes.pick(dynamic_options(runs, cost, per_step))


@dataclass(frozen=True)
class Combos(Search):
    """One replay per combination the method enumerates (`combos(method)`: dicts of the `auto` parameters'
    values), compared like `Sizes`: measured tokens per step against the mean cost of the forwards verified."""
    combos: Callable[[Method], list[dict]]

    def plans(self, env: Any, method: Method) -> list[tuple[Method, dict]]:
        return [(with_values(given(method), **c), dict(c)) for c in self.combos(method)]

    def choose(self, method: Method, runs: Runs, cost: shapes.CostModel, per_step: PerStep) -> shapes.Shape:
        return shapes.pick(sized_options(runs, cost, per_step))


@dataclass(frozen=True)
class Cheapest(Search):
    """`param` rows per decode forward, 1..`most`: the count whose forward the calibration prices lowest, unfitted
    (`CostModel.unfitted`), a count within `shapes.ROW_TIE` of the lowest counting as a tie that the smaller wins;
    1 is plain decoding (`draft_nothing`). For padding a decode step with filler tokens (`ar:rows=`): its extra
    rows are there to make the forward cheaper, not to be accepted, so the shape is chosen on the cost of a
    forward alone. Why not a replay like the other searches: the filler's acceptance is a bonus that the choice
    must not depend on (a shape chosen for it would be a drafter, not the baseline), and without a replay the
    choice needs no held-out greedy decoding and is the same for every task and run on one calibration."""
    param: str
    most: int
    replays = False

    def plans(self, env: Any, method: Method) -> list[tuple[Method, dict]]:
        return []

    def choose(self, method: Method, runs: Runs, cost: shapes.CostModel, per_step: PerStep) -> shapes.Shape:
        return shapes.cheapest_rows({n: float(cost.unfitted(n)) for n in range(2, self.most + 1)}, self.param)


def sized_options(runs: Runs, cost: shapes.CostModel, per_step: PerStep) -> list[shapes.Option]:
    """One option per replayed size: its measured tokens per step, and the mean cost of the forwards it verified
    (draft and scored-only nodes; they vary from step to step)."""
    opts = []
    for fixed, meas in runs:
        sizes = [1 + sum(step) for step in meas.nodes] or [1]
        size = sum(sizes) / len(sizes)
        verify_cost = sum(float(cost.cost(n, tree=meas.tree)) for n in sizes) / len(sizes)
        opts.append(shapes.Option(dict(fixed), 1.0 + sum(meas.accept), size, verify_cost, per_step(meas)))
    return opts


def dynamic_options(runs: Runs, cost: shapes.CostModel, per_step: PerStep) -> list[shapes.Option]:
    """One option per replayed budget: its measured tokens per step against the mean cost of the trees it verified
    (a dynamic tree's size varies per step)."""
    opts = []
    for fixed, meas in runs:
        n = max([len(meas.accept)] + [len(d) for d in meas.nodes] + [1])
        accept = meas.accept + [0.0] * (n - len(meas.accept))
        opts += [dataclasses.replace(o, params=dict(fixed)) for o in shapes.chain_options(
            accept, cost, "depth", per_step(meas), lengths=[n], tree=True, fixed=fixed, steps=meas.nodes)]
    return opts


def declared(method: Method) -> Search:
    """The method's search for this spelling; a MethodError when it declares none."""
    found = search(method)
    if found is None:
        raise MethodError(f"{method.label}: auto is not supported for {', '.join(sorted(method.auto))} of "
                          f"{method.name}")
    return found


def plans(env: Any, method: Method) -> list[tuple[Method, dict]]:
    """The concrete methods to replay, each with the parameters its replay fixes."""
    return declared(method).plans(env, method)


def choose(method: Method, runs: Runs, cost: shapes.CostModel) -> shapes.Shape:
    """The shape from the measurements, with drafting priced in decode steps of this machine."""
    step_ms = float(getattr(cost, "step_ms", 0.0) or 0.0)

    def per_step(meas: Replayed, per_token: bool = False):
        """Drafting per step, plus the draft's prefill spread over the steps of an example: a shape that takes E
        tokens per step pays prefill x E / new_tokens per step. Why apart: a draft's prefill is paid once per
        example; charged per drafted token (as it was), it weighed on a shape by how many tokens it drafts rather
        than by how many steps an example takes."""
        unit = meas.target_ms or step_ms       # the step timed beside the drafting: a host slower now than when
        if not unit:                           # the cost curve was measured slows both alike
            return 0.0
        once = meas.prefill_ms / unit / meas.new_tokens if meas.new_tokens else 0.0
        if per_token:
            return lambda n: n * meas.draft_ms_token / unit + once * shapes.expected_tokens(meas.accept, n)
        return meas.draft_ms_step / unit + once * (1.0 + sum(meas.accept))

    return declared(method).choose(method, runs, cost, per_step)
