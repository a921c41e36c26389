"""Registry of draft rescorers (the refine stage). Each entry names a factory; `none` is plain BPD."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .base import Lattice, Rescorer


@dataclass(frozen=True)
class RescorerSpec:
    name: str
    description: str
    build: Callable[..., Rescorer | None]


RESCORERS: dict[str, RescorerSpec] = {
    "none": RescorerSpec("none", "plain BPD: the heads' top-1 draft", lambda **_: None),
}


def get_rescorer(name: str) -> RescorerSpec:
    if name not in RESCORERS:
        raise ValueError(f"unknown rescorer '{name}'; valid: {', '.join(RESCORERS)}")
    return RESCORERS[name]


__all__ = ["Lattice", "Rescorer", "RESCORERS", "RescorerSpec", "get_rescorer"]
