"""The package's layers, read from every import (function-level ones included): imports run bottom to top only, no
file imports itself back through others, and decoding never reaches the training code (docs/architecture.md)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "bpdbench"
# the rank of each top-level part of bpdbench; a module may import its own rank or lower ones
RANK = {"engine": 0, "nets": 0, "store": 0, "paths": 0, "stats": 0,
        "hardware": 1,
        "models": 2,
        "refine": 3, "config": 3,
        "artefacts": 4,             # below the methods that declare what they read (artefacts/keys.py)
        "methods": 5, "train": 5,
        "experiments": 6,
        "report": 7, "sweep": 7,
        "cli": 8, "__init__": 8}
DECODING = ("engine", "nets", "refine", "methods", "artefacts", "hardware", "store", "models")


def _module(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """bpdbench modules this file imports, resolved to the deepest module that exists."""
    tree = ast.parse(path.read_text())
    here = _module(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            names = [f"{mod}.{a.name}" for a in node.names]     # a submodule, or else an attribute of mod
        for n in names:
            if n.startswith("bpdbench"):
                found.add(_existing(n))
    found.discard(_module(path))
    return found


def _existing(name: str) -> str:
    parts = name.split(".")
    while parts:
        p = ROOT.joinpath(*parts)
        if p.with_suffix(".py").exists() or (p / "__init__.py").exists():
            return ".".join(parts)
        parts.pop()
    return name


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


GRAPH = {_module(p): _imports(p) for p in sorted(PKG.rglob("*.py"))}


def test_every_part_has_a_rank():
    assert sorted({_part(m) for m in GRAPH} - set(RANK)) == []


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_imports_go_down(module):
    up = [m for m in GRAPH[module] if RANK[_part(m)] > RANK[_part(module)]]
    assert up == [], f"{module} imports a higher layer: {up}"


@pytest.mark.parametrize("module", sorted(m for m in GRAPH if _part(m) in DECODING))
def test_decoding_never_imports_training(module):
    assert not [m for m in GRAPH[module] if _part(m) == "train"]


def test_no_circle_between_files():
    seen: dict[str, int] = {}          # 1: on the current path, 2: done

    def visit(m: str, path: list[str]) -> None:
        seen[m] = 1
        for n in sorted(GRAPH.get(m, ())):
            if n.endswith("__init__") or n not in GRAPH:
                continue
            if seen.get(n) == 1:
                raise AssertionError("import circle: " + " -> ".join(path[path.index(n):] + [n]))
            if n not in seen:
                visit(n, path + [n])
        seen[m] = 2

    for m in GRAPH:
        if m not in seen:
            visit(m, [m])
