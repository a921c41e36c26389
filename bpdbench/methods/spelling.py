"""The one grammar of method spellings, over the registry `registry.py` fills.

Kept apart from the registry so that a method whose parameter is itself a method (sam's `fallback=`) can parse it
without importing the registry that imports it: registry.py fills REGISTRY below with every spec, and parsing
reads it at call time.
"""
from __future__ import annotations

import re
from functools import lru_cache

from .base import Method, MethodError, MethodSpec, option_default

REGISTRY: dict[str, MethodSpec] = {}      # name -> spec; filled by registry.py (imported by the package)

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


@lru_cache(maxsize=4096)
def canonical(spelling: str) -> str:
    """Canonical label of a spelling, or the spelling itself when it is not a method (table columns, old files).
    Cached: the registry is fixed once imported, and tables meet the same spellings in every folder."""
    try:
        return parse(spelling).label
    except MethodError:
        return spelling


def get(name: str) -> MethodSpec:
    return parse(name).spec


def bind(method: Method, cfg) -> Method:
    """The method with the run-wide options its parameters stand for (`Param.flag`: --heads, --k,
    --draft-threshold, --alpha) as its own parameters where its spelling leaves them out and the option differs
    from its default, inner methods too: `bpd` under --heads 4 is `bpd:heads=4`, in its label as in what it drafts,
    and a parameter at its default is read as that default (`Method.option`). The plan binds its methods once
    (experiments/plan.py); binding again changes nothing."""
    params = {k: bind(v, cfg) if isinstance(v, Method) else v for k, v in method.params.items()}
    for p in method.spec.params:
        value = getattr(cfg, p.flag, None) if p.flag else None
        if value is not None and p.name not in params and value != option_default(p.flag):
            params[p.name] = value
    return method if params == method.params else Method(method.spec, params, method.spelled)
