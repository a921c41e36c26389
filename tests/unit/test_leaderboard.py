"""The per-machine leaderboard (report/leaderboard.py) on synthetic speed folders: one page per CPU fingerprint (the
grid's boards) and one of its studies (here the results/speed* folders, which no grid made), no table mixing dtypes,
models or commits, every Markdown table at most 12 columns, headings that name the CPU, rows ranked by speedup,
acceptance per draft position from the run or a stand-in replay, old folders left out. The new page structure,
noise floor and paired verdicts: tests/unit/test_leaderboard_board.py."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

from bpdbench.experiments.speed import summarize
from bpdbench.report import leaderboard, plots, tables

CATEGORIES = ["writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities",
              "translation", "summarization", "qa", "math_reasoning", "rag"]
XEON = {"processor": "Intel(R) Xeon(R) Processor", "fingerprint": "f48c4d64e244",
        "cpu_flags": ["avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16"]}
EPYC = {"processor": "AMD EPYC", "fingerprint": "afcf1aeb72d2", "cpu_flags": ["avx2", "fma"]}
TIMES = {"c0": 100.0, "c1": 200.0}                  # commit -> time: c1 is the newer commit


def speed_folder(results: Path, name: str, cpu: dict | None, *, task="spec_bench", model="m-0.5b",
                 dtype="bfloat16", commit="c1", per_category=2, speedups=None, counts=False, kind="speed",
                 planned=None):
    """A `bpdbench speed` folder: records of ar and each method (method seconds = ar's / its speedup, slightly
    varied per prompt), speed.csv from the command's own summarize(), config.json with or without the machine."""
    speedups = speedups or {"bpd": 1.2, "pld": 1.5, "medusa": 0.9}
    records = []
    for c, cat in enumerate(CATEGORIES if task == "spec_bench" else ["writing"]):
        for i in range(per_category):
            pid = f"{cat}-{i}"
            for method, s in {"ar": 1.0, **speedups}.items():
                rec = {"id": pid, "category": cat, "method": method, "tokens": 32, "serial_calls": 32 if s == 1
                       else 24, "times": [1.0], "median_s": 1.0 / s * (1 + 0.03 * ((c + i) % 3)), "spread": 0.0,
                       "identical": True, "first_divergence": None, "certificate": "exact", "diverged_tokens": 0}
                if counts and method != "ar":
                    rec.update(steps=23, accepted_per_head=[8, 4, 1])
                records.append(rec)
    d = results / kind / name
    d.mkdir(parents=True)
    (d / "speed.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    summarize(records).to_csv(d / "speed.csv", index=False)
    env = {"cpu_count": 2, "threads": 2, "dtype": dtype, "versions": {"torch": "2.13.0+cpu"}, "git_commit": commit,
           **(cpu or {"processor": "AMD EPYC"})}
    (d / "config.json").write_text(json.dumps({
        "config": {"task": task, "model": model, "dtype": dtype, "limit": 26, "offset": 0, "max_new_tokens": 32,
                   "heads_profile": "quick", "threads": 2},
        "methods": ["ar", *speedups], "repeats": 2, "per_category": per_category,
        "resolved": {"max_new_tokens": 32, **({"n_selected": planned} if planned else {})}, "environment": env}))
    return d


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    r = tmp_path_factory.mktemp("template") / "results"
    many = {f"method{i}": 0.8 + 0.05 * i for i in range(14)}          # 14 methods x 13 categories: must split
    speed_folder(r, "spec_bench", XEON, speedups=many)
    speed_folder(r, "spec_bench-epyc", EPYC, counts=True)
    speed_folder(r, "mt_bench", XEON, task="mt_bench", per_category=4)
    speed_folder(r, "mt_bench-fp32", XEON, task="mt_bench", per_category=4, dtype="float32")
    speed_folder(r, "mt_bench-1.5b", XEON, task="mt_bench", per_category=4, model="m-1.5b")
    speed_folder(r, "mt_bench-old", XEON, task="mt_bench", per_category=4, commit="c0",
                 speedups={"bpd": 3.0})                                   # older commit, same protocol: left out
    speed_folder(r, "mt_bench-field", XEON, task="mt_bench", per_category=4, speedups={"rest": 1.1},
                 kind="speed-field")                                      # same commit and protocol: merged
    speed_folder(r, "mt_bench-legacy", None, task="mt_bench", per_category=4)   # no fingerprint: older recipe
    return r


@pytest.fixture()
def results(template, tmp_path, monkeypatch):
    """A fresh copy of the folders (tests add files), commit times from TIMES instead of this checkout's git."""
    monkeypatch.setattr(leaderboard, "commit_time", lambda c: TIMES.get(c.removesuffix("-dirty")))
    return Path(shutil.copytree(template, tmp_path / "results"))


@pytest.fixture()
def no_drawing(monkeypatch):
    """Figures are drawn once, in the build test; elsewhere a stub PNG keeps the pages' tests quick."""
    monkeypatch.setattr(plots, "speedup_bars", lambda *a, **k: b"\x89PNG stub")


def test_one_page_per_fingerprint_and_old_folders_left_out(results, no_drawing):
    lb = leaderboard.collect(results)
    assert [m.fingerprint for m in lb.machines] == ["afcf1aeb72d2", "f48c4d64e244"]
    out = results / "tables"
    out.mkdir()
    tables.leaderboard_files(results, out)
    pages = sorted(p.name for p in (out / "leaderboard").glob("*.md"))
    assert pages == ["afcf1aeb72d2-studies.md", "afcf1aeb72d2.md", "f48c4d64e244-studies.md", "f48c4d64e244.md"]
    assert all(not m.boards for m in lb.machines)           # no folder here is the leaderboard grid's
    index = (out / "leaderboard.md").read_text()
    assert "[afcf1aeb72d2](leaderboard/afcf1aeb72d2.md)" in index and "Intel(R) Xeon(R) Processor" in index
    left = dict(lb.left_out)
    assert "lacks environment.fingerprint" in left["speed/mt_bench-legacy"]
    assert "older than c1" in left["speed/mt_bench-old"]
    assert (out / "leaderboard.html").read_text().count("<h2 id=") == 2


def test_a_table_never_mixes_machines_dtypes_models_or_commits(results):
    lb = leaderboard.collect(results)
    keys = []
    for m in lb.machines:
        for b in [*m.boards, *m.studies]:
            envs = [r.env for r in b.runs]
            assert {e["fingerprint"] for e in envs} == {m.fingerprint}
            assert {r.folder.model for r in b.runs} == {b.model} and {r.folder.dtype for r in b.runs} == {b.dtype}
            assert len({e["git_commit"] for e in envs}) == 1
            keys.append((m.fingerprint, b.task, b.model, b.dtype))
    assert len(keys) == len(set(keys)) == 5              # bf16, fp32 and 1.5B apart; the field folder merged
    (merged,) = [b for m in lb.machines for b in m.studies
                 if (b.task, b.model, b.dtype) == ("mt_bench", "m-0.5b", "bfloat16")]
    assert [r.rel for r in merged.runs] == ["speed-field/mt_bench-field", "speed/mt_bench"]
    assert merged.rows.method.value_counts().max() == 1 and "rest" in set(merged.rows.method)
    assert (merged.rows.speedup_vs_ar < 2.0).all()       # the older commit's 3.0x bpd is not on the board


def test_every_markdown_table_fits_twelve_columns_and_names_the_cpu(results, no_drawing):
    out = results / "tables"
    out.mkdir()
    tables.leaderboard_files(results, out)
    md = [out / "leaderboard.md", *(out / "leaderboard").glob("*.md")]
    headers = [line for p in md for line in p.read_text().splitlines() if re.match(r"^\|---", line)]
    assert headers and all(line.count("|") - 1 <= leaderboard.MAX_COLUMNS for line in headers)
    page = (out / "leaderboard" / "f48c4d64e244.md").read_text()
    assert page.startswith("# Leaderboard: Intel(R) Xeon(R) Processor, fingerprint f48c4d64e244")
    page = (out / "leaderboard" / "f48c4d64e244-studies.md").read_text()
    assert page.count("Speedup by category (1/2)") == 1                 # 13 categories, 15 methods: split
    for b in leaderboard.collect(results).machines[1].studies:
        for what in ("Intel(R) Xeon(R) Processor", "avx2 avx512f avx512_bf16 amx_bf16", "2 cores, 2 threads",
                     b.dtype, "torch 2.13.0+cpu", "commit c1", "n = ", "new tokens"):
            assert what in b.caption, (what, b.caption)
        assert all("Intel(R) Xeon(R) Processor" in t.title for t in b.tables)
        assert f"## {b.heading}\n\n{b.caption}" in page


def test_rows_are_ranked_by_speedup_and_the_verdict_names_the_best(results):
    lb = leaderboard.collect(results)
    for m in lb.machines:
        for b in m.studies:
            s = b.rows.speedup_vs_ar.tolist()
            assert s == sorted(s, reverse=True)
            shown = b.tables[0].frame
            assert shown["#"].tolist() == list(range(1, len(shown) + 1))
            assert shown.method.tolist() == b.rows.method.tolist()
    (epyc,) = lb.machines[0].studies
    assert epyc.rows.method.iloc[0] == "pld" and "pld 1.5" in epyc.verdict
    which = [t for t in epyc.tables if t.id.endswith("-which")][0].frame
    assert which.method.tolist() == ["pld", "bpd", "medusa"] and which["against the best"].iloc[0] == "best"


def test_acceptance_per_position_from_the_run_a_replay_or_na(results):
    lb = leaderboard.collect(results)
    (epyc,) = lb.machines[0].studies                   # speed.jsonl with steps and accepted_per_head
    a, src = epyc.accept["pld"]
    assert src == "this run" and a == pytest.approx([8 / 23, 4 / 23, 1 / 23])
    assert "ar" not in epyc.accept
    xeon = [b for b in lb.machines[1].studies if b.task == "mt_bench" and b.dtype == "bfloat16"
            and b.model == "m-0.5b"][0]
    assert xeon.accept["bpd"] == ([], "n/a")
    replay = results / "replay" / "mt_bench"                          # a stand-in replay of the same setting
    replay.mkdir(parents=True)
    (replay / "config.json").write_text(json.dumps({
        "config": {"task": "mt_bench", "model": "m-0.5b", "dtype": "bfloat16", "heads_profile": "quick"},
        "methods": ["bpd"], "environment": {"dtype": "bfloat16"}}))
    (replay / "replay.jsonl").write_text(json.dumps({"id": "a", "new_tokens": 9, "bpd": {
        "steps": 10, "accepted_per_head": [5, 2, 0, 0]}}) + "\n")
    xeon = [b for b in leaderboard.collect(results).machines[1].studies if b.task == "mt_bench"
            and b.dtype == "bfloat16" and b.model == "m-0.5b"][0]
    assert xeon.accept["bpd"] == ([0.5, 0.2, 0.0, 0.0], "replay/mt_bench")


def test_build_keeps_the_wide_csv_and_retires_the_wide_markdown(results):
    out = results / "tables"
    out.mkdir()
    (out / "speed.md").write_text("# the old 35-column table\n")
    written = tables.build(results)
    assert not (out / "speed.md").exists() and not (out / "speed_by_category.md").exists()
    wide = pd.read_csv(out / "speed.csv")
    assert {"folder", "fingerprint", "cpu", "commit"} <= set(wide.columns)
    assert set(wide.folder) >= {"speed/spec_bench", "speed-field/mt_bench-field", "speed/mt_bench-legacy"}
    rows = pd.read_csv(out / "leaderboard.csv")
    assert {"fingerprint", "board", "rank", "speedup_vs_ar", "a_1"} <= set(rows.columns)
    assert out / "leaderboard.html" in written and (out / "leaderboard.html").stat().st_size > 10_000
    pngs = sorted((out / "leaderboard").glob("*.png"))
    assert len(pngs) == 5 and all(p.read_bytes()[:4] == b"\x89PNG" for p in pngs)
    assert "data:image/png;base64," in (out / "leaderboard.html").read_text()


def test_fit_splits_wide_frames_keeping_the_row_labels():
    wide = pd.DataFrame({"method": ["a"], **{f"c{i}": [i] for i in range(25)}})
    parts = leaderboard.fit(wide)
    assert len(parts) == 3 and all(len(p.columns) <= 12 and p.columns[0] == "method" for p in parts)
    assert sum(len(p.columns) - 1 for p in parts) == 25


def test_folders_that_evaluated_train_or_tune_examples_are_left_out(results, no_drawing):
    """The leaderboard takes only folders `bpdbench audit` finds clean: one whose prompts include a train example
    (MT-Bench question 90, index 9) is left out; the control, the same folder with eval ids, is placed."""
    import tasks
    if tasks.default_data_dir() is None or not (tasks.default_data_dir() / "mt_bench").is_dir():
        pytest.skip("needs ../shared/data/mt_bench to classify the ids")
    d = speed_folder(results, "mt_bench-leak", EPYC, task="mt_bench", per_category=1, speedups={"pld": 1.4})
    text = (d / "speed.jsonl").read_text()
    (d / "speed.jsonl").write_text(text.replace('"writing-0"', '"90"'))
    left = dict(leaderboard.collect(results).left_out)
    assert "overlap: 1 train" in left["speed/mt_bench-leak"]
    (d / "speed.jsonl").write_text(text.replace('"writing-0"', '"81"'))
    assert "speed/mt_bench-leak" not in dict(leaderboard.collect(results).left_out)


def test_a_label_run_with_a_default_since_changed_says_so():
    """`sam` measured before its default became the published one ran 9 tokens, threshold 4, bias 4, no fallback:
    its row must not read as today's `sam`; a label that spelled its values is what it says."""
    old = {"tokens": 9, "threshold": 4, "bias": 4}
    assert leaderboard.older_default("sam", old) == \
        "sam [older default: tokens=9, threshold=4, bias=4, fallback=none]"
    assert leaderboard.older_default("sam", {"tokens": 39, "threshold": 5, "bias": 5, "fallback": "recycling"}) == "sam"
    assert leaderboard.older_default("sam:tokens=9,threshold=4,bias=4,fallback=none", old) == \
        "sam:tokens=9,threshold=4,bias=4,fallback=none"
    assert leaderboard.older_default("hydra:tree=dynamic", {"nodes": 16, "topk": 4}) == \
        "hydra:tree=dynamic [older default: nodes=16, topk=4]"
    assert leaderboard.older_default("pld", {"tokens": 10}) == "pld"


def test_recycling_timed_before_the_state_restore_is_marked():
    """Folders made before speed restored drafter state per repeat have no repeat_drift column; a method that kept
    state then (recycling, or sam with it as fallback) is renamed to say its repeats saw their own output."""
    assert leaderboard.keeps_state("recycling", {"persist": 1}) and not leaderboard.keeps_state("recycling:persist=0",
                                                                                               {"persist": 0})
    assert leaderboard.keeps_state("sam", {"fallback": "recycling"}) and not leaderboard.keeps_state("pld", {})


def test_the_leaderboard_grids_folder_is_read_and_a_run_still_going_says_partial(tmp_path, monkeypatch):
    """grids/leaderboard.toml writes results/leaderboard-<machine>/<task>: it is placed (not only results/speed*), and while
    its run is accumulated over sittings its board says how many of the planned prompts it holds."""
    monkeypatch.setattr(leaderboard, "commit_time", lambda c: TIMES.get(c.removesuffix("-dirty")))
    speed_folder(tmp_path, "spec_bench", EPYC, kind="leaderboard-afcf1aeb72d2", per_category=1, planned=39)
    speed_folder(tmp_path, "mt_bench", EPYC, kind="leaderboard-afcf1aeb72d2", task="mt_bench", per_category=16,
                 planned=16)
    boards = {b.task: b for m in leaderboard.collect(tmp_path).machines for b in m.boards}
    for b in boards.values():
        leaderboard.describe(b)
    assert "PARTIAL: 13 of the 39 planned prompts" in boards["spec_bench"].heading
    assert "PARTIAL" not in boards["mt_bench"].heading


def test_the_heading_counts_the_prompts_per_category_it_holds_not_the_planned_number(tmp_path, monkeypatch):
    """`--limit 3` on a grid planned at 3 per category measures 1 prompt in each of 3 categories: the heading says
    1 per category, never the plan's 3."""
    monkeypatch.setattr(leaderboard, "commit_time", lambda c: TIMES.get(c.removesuffix("-dirty")))
    d = speed_folder(tmp_path, "spec_bench", EPYC, kind="leaderboard", per_category=1, planned=39)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "per_category": 3}))
    (b,) = [b for m in leaderboard.collect(tmp_path).machines for b in m.boards]
    leaderboard.describe(b)
    assert "(1 per category, 13 categories; PARTIAL: 13 of the 39" in b.heading and "3 per category" not in b.heading


