"""`bpdbench sweep` on a local Ray cluster of two single-CPU workers with the tiny model: the merged results equal the
same cells run one by one through the CLI, a worker killed mid-cell is recovered without lost or doubled examples, a
cell that keeps failing is retried, reported and makes the sweep exit non-zero, and a finished sweep runs nothing
(Ray is not even started). Grid files are validated before anything loads: one `error:` line, exit 2."""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import time
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from bpdbench.cli import app
from tests.integration.test_refinement_cli import kenlm_required  # noqa: F401 (a fixture)

def needs_ray(test):
    """A test that starts a local Ray instance: the `ray` tier, skipped where Ray is not installed."""
    missing = importlib.util.find_spec("ray") is None
    return pytest.mark.ray(pytest.mark.skipif(missing, reason="Ray not installed (make install)")(test))

TIMING = {"seconds", "ref_seconds", "tokens_per_s", "speedup_vs_ar"}
COMMON = {"model": None, "dtype": "float32", "heads_profile": "init", "heads": 2, "limit": 3, "max_new_tokens": 12}
RUN_METHODS = ["ar", "pld", "bpd", "bpd:heads=1"]


def cli(*args) -> tuple[int, str]:
    result = CliRunner().invoke(app, [str(a) for a in args])
    return result.exit_code, result.output


def write(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """xsum and mt_bench fixtures in their task layouts (synthetic text, no dataset in the repo)."""
    root = tmp_path_factory.mktemp("data")
    write(root / "xsum" / "test.jsonl", [{"id": f"x{i}", "document": f"Story {i}: the cat sat on the mat while "
                                          f"{i} dogs ran past the old mill.", "summary": "a cat"} for i in range(12)])
    write(root / "mt_bench" / "question.jsonl", [{"question_id": i, "category": ["writing", "math"][i % 2],
                                                  "turns": [f"Write two lines about {i} foxes.", "More."]}
                                                 for i in range(12)])
    return root


def grid_text(model: Path, results: Path, data: Path, cache: Path, extra: str = "") -> str:
    lines = [f'results = "{results}"', f'data = "{data}"', f'cache = "{cache}"', "threads = 1", "retries = 1"]
    defaults = [f'{k} = {json.dumps(str(model) if k == "model" else v)}' for k, v in COMMON.items()]
    return "\n".join(["[sweep]", *lines, "", "[defaults]", *defaults, "",
                      "[[run]]", 'tasks = ["xsum", "mt_bench"]', f"methods = {json.dumps(RUN_METHODS)}", "",
                      "[[replay]]", 'tasks = ["xsum"]', 'methods = ["bpd", "pld", "16best-0gram"]', "",
                      "[[oracle]]", 'tasks = ["mt_bench"]', "k = 4", "",
                      "[[speed]]", 'tasks = ["mt_bench"]', 'methods = ["ar", "pld"]', "repeats = 1",
                      "max_new_tokens = 8", "", extra])


def serial(tmp: Path, model: Path, data: Path, monkeypatch) -> Path:
    """The same cells, one command after another, as the reproduction script of the time ran them."""
    root = tmp / "serial"
    monkeypatch.setenv("BPDBENCH_RESULTS", str(root))
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp / "serial-cache"))
    monkeypatch.setenv("BPDBENCH_DATA", str(data))
    common = ["--model", model, "--dtype", "float32", "--heads-profile", "init", "--heads", "2", "--limit", "3",
              "--max-new-tokens", "12", "--threads", "1"]
    for task in ("xsum", "mt_bench"):
        for m in RUN_METHODS:
            code, text = cli("run", "--task", task, "--method", m, *common)
            assert code == 0, text
    assert cli("replay", "--task", "xsum", "--methods", "bpd,pld,16best-0gram", *common)[0] == 0
    assert cli("oracle", "--task", "mt_bench", "--k", "4", *common)[0] == 0
    return root


def records(path: Path) -> list[dict]:
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return sorted(({k: v for k, v in r.items() if k not in TIMING} for r in rows), key=lambda r: r["id"])


