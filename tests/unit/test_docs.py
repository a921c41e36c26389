"""Every `bpdbench ...` line in the README and docs/ parses with the CLI's own parser (command, options and their
values), and every method spelling given to --method/--methods parses with the one method grammar: the documented
commands cannot drift from the code. Nothing runs."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest
import typer

from bpdbench.cli import app
from bpdbench.methods import MethodError, parse_list

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINE = re.compile(r"^\s*(?:\$\s*)?(?:[A-Z_]+=\S+\s+)*(bpdbench\s+[a-z][\w-]*(?:\s.*)?)$")


def _commands() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        fenced = False
        for line in page.read_text().splitlines():
            if line.lstrip().startswith("```"):
                fenced = not fenced
                continue
            m = LINE.match(line) if fenced else None
            if m:
                text = m.group(1).split("  #")[0].split(" # ")[0].strip()
                found.append((f"{page.name}: {text}", text))
    return found


COMMANDS = _commands()


def test_the_docs_show_commands():
    assert len(COMMANDS) > 40


@pytest.mark.parametrize("where,text", COMMANDS, ids=[w for w, _ in COMMANDS])
def test_documented_command_parses(where, text, tmp_path, monkeypatch):
    if where.startswith("adding-a-drafter.md"):     # the page's example method, registered as the page adds it
        from tests.unit.test_adding_a_drafter import load_example
        load_example(tmp_path, monkeypatch)
    text = re.split(r"\s(?:\||&&|>|2>)\s", text)[0].rstrip("\\ ")   # the bpdbench part of a shell line
    args = shlex.split(text)[1:]
    group = typer.main.get_command(app)
    name, rest = args[0], args[1:]
    command = group.get_command(click.Context(group), name)
    assert command is not None, f"{where}: no command {name!r}"
    rest = [a for a in rest if not re.fullmatch(r"<[^>]+>|\.\.\.|\[.*\]", a)]   # placeholders stand for values
    try:
        ctx = command.make_context(name, rest)
    except click.exceptions.Exit:
        return                                                      # --help
    except click.UsageError as e:
        pytest.fail(f"{where}: {e.format_message()}")
    for key in ("method", "methods", "rescorer"):
        spelling = ctx.params.get(key)
        if isinstance(spelling, str) and "<" not in spelling and spelling != "none":
            try:
                parse_list(spelling)
            except MethodError as e:
                pytest.fail(f"{where}: {e}")
