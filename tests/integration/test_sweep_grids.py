"""The grids in grids/ as the recipes of the committed results: every folder the retired scripts wrote (certificates,
peer speed runs, the draft networks' results, the sampling grid) is a finished cell of its grid, and a cell's
config.json names the grid and cell that made it without that (or where it ran) making it look unfinished. No Ray:
cells run in-process, as a Ray worker runs them."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from bpdbench import paths
from tests.integration.test_sweep import cli, data  # noqa: F401 (data is a fixture)


def test_a_cell_records_its_grid_and_stays_finished(tiny_model_dir, data, tmp_path, monkeypatch):
    """config.json names the grid and cell; that key, the private greedy folder each attempt gets and the `out` path
    are not what a cell computed, so the folder is finished for the grid, resumes with a larger limit, and the CLI
    resumes it too."""
    from bpdbench.sweep import cells, commands, grid
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "g.toml"

    def plan(limit: int):
        path.write_text("\n".join([
            "[sweep]", f'results = "{tmp_path / "res"}"', "", "[[run]]",
            'out = "sampling/{task}/{method}-T{temperature}"', 'tasks = ["xsum"]', 'methods = ["ar", "pld"]',
            f'model = "{tiny_model_dir}"', 'dtype = "float32"', "private_greedy = true", f"limit = {limit}",
            "max_new_tokens = 6"]))
        return grid.load(path, data=str(data))
    first = plan(1)
    monkeypatch.setenv("BPDBENCH_RESULTS", str(first.results))
    monkeypatch.setenv("BPDBENCH_DATA", str(data))
    for cell in first.cells:
        assert cells.run_cell(cell, 0, "sweep/g", None)["status"] == "ok"
    pld = next(c for c in plan(2).cells if c.config.method == "pld")
    assert not commands.finished(pld, first.results)            # one example more to decode
    assert cells.run_cell(pld, 0, "sweep/g", None)["status"] == "ok"    # resumed with a fresh greedy folder
    meta = json.loads((first.results / pld.rel / "config.json").read_text())
    assert meta["sweep"] == {"grid": paths.portable(path.resolve()), "cell": "sampling/xsum/pld-T0",   # portable
                             "grid_sha256": hashlib.sha256(path.read_bytes()).hexdigest()[:16]}
    assert meta["config"]["greedy_dir"] != str(tmp_path / "cache" / "greedy") and meta["config"]["limit"] == 2
    assert commands.finished(pld, first.results)
    examples = [json.loads(x) for x in (first.results / pld.rel / "examples.jsonl").read_text().splitlines()]
    assert len(examples) == 2 and all(r["ref_seconds"] for r in examples)      # its own AR, timed in the cell
    code, text = cli("run", "--task", "xsum", "--method", "pld", "--model", tiny_model_dir, "--dtype", "float32",
                     "--limit", "2", "--max-new-tokens", "6", "--out", first.results / pld.rel, "--resume")
    assert code == 0, text
    assert "sweep" not in json.loads((first.results / pld.rel / "config.json").read_text())   # a command line's own


def test_a_speed_cell_cut_after_a_prompt_is_not_finished(tiny_model_dir, data, tmp_path, monkeypatch):
    """speed.csv is rewritten after every prompt, so a run killed after its first prompt leaves a summary newer
    than its config.json: the cell must still be run (and resumes), not reported finished."""
    from bpdbench.sweep import cells, commands, grid
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "g.toml"
    path.write_text("\n".join([
        "[sweep]", f'results = "{tmp_path / "res"}"', "", "[[speed]]", 'tasks = ["mt_bench"]',
        'methods = ["ar", "pld"]', f'model = "{tiny_model_dir}"', 'dtype = "float32"', "repeats = 1", "limit = 2",
        "max_new_tokens = 4"]))
    plan = grid.load(path, data=str(data))
    monkeypatch.setenv("BPDBENCH_RESULTS", str(plan.results))
    monkeypatch.setenv("BPDBENCH_DATA", str(data))
    (cell,) = plan.cells
    assert cells.run_cell(cell, 0, "sweep/g", None)["status"] == "ok" and commands.finished(cell, plan.results)
    out = plan.results / cell.rel
    rows = (out / "speed.jsonl").read_text().splitlines()
    first = json.loads(rows[0])["id"]
    (out / "speed.jsonl").write_text("".join(r + "\n" for r in rows if json.loads(r)["id"] == first))
    (out / "speed.csv").write_text((out / "speed.csv").read_text())       # the summary of that prompt, newer
    assert not commands.finished(cell, plan.results)
    assert cells.run_cell(cell, 0, "sweep/g", None)["status"] == "ok" and commands.finished(cell, plan.results)
    assert len((out / "speed.jsonl").read_text().splitlines()) == len(rows)


def test_a_folder_decoded_with_heads_of_another_recipe_is_not_finished(tiny_model_dir, data, tmp_path, monkeypatch):
    """Heads retrained by another `train-heads` recipe give other numbers, so a folder made with them is not the
    cell's result; heads without a recorded recipe were made by the first one, and untrained heads have none."""
    from bpdbench.sweep import cells, commands, grid
    from bpdbench.train import heads as train_heads
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "g.toml"
    path.write_text("\n".join([
        "[sweep]", f'results = "{tmp_path / "res"}"', "", "[[run]]", 'out = "runs/{task}-{method}"',
        'tasks = ["xsum"]', 'methods = ["bpd"]', f'model = "{tiny_model_dir}"', 'dtype = "float32"',
        'heads_profile = "init"', "limit = 1", "max_new_tokens = 6"]))
    plan = grid.load(path, data=str(data))
    monkeypatch.setenv("BPDBENCH_RESULTS", str(plan.results))
    monkeypatch.setenv("BPDBENCH_DATA", str(data))
    (cell,) = plan.cells
    assert cells.run_cell(cell, 0, "sweep/g", None)["status"] == "ok" and commands.finished(cell, plan.results)
    conf = plan.results / cell.rel / "config.json"
    meta = json.loads(conf.read_text())
    legacy = train_heads.RECIPE == train_heads.FIRST_RECIPE             # heads that recorded no recipe
    for recipe, finished in (({}, legacy), ({"recipe": train_heads.RECIPE}, True), ({"recipe": "heads-fit/0"}, False)):
        meta["resolved"]["heads"] = {"profile": "quick", "path": "/x", **recipe}      # as cached heads record it
        conf.write_text(json.dumps(meta))
        summary = plan.results / cell.rel / "summary.csv"
        summary.write_text(summary.read_text())                                       # written after config.json
        assert commands.finished(cell, plan.results) is finished, recipe


