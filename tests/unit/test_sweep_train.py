"""Trainings are grid artefacts: a grid's [[train]] blocks name draft networks, the sweep builds each before any cell
(one after another, after the model's cache), copies its report into the results, and refuses a bad block in one
line before anything loads. Only result commands write into results/: the trainer itself does not.

Why: the trainings were a shell loop (scripts/drafters.sh), the one recipe of committed numbers that was not a grid,
and the trainer wrote its report into results/ from wherever it ran."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bpdbench.config import ConfigError
from bpdbench.artefacts import graph
from bpdbench.sweep.trainings import trainings
from bpdbench.sweep import grid as grid_lib

ROOT = Path(__file__).resolve().parents[2]
CELL = '[[replay]]\ntasks = ["mt_bench"]\nmethods = ["pld"]\nlimit = 1\n'


def _grid(tmp_path: Path, train: str, cells: str = CELL) -> Path:
    path = tmp_path / "g.toml"
    path.write_text(f'[sweep]\nresults = "res"\n\n[defaults]\nmodel = "qwen2.5-coder-0.5b"\n\n{train}\n{cells}')
    return path


def test_train_blocks_become_artefacts_built_first(tmp_path):
    plan = grid_lib.load(_grid(tmp_path, '[[train]]\nnetworks = ["hydra", "koala-adv"]\nprofile = "ci"\n'))
    nets = [a for a in plan.artefacts if a.kind == "network"]
    assert [a.detail for a in nets] == ["hydra-ci", "koala-adv-ci"]
    assert nets[1].needs == (nets[0].id, "distill-ci:qwen2.5-coder-0.5b")     # one after another, on shared data
    (data,) = [a for a in plan.artefacts if a.kind == "distill"]                 # generated once, apart from fits
    assert nets[0].needs == (data.id,) and data.detail == "ci"
    assert all(n in data.needs for n in [a.id for a in plan.artefacts if a.kind == "model"])
    order = [a.kind for a in plan.artefacts]
    assert order.index("network") < max((i for i, k in enumerate(order) if k == "method"), default=len(order))
    assert all({a.id for a in nets} <= set(c.needs) for c in plan.cells)      # every cell waits for them


@pytest.mark.parametrize("block, words", [
    ('[[train]]\nnetworks = ["nope"]\n', ["[[train]] 1", "unknown drafter 'nope'"]),
    ('[[train]]\nnetworks = ["hydra"]\nprofile = "huge"\n', ["[[train]] 1", "profile must be one of"]),
    ('[[train]]\nnetworks = "hydra"\n', ["networks must be a list"]),
    ('[[train]]\nnetworks = ["hydra-adv"]\n', ["KOALA's term"]),
    ('[[train]]\nnetworks = ["hydra"]\nepochs = 3\n', ["unknown key 'epochs'"]),
    ('[[train]]\nnetworks = ["hydra"]\nreports = "../elsewhere"\n', ["reports must be a folder inside"]),
])
def test_a_bad_train_block_is_one_line(tmp_path, block, words):
    with pytest.raises(ConfigError) as e:
        grid_lib.load(_grid(tmp_path, block))
    assert len(str(e.value).splitlines()) == 1 and all(w in str(e.value) for w in words), str(e.value)


def test_a_network_that_reads_layers_needs_the_prefill_data_that_keeps_them(tmp_path, monkeypatch):
    """eagle3 at quick trains on prefill-quick, not the greedy quick data eagle trains on: the graph builds that
    (in an empty cache: a machine that holds the networks already needs no data)."""
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path / "cache"))
    plan = grid_lib.load(_grid(tmp_path, '[[train]]\nnetworks = ["eagle", "eagle3"]\nprofile = "quick"\n', cells=""))
    nets = {a.detail: a for a in plan.artefacts if a.kind == "network"}
    data = {a.id: a.detail for a in plan.artefacts if a.kind == "distill"}
    assert [data[n] for n in nets["eagle-quick"].needs if n in data] == ["quick"]
    assert [data[n] for n in nets["eagle3-quick"].needs if n in data] == ["prefill-quick"]
    with pytest.raises(ConfigError, match="eagle3 reads the base's layers"):
        grid_lib.load(_grid(tmp_path, '[[train]]\nnetworks = ["eagle3"]\nprofile = "full"\n', cells=""))


def test_a_grid_of_trainings_alone_is_a_grid(tmp_path):
    plan = grid_lib.load(_grid(tmp_path, '[[train]]\nnetworks = ["eagle"]\nprofile = "ci"\n', cells=""))
    assert plan.cells == [] and [a.detail for a in plan.artefacts if a.kind == "network"] == ["eagle-ci"]


def test_build_trains_once_and_copies_the_report(tmp_path, monkeypatch):
    from bpdbench.experiments.session import register_builders
    register_builders()        # the real builders first, so the fake below stays
    from bpdbench import paths
    from bpdbench.artefacts import policy
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path / "cache"))
    calls = []

    def fake_train(saved, profile, model, log=print):
        calls.append((saved, profile, model))
        folder = paths.network_dir(model, saved, profile)
        folder.mkdir(parents=True)
        (folder / "report.json").write_text(json.dumps({"name": saved, "heldout": {"top1": [0.5]}}))
    monkeypatch.setitem(policy.BUILDERS, "network", fake_train)
    (net,) = trainings([{"networks": ["koala-adv"], "profile": "ci"}], "tiny/m", "g",
                                       str(tmp_path / "res"))
    assert graph.build(net, False, lambda m: None) == "built"
    assert graph.build(net, False, lambda m: None) == "present"
    assert calls == [("koala-adv", "ci", "tiny/m")]
    report = tmp_path / "res" / "drafters" / "training" / "tiny_m-koala-adv-ci.json"
    assert json.loads(report.read_text())["name"] == "koala-adv"


def test_no_shell_recipe_and_no_trainer_writes_results():
    """scripts/ keeps the installers only; nothing under train/ names the results root."""
    shells = sorted(p.name for p in (ROOT / "scripts").glob("*.sh"))
    assert all(name.startswith("install_") for name in shells), shells
    writers = [str(p.relative_to(ROOT)) for p in (ROOT / "bpdbench" / "train").rglob("*.py")
               if "results_root" in p.read_text()]
    assert writers == []


def test_distillation_data_is_planned_only_where_something_is_built_from_it(tmp_path, monkeypatch):
    """A node of its own (its minutes said apart from the fits), left out where every heads or network node that
    reads it is there already: 6 min of generation for nothing otherwise."""
    from bpdbench import paths
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path / "cache"))
    grid = _grid(tmp_path, '[[train]]\nnetworks = ["hydra"]\nprofile = "ci"\n',
                 '[[replay]]\ntasks = ["mt_bench"]\nmethods = ["bpd"]\nlimit = 1\n')
    plan = grid_lib.load(grid)
    data = {a.id for a in plan.artefacts if a.kind == "distill"}
    assert data == {"distill-ci:qwen2.5-coder-0.5b", "distill-heads-quick:qwen2.5-coder-0.5b"}
    heads = next(a for a in plan.artefacts if a.kind == "heads")
    assert "distill-heads-quick:qwen2.5-coder-0.5b" in heads.needs
    (paths.heads_dir("qwen2.5-coder-0.5b", "quick")).mkdir(parents=True)
    (paths.heads_dir("qwen2.5-coder-0.5b", "quick") / "config.json").write_text("{}")
    plan = grid_lib.load(grid)
    assert {a.id for a in plan.artefacts if a.kind == "distill"} == {"distill-ci:qwen2.5-coder-0.5b"}
    assert not any("heads-quick" in n and n.startswith("distill") for x in plan.artefacts + plan.cells
                   for n in x.needs)



def test_a_methods_first_use_training_reads_its_data_from_a_node_of_its_own(tmp_path, monkeypatch):
    """hydra's first use trains its quick drafter: the graph generates that drafter's distillation data before the
    method's build (said apart in the dry run), and leaves it out once the drafter is there."""
    from bpdbench import paths
    from bpdbench.store import seal
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path / "cache"))
    m = "qwen2.5-coder-0.5b"
    grid = _grid(tmp_path, "", '[[replay]]\ntasks = ["mt_bench"]\nmethods = ["hydra"]\nlimit = 1\n')
    plan = grid_lib.load(grid)
    (network,) = [a for a in plan.artefacts if a.kind == "network"]       # the node a [[train]] block would make
    assert network.id == f"network-hydra-quick:{m}" and network.label == "hydra drafter (quick)"
    assert f"distill-quick:{m}" in network.needs and f"distill-quick:{m}" in {a.id for a in plan.artefacts}
    where = paths.network_dir(m, "hydra", "quick")
    where.mkdir(parents=True)
    (where / "config.json").write_text("{}")
    (where / "report.json").write_text("{}")
    seal.seal(where)                        # a network is there when its folder is whole (sealed when trained)
    plan = grid_lib.load(grid)
    assert not any(a.id == f"distill-quick:{m}" or f"distill-quick:{m}" in a.needs for a in plan.artefacts)


