"""The method registry and its one grammar, used by run, replay, speed, regress, tables and the hardware table.

`name[:key=value,...]`; a comma-separated list of methods may contain such spellings (`ar,bpd:heads=4,threshold=0.4,
medusa`: a `key=value` item continues the method before it). Older spellings stay valid as aliases and are read
into the same method: `none` = `bpd`, `bpd-h3` = `bpd:heads=3`, `bpd-t0.4` = `bpd:threshold=0.4`, `oracle-k16` =
`oracle:k=16`, `medusa-auto` = `medusa:tree=auto`... (see ALIASES), `hf:<model>` = `hf-lm:model=<model>`.
"""
from __future__ import annotations

from .amphista import SPECS as AMPHISTA
from .ar import SPECS as AR
from .cascade import SPECS as CASCADE
from .eagle import SPECS as EAGLE
from .heads import SPECS as HEADS
from .hierarchy import SPECS as HIERARCHY
from .hf import SPECS as HF
from .hybrid import SPECS as HYBRID
from .hydra import SPECS as HYDRA
from .layerskip import SPECS as LAYERSKIP
from .koala import SPECS as KOALA
from .llamacpp import SPECS as LLAMACPP
from .lookahead import SPECS as LOOKAHEAD
from .oracle import SPECS as ORACLE
from .pld import SPECS as PLD
from .qdraft import SPECS as QDRAFT
from .recycling import SPECS as RECYCLING
from .rest import SPECS as REST
from .sam import SPECS as SAM
from .sps import SPECS as SPS
from .spelling import (ALIASES, REGISTRY, bind, canonical, get, parse, parse_list, split_list,  # noqa: F401
                       valid_names)

REGISTRY.update({s.name: s for group in (AR, HEADS, ORACLE, PLD, SPS, CASCADE, HIERARCHY, HF, RECYCLING, LOOKAHEAD,
                                         SAM, REST, QDRAFT, LAYERSKIP, HYBRID, LLAMACPP) for s in group})
REGISTRY.update({s.name: s for group in (EAGLE, HYDRA, AMPHISTA, KOALA) for s in group})   # draft networks



def register_networks() -> None:
    """A method for every registered draft network whose record describes one (nets/registry.NetworkSpec.method)
    and that no method module defines: a network added in one file drafts under its own name, as every trained
    drafter does (methods/trained.spec: chain, tree=W, tree=dynamic, auto)."""
    from ..nets.registry import networks
    from .trained import spec
    for net in networks().values():
        if net.method and net.name not in REGISTRY:
            REGISTRY[net.name] = spec(net.name, net.method, net.name)


register_networks()

