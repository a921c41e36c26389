"""Every draft network, one record each (`NetworkSpec`), registered by the network's own module.

Why a record per network: adding one used to mean editing a table of constructors and fit settings (train), a
table of checkpoint types (nets/checkpoint.py), type tests in the training objectives and the test fixtures. Now a
network's module says everything once, beside its class: how to build it, which checkpoint type it saves as, what
it reads from the decode loop (the last layer's hidden states always; the states of chosen layers when it declares
them) and the fit settings that differ from the defaults. Everything that enumerates networks reads `networks()`.

Why the objective is a name: decoding (engine/, nets/, methods/) never imports training (train/), yet the record
is read by both. So the record holds only what decoding may see plus the *name* of its training objective, which
train/objectives.OBJECTIVES resolves (one table keyed by those names: "positional", "unrolled", "prefix"). A
network whose drafting fits an existing objective (its model gives `teacher_states`, as Medusa, Hydra and
Amphista do) needs no training code at all; one that needs a new objective registers it there under a new name.

A network outside the package registers the same way (`register(NetworkSpec(...))` when its module is imported);
docs/draft-networks.md, "Adding a network", walks through one.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from ..engine.types import Layers
from .base import DraftModel

# The modules of bpdbench.nets that register networks (imported on first use of the registry, not at import time:
# reading one checkpoint must not import every network's dependencies before it is asked).
BUILTIN = ("medusa", "hydra", "amphista", "eagle", "eagle3")


@dataclass(frozen=True)
class FitDefaults:
    """The fit settings a network trains with unless its profile says otherwise (train/fit.FitConfig)."""
    lr: float = 2e-3
    batch: int = 512               # rows (positional objectives) or sequences (sequential ones)
    unroll: int = 1                # training-time drafting passes (EAGLE: its own features fed back)
    noise: float = 0.0             # feature noise, relative to the features' RMS (EAGLE)
    feature_weight: float = 0.0    # weight of the feature regression beside the cross-entropy (EAGLE)
    decay: float = 1.0             # weight of training-time drafting pass p's loss: decay^(p-1) (EAGLE-3: 0.8)
    ramp: bool = False             # the passes grow from 1 to `unroll` over the budget (train/fit.py), so a short
                                   # CPU fit learns depth 1 before its own drafts are worth training on


@dataclass(frozen=True)
class NetworkSpec:
    """One trainable draft network, by its trainer name (the cache folder: `hydra++`, `koala-hydra`)."""
    name: str
    model: type[DraftModel]        # its class; `model.type_name` is the checkpoint type config.json names
    build: Callable[[int, int, int], DraftModel]    # (d, depth, the base's layer count) -> an untrained model
    objective: str                 # the training objective's name (train/objectives.OBJECTIVES)
    layers: Callable[[int], Layers] | None = None   # hidden states of chosen layers it reads (layer count -> which)
    defaults: FitDefaults = FitDefaults()
    adversarial: bool = False      # trains with KOALA's adversarial term when asked (--adversarial)
    method: str | None = None      # a method of its name with this description (methods/registry.register_networks),
                                   # for a network without a method module of its own (the package's have one each)

    @property
    def type_name(self) -> str:
        return self.model.type_name


_SPECS: dict[str, NetworkSpec] = {}
_loaded = False


def register(*specs: NetworkSpec) -> None:
    """Add networks (a network's module calls this when imported). A name registered again is replaced, so a
    module reloaded in one process stays one entry."""
    for spec in specs:
        if not spec.model.type_name:
            raise ValueError(f"network {spec.name}: {spec.model.__name__}.type_name is empty; name its checkpoint type")
        _SPECS[spec.name] = spec


def networks() -> dict[str, NetworkSpec]:
    """Every registered network by trainer name, the package's own first (in BUILTIN's order)."""
    global _loaded
    if not _loaded:
        for module in BUILTIN:
            importlib.import_module(f"{__package__}.{module}")
        _loaded = True
    return dict(_SPECS)


def get(name: str) -> NetworkSpec:
    """The network a trainer name names, or a one-line ValueError listing the valid ones."""
    known = networks()
    if name not in known:
        raise ValueError(f"unknown drafter '{name}'; valid: {', '.join(known)}")
    return known[name]


def types() -> dict[str, type[DraftModel]]:
    """Checkpoint type -> class, for reading a drafter folder (several trainer names may share one type)."""
    return {spec.type_name: spec.model for spec in networks().values()}


def attention_sizes(d: int) -> dict:
    """Attention and MLP sizes of a draft decoder layer: the base's head size (64) and 2 key/value heads, as Qwen2.5
    0.5B has (14 heads at d = 896), and an MLP of about 2.3 d (the base's is 5.4 d: drafting cost matters more
    here than capacity); small test models get one head."""
    heads = max(1, d // 64)
    return {"heads": heads, "kv_heads": 2 if heads % 2 == 0 else 1, "ffn": 2048 if d == 896 else max(64, 2 * d)}
