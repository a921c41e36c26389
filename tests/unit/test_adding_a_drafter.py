"""docs/adding-a-drafter.md's worked example, taken from the page as it stands and registered here: a draft network
(KOALA's Medusa heads) whose depth `auto` sizes, added by touching at most 3 files.

What "touches" means: the files a user creates or edits to add the method and keep the suite green. The page names
each one above the code that goes in it (``File: `path` (new)`` or ``(edit)``), and this test holds the page to that
count and to being enough. It loads the new module from the page's code (written to a temporary file and imported
under the package, as the registry's import would; the package itself is never written), checks that the page's
registry edit is a line of registry.py with the new name added, and registers the module's SPECS for the test, which
is what that edit does. Then, with nothing else edited, it runs on the tiny model what the suite requires of every
registered method, through the suite's own code: replay equals real decoding and drafts are accepted
(tests/unit/test_replay.py), the method drafts inside SAM as the page's FALLBACKS entry spells it (tests/unit/test_compose.py),
`bpdbench methods` lists it (tests/integration/test_cli.py); and what its contract promises without another edit: `auto` sizes
its depth through the session, its preflight refuses a missing drafter under --no-auto-train before the model loads,
the sweep plans its drafter as an artefact, the drafter tables count it as a draft network. The real-model checks
(tests/slow/test_real_model.py, `make test-heavy`) would train its drafter for real and are not run here."""
from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import tests.unit.test_compose as compose_suite
from bpdbench.config import ConfigError, RunConfig
from bpdbench.methods import REGISTRY, MethodSpec, contract, parse
from tests.unit.test_replay import SETTINGS, drafter_cache, replay_equals_real, setup, tiny_world  # noqa: F401 (fixtures)
from tests import helpers
from tests.helpers import FREE_DRAFTING

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "adding-a-drafter.md"
world = compose_suite.world          # the tiny model with every artefact, as test_compose decodes SAM's fallbacks


def page_files() -> dict[str, tuple[str, str]]:
    """The files the page tells a user to create or edit: path -> (new|edit, the code block under its line)."""
    return helpers.page_files(PAGE.read_text().splitlines())


def _new_module() -> tuple[str, str]:
    (path, code), = [(p, code) for p, (mode, code) in page_files().items() if mode == "new"]
    return path, code


def load_example(tmp_dir: Path, monkeypatch: pytest.MonkeyPatch) -> list[MethodSpec]:
    """Import the page's new module under the package and register its SPECS for the test (the registry edit)."""
    path, code = _new_module()
    name = "bpdbench.methods." + Path(path).stem
    src = tmp_dir / Path(path).name
    src.write_text(code)
    spec = importlib.util.spec_from_file_location(name, src)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    for s in module.SPECS:
        monkeypatch.setitem(REGISTRY, s.name, s)
    return module.SPECS


@pytest.fixture
def example(tmp_path, monkeypatch) -> MethodSpec:
    (spec,) = load_example(tmp_path, monkeypatch)
    return spec


def _fallback_entry() -> tuple[str, str]:
    """The page's FALLBACKS entry for tests/unit/test_compose.py: (name, spelling)."""
    code = page_files()["tests/unit/test_compose.py"][1]
    (entry,) = re.findall(r'"([^"]+)": "([^"]+)"', code)
    return entry


def test_the_example_touches_at_most_three_files():
    files = page_files()
    assert 1 <= len(files) <= 3, sorted(files)
    path, _ = _new_module()
    assert path.startswith("bpdbench/methods/") and not (ROOT / path).exists(), path
    for p, (mode, _) in files.items():
        assert mode == "new" or (ROOT / p).is_file(), f"the page edits {p}, which does not exist"
    # the registry edit: the import of the new module, and a line registry.py has, with the new group added
    code = files["bpdbench/methods/registry.py"][1].splitlines()
    (imported,) = re.findall(rf"^from \.{Path(path).stem} import SPECS as (\w+)$", code[0])
    (line,) = [c for c in code[1:] if imported in c]
    registry = [x.strip() for x in (ROOT / "bpdbench/methods/registry.py").read_text().splitlines()]
    assert line.replace(f", {imported}", "").strip() in registry, line
    # the suite's one list a new method must join: SAM's fallbacks (tests/unit/test_compose.py)
    assert "FALLBACKS = {" in (ROOT / "tests/unit/test_compose.py").read_text()
    name, _ = _fallback_entry()
    assert name not in compose_suite.FALLBACKS and name not in compose_suite.REFUSED