MACHINE = ("dtype", "heads_path")      # what a grid resolves on this machine (dtype auto, ~) that a folder recorded


@pytest.mark.parametrize("name,folders", [
    ("certificates", ["certificates/*/summary.csv"]),
    ("peers", ["speed/*-peers/speed.csv", "speed/mt_bench-1.5b-sps/speed.csv"]),
    ("drafters", ["drafters/replay/*/replay.csv", "drafters/runs/*/summary.csv", "speed/mt_bench-hydra/speed.csv"]),
    ("sampling", ["sampling/*/*/summary.csv"]),
    ("paper", ["runs/*-fp32-quick/summary.csv", "runs/*-bf16-*/summary.csv", "medusa/*/replay.csv",
               "speed/mt_bench/speed.csv", "speed/mt_bench-1.5b/speed.csv", "speed/mt_bench-auto/speed.csv",
               "speed/mt_bench-pld/speed.csv", "alpha_law/*/alpha_law.csv"])])
def test_committed_folders_are_finished_cells_of_their_grid(name, folders):
    """Every committed folder the retired scripts wrote is a cell of its grid, finished where this machine resolves
    the grid as the folder's did (dtype auto, ~ in heads_path)."""
    from bpdbench.sweep import commands, grid
    root = Path(__file__).resolve().parents[2]
    if not (root.parent / "shared" / "data" / "xsum").is_dir():
        pytest.skip("needs ../shared/data")
    plan = grid.load(root / "grids" / f"{name}.toml")
    by_id = {c.id: c for c in plan.cells}
    committed = {p.parent.relative_to(plan.results).as_posix() for pattern in folders
                 for p in plan.results.glob(pattern)}
    assert committed and committed <= set(by_id), sorted(committed - set(by_id))
    for folder in sorted(committed):
        recorded = json.loads((plan.results / folder / "config.json").read_text())["config"]
        cell = by_id[folder]
        if all(getattr(cell.config, k) == recorded.get(k) for k in MACHINE):
            assert commands.finished(cell, plan.results), folder


