"""Medusa tree candidates: a fixed tree of (head, rank) index paths over the top-k lattice, verified in one forward.

Each path [r0, r1, ...] drafts head 0's r0-th candidate, then head 1's r1-th, ...; the verifier merges the paths
into a token trie (bpdbench/tree.py) and accepts the longest path that matches the base's greedy choices.
"""
from __future__ import annotations

from rescorers.base import Lattice

# Medusa's default `mc_sim_7b_63` (63 nodes, depth 4), from the Medusa repository (see ../shared/paper.md).
MC_SIM_7B_63 = [[0], [0, 0], [1], [0, 1], [2], [0, 0, 0], [1, 0], [0, 2], [3], [0, 3], [4], [0, 4], [2, 0], [0, 5],
                [0, 0, 1], [5], [0, 6], [6], [0, 7], [0, 1, 0], [1, 1], [7], [0, 8], [0, 0, 2], [3, 0], [0, 9], [8],
                [9], [1, 0, 0], [0, 2, 0], [1, 2], [0, 0, 3], [4, 0], [2, 1], [0, 0, 4], [0, 0, 5], [0, 0, 0, 0],
                [0, 1, 1], [0, 0, 6], [0, 3, 0], [5, 0], [1, 3], [0, 0, 7], [0, 0, 8], [0, 0, 9], [6, 0], [0, 4, 0],
                [1, 4], [7, 0], [0, 1, 2], [2, 0, 0], [3, 1], [2, 2], [8, 0], [0, 5, 0], [1, 5], [1, 0, 1], [0, 2, 1],
                [9, 0], [0, 6, 0], [0, 0, 0, 1], [1, 6], [0, 7, 0]]


def auto_tree(accuracy: list[list[float]], nodes: int = 63) -> list[list[int]]:
    """Greedy tree from measured per-head top-r accuracies (accuracy[head][rank], independent-heads estimate):
    repeatedly add the child path with the highest probability of being accepted, as Medusa's tree search does."""
    import heapq
    tree: list[list[int]] = []
    frontier = [(-accuracy[0][r], [r]) for r in range(len(accuracy[0]))]
    heapq.heapify(frontier)
    while frontier and len(tree) < nodes:
        neg, path = heapq.heappop(frontier)
        tree.append(path)
        depth = len(path)
        if depth < len(accuracy):
            for r in range(len(accuracy[depth])):
                heapq.heappush(frontier, (neg * accuracy[depth][r], path + [r]))
    return sorted(tree, key=lambda p: (len(p), p))


class MedusaTree:
    def __init__(self, name: str, choices: list[list[int]] | None = None):
        self.name = name
        self.choices = choices or MC_SIM_7B_63
        self.p = len(self.choices)
        self.depth = max(map(len, self.choices))
        self.width = max(max(c) for c in self.choices) + 1

    def reset(self, prompt_ids: list[int]) -> None:
        """Stateless."""

    def refine(self, lattice: Lattice, context: list[int]) -> list[list[int]]:
        ids = lattice.ids.tolist()
        h, k = len(ids), len(ids[0])
        return [[ids[d][r] for d, r in enumerate(path)] for path in self.choices
                if len(path) <= h and max(path) < k]
