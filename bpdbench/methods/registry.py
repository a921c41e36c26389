"""The method registry and its one grammar, used by run, replay, speed, regress, tables and the hardware table.

`name[:key=value,...]`; a comma-separated list of methods may contain such spellings (`ar,bpd:heads=4,threshold=0.4,
medusa`: a `key=value` item continues the method before it). Older spellings stay valid as aliases and are read
into the same method: `none` = `bpd`, `bpd-h3` = `bpd:heads=3`, `bpd-t0.4` = `bpd:threshold=0.4`, `oracle-k16` =
`oracle:k=16`, `medusa-auto` = `medusa:tree=auto`... (see ALIASES), `hf:<model>` = `hf-lm:model=<model>`.
"""
from __future__ import annotations

import re

from .amphista import SPECS as AMPHISTA
from .ar import SPECS as AR
from .base import Method, MethodError, MethodSpec
from .cascade import SPECS as CASCADE
from .eagle import SPECS as EAGLE
from .heads import SPECS as HEADS
from .hierarchy import SPECS as HIERARCHY
from .hf import SPECS as HF
from .hydra import SPECS as HYDRA
from .koala import SPECS as KOALA
from .lookahead import SPECS as LOOKAHEAD
from .oracle import SPECS as ORACLE
from .pld import SPECS as PLD
from .recycling import SPECS as RECYCLING
from .rest import SPECS as REST
from .sam import SPECS as SAM
from .sps import SPECS as SPS

REGISTRY: dict[str, MethodSpec] = {s.name: s for group in (AR, HEADS, ORACLE, PLD, SPS, CASCADE, HIERARCHY, HF,
                                                                  RECYCLING, LOOKAHEAD, SAM, REST)
                                  for s in group}
REGISTRY.update({s.name: s for group in (EAGLE, HYDRA, AMPHISTA, KOALA) for s in group})   # trained drafters

# old spelling -> (method, parameters); regex aliases carry a parameter in the name
ALIASES: dict[str, str] = {"none": "bpd", "medusa-auto": "medusa:tree=auto"}
_PATTERNS = [(re.compile(r"bpd-h(\d+)$"), "bpd", "heads"), (re.compile(r"bpd-t(.+)$"), "bpd", "threshold"),
             (re.compile(r"oracle-k(\d+)$"), "oracle", "k")]


def valid_names() -> str:
    return ", ".join(REGISTRY)


def parse(spelling: str) -> Method:
    """One method from its spelling; a one-line MethodError naming what is wrong and what is valid."""
    text = spelling.strip()
    if not text:
        raise MethodError(f"empty method name; valid: {valid_names()}")
    if text.startswith("hf:") and "=" not in text:                 # the old local-rescorer spelling
        text = f"hf-lm:model={text[3:]}"
    name, _, rest = text.partition(":")
    raw: dict[str, str] = {}
    if name in ALIASES:
        name, _, implied = ALIASES[name].partition(":")
        rest = ",".join(filter(None, [implied, rest]))
    for pattern, target, param in _PATTERNS:
        m = pattern.match(name)
        if m:
            name, raw[param] = target, m.group(1)
            break
    spec = REGISTRY.get(name)
    if spec is None:
        raise MethodError(f"unknown method '{spelling}'; valid: {valid_names()} (see `bpdbench methods`)")
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq or not key or not value:
            raise MethodError(f"{spelling}: write parameters as key=value, got '{item}'")
        if key in raw:
            raise MethodError(f"{spelling}: parameter '{key}' given twice")
        raw[key.strip()] = value.strip()
    params = {k: spec.param(k).parse(name, v) for k, v in raw.items()}
    method = Method(spec, params)
    if spec.check is not None:
        spec.check(method)
    return method


def split_list(text: str) -> list[str]:
    """`a,b:x=1,y=2,c` -> [a, b:x=1,y=2, c]."""
    out: list[str] = []
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        if "=" in item and ":" not in item.split("=", 1)[0] and out:
            out[-1] += "," + item
        else:
            out.append(item)
    return out


def parse_list(text: str | list[str]) -> list[Method]:
    """Methods in order, duplicates (same canonical label) dropped."""
    items = split_list(text) if isinstance(text, str) else [s for t in text for s in split_list(t)]
    methods: dict[str, Method] = {}
    for item in items:
        m = parse(item)
        methods.setdefault(m.label, m)
    if not methods:
        raise MethodError(f"no methods given; valid: {valid_names()}")
    return list(methods.values())


def canonical(spelling: str) -> str:
    """Canonical label of a spelling, or the spelling itself when it is not a method (table columns, old files)."""
    try:
        return parse(spelling).label
    except MethodError:
        return spelling


def get(name: str) -> MethodSpec:
    return parse(name).spec
