"""Rescorer contract: the *refine* stage of the decoding loop.

The heads give a top-k "sausage" lattice (k candidates at each of h draft positions). A rescorer turns it into p
drafts, best first; the verifier checks all p in one forward and keeps the longest accepted one. `none` returns the
heads' top-1 path, which is plain BPD.
"""
from __future__ import annotations

from typing import Protocol

from ..engine.types import Lattice


class Rescorer(Protocol):
    name: str
    p: int                  # how many drafts `refine` returns (1 for 1-best methods)

    def reset(self, prompt_ids: list[int]) -> None:
        """Called once per example before decoding (lets stateful rescorers drop their caches)."""

    def refine(self, lattice: Lattice, context: list[int]) -> list[list[int]]:
        """Return up to p drafts (each h token ids), best first. `context` = prompt + all tokens decided so far,
        ending with the base model's next token, which is certain and precedes draft position 0."""