def test_two_boards_of_one_benchmark_say_which_experiment_and_the_grid_s_comes_first(tmp_path, monkeypatch):
    """A frontier study of the same machine and benchmark is another protocol, hence another board: its heading (and
    its "which drafter" line) names its experiment, and the leaderboard grid's board is listed before it."""
    monkeypatch.setattr(leaderboard, "commit_time", lambda c: TIMES.get(c.removesuffix("-dirty")))
    speed_folder(tmp_path, "mt_bench", EPYC, kind="leaderboard-afcf1aeb72d2", task="mt_bench", per_category=8,
                 speedups={"pld": 1.5})
    d = speed_folder(tmp_path, "mt_bench", EPYC, kind="frontier-stop", task="mt_bench", per_category=8,
                     speedups={"bpd": 1.2, "pld": 1.4, "medusa": 0.9})
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "repeats": 3}))           # another protocol: another board
    (machine,) = leaderboard.collect(tmp_path).machines
    (grid,), (study,) = machine.boards, machine.studies
    assert grid.heading.endswith("· leaderboard-afcf1aeb72d2") and study.heading.endswith("· frontier-stop")
    assert "frontier-stop" in study.why_study


def test_a_newer_study_under_the_grid_s_protocol_sits_beside_the_grid_s_board(tmp_path, monkeypatch):
    """A frontier study of a few rows, newer and under the same protocol as the leaderboard grid's folder, is its own
    board: the grid's board keeps its folder (not left out as older), the study's is listed after it."""
    monkeypatch.setattr(leaderboard, "commit_time", lambda c: TIMES.get(c.removesuffix("-dirty")))
    speed_folder(tmp_path, "mt_bench", EPYC, kind="leaderboard-afcf1aeb72d2", task="mt_bench", per_category=8,
                 commit="c0", speedups={"pld": 1.5, "bpd": 1.1})
    speed_folder(tmp_path, "mt_bench", EPYC, kind="frontier-rescore", task="mt_bench", per_category=8, commit="c1",
                 speedups={"pld": 1.6})
    board = leaderboard.collect(tmp_path)
    (machine,) = board.machines
    assert [[r.rel for r in b.runs] for b in [*machine.boards, *machine.studies]] == [
        ["leaderboard-afcf1aeb72d2/mt_bench"], ["frontier-rescore/mt_bench"]]
    assert not board.left_out


