"""`koala` (Zhang et al. 2024): multi-layer draft heads, optionally trained with an adversarial term (a
discriminator that tells the base's final states from the heads' predicted ones). KOALA deepens Medusa- and
EAGLE-style heads; here the variants are two-layer Medusa heads (`base=medusa`, the default, saved in the Medusa-1
layout) and two-layer Hydra heads (`base=hydra`), with (`adv=1`) or without (`adv=0`) the adversarial term, each
its own cached drafter: koala, koala-adv, koala-hydra, koala-hydra-adv (`bpdbench train-network koala
[--base hydra] [--adversarial 0.1]`).
"""
from __future__ import annotations

from .base import Param
from .trained import spec

BASE = Param("base", str, "the heads made deeper: medusa (independent heads) or hydra (sequential heads)",
             choices=("medusa", "hydra"))
ADV = Param("adv", int, "1: the drafter trained with KOALA's adversarial term", low=0, high=2)


def trained_name(method) -> str:
    base = method.get("base", "medusa")
    return "koala" + ("-hydra" if base == "hydra" else "") + ("-adv" if method.get("adv", 0) else "")


def drafter_type(method) -> str:
    return "hydra" if method.get("base", "medusa") == "hydra" else "medusa"


SPECS = [spec("koala", "KOALA: multi-layer Medusa (base=medusa) or Hydra (base=hydra) heads, adversarial term "
              "optional (adv=1)", trained_name, drafter_type, (BASE, ADV))]
