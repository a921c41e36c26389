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


# ---- a method is its spelling: inner methods are parsed once, with the outer spelling ------------------------------

GRAMMAR = {("methods/base.py", "nested_spelling"), ("methods/base.py", "inner_text"),
           ("paths.py", "folder_name")}        # the nested-spelling grammar, and the one label-to-folder rule


def semicolon_handlers(source: str) -> list[str]:
    """Functions that split or rewrite a `;`-joined spelling (a call with the literal ';' as an argument)."""
    found = []
    for fn in ast.walk(ast.parse(source)):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, ast.Call) and any(isinstance(a, ast.Constant) and a.value == ";"
                                                      for a in node.args):
                    found.append(fn.name)
                    break
    return found


def test_no_semicolon_spelling_is_read_outside_the_grammar():
    found = {(str(p.relative_to(PKG)), f) for p in PKG.rglob("*.py") for f in semicolon_handlers(p.read_text())}
    assert found - GRAMMAR == set() and found, found
    assert semicolon_handlers('def build(m):\n    return m.get("x").replace(";", ",")\n') == ["build"]   # control


def test_inner_methods_are_typed_once_and_part_of_the_outer_contract():
    from bpdbench.artefacts.keys import Kind, artefacts, kinds
    from bpdbench.methods import Method, parse
    sam = parse("sam:fallback=hydra;tree=4")
    inner = sam.get("fallback")
    assert isinstance(inner, Method) and inner.label == "hydra:tree=4" and sam.label == "sam:fallback=hydra;tree=4"
    assert Kind.NETWORK in kinds(sam) and Kind.NETWORK not in kinds(parse("sam"))
    cfg = RunConfig()
    assert set(artefacts(inner, cfg)) <= set(artefacts(sam, cfg))      # the graph builds the fallback's network
    hybrid = parse("hybrid:model=qdraft;length=4;cache=base")
    assert isinstance(hybrid.get("model"), Method) and hybrid.get("model").label == "qdraft:length=4,cache=base"
    assert parse(hybrid.label).label == hybrid.label


def cfg_reads(source: str) -> list[int]:
    """Lines reading a run-wide option that a method's parameter stands for (`cfg.heads`, `env.cfg.k`, ...)."""
    return sorted(n.lineno for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Attribute)
            and n.attr in ("heads", "k", "alpha", "draft_threshold")
            and (isinstance(n.value, ast.Name) and n.value.id == "cfg"
                 or isinstance(n.value, ast.Attribute) and n.value.attr == "cfg"))


def test_no_method_reads_the_run_options_its_parameters_stand_for():
    found = {str(p.relative_to(PKG)): n for part in ("methods", "refine", "artefacts")
             for p in sorted((PKG / part).rglob("*.py")) if (n := cfg_reads(p.read_text()))}
    assert found == {}
    assert cfg_reads("n = method.get('heads', env.cfg.heads)\nk = cfg.k\n") == [1, 2]     # the control


def test_a_method_is_its_spelling_under_the_run_options():
    """--heads 5 is bpd:heads=5 in the label, inner methods too; the defaults change no label; binding twice is
    binding once; a recorded folder from before labels named them reads as the label it is."""
    from bpdbench.methods import bind, parse
    from bpdbench.sweep.commands import bound_label
    five = RunConfig(heads=5)
    assert bind(parse("bpd"), five).label == "bpd:heads=5" and bind(parse("bpd"), five).get("heads") == 5
    assert bind(parse("sam:fallback=bpd"), five).label == "sam:fallback=bpd;heads=5"
    assert bind(parse("bpd:heads=3"), five).label == "bpd:heads=3"
    plain = bind(parse("ngram4"), RunConfig())
    assert plain.label == "ngram4" and (plain.option("heads"), plain.option("k"), plain.get("alpha")) == (8, 16, None)
    assert bind(plain, RunConfig()) is plain and bind(parse("recycling"), five).label == "recycling"
    bound = bind(parse("ngram4"), RunConfig(heads=5, k=4, alpha=0.5, draft_threshold=0.25))
    assert bound.label == "ngram4:heads=5,threshold=0.25,k=4,alpha=0.5" and bind(bound, five) is bound
    assert bind(parse("recycling"), RunConfig(k=4)).label == "recycling"    # its k is its own, not --k
    assert bound_label("bpd", {"heads": 5}) == "bpd:heads=5" and bound_label("hf-greedy", {"heads": 5}) == "hf-greedy"