def test_the_contract_is_what_everything_reads(example, tiny_model_dir):
    from bpdbench.methods.compose import INPUTS, check_inner
    from bpdbench.methods.search import Chain
    from bpdbench.report.drafters import is_network
    from bpdbench.artefacts.graph import artefacts_for
    m = parse(f"{example.name}:depth=auto")
    assert m.auto == ["depth"]
    assert contract.inputs(m) == contract.ALWAYS | {contract.Input.HIDDEN}
    assert contract.kinds(m) == {contract.Kind.NETWORK} and is_network(m)
    assert isinstance(contract.search(m), Chain) and contract.search(m).param == "depth"
    check_inner("sam", "fallback", m, INPUTS)
    assert parse(f"sam:fallback={example.name}").label == f"sam:fallback={example.name}"
    cell = SimpleNamespace(command="run", timed=False, config=RunConfig(model=str(tiny_model_dir), heads_profile="init"))
    planned = [(a.kind, a.detail) for a in artefacts_for(cell, [m], lambda profile: "float32")]
    assert planned == [("distill", "quick"), ("network", "koala-quick")], planned    # its data, then it


def test_bpdbench_methods_lists_it(example):
    from tests.integration.test_cli import cli
    code, text = cli("methods")
    assert code == 0 and f"\n{example.name} " in "\n" + text
    line = text.split(f"\n{example.name} ")[1].splitlines()[1]
    assert "koala drafter (quick)" in line and "takes the hidden states" in line, line


def test_preflight_refuses_before_the_model_loads(example, tiny_model_dir, trained_drafters, tmp_path, monkeypatch):
    from bpdbench.methods.preflight import check_methods
    from tests.drafter_fixtures import copy_drafters
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path / "empty"))
    cfg = RunConfig(model=str(tiny_model_dir), auto_train=False)
    with pytest.raises(ConfigError, match="bpdbench train-network koala"):
        check_methods(cfg, [parse(example.name)])
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path / "cache"))
    copy_drafters(trained_drafters, tmp_path / "cache")
    check_methods(cfg, [parse(example.name)])
    with pytest.raises(ConfigError, match="depth=99 but this medusa drafter drafts at most"):
        check_methods(cfg, [parse(f"{example.name}:depth=99")])


@pytest.mark.parametrize("eos_at,max_new", SETTINGS)
def test_replay_equals_real_and_drafts_are_accepted(example, setup, tiny_model_dir, drafter_cache,  # noqa: F811
                                                    tmp_path, monkeypatch, eos_at, max_new):
    model, tok = setup
    env, _, greedies, memos = tiny_world(model, tok, tiny_model_dir, drafter_cache, tmp_path, monkeypatch, eos_at,
                                         max_new)
    assert replay_equals_real(env, example.name, greedies, memos) > 0      # the suite's default spelling
    replay_equals_real(env, f"{example.name}:depth=2,p=0", greedies, memos)


def test_it_drafts_inside_sam_as_the_page_spells_it(example, world, tiny_model_dir, monkeypatch):
    name, spelling = _fallback_entry()
    assert name == example.name
    monkeypatch.setitem(compose_suite.FALLBACKS, name, spelling)
    compose_suite.test_every_registered_method_is_decided()
    compose_suite.test_every_accepted_fallback_drafts_inside_sam(world, tiny_model_dir, name)


def test_auto_sizes_its_depth_through_the_session(example, tiny_model_dir, trained_drafters, tmp_path, monkeypatch):
    """depth=auto: the session resolves it through the method's declared search (one replay at the trained depth),
    records the choice under the auto label and decodes losslessly."""
    from conftest import write_prompts
    from bpdbench.experiments import autoshape, session
    from bpdbench.experiments.plan import prepare
    from bpdbench.hardware.shapes import TableCost
    from tests.drafter_fixtures import copy_drafters
    torch.set_num_threads(1)
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path / "cache"))
    copy_drafters(trained_drafters, tmp_path / "cache")
    monkeypatch.setattr(autoshape, "cost_model", lambda s: TableCost({64: 1.0}, step_ms=1e9))  # flat, drafting free
    monkeypatch.setattr(autoshape, "step_clock", lambda s, context=64: FREE_DRAFTING)     # drafting free
    monkeypatch.setattr(autoshape, "N_EXAMPLES", 3)
    run = RunConfig(task="prompts", data_file=str(write_prompts(tmp_path, 12)), model=str(tiny_model_dir),
                    dtype="float32", max_new_tokens=24, limit=3)
    m = parse(f"{example.name}:depth=auto")
    logs: list[str] = []
    s = session.open_session(prepare(run, "replay", [m], log=logs.append), logs.append)
    d = s.drafter(m)
    rec = s.env.resolved[m.label]
    assert any("measuring acceptance" in line for line in logs), logs
    assert d.name == m.label and rec["depth"] == rec["auto"]["params"]["depth"] == d.depth, rec
    assert 1 <= d.depth <= d.model.depth
    for ex in s.examples:
        prompt = s.prompt(ex)
        assert s.decode(d, prompt).tokens == s.reference.get(prompt, s.limits)[0]
