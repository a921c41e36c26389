"""Artefacts a method needs that this machine can build (heads, trained drafters, neural rescorers, model
histories): the one rule for building them on first use (`policy`)."""
from .policy import MINUTES, Need

__all__ = ["MINUTES", "Need"]
