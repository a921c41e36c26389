"""docs/architecture.md names modules, and each one it names exists: a path (`engine/loop.py`, `bpdbench/store/`,
`tests/unit/test_layers.py`), a file of a package's paragraph in the layers block (`loop.py`), or a module listed in
parentheses there (`(graph)`, `(distill, heads)`).

Why a test: the page named a `train/drafter` module that did not exist; a reader who follows the map into the tree
must find what it says is there."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
PATH = re.compile(r"`([\w./-]+/[\w./-]*?)(?::[^`]*)?`")                 # `a/b.py`, `a/b.py: name`, `bpdbench/x/`
PARA = re.compile(r"^(bpdbench/(\w+)/)\s+(.*)$")                         # a package's paragraph in the layers block
FILE = re.compile(r"\b([a-z_]\w*\.py)\b")
GROUP = re.compile(r"\(([a-z_]+(?:, [a-z_]+)*)\)")                       # (graph) / (network, fit, objectives)


def _exists(name: str) -> bool:
    name = name.rstrip("/")
    for base in (ROOT, ROOT / "bpdbench"):
        p = base / name
        if p.exists() or p.with_suffix(".py").exists():
            return True
    return False


def _layers_block(text: str) -> dict[str, str]:
    """Each package's paragraph of the layers code block, its continuation lines joined."""
    block = text.split("## Layers and folders", 1)[1].split("```", 2)[1]
    paras: dict[str, str] = {}
    current = None
    for line in block.splitlines():
        m = PARA.match(line)
        if m:
            current = m.group(2)
            paras[current] = m.group(3)
        elif current and line.startswith(" "):
            paras[current] += " " + line.strip()
        else:
            current = None
    return paras


def missing(text: str) -> list[str]:
    out = [f"`{p}`" for p in PATH.findall(text) if not _exists(p) and not p.startswith(("http", "../"))]
    for package, para in _layers_block(text).items():
        folder = ROOT / "bpdbench" / package
        for f in FILE.findall(para):
            if not (folder / f).exists() and not list((ROOT / "bpdbench").rglob(f)):
                out.append(f"{package}: {f}")
        for group in GROUP.findall(para):
            for name in group.split(", "):
                if not ((folder / f"{name}.py").exists() or (folder / name).is_dir()):
                    out.append(f"{package}: ({name})")
    return out


def test_every_module_the_page_names_exists():
    assert missing(DOC.read_text()) == []


def test_a_module_that_is_not_there_is_found():
    """The control: a page naming modules that do not exist fails, in each of the three forms."""
    page = DOC.read_text().replace("(graph)", "(graph_nowhere)").replace("(loop.py)", "(nowhere_loop.py)")
    page += "\nThe decode loop lives in `engine/nowhere.py`.\n"
    found = missing(page)
    assert "artefacts: (graph_nowhere)" in found and "`engine/nowhere.py`" in found
    assert "engine: nowhere_loop.py" in found
