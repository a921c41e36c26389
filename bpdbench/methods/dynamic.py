"""EAGLE-2's dynamic draft tree (SafeAILab/EAGLE, `topK_genrate`): expand by confidence, then rerank.

Why: a fixed tree spends its verify budget on the same positions whatever the context; EAGLE-2 observed that the
draft model's cumulative confidence (the product of draft probabilities along a path) tracks acceptance, so the
tree is grown where the drafter is sure and cut where it is not. Expansion: at each of `depth` levels, the `topk`
frontier nodes with the highest cumulative log-probability are each expanded with their top-`topk` children.
Rerank: among all generated nodes, the best `nodes` by cumulative log-probability are kept, a node only with its
ancestors (a child never scores above its parent, so this is EAGLE-2's top-`total_tokens` with ties broken toward
the shallower node). The tree goes to the verifier as the paths to its leaves, best first.

The policy is independent of the drafter: `expand(paths, k)` gives, per frontier path, the top-k log-probs and
token ids of the next position. Autoregressive drafters condition each node on its own path; Medusa-style
independent heads give every node of a depth the same distribution, so the tree is the top-`nodes` lattice paths
by summed head log-probs.
"""
from __future__ import annotations

from typing import Callable, Sequence

from .search import Budgets

# tree=dynamic defaults: EAGLE-2's published shape (SafeAILab/EAGLE, eagle/evaluation/gen_ea_answer_vicuna.py:
# --total-token 60 --depth 5 --top-k 10). total_token counts the root, so 59 draft nodes are verified; `depth` counts
# the expansions after the root's top-k (cnets1.py topK_generate), so the tree has 6 draft levels. A CPU verifies 60
# tokens at a few decode steps' cost: `nodes=auto` is the budget sized for this machine.
DYNAMIC_NODES, DYNAMIC_TOPK, DYNAMIC_LEVELS = 59, 10, 6
DYNAMIC_BUDGETS = (4, 8, 16, 32, 64)  # nodes=auto chooses among these verify budgets, one replay each
BUDGETS = Budgets("nodes", DYNAMIC_BUDGETS)


def is_dynamic(method) -> bool:
    """tree=dynamic: `auto` sizes the node budget (BUDGETS), not a chain or a fixed tree."""
    return method.get("tree") == "dynamic"

Expand = Callable[[list[list[int]], int], tuple[Sequence[Sequence[float]], Sequence[Sequence[int]]]]
Node = tuple[tuple[int, ...], float]


def generate(expand: Expand, depth: int, topk: int, frontier_size: int | None = None) -> list[Node]:
    """Every node the expansion generates (path, cumulative log-probability), in generation order. The frontier
    keeps `topk` nodes per depth unless `frontier_size` says otherwise (lattices keep `nodes`: exact top-N)."""
    frontier: list[Node] = [((), 0.0)]
    generated: list[Node] = []
    for _ in range(depth):
        lps, ids = expand([list(p) for p, _ in frontier], topk)
        children = [(p + (int(ids[m][j]),), s + float(lps[m][j]))
                    for m, (p, s) in enumerate(frontier) for j in range(len(ids[m]))]
        if not children:
            break
        generated += children
        frontier = sorted(children, key=lambda c: (-c[1], c[0]))[:frontier_size or topk]
    return generated


def rerank(generated: list[Node], nodes: int) -> list[Node]:
    """The best `nodes` nodes by cumulative log-probability, closed under ancestors (parents before children)."""
    kept: dict[tuple[int, ...], float] = {}
    for path, score in sorted(generated, key=lambda c: (-c[1], len(c[0]), c[0])):
        if len(kept) >= nodes:
            break
        if len(path) == 1 or path[:-1] in kept:
            kept.setdefault(path, score)
    return list(kept.items())


def leaves(kept: list[Node]) -> list[list[int]]:
    """Paths to every kept node that no kept node extends, best first (the verifier merges them into one trie)."""
    inner = {p[:-1] for p, _ in kept}
    return [list(p) for p, _ in sorted(kept, key=lambda c: (-c[1], c[0])) if p not in inner]


def dynamic_tree(expand: Expand, depth: int, topk: int, nodes: int, frontier_size: int | None = None
                 ) -> list[list[int]]:
    """EAGLE-2's tree: expansion then rerank, as the paths to its leaves."""
    return leaves(rerank(generate(expand, depth, topk, frontier_size), nodes))


class LatticeTree:
    """The dynamic tree of independent heads (medusa:tree=dynamic): every node of depth d has head d's top-k, so
    the tree is the `nodes` best lattice paths (prefixes) by summed head log-probs. The frontier keeps `nodes`
    per depth, which makes the top-`nodes` exact (a kept node's ancestors are kept and outscore it); EAGLE-2's
    frontier of top_k nodes approximates that set for a model whose children depend on the path, which independent
    heads' do not. Its depth is the heads used and its ranks the lattice's k (`heads=6,k=10`: EAGLE-2's levels and
    width). A lattice rescorer (reset/refine) so it replaces Medusa's fixed tree in the heads drafter."""

    def __init__(self, nodes: int):
        self.nodes = self.p = nodes

    def reset(self, prompt_ids: list[int]) -> None:
        pass

    def refine(self, lattice, tokens: list[int]) -> list[list[int]]:
        ids, lps = lattice.ids.tolist(), lattice.logprobs.tolist()

        def expand(paths, k):
            d = len(paths[0])
            return [lps[d][:k]] * len(paths), [ids[d][:k]] * len(paths)
        return dynamic_tree(expand, len(ids), len(ids[0]), self.nodes, self.nodes)