def test_tables_render_every_certificate(tmp_path):
    """`bpdbench tables` gives every committed certificate folder one row, with the numbers of its summary.csv."""
    import shutil

    import pandas as pd
    from bpdbench.report.tables import build
    committed = Path(__file__).resolve().parents[2] / "results" / "certificates"
    shutil.copytree(committed, tmp_path / "certificates")
    build(tmp_path)
    table = pd.read_csv(tmp_path / "tables" / "certificates.csv")
    folders = sorted(committed.glob("*/summary.csv"))
    assert folders and len(table) == len(folders)
    for path in folders:
        s = pd.read_csv(path).iloc[0]
        row = table[(table.task == s.task) & (table.method == s.method)]
        assert len(row) == 1, path
        for col in ("n_examples", "new_tokens", "block_efficiency", "lossless_rate"):
            assert row[col].iloc[0] == pytest.approx(s[col], abs=5e-4), (path, col)


def test_alpha_law_cells(tmp_path):
    from bpdbench.sweep import grid
    from bpdbench.config import ConfigError
    path = tmp_path / "g.toml"
    path.write_text('[sweep]\nresults = "res"\n\n[[alpha_law]]\ntasks = ["mt_bench"]\ngamma_max = 4\n'
                    'temperatures = [0, 1]\ndtype = "float32"\n')
    (cell,) = grid.load(path).cells
    assert (cell.command, cell.rel, cell.config.method) == ("alpha_law", "alpha_law/mt_bench", "sps:gamma=4")
    assert cell.options == {"gamma_max": 4, "temperatures": [0.0, 1.0]} and cell.config.temperature is None
    path.write_text('[sweep]\nresults = "res"\n\n[[alpha_law]]\ntasks = ["mt_bench"]\ntemperatures = [-1]\n')
    with pytest.raises(ConfigError, match="temperatures must be"):
        grid.load(path)


def test_certify_cells(tmp_path):
    from bpdbench.config import ConfigError
    from bpdbench.sweep import grid
    path = tmp_path / "g.toml"
    path.write_text('[sweep]\nresults = "res"\n\n[[certify]]\ntasks = ["mt_bench"]\nmethods = ["pld"]\n'
                    'temperature = 0.7\nsamples = 50\nrules = ["exact", "no-residual"]\ndtype = "float32"\n')
    (cell,) = grid.load(path).cells
    assert (cell.command, cell.rel) == ("certify", "certify/mt_bench-pld-T0.7-float32")
    assert cell.options == {"methods": "pld", "rules": ["exact", "no-residual"], "samples": 50, "positions": 4,
                            "level": 0.01} and cell.config.temperature == 0.7
    path.write_text('[sweep]\nresults = "res"\n\n[[certify]]\ntasks = ["mt_bench"]\nmethods = ["pld"]\n'
                    'temperature = 0.7\nlevel = 2\n')
    with pytest.raises(ConfigError, match="level must be"):
        grid.load(path)


