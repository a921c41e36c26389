"""Autoregressive decoding: the empty drafter, the baseline every method is certified against. At T > 0 it is plain
sampling from p (nothing drafted, every token drawn by the sampling rule), the baseline of `bpdbench certify`."""
from __future__ import annotations

from ..engine import EmptyDrafter
from .base import MethodSpec

SPECS = [MethodSpec("ar", "greedy autoregressive decoding (the empty drafter; block efficiency 1.0)",
                    lambda env, m: EmptyDrafter(), artefacts=())]