def assert_same_results(a: Path, b: Path) -> int:
    """Every example's tokens, counters and certificate, every summary and config, timing excluded."""
    n = 0
    for folder in sorted(p.parent for p in a.glob("runs/*/examples.jsonl")):
        other = b / folder.relative_to(a)
        assert records(folder / "examples.jsonl") == records(other / "examples.jsonl"), folder.name
        sa, sb = (pd.read_csv(f / "summary.csv").drop(columns=list(TIMING), errors="ignore") for f in (folder, other))
        pd.testing.assert_frame_equal(sa, sb)
        n += 1
    for name in ("replay/xsum", "oracle/mt_bench"):
        assert records(a / name / "replay.jsonl") == records(b / name / "replay.jsonl"), name
        pd.testing.assert_frame_equal(pd.read_csv(a / name / "replay.csv"), pd.read_csv(b / name / "replay.csv"))
        n += 1
    for conf in a.glob("*/*/config.json"):
        ca, cb = (json.loads(p.read_text())["config"] for p in (conf, b / conf.relative_to(a)))
        assert {k: v for k, v in ca.items() if k not in ("threads", "resume")} == \
               {k: v for k, v in cb.items() if k not in ("threads", "resume")}, conf
    return n


@needs_ray
def test_sweep_equals_serial_recovers_a_killed_worker_and_reruns_nothing(tiny_model_dir, data, tmp_path,
                                                                          monkeypatch):
    from bpdbench.sweep import driver, grid

    path = tmp_path / "grid.toml"
    path.write_text(grid_text(tiny_model_dir, tmp_path / "results", data, tmp_path / "cache"))
    plan = grid.load(path)
    assert len(plan.cells) == 11     # 8 run + replay + oracle + speed; init heads, a folder: only the timed cell's
    assert [(a.kind, a.detail) for a in plan.artefacts] == [("calibration", "float32-cpu-1t")]     # cost curve
    once = tmp_path / "worker-died"
    victim = next(c for c in plan.cells if c.id.startswith("runs/xsum") and c.config.method == "bpd")
    plan.cells[plan.cells.index(victim)] = dataclasses.replace(victim, hooks={"exit_after_examples": 1,
                                                                              "once_file": str(once)})
    t = time.time()
    report = driver.run(plan, "local", cpus=2, log=print)
    print(f"sweep of 11 cells on 2 workers: {time.time() - t:.1f}s")
    assert once.exists(), "the hook never killed the worker"
    assert driver.exit_code(report) == 0, report
    assert [c["status"] for c in report["cells"]] == ["ok"] * 11
    died = next(c for c in report["cells"] if c["id"] == victim.id)
    assert died["interrupted"] == 1                      # the retry found the dead attempt's state and resumed
    ids = [json.loads(x)["id"] for x in (plan.results / victim.rel / "examples.jsonl").read_text().splitlines()]
    assert sorted(ids) == ["x0", "x1", "x2"]             # none lost, none doubled
    hosts = {c["host"] for c in report["cells"]}
    assert hosts and (plan.results / "sweep" / "grid" / "report.json").exists()

    assert assert_same_results(serial(tmp_path, tiny_model_dir, data, monkeypatch), plan.results) == 10

    before = {p: p.stat().st_mtime_ns for p in plan.results.rglob("*") if p.is_file() and "sweep" not in p.parts}
    monkeypatch.setattr(driver, "connect", lambda *a, **k: pytest.fail("a finished sweep started Ray"))
    again = driver.run(grid.load(path), "local", cpus=2, log=print)
    assert again["counts"] == {"finished": 11} and not again["failed"]
    assert before == {p: p.stat().st_mtime_ns for p in before}

    import shutil
    from bpdbench.sweep import commands
    moved = tmp_path / "elsewhere" / "results"          # the same tree in another checkout: nothing to rerun
    shutil.copytree(plan.results, moved)
    elsewhere = tmp_path / "elsewhere" / "grid.toml"
    elsewhere.write_text(grid_text(tiny_model_dir, moved, data, tmp_path / "cache"))
    assert all(commands.finished(c, moved) for c in grid.load(elsewhere).cells)


