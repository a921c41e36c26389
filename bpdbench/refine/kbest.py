"""16-best 0-gram: the p best lattice paths by head scores alone, all verified together.

Isolates the gain from verifying many drafts from the gain of an LM (paper, "16-best 0-gram").
"""
from __future__ import annotations

from .lattice import kbest_paths
from .base import Lattice


class KBestRescorer:
    def __init__(self, name: str, p: int = 16):
        self.name = name
        self.p = int(p)

    def reset(self, prompt_ids: list[int]) -> None:
        """Stateless."""

    def refine(self, lattice: Lattice, context: list[int]) -> list[list[int]]:
        return [ids for _, ids in kbest_paths(lattice, self.p)]