def test_a_certify_cell_runs_and_is_then_finished(tiny_model_dir, data, tmp_path, monkeypatch):
    from bpdbench.sweep import cells, commands, grid
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "g.toml"
    path.write_text("\n".join([
        "[sweep]", f'results = "{tmp_path / "res"}"', "", "[[certify]]", 'tasks = ["xsum"]', 'methods = ["pld"]',
        f'model = "{tiny_model_dir}"', 'dtype = "float32"', "temperature = 1.0", "limit = 1", "samples = 20",
        "positions = 1", 'rules = ["exact"]']))
    plan = grid.load(path, data=str(data))
    monkeypatch.setenv("BPDBENCH_RESULTS", str(plan.results))
    monkeypatch.setenv("BPDBENCH_DATA", str(data))
    (cell,) = plan.cells
    assert not commands.finished(cell, plan.results)
    assert cells.run_cell(cell, 0, "sweep/g", None)["status"] == "ok"
    assert commands.finished(cell, plan.results)
    meta = json.loads((plan.results / cell.rel / "certify.json").read_text())
    assert meta["methods"] == ["pld"] and meta["sweep"]["cell"] == cell.rel


def test_reference_grid_plans_the_reproduction(tmp_path, monkeypatch):
    """grids/reference.toml is the reproduction script of the time as a grid: what it runs and what waits for what
    (on an empty cache: the heads' distillation data is planned only where the heads are missing)."""
    from bpdbench.sweep import grid
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path / "cache"))
    ref = Path(__file__).resolve().parents[2] / "grids" / "reference.toml"
    if not (Path(__file__).resolve().parents[3] / "shared" / "data" / "xsum").is_dir():
        pytest.skip("needs ../shared/data")
    plan = grid.load(ref, results=str(tmp_path / "results"), limit=2)
    counts = {k: sum(c.command == k for c in plan.cells) for k in ("tune", "replay", "oracle", "analyze", "speed")}
    assert counts == {"tune": 18, "replay": 6, "oracle": 6, "analyze": 6, "speed": 1}
    m = "qwen2.5-coder-0.5b"
    from bpdbench.train.pacing import resolve_dtype
    gen = resolve_dtype("auto", log=lambda s: None)[0]     # the heads generate in this machine's fast dtype
    assert {a.id for a in plan.artefacts} == {f"model-bfloat16:{m}", f"heads-quick:{m}", f"ngram2:{m}",
                                              f"ngram4:{m}", f"neural-m:{m}", f"model-{gen}:{m}",
                                              f"distill-heads-quick:{m}",
                                              f"calibration-bfloat16-cpu-2t:{m}"}      # the speed cell's, timed last
    curve = next(a for a in plan.artefacts if a.kind == "calibration")
    assert set(curve.needs) == {a.id for a in plan.artefacts} - {curve.id} and plan.artefacts[-1] == curve
    neural = next(a for a in plan.artefacts if a.detail == "neural-m")
    assert set(neural.needs) == {f"heads-quick:{m}", f"model-bfloat16:{m}"}
    replay = next(c for c in plan.cells if c.id == "replay/xsum")
    assert {f"tune:{m}/xsum/{r}" for r in ("ngram4", "16best-ngram4", "neural-m")} <= set(replay.needs)
    assert replay.config.limit == 2 and len(replay.options["methods"].split(",")) == 14
    code, text = cli("sweep", ref, "--results", tmp_path / "results", "--dry-run")
    assert code == 0 and "37 cells (0 finished, 37 to run)" in text, text
    tuned = grid.only(plan, ["tune:*"])     # the tuned alphas re-made alone: their cells and what they wait for
    assert {c.command for c in tuned.cells} == {"tune"} and len(tuned.cells) == 18 and not tuned.tables
    assert {a.id for a in tuned.artefacts} == {f"model-bfloat16:{m}", f"heads-quick:{m}", f"ngram4:{m}",
                                               f"neural-m:{m}", f"model-{gen}:{m}", f"distill-heads-quick:{m}"}
    just_replay = grid.only(plan, ["replay/xsum"])
    assert {c.id for c in just_replay.cells} == {"replay/xsum"} | {f"tune:{m}/xsum/{r}" for r in
                                                                   ("ngram4", "16best-ngram4", "neural-m")}
    code, text = cli("sweep", ref, "--results", tmp_path / "results", "--dry-run", "--only", "nothing*")
    assert code != 0 and "no cell of" in text and "--dry-run` lists them" in text, text
