"""One word per concept (docs/architecture.md, Glossary): a retired word anywhere in code or docs fails, so does a
second public class of the same name, and a renamed command says its new name in one line.

Why a test: the words drifted back each time they were fixed by hand ("medusa" had six meanings, "drafter" named the
protocol and the networks, two classes were called `Plan`)."""
from __future__ import annotations

import ast
import re
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GLOSSARY = ROOT / "docs" / "architecture.md"
SCANNED = ("bpdbench", "tests", "docs", "grids", "scripts", "README.md", "Makefile", ".ci")
EXEMPT = "retired-word-ok"          # a line that must name a retired word (the renamed-command table)


def retired() -> dict[str, str]:
    """Retired word -> its replacement, from the glossary's table between the `retired` markers."""
    text = GLOSSARY.read_text()
    block = text.split("<!-- retired -->", 1)[1].split("<!-- /retired -->", 1)[0]
    rows = [r for r in block.splitlines() if r.startswith("| `")]
    return {r.split("|")[1].strip().strip("`"): r.split("|")[2].strip() for r in rows}


def _files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", *SCANNED], cwd=ROOT, capture_output=True, text=True).stdout.split()
    return [ROOT / f for f in out if (ROOT / f).is_file() and not f.endswith((".png", ".gz", ".pt"))]


def _outside_table(path: Path, text: str) -> str:
    if path == GLOSSARY:        # the table that lists them
        head, rest = text.split("<!-- retired -->", 1)
        return head + rest.split("<!-- /retired -->", 1)[1]
    return text


def test_the_glossary_retires_words():
    words = retired()
    assert {"trained drafter", "refiner", "train-drafter"} <= set(words), words


@pytest.mark.parametrize("word", sorted(retired()))
def test_no_retired_word(word):
    pattern = re.compile(rf"(?<![\w-]){re.escape(word)}s?(?![\w-])", re.IGNORECASE)
    hits = []
    for path in _files():
        try:
            text = _outside_table(path, path.read_text())
        except UnicodeDecodeError:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if pattern.search(line) and EXEMPT not in line and path != Path(__file__):
                hits.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
    assert hits == [], f"retired word {word!r} (use {retired()[word]}):\n" + "\n".join(hits[:20])


def test_the_scan_finds_a_planted_word(tmp_path):
    """The control: the pattern the test uses matches the words in running text, plural and capitalised."""
    for word in retired():
        pattern = re.compile(rf"(?<![\w-]){re.escape(word)}s?(?![\w-])", re.IGNORECASE)
        assert pattern.search(f"the {word.upper()}s, here")
        assert not pattern.search(f"the x{word}x")


def test_public_classes_have_one_name_each():
    seen: dict[str, list[str]] = defaultdict(list)
    for path in sorted((ROOT / "bpdbench").rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                seen[node.name].append(str(path.relative_to(ROOT)))
    assert {k: v for k, v in seen.items() if len(v) > 1} == {}


def test_a_renamed_command_names_its_new_name(monkeypatch, capsys):
    import sys

    from bpdbench import cli
    monkeypatch.setattr(sys, "argv", ["bpdbench", "train-drafter", "hydra"])      # retired-word-ok
    with pytest.raises(SystemExit) as e:
        cli.main()
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and "bpdbench train-network" in err