@needs_ray
def test_failing_cell_is_retried_reported_and_exits_nonzero(tiny_model_dir, data, tmp_path):
    from bpdbench.sweep import driver, grid

    path = tmp_path / "grid.toml"
    path.write_text("\n".join([
        "[sweep]", f'results = "{tmp_path / "results"}"', f'data = "{data}"', "retries = 2", "",
        "[[run]]", 'tasks = ["xsum"]', 'methods = ["ar", "pld"]', f'model = "{tiny_model_dir}"', 'dtype = "float32"',
        "limit = 2", "max_new_tokens = 6"]))
    plan = grid.load(path)
    bad = next(c for c in plan.cells if c.config.method == "pld")
    plan.cells[plan.cells.index(bad)] = dataclasses.replace(bad, hooks={"fail": True})
    report = driver.run(plan, "local", cpus=2, log=print)
    by_id = {c["id"]: c for c in report["cells"]}
    assert by_id[bad.id]["status"] == "failed" and by_id[bad.id]["attempts"] == 3
    assert "test hook" in by_id[bad.id]["error"] and report["failed"] == [bad.id]
    assert [c["status"] for c in report["cells"] if c["id"] != bad.id] == ["ok"]
    assert driver.exit_code(report) == 1
    assert json.loads((plan.results / "sweep" / "grid" / "report.json").read_text())["failed"] == [bad.id]


@needs_ray
def test_artefacts_once_then_tune_then_the_replay_reading_its_alpha(tiny_model_dir, data, tmp_path, kenlm_required):
    """The 2-gram and cascade's bigram table are built once by their own tasks (the table through cascade's first
    use); the replay waits for the tune cell and reads the alpha it stored."""
    from bpdbench.sweep import driver, grid
    corpus = tmp_path / "data"
    import shutil
    shutil.copytree(data, corpus)
    write(corpus / "corpus" / "c4_en_validation_2k.jsonl", [{"text": f"the cat sat on the mat and {i} dogs ran past the mill"}
                                           for i in range(200)])
    path = tmp_path / "grid.toml"
    path.write_text("\n".join([
        "[sweep]", f'results = "{tmp_path / "results"}"', f'data = "{corpus}"', f'cache = "{tmp_path / "cache"}"',
        "", "[defaults]", *[f'{k} = {json.dumps(str(tiny_model_dir) if k == "model" else v)}'
                              for k, v in COMMON.items()], "k = 4", "",
        "[[tune]]", 'tasks = ["xsum"]', 'methods = ["ngram2"]', "limit = 2", "",
        "[[replay]]", 'tasks = ["xsum"]', 'methods = ["bpd", "ngram2", "cascade"]', "",
        "[[analyze]]", 'tasks = ["xsum"]']))
    plan = grid.load(path)
    assert [a.id for a in plan.artefacts] == [f"ngram2:{tiny_model_dir}", f"corpus bigram table:{tiny_model_dir}"]
    replay = next(c for c in plan.cells if c.command == "replay")
    assert f"tune:{tiny_model_dir}/xsum/ngram2" in replay.needs
    report = driver.run(plan, "local", cpus=2, log=print)
    assert driver.exit_code(report) == 0 and [a["status"] for a in report["artefacts"]] == ["built"] * 2, report
    table = json.loads((plan.results / "alpha.json").read_text())
    alpha, saw = table[f"{tiny_model_dir}/xsum/ngram2"], table["_saw"][f"{tiny_model_dir}/xsum/ngram2"]
    assert saw["split"] == "tune" and 0 < len(saw["examples"]) <= 2      # what the alpha was picked on
    resolved = json.loads((plan.results / "replay" / "xsum" / "config.json").read_text())["resolved"]["methods"]
    ngram2 = resolved["ngram2:heads=2,k=4"]                  # heads and k are part of what it drafts, and its label
    assert ngram2["alpha"] == alpha and ngram2["alpha_source"].split("#")[0].endswith("alpha.json")
    assert ngram2["alpha_table"]["seen"] == {"ids": {"xsum": saw["examples"]}}   # what audit counts
    from bpdbench.experiments import audit
    seen = audit.folder(plan.results / "replay" / "xsum")["artefacts"]
    assert seen["methods.ngram2:heads=2,k=4.alpha_table"]["overlap"] == 0, seen
    assert (plan.results / "analysis" / "xsum" / "entropy.csv").exists()
    assert driver.run(grid.load(path), "local", log=print)["counts"] == {"finished": 3}