def test_a_network_profiles_data_budget_bears_its_name():
    """What the decoding side assumes of a drafter's data (methods/trained.data_of) without importing a trainer."""
    from bpdbench.methods import trained
    from bpdbench.train.network import PROFILES
    from bpdbench.train.profiles import name_of
    assert set(trained.PROFILES) == set(PROFILES)
    assert all(name_of(PROFILES[name].data) == trained.DATA.get(name, name) for name in trained.PROFILES)
    from bpdbench.train.network import LAYERED_DATA
    assert trained.LAYERED_DATA == LAYERED_DATA

def test_the_drafters_grid_trains_what_its_replays_read():
    plan = grid_lib.load(ROOT / "grids" / "drafters.toml")
    nets = {a.detail for a in plan.artefacts if a.kind == "network"}
    assert {"medusa-quick", "koala-adv-quick", "koala-hydra-adv-quick", "medusa-full", "hydra-full"} <= nets


def test_every_kind_is_declared_once_and_the_dry_run_says_what_building_costs(tmp_path, monkeypatch):
    """The graph's kinds table is what build and the dry run read: a missing node names its minutes and the command
    that builds it alone; a node that is there says so."""
    from bpdbench import paths
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path / "cache"))
    assert set(graph.KINDS) == {"model", "distill", "heads", "rescorer", "network", "table", "history", "suffix-index",
                                "calibration"}
    assert sorted(graph.RANK, key=graph.RANK.get) == ["model", "distill", "heads", "rescorer", "network", "table",
                                                      "history", "suffix-index", "calibration"]
    data = graph.Artefact("distill", "tiny/m", "heads-quick")
    assert graph.describe(data) == (f"to build (bpdbench train-heads --profile quick, its first step, in its minutes) into "
                                    f"{paths.distill_dir('tiny/m', 'heads-quick')}")
    heads = graph.Artefact("heads", "tiny/m", "quick")
    assert graph.describe(heads) == (f"to build, about 10 min (bpdbench train-heads --profile quick) into "
                                     f"{paths.heads_dir('tiny/m', 'quick')}")
    (paths.heads_dir("tiny/m", "quick")).mkdir(parents=True)
    (paths.heads_dir("tiny/m", "quick") / "config.json").write_text("{}")
    assert graph.describe(heads) == "present"
    (net,) = trainings([{"networks": ["koala-adv"], "profile": "ci"}], "tiny/m", "g", str(tmp_path / "res"))
    assert graph.describe(net).startswith("to build, about 1 min (bpdbench train-network koala-adv --profile ci) into ")
    assert "ngram --order 4" in graph.describe(graph.Artefact("rescorer", "tiny/m", "ngram4"))
    curve = graph.Artefact("calibration", "tiny/m", "float32-cpu-1t", (), ("float32", "cpu", 1))
    assert graph.describe(curve).startswith("to build, about 1.5 min (bpdbench calibrate --model tiny/m --dtype "
                                            "float32 --device cpu --threads 1) into ")


def test_a_data_node_builds_the_budget_its_reader_would(monkeypatch):
    """The registered builder turns the node's name into the budget the heads or the network would ask for."""
    from bpdbench import train
    from bpdbench.train import distill
    from bpdbench.artefacts import policy
    asked = []
    monkeypatch.setattr(distill, "ensure", lambda model, budget, *a, **k: asked.append((model, budget)))
    train.register_builders()
    for name in ("heads-ci", "ci"):
        graph.build(graph.Artefact("distill", "tiny/m", name), True, lambda m: None)
    assert policy.BUILDERS["distill"] is not None and asked[1] == ("tiny/m", "ci")
    assert asked[0][0] == "tiny/m" and distill.name_of(asked[0][1]) == "heads-ci"
