"""Autoregressive greedy decoding: the empty drafter, the baseline every method is certified against."""
from __future__ import annotations

from ..engine import EmptyDrafter
from .base import MethodSpec

SPECS = [MethodSpec("ar", "greedy autoregressive decoding (the empty drafter; block efficiency 1.0)",
                    lambda env, m: EmptyDrafter(), family="baseline")]