def test_an_auto_row_that_sized_itself_to_ar_is_marked_and_never_named_best(tmp_path, monkeypatch, no_drawing):
    """`auto` may find no shape faster than AR (trees on a CPU without AMX): that row is AR's loop under another
    name. A timing jitter above AR must not make it "the drafter to use", overall or in a category."""
    monkeypatch.setattr(leaderboard, "commit_time", lambda c: TIMES.get(c.removesuffix("-dirty")))
    d = speed_folder(tmp_path, "spec_bench", EPYC, kind="leaderboard-afcf1aeb72d2",
                     speedups={"medusa:nodes=auto": 1.3, "pld": 1.1, "bpd": 0.9})
    cfg = json.loads((d / "config.json").read_text())
    cfg["resolved"]["methods"] = {"medusa:nodes=auto": {"draft_nothing": True}, "pld": {"tokens": 10}}
    (d / "config.json").write_text(json.dumps(cfg))
    (b,) = leaderboard.collect(tmp_path).machines[0].boards
    speed = b.tables[0].frame
    assert "medusa:nodes=auto (auto: AR)" in set(speed.method) and "pld" in set(speed.method)
    assert "pld" in b.verdict and "medusa" not in b.verdict
    which = next(t.frame for t in b.tables if t.id.endswith("-which"))
    assert not any("medusa" in m for m in which.method) and which.method.iloc[0] == "pld"