def test_a_cell_waits_for_what_it_needs_and_says_which_failed(tiny_model_dir, data, tmp_path):
    from bpdbench.sweep import cells, grid
    path = tmp_path / "g.toml"
    path.write_text(f'[[run]]\ntasks = ["xsum"]\nmodel = "{tiny_model_dir}"\ndata_file = "{data}/xsum/test.jsonl"\n')
    cell = grid.load(path, data=str(data)).cells[0]
    res = cells.run_cell(cell, 0, "sweep/g", None, {"id": "heads-quick:m", "status": "failed"})
    assert res["status"] == "blocked" and "heads-quick:m" in res["error"]


def test_grid_expansion(tiny_model_dir, data, tmp_path):
    """Keys resolve as documented: block over [defaults] over the command's CLI defaults; CLI options over the grid."""
    from bpdbench.hardware.dtype import choose
    from bpdbench.sweep import grid
    (tmp_path / "sub").mkdir()
    write(tmp_path / "sub" / "p.jsonl", [{"id": "a", "prompt": "hello"}, {"id": "b", "prompt": "there"}])
    path = tmp_path / "sub" / "g.toml"
    path.write_text("\n".join([
        "[sweep]", 'results = "out"', "threads = 1", "", "[defaults]", 'models = ["qwen2.5-coder-0.5b"]', "limit = 40",
        "", "[[replay]]", 'tasks = ["xsum"]', 'folder = "medusa"', 'methods = "bpd,medusa"', "threads = 2",
        "", "[[run]]", 'task = "prompts"', f'model = "{tiny_model_dir}"', 'method = "pld"', 'data_file = "p.jsonl"',
        'limit = "all"', "", "[[speed]]", 'tasks = ["mt_bench"]', "per_category = 3", "", "[[oracle]]",
        'tasks = ["mt_bench"]', "limit = 1"]))
    plan = grid.load(path, data=str(data))
    by_kind = {c.command: c for c in plan.cells}
    assert plan.results == tmp_path / "sub" / "out" and plan.env() == {"BPDBENCH_RESULTS": str(plan.results),
                                                                    "BPDBENCH_DATA": str(data)}
    replay, run, speed = by_kind["replay"], by_kind["run"], by_kind["speed"]
    assert replay.rel == "medusa/xsum" and replay.config.out == str(plan.results / "medusa" / "xsum")
    assert replay.threads == 2 and replay.config.threads == 2 and replay.config.limit == 40
    assert run.config.model == str(tiny_model_dir) and run.config.limit is None and run.threads == 1
    assert run.config.data_file == str(tmp_path / "sub" / "p.jsonl") and run.config.out is None
    assert speed.config.max_new_tokens == 128 and speed.options["repeats"] == 3   # speed's own CLI defaults
    sampled = tmp_path / "s.toml"
    sampled.write_text("\n".join([
        "[defaults]", "top_p = 0.9", "", "[[run]]", 'tasks = ["xsum"]', "temperatures = [0, 0.7]", "seeds = [0, 1]",
        "", "[[speed]]", 'tasks = ["mt_bench"]', "temperature = 0.7", "", "[[oracle]]", 'tasks = ["xsum"]']))
    cells = {c.id: c.config for c in grid.load(sampled, data=str(data)).cells}
    m, d = "qwen2.5-coder-0.5b", choose().dtype         # dtype auto: the cell names the dtype it runs in
    assert set(cells) == {f"runs/xsum-{m}-bpd-{d}", f"runs/xsum-{m}-bpd-T0.7-p0.9-{d}",
                          f"runs/xsum-{m}-bpd-T0.7-p0.9-s1-{d}", "speed/mt_bench-T0.7-p0.9", "oracle/xsum"}
    assert {c.dtype for c in cells.values()} == {d}
    assert (cells[f"runs/xsum-{m}-bpd-{d}"].top_p, cells["oracle/xsum"].top_p) == (None, None)  # greedy
    assert cells["speed/mt_bench-T0.7-p0.9"].out.endswith("speed/mt_bench-T0.7-p0.9")
    with pytest.raises(grid.GridError, match="--results"):   # a reduced pass never overwrites the full grid's
        grid.load(path, data=str(data), limit=2)
    capped = grid.load(path, data=str(data), limit=2, threads=3, results=str(tmp_path / "quick"))
    assert {c.command: c.config.limit for c in capped.cells} == {"replay": 2, "run": 2, "speed": 2, "oracle": 1}
    assert next(c for c in capped.cells if c.command == "speed").options["per_category"] == 2
    assert "per_category" not in next(c for c in capped.cells if c.command == "replay").options
    assert {c.threads for c in capped.cells} == {3}


