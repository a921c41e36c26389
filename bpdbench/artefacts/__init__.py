"""Artefacts a method needs that this machine can build: the one rule for building them on first use (`policy`),
the builders training registers for it (`policy.builder`: decoding asks by kind and never imports a trainer), and
the artefacts' inputs and formats that decoding reads (`corpus`, `history`)."""
from .policy import MINUTES, Need, builder, register, warn_use

__all__ = ["MINUTES", "Need", "builder", "register", "warn_use"]
