"""Commands are records (experiments/commands.py COMMANDS): nothing in the package tests a command's name, every
record is complete, and a new command is one entry that the CLI's entry and the sweep both run."""
from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from bpdbench.config import RunConfig
from bpdbench.experiments import command as command_lib
from bpdbench.experiments.commands import COMMANDS, result_files, spec

PKG = Path(__file__).resolve().parents[2] / "bpdbench"
HOLDERS = {"kind", "command"}            # what a command's name was held in


def _held(node: ast.AST) -> bool:
    name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
    return name in HOLDERS


def _names(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return {n for e in node.elts for n in _names(e)}
    return set()


def name_tests(source: str) -> list[int]:
    """Lines that compare something holding a command (`kind`, `command`) with a command's name."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_held(s) for s in sides) and any(_names(s) & set(COMMANDS) for s in sides):
                lines.append(node.lineno)
    return lines


def test_the_count_of_tests_of_a_command_name_is_zero():
    found = {str(p.relative_to(PKG)): n for p in sorted(PKG.rglob("*.py")) if (n := name_tests(p.read_text()))}
    assert found == {}


def test_the_counter_finds_the_tests_it_counts():
    """The control: the shapes the sweep and execute used to have are found."""
    assert name_tests('if plan.kind == "speed":\n    pass\n') == [1]
    assert name_tests('x = cell.kind in ("tune", "oracle")\n') == [1]
    assert name_tests('if command != "run":\n    pass\n') == [1]
    assert name_tests('if spec.kind == "ngram":\n    pass\n') == []          # a rescorer's kind, not a command


def test_every_record_is_complete_and_consistent():
    for name, c in COMMANDS.items():
        assert c.name == name and callable(c.body) and callable(c.finish) and callable(c.kept)
        assert c.methods in ("one", "many", "fixed") and (c.fixed is not None) == (c.methods == "fixed")
        assert c.split in ("eval", "tune")
        assert c.writes_folder == (c.folder != "" or c.named_by_methods), name
        assert set(c.defaults) <= c.grid_keys | {f.name for f in dataclasses.fields(RunConfig)}, name
        if c.options is not None:
            c.options()                                            # its defaults pass its own checks
            assert set(c.recorded) <= {f.name for f in dataclasses.fields(c.options)} | {"per_category"}
    assert result_files() == {"run": "examples.jsonl", "replay": "replay.jsonl", "oracle": "replay.jsonl",
                              "speed": "speed.jsonl"}
    with pytest.raises(ValueError, match="unknown command 'nope'; valid: tune, run"):
        spec("nope")


def test_a_new_command_is_one_record_that_prepare_and_execute_run(tmp_path, monkeypatch, tiny_model_dir):
    """A command added to the registry alone is prepared, locked, given a session and finished like the others."""
    from bpdbench.experiments import commands
    from bpdbench.experiments.execute import execute
    from bpdbench.experiments.plan import prepare
    from tests.conftest import write_prompts
    seen = {}

    def count(s, plan, lock, log, progress):
        plan.out.mkdir(parents=True, exist_ok=True)
        (plan.out / "count.csv").write_text(f"examples\n{len(s.examples)}\n")
        return len(s.examples)

    new = command_lib.CommandSpec("count", count, summary="count.csv", folder="count",
                                  finish=lambda plan, n, log: seen.update(n=n))
    monkeypatch.setitem(commands.COMMANDS, "count", new)
    cfg = RunConfig(task="prompts", data_file=str(write_prompts(tmp_path, 2)), limit=2, model=str(tiny_model_dir),
                    dtype="float32", out=str(tmp_path / "out"))
    plan = prepare(cfg, "count", files=False)
    assert plan.methods == () and plan.out == tmp_path / "out"
    assert execute(plan, log=lambda m: None) == 2 and seen == {"n": 2}
    assert (tmp_path / "out" / "count.csv").read_text() == "examples\n2\n"