GRID_CASES = [
    ("missing-file", None, ["grid file not found"]),
    ("not-toml", "[[run]\ntasks = 1", ["not valid TOML"]),
    ("unknown-table", "[[decode]]\ntasks = [\"xsum\"]", ["unknown table [decode]", "[[run]]"]),
    ("unknown-key", "[[run]]\ntasks = [\"xsum\"]\nlimt = 3", ["[[run]] 1", "unknown key 'limt'", "limit"]),
    ("unknown-method", "[[run]]\ntasks = [\"xsum\"]\nmethods = [\"warp\"]", ["unknown method 'warp'", "valid:"]),
    ("unknown-task", "[[run]]\ntasks = [\"nope\"]", ["unknown task 'nope'", "valid:"]),
    ("limit-zero", "[[run]]\ntasks = [\"xsum\"]\nlimit = 0", ["limit must be >= 1"]),
    ("limit-text", "[[run]]\ntasks = [\"xsum\"]\nlimit = \"many\"", ["limit must be int", '"all"']),
    ("limit-float", "[[replay]]\ntasks = [\"xsum\"]\nlimit = 2.5", ["limit must be int"]),
    ("no-tasks", "[[run]]\nmethods = [\"ar\"]", ["name its tasks"]),
    ("tune-no-alpha", "[[tune]]\ntasks = [\"xsum\"]\nmethods = [\"bpd\"]", ["bpd has no alpha to tune"]),
    ("replay-external", "[[replay]]\ntasks = [\"xsum\"]\nmethods = [\"hf-pld\"]", ["hf-pld", "[[speed]]"]),
    ("same-folder", "[[replay]]\ntasks = [\"xsum\"]\nlimit = 2\n[[replay]]\ntasks = [\"xsum\"]\nlimit = 3",
     ["two cells write replay/xsum", "limit"]),
    ("sampling", "[[run]]\ntasks = [\"xsum\"]\ntemperatures = [-0.5]", ["temperature"]),
    ("replay-sampling", "[[replay]]\ntasks = [\"xsum\"]\ntemperatures = [0.7]", ["replay decodes greedily"]),
    ("threads-zero", "[sweep]\nthreads = 0\n[[run]]\ntasks = [\"xsum\"]", ["threads >= 1"]),
    ("sweep-key", "[sweep]\nworkers = 2\n[[run]]\ntasks = [\"xsum\"]", ["[sweep]", "unknown key 'workers'"]),
    ("not-array", "[run]\ntasks = [\"xsum\"]", ["[[run]] blocks"]),
    ("speed-repeats", "[[speed]]\ntasks = [\"mt_bench\"]\nrepeats = 0", ["repeats must be an integer >= 1"]),
    ("replay-per-category", "[[replay]]\ntasks = [\"xsum\"]\nper_category = 0", ["per_category must be an integer"]),
    ("gpu-on-cpu", "[sweep]\ngpus = 1\n[[run]]\ntasks = [\"xsum\"]", ["gpus = 1", "device"]),
    ("cuda-no-gpu", "[[run]]\ntasks = [\"xsum\"]\ndevice = \"cuda\"", ["needs gpus = 1"]),
    ("data-file", "[[run]]\ntasks = [\"prompts\"]\ndata_file = \"none.jsonl\"", ["data file not found"]),
    ("out-placeholder", "[[run]]\ntasks = [\"xsum\"]\nout = \"c/{task}-{methd}\"",
     ["[[run]] 1", "{methd}", "{method}"]),
    ("out-absolute", "[[run]]\ntasks = [\"xsum\"]\nout = \"/tmp/c/{task}\"", ["relative to the results root"]),
    ("out-dotdot", "[[replay]]\ntasks = [\"xsum\"]\nout = \"r/../../{task}\"", ["no '..'"]),
    ("out-brace", "[[run]]\ntasks = [\"xsum\"]\nout = \"c/{task\"", ["out = 'c/{task'", "brace"]),
    ("out-spec", "[[run]]\ntasks = [\"xsum\"]\nout = \"c/{method:.}\"", ["separator must be - or _"]),
    ("out-method", "[[replay]]\ntasks = [\"xsum\"]\nout = \"r/{method}\"", ["a replay cell has several"]),
    ("out-folder", "[[speed]]\ntasks = [\"xsum\"]\nfolder = \"s\"\nout = \"s/{task}\"", ["folder or out, not both"]),
    ("out-same-folder", "[[run]]\ntasks = [\"xsum\"]\nmethods = [\"bpd\", \"pld\"]\nout = \"c/{task}\"",
     ["two cells write c/xsum with different method", "out template"]),
    ("private-greedy", "[[run]]\ntasks = [\"xsum\"]\nprivate_greedy = 1", ["private_greedy must be true or false"]),
]


