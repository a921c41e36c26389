"""Medusa tree candidates: a fixed tree of (head, rank) index paths over the top-k lattice, verified in one forward.

Each path [r0, r1, ...] drafts head 0's r0-th candidate, then head 1's r1-th, ...; the verifier merges the paths
into a token trie (bpdbench/tree.py) and accepts the longest path that matches the base's greedy choices.
"""
from __future__ import annotations

from .base import Lattice

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


def rank_accuracy(heldout: dict, ranks: int = 10) -> list[list[float]]:
    """accuracy[head][rank] from a heads report: measured per rank when the report has it (`rank`), else estimated
    from top-1 and top-16 (the mass between them spread over ranks 2..16 as 1/r, a Zipf-like fall-off)."""
    if heldout.get("rank"):
        return [row[:ranks] for row in heldout["rank"]]
    norm = sum(1 / r for r in range(2, 17))
    return [[t1] + [max(t16 - t1, 0.0) / r / norm for r in range(2, ranks + 1)]
            for t1, t16 in zip(heldout["top1"], heldout["top16"])]


def tree_from_report(heads_meta: dict | None, name: str = "medusa-auto", nodes: int = 63) -> list[list[int]]:
    heldout = (heads_meta or {}).get("heldout")
    if not heldout:
        raise ValueError(f"{name} builds its tree from the heads' held-out agreement report, and these heads have "
                         f"none: train them with `bpdbench train-heads`, or use `medusa`")
    return auto_tree(rank_accuracy(heldout), nodes)


class RescoredTree:
    """Medusa's tree over a lattice that a local rescorer re-ranked first: at each draft position the rescorer's
    pick moves to rank 0 (the others keep the heads' order), so the tree's main path is the rescored draft and its
    side branches are the heads' alternatives."""

    def __init__(self, name: str, tree: "MedusaTree", local):
        self.name, self.tree, self.local = name, tree, local

    @property
    def p(self) -> int:
        return self.tree.p

    def reset(self, prompt_ids: list[int]) -> None:
        self.local.reset(prompt_ids)

    def refine(self, lattice: Lattice, context: list[int]) -> list[list[int]]:
        pick = self.local.refine(lattice, context)[0]
        ids, lp = lattice.ids.clone(), lattice.logprobs.clone()
        for i, token in enumerate(pick):
            j = int((ids[i] == token).nonzero()[0])
            if j:
                order = [j] + [r for r in range(ids.shape[1]) if r != j]
                ids[i], lp[i] = ids[i, order], lp[i, order]
        return self.tree.refine(Lattice(ids, lp), context)


class MedusaTree:
    def __init__(self, name: str, choices: list[list[int]] | None = None):
        self.name = name
        self.use(choices or MC_SIM_7B_63)

    def use(self, choices: list[list[int]]) -> None:
        """Verify these rank paths from now on (a tree sized for the machine, bpdbench/hardware/shapes.py)."""
        if not choices:
            raise ValueError(f"{self.name}: a tree needs at least one node")
        self.choices = [list(c) for c in choices]
        self.p = len(self.choices)
        self.depth = max(map(len, self.choices))
        self.width = max(max(c) for c in self.choices) + 1

    @property
    def max_depth(self) -> int:
        """The deepest lattice row its paths read, so a lattice drafter computes no head past it (methods/lattice.py).
        Read per proposal: `use` may change the tree after the drafter is built (medusa:nodes=auto)."""
        return self.depth

    def reset(self, prompt_ids: list[int]) -> None:
        """Stateless."""

    def refine(self, lattice: Lattice, context: list[int]) -> list[list[int]]:
        ids = lattice.ids.tolist()
        h, k = len(ids), len(ids[0])
        return [[ids[d][r] for d, r in enumerate(path)] for path in self.choices
                if len(path) <= h and max(path) < k]
