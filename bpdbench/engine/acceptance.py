"""Acceptance rules: which proposed tokens the base model keeps, and which token it adds.

A rule has two parts so that real decoding and replay share the decision: `targets` turns the verify forward's
logits into what each tree node's children are compared with, and `decide` picks the path and the bonus token from
those targets. Replay builds the targets from the greedy reference instead of logits and calls the same `decide`.
A sampling rule (speculative sampling, `sampling.py`) implements the same calls with the draft distributions of the
proposal; its targets are the warped probabilities per node and `first` draws the prefill's token.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from .tree import Tree, accept as tree_accept
from .types import Proposal


@dataclass(frozen=True)
class Decision:
    path: int        # index of the winning proposal path
    accepted: int    # how many of its tokens are kept
    bonus: int       # the base's token after the last kept node


class Acceptance(Protocol):
    name: str
    lossless_is_exact: bool   # True when the output must equal greedy token for token
    argmax_only: bool         # True when `targets` is the per-node argmax: the engine may compute it lazily

    def targets(self, logits: torch.Tensor) -> list[int]:
        """[n_nodes, V] logits of the verify forward -> the token each node's child must equal."""

    def decide(self, tree: Tree, targets: list[int], proposal: Proposal) -> Decision:
        """The longest acceptable path and the bonus token."""

    def first(self, logits: torch.Tensor) -> int:
        """[1, V] logits after the prompt -> the first generated token (nothing was drafted for it)."""


class GreedyAcceptance:
    """Keep the longest path whose every token equals the base's argmax at its parent (ties: the earlier path)."""
    name = "greedy"
    lossless_is_exact = True
    argmax_only = True

    def targets(self, logits: torch.Tensor) -> list[int]:
        return logits.argmax(-1).tolist()

    def first(self, logits: torch.Tensor) -> int:
        return self.targets(logits)[0]

    def decide(self, tree: Tree, targets: list[int], proposal: Proposal) -> Decision:
        best, a = tree_accept(tree, targets)
        last = tree.paths[best][a - 1] if a else 0
        return Decision(best, a, targets[last])


GREEDY = GreedyAcceptance()