@pytest.mark.parametrize("case,text,expect", GRID_CASES, ids=[c[0] for c in GRID_CASES])
def test_sweep_refuses_bad_grids(case, text, expect, tmp_path, data):
    path = tmp_path / "grid.toml"
    if text is not None:
        path.write_text(text)
    code, out = cli("sweep", path, "--data", data, "--results", tmp_path / "results")
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in out, out
    for word in expect:
        assert word in errors[0], (word, errors[0])
    assert not (tmp_path / "results").exists()          # refused before anything ran or was written


@pytest.mark.parametrize("args,expect", [(["--address", "localhost"], "--address"), (["--limit", "0"], "--limit"),
                                          (["--cpus", "0"], "--cpus"),
                                          (["--limit", "5"], "--results")])
def test_sweep_refuses_bad_options(args, expect, tmp_path):
    path = tmp_path / "grid.toml"
    path.write_text("[[run]]\ntasks = [\"xsum\"]\n")
    code, out = cli("sweep", path, *args)
    assert code == 2 and out.startswith("error:") and expect in out, out


def _tune_like_writer(args: tuple) -> None:
    from bpdbench.store import update_json
    path, who = args
    for i in range(25):
        update_json(Path(path), lambda t, i=i: {**t, f"{who}/{i}": i})


def test_an_alpha_without_its_split_is_tuned_again():
    """alpha.json entries from before the splits were picked on the evaluated slice: the sweep tunes them again."""
    from bpdbench.refine import tuned_on_tune_split
    old = {"m/xsum/ngram2": 0.5}
    assert not tuned_on_tune_split(old, "m/xsum/ngram2")
    assert tuned_on_tune_split({**old, "_saw": {"m/xsum/ngram2": {"split": "tune", "examples": ["3"]}}},
                               "m/xsum/ngram2")
    assert not tuned_on_tune_split({**old, "_saw": {"m/xsum/ngram2": {"split": "eval"}}}, "m/xsum/ngram2")


def test_alpha_table_writers_side_by_side_keep_every_entry(tmp_path):
    """Tune cells of one sweep write the same alpha table at once: a read-modify-write without the lock loses keys."""
    import multiprocessing
    table = tmp_path / "alpha.json"
    with multiprocessing.get_context("fork").Pool(4) as pool:
        pool.map(_tune_like_writer, [(str(table), f"w{j}") for j in range(4)])
    assert len(json.loads(table.read_text())) == 100


def test_a_node_with_another_checkout_refuses_its_cells(tiny_model_dir, data, tmp_path):
    from bpdbench.config import git_commit
    from bpdbench.sweep import cells, grid
    path = tmp_path / "g.toml"
    path.write_text(f'[[run]]\ntasks = ["xsum"]\nmodel = "{tiny_model_dir}"\ndata_file = "{data}/xsum/test.jsonl"\n')
    cell = grid.load(path, data=str(data)).cells[0]
    if git_commit() == "unknown":
        pytest.skip("not a git checkout: the commit check has nothing to compare")
    res = cells.run_cell(cell, 0, "sweep/g", "0" * 40)
    assert res["status"] == "failed" and "0" * 40 in res["error"] and "every node" in res["error"]
