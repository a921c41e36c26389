"""The leaderboard as evidence (issue 57): one page per machine holding the grid's board only, studies apart; the
paired bootstrap behind "which drafter"; the null row's noise floor that refuses a board; one commit and one sweep
per board; #MAT beside a_1..a_k; Spec-Bench's tasks as columns; the labels a row ran; trained rows' training."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pandas as pd
import pytest

from bpdbench import stats
from bpdbench.experiments.speed import summarize
from bpdbench.report import checks, leaderboard, pages, plots

CPU = {"processor": "AMD EPYC", "fingerprint": "afcf1aeb72d2", "cpu_flags": ["avx2", "fma"], "cpu_count": 2,
       "threads": 2, "versions": {"torch": "2.13.0+cpu"}}
TIMES = {"c0": 100.0, "c1": 200.0}
TASKS = ["mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag"]


def folder(results: Path, rel: str, speedups: dict, *, commit="c1", grid="grids/leaderboard.toml", sha=None,
           today=False, repeats=3, per_task=2, seed=0, resolved=None, noise=0.02, planned=None):
    """A speed folder: per question (two turns on MT-Bench when `today`), AR and each method's records, the method's
    seconds = AR's / its speedup with multiplicative noise; speed.csv from speed's own summarize()."""
    rng = random.Random(seed)
    records = []
    for t in TASKS[:3] if not today else TASKS:
        for i in range(per_task):
            q = f"{t}-{i}"
            for turn in ((1, 2) if today and t == "mt_bench" else (1,)):
                pid = q if turn == 1 else f"{q}-t2"
                base = 1.0 + 0.5 * rng.random()
                for method, s in {"ar": 1.0, **speedups}.items():
                    calls = 33 if s <= 1.0 else 12
                    rec = {"id": pid, "category": t, "method": method, "tokens": 33, "serial_calls": calls,
                           "times": [1.0], "median_s": base / s * (1 + noise * rng.uniform(-1, 1)), "spread": 0.02,
                           "identical": True, "first_divergence": None, "certificate": "exact",
                           "diverged_tokens": 0, "load_average": 1.5, "others_cores": 0.05}
                    if calls < 33:                              # 32 tokens in 11 verify steps: accepted 21
                        rec.update(steps=11, accepted_per_head=[10, 7, 4])
                    if today:
                        rec.update(subtask=t, question=q, turn=turn, prefill_s=0.1)
                    records.append(rec)
    d = results / rel
    d.mkdir(parents=True)
    (d / "speed.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    summarize(records).to_csv(d / "speed.csv", index=False)
    task = rel.split("/")[1].split("-")[0]
    sweep = {"grid": grid, "cell": rel, **({"grid_sha256": sha} if sha else {})} if grid else None
    (d / "config.json").write_text(json.dumps({
        "config": {"task": task, "model": "m-0.5b", "dtype": "bfloat16", "limit": 12, "max_new_tokens": 33,
                   "heads_profile": "quick", "threads": 2},
        "methods": ["ar", *speedups], "repeats": repeats, "per_category": per_task,
        "resolved": {"max_new_tokens": 33, "methods": resolved or {}, **({"n_selected": planned} if planned else {})},
        "environment": {**CPU, "dtype": "bfloat16", "git_commit": commit}, **({"sweep": sweep} if sweep else {})}))
    return d


@pytest.fixture(autouse=True)
def quick(monkeypatch):
    monkeypatch.setattr(leaderboard, "commit_time", lambda c: TIMES.get(c.removesuffix("-dirty")))
    monkeypatch.setattr(leaderboard, "overlap", lambda f: "")        # fixture ids are no task's: not audited
    monkeypatch.setattr(plots, "speedup_bars", lambda *a, **k: b"\x89PNG stub")


def machine(results: Path):
    (m,) = leaderboard.collect(results).machines
    return m


def test_paired_bootstrap_separates_a_clear_gap_and_not_equal_timings_with_noise():
    rng = random.Random(1)
    best = [1.0 + rng.random() for _ in range(24)]
    slower = [b * 1.10 * (1 + 0.02 * rng.uniform(-1, 1)) for b in best]
    r, lo, hi = stats.paired_bootstrap_ratio(best, slower)
    assert r == pytest.approx(1.10, abs=0.01) and lo > 1.0 and hi > lo
    same = [b * (1 + 0.05 * rng.uniform(-1, 1)) for b in best]
    r, lo, hi = stats.paired_bootstrap_ratio(best, same)
    assert lo < 1.0 < hi
    # unpaired intervals of the clear gap overlap (prompt lengths vary 2x): pairing is what separates it
    a, b = stats.bootstrap_ratio(best, [1.0] * 24), stats.bootstrap_ratio(slower, [1.0] * 24)
    assert a[1] > b[0]
    assert stats.paired_bootstrap_ratio([1.0], [2.0])[1:] != stats.paired_bootstrap_ratio([1.0], [2.0])[1:]  # nan
    with pytest.raises(ValueError):
        stats.paired_bootstrap_ratio([1.0, 2.0], [1.0])


def test_the_paired_bootstrap_resamples_within_strata():
    """One stratum of long prompts, one of short ones: resampled within strata, every draw keeps one long and one
    short prompt per pair, so the ratio cannot wander to the extremes an unstratified draw reaches."""
    best = [10.0, 10.0, 1.0, 1.0]
    other = [10.0, 10.0, 2.0, 2.0]
    strata = ["long", "long", "short", "short"]
    _, lo, hi = stats.paired_bootstrap_ratio(best, other, strata)
    assert lo == pytest.approx(12 / 11) and hi == pytest.approx(12 / 11)
    _, lo, hi = stats.paired_bootstrap_ratio(best, other)
    assert lo < 12 / 11 < hi


def test_one_page_one_board_studies_apart_and_the_index_marks_partial(tmp_path):
    r = tmp_path / "results"
    folder(r, "leaderboard-afcf1aeb72d2/spec_bench", {"pld": 1.4, "bpd": 1.1}, planned=30)
    folder(r, "leaderboard-afcf1aeb72d2/spec_bench-old", {"pld": 1.2}, commit="c0", repeats=2)   # older grid board
    folder(r, "frontier-x/spec_bench", {"pld": 1.6}, grid="/tmp/made-elsewhere/frontier.toml")
    m = machine(r)
    assert [(b.task, b.runs[0].rel) for b in m.boards] == [("spec_bench", "leaderboard-afcf1aeb72d2/spec_bench")]
    assert {b.runs[0].rel for b in m.studies} == {"leaderboard-afcf1aeb72d2/spec_bench-old", "frontier-x/spec_bench"}
    old = next(b for b in m.studies if b.runs[0].rel.endswith("-old"))
    assert "older leaderboard-grid board" in old.why_study
    out = tmp_path / "tables"
    out.mkdir()
    pages.write(leaderboard.collect(r), out)
    page = (out / "leaderboard" / "afcf1aeb72d2.md").read_text()
    which = page.split("## Which drafter on this machine")[1].split("\n## ")[0]
    assert which.count("\n- ") == 1 and "frontier-x" not in page and "afcf1aeb72d2-studies.md" in page
    studies = (out / "leaderboard" / "afcf1aeb72d2-studies.md").read_text()
    assert "frontier-x" in studies and "/tmp/" not in studies         # no path of the machine that made it
    assert "frontier.toml (outside the repository)" in studies
    index = (out / "leaderboard.md").read_text()
    row = next(line for line in index.splitlines() if line.startswith("| afcf1aeb72d2 | spec_bench"))
    assert "PARTIAL" in row and "older (" in row                 # this fixture's cell is not today's grid


def test_a_board_with_a_committed_draw_is_partial_until_every_drawn_question_is_measured(tmp_path):
    r = tmp_path / "results"
    d = folder(r, "leaderboard-afcf1aeb72d2/spec_bench", {"null": 1.0, "pld": 1.3}, today=True, per_task=1)
    cfg = json.loads((d / "config.json").read_text())
    drawn = [f"{t}-0" for t in TASKS]
    (d / "config.json").write_text(json.dumps({**cfg, "draw": {"seed": 1, "ids": drawn}}))
    (b,) = machine(r).boards
    assert not b.partial and "6 prompts (1 per task, 6 tasks)" in b.heading    # 7 records: MT-Bench has 2 turns
    (d / "config.json").write_text(json.dumps({**cfg, "draw": {"seed": 1, "ids": [*drawn, "rag-1"]}}))
    (b,) = machine(r).boards
    assert b.partial and "PARTIAL: 6 of the 7 planned prompts" in b.heading


def test_a_board_is_one_commit_and_one_sweep_and_the_page_says_when_boards_differ(tmp_path):
    r = tmp_path / "results"
    folder(r, "leaderboard-afcf1aeb72d2/spec_bench", {"pld": 1.4}, sha="aaaa")
    folder(r, "leaderboard-afcf1aeb72d2/spec_bench-b", {"bpd": 1.2}, sha="bbbb")    # same commit, another sweep
    folder(r, "leaderboard-afcf1aeb72d2/mt_bench", {"pld": 1.3}, commit="c0")
    m = machine(r)
    for b in [*m.boards, *m.studies]:
        assert len({x.commit for x in b.runs}) == 1 and len({x.sweep.get("grid_sha256") for x in b.runs}) == 1
    assert len([b for b in m.boards if b.task == "spec_bench"]) == 1
    assert any(b.task == "spec_bench" for b in m.studies)        # the other sweep: its own board, not merged
    assert "2 commits" in m.commits and "mt_bench at c0" in m.commits and "spec_bench at c1" in m.commits


def test_where_today_grid_has_a_board_older_grids_boards_go_to_the_studies_page(tmp_path, monkeypatch):
    """The first protocol's MT-Bench board is not an answer beside today's Spec-Bench board: once a board follows
    today's grid, the machine's page holds only such boards. The control: without one, older boards stay."""
    from bpdbench.report import leaderboard as lb
    r = tmp_path / "results"
    folder(r, "leaderboard-afcf1aeb72d2/mt_bench", {"pld": 1.3}, commit="c0")
    folder(r, "leaderboard-afcf1aeb72d2/spec_bench", {"null": 1.0, "pld": 1.4}, today=True)
    monkeypatch.setattr(lb.checks, "follows_today", lambda f, rel: "" if "spec_bench" in rel else "an older grid")
    m = machine(r)
    assert [b.task for b in m.boards] == ["spec_bench"] and [b.task for b in m.studies] == ["mt_bench"]
    assert "older leaderboard grid" in m.studies[0].why_study and not m.commits
    monkeypatch.setattr(lb.checks, "follows_today", lambda f, rel: "an older grid")
    assert sorted(b.task for b in machine(r).boards) == ["mt_bench", "spec_bench"]


def test_the_null_row_checks_the_noise_floor_and_refuses_a_board_outside_it(tmp_path):
    r = tmp_path / "results"
    folder(r, "leaderboard-afcf1aeb72d2/spec_bench", {"null": 1.0, "pld": 1.4, "bpd": 1.1}, today=True)
    (b,) = machine(r).boards
    assert not b.refused and b.noise.startswith("noise floor: `null` reads")
    assert "load average ≤ 1.50" in b.noise and "others' cores ≤ 0.05" in b.noise and "repeat spread" in b.noise
    assert "pld" in b.verdict
    r = tmp_path / "noisy"
    folder(r, "leaderboard-afcf1aeb72d2/spec_bench", {"null": 1.08, "pld": 1.4, "bpd": 1.1}, today=True)
    (b,) = machine(r).boards
    assert b.refused.startswith("REFUSED: the noise-floor row `null` reads 1.0") and "load average" in b.refused
    assert "REFUSED" in b.verdict and "pld 1.4" not in b.verdict and b.figure() is None
    assert set(b.tables[0].frame["#"]) == {"—"} and not any(t.id.endswith("-which") for t in b.tables)
    from bpdbench.report import tables
    rows = tables.leaderboard_rows(leaderboard.collect(r))
    assert rows["rank"].isna().all() and rows.refused.str.startswith("REFUSED").all()
    r = tmp_path / "none"
    folder(r, "leaderboard-afcf1aeb72d2/spec_bench", {"pld": 1.4}, today=True)      # today's protocol, no null
    assert "REFUSED: no `null` row" in machine(r).boards[0].refused
    r = tmp_path / "old"
    folder(r, "leaderboard-afcf1aeb72d2/spec_bench", {"pld": 1.4})                  # an old board: unchecked
    (b,) = machine(r).boards
    assert not b.refused and b.noise.startswith("noise floor unchecked")


def test_noise_floor_needs_the_interval_to_contain_one():
    rows = pd.DataFrame({"method": ["null", "ar"], "speedup_vs_ar": [1.02, 1.0], "speedup_ci_low": [1.01, 1.0],
                         "speedup_ci_high": [1.03, 1.0], "median_spread": [0.01, 0.01],
                         "load_average_max": [2.0, 2.0], "others_cores_max": [0.1, 0.1]})
    refused, _ = checks.noise_floor(rows, today=True)
    assert "its interval excludes 1" in refused
    refused, line = checks.noise_floor(rows.assign(speedup_ci_low=0.99), today=True)
    assert not refused and "within 1.00 ± 3%" in line


def test_mat_beside_a_j_ms_per_token_and_the_spec_bench_tasks_as_columns(tmp_path):
    r = tmp_path / "results"
    folder(r, "leaderboard-afcf1aeb72d2/spec_bench", {"null": 1.0, "pld": 1.4, "bpd": 1.1}, today=True)
    (b,) = machine(r).boards
    drafting = next(t.frame for t in b.tables if t.id.endswith("-accept")).set_index("method")
    a = [float(drafting.loc["pld", f"a_{j}"]) for j in (1, 2, 3)]
    assert float(drafting.loc["pld", "#MAT"]) == pytest.approx(sum(a) + 1, abs=0.01)   # 32 / 11 = 1 + 21 / 11
    assert "τ" not in str(b.tables[0].frame.columns) and "block efficiency" in drafting.columns
    speed = b.tables[0].frame.set_index("method")
    row = b.rows.set_index("method").loc["pld"]
    assert float(speed.loc["pld", "ms/token"]) == pytest.approx(1000 * row.seconds / row.tokens, abs=0.1)
    assert " ms/token · " in b.heading and "12 prompts (2 per task, 6 tasks)" in b.heading
    grid = next(t.frame for t in b.tables if "-category-" in t.id)
    assert list(grid.columns) == ["method", *TASKS, "overall"]
    assert "Speedup by task" in next(t.title for t in b.tables if "-category-" in t.id)
    assert next(t.frame for t in b.tables if t.id.endswith("-which"))["paired prompts"].iloc[1] == 12


def test_rows_show_the_spelling_they_ran_and_auto_keeps_its_tag_through_renames(tmp_path):
    r = tmp_path / "results"
    resolved = {"hybrid": {"retrieval": "sam:fallback=none", "model": "qdraft:length=6", "nodes": 12},
                "sam:tokens=auto": {"tokens": 9, "threshold": 5, "bias": 5, "draft_nothing": True}}
    folder(r, "leaderboard-afcf1aeb72d2/spec_bench", {"hybrid": 1.3, "sam:tokens=auto": 1.05}, resolved=resolved)
    (b,) = machine(r).boards
    shown = set(b.tables[0].frame.method)
    assert "hybrid [= sam:fallback=none + qdraft:length=6, 12 nodes]" in shown
    assert any(m.startswith("sam:tokens=auto [older default") and m.endswith("(auto: AR)") for m in shown)
    assert "predicted (calibrated forwards + this run's draft time)" in b.tables[0].frame.columns


def test_trained_rows_show_their_training_data_and_held_out_top1(tmp_path):
    r = tmp_path / "results"
    resolved = {"eagle": {"drafter": "eagle", "name": "eagle", "profile": "quick", "heldout": {"top1": [0.31, 0.2]}}}
    d = folder(r, "leaderboard-afcf1aeb72d2/spec_bench", {"bpd": 1.1, "eagle": 1.2, "pld": 1.3}, resolved=resolved)
    cfg = json.loads((d / "config.json").read_text())
    cfg["resolved"]["heads"] = {"recipe": "heads-fit/1", "greedy_positions": 16000, "heldout": {"top1": [0.227]}}
    (d / "config.json").write_text(json.dumps(cfg))
    (b,) = machine(r).boards
    t = next(t.frame for t in b.tables if t.id.endswith("-training")).set_index("method")
    assert set(t.index) == {"bpd", "eagle"}
    assert t.loc["bpd", "greedy positions"] == "16,000" and t.loc["bpd", "held-out top-1 (depth 1)"] == "0.227"
    assert t.loc["eagle", "greedy positions"] == "—" and t.loc["eagle", "held-out top-1 (depth 1)"] == "0.310"
    train = r / "drafters" / "training"
    train.mkdir(parents=True)
    (train / "eagle.json").write_text(json.dumps({"name": "eagle", "profile": "quick",
                                                  "data": {"greedy_positions": 26064}}))
    (b,) = machine(r).boards
    t = next(t.frame for t in b.tables if t.id.endswith("-training")).set_index("method")
    assert t.loc["eagle", "greedy positions"] == "26,064" and "training report" in t.loc["eagle", "from"]


def test_a_board_follows_today_s_grid_only_with_its_cell_methods_and_protocol(tmp_path):
    blocks = checks._blocks("grids/leaderboard.toml")
    if not blocks:
        pytest.skip("grids/leaderboard.toml not here")
    cell = blocks[0]
    task = (cell.get("tasks") or [cell.get("task")])[0]
    rel = str(cell["out"]).replace("{machine}", "afcf1aeb72d2").replace("{task}", task)
    r = tmp_path / "results"
    d = folder(r, rel, {"pld": 1.2})
    cfg = json.loads((d / "config.json").read_text())
    cfg["methods"] = list(cell["methods"])
    cfg["config"].update(task=task, limit=cell.get("limit"))
    cfg.update(repeats=cell.get("repeats"), per_category=cell.get("per_category"))
    cfg["resolved"]["max_new_tokens"] = cell.get("max_new_tokens")
    (d / "config.json").write_text(json.dumps(cfg))
    f = leaderboard.load.read_folder(d, rel.split("/")[0], r / rel.split("/")[0])
    assert checks.follows_today(f, rel) == ""
    (d / "config.json").write_text(json.dumps({**cfg, "methods": cfg["methods"][:-1]}))
    f = leaderboard.load.read_folder(d, rel.split("/")[0], r / rel.split("/")[0])
    assert "methods" in checks.follows_today(f, rel)


def test_another_engine_s_rows_stand_apart_and_are_never_named_the_drafter(tmp_path):
    r = tmp_path / "results"
    folder(r, "leaderboard-afcf1aeb72d2/spec_bench", {"llamacpp": 2.9, "pld": 1.3, "bpd": 1.1})
    (b,) = machine(r).boards
    assert "llamacpp" not in set(b.rows.method) and "llamacpp" not in b.verdict and "pld 1.3" in b.verdict
    engines = next(t.frame for t in b.tables if t.id.endswith("-engines"))
    assert engines.method.tolist() == ["llamacpp"] and engines["certified against"].iloc[0] == "llamacpp"
    assert float(engines["ms/token"].iloc[0]) > 0
    assert not any(t.id.endswith("-verify-curves") for t in b.tables)        # no curves recorded: no table


def test_both_engines_verify_curves_stand_beside_the_engines_rows(tmp_path):
    r = tmp_path / "results"
    d = folder(r, "leaderboard-afcf1aeb72d2/spec_bench", {"llamacpp": 2.9, "pld": 1.3})
    config = json.loads((d / "config.json").read_text())
    config["verify_curves"] = {"context": 512, "bpdbench": {"1": 1.0, "4": 0.88, "16": 1.52},
                               "llamacpp": {"1": 1.0, "4": 1.7, "16": 4.7}, "bpdbench_step_ms": 63.0,
                               "llamacpp_step_ms": 21.5, "bpdbench_dtype": "bfloat16", "llamacpp_version": "0.3.36",
                               "llamacpp_file": "model-q4_k_m.gguf"}
    (d / "config.json").write_text(json.dumps(config))
    (b,) = machine(r).boards
    (t,) = [t for t in b.tables if t.id.endswith("-verify-curves")]
    assert t.frame["n"].tolist() == [1, 4, 16] and t.frame["llama.cpp (steps)"].tolist() == ["1.00", "1.70", "4.70"]
    assert "21.5 ms" in t.note and "0.3.36" in t.note


def test_the_replication_folder_is_a_table_of_its_board_not_a_board(tmp_path):
    r = tmp_path / "results"
    folder(r, "leaderboard-afcf1aeb72d2/spec_bench-board", {"null": 1.0, "pld": 1.4}, today=True)
    folder(r, "leaderboard-afcf1aeb72d2/spec_bench-replication", {"null": 1.0, "pld": 1.4}, today=True, seed=5,
           per_task=1)
    m = machine(r)
    assert [b.runs[0].rel for b in m.boards] == ["leaderboard-afcf1aeb72d2/spec_bench-board"] and not m.studies
    (table,) = [t for t in m.boards[0].tables if t.id.endswith("-replication")]
    assert list(table.frame.method) == ["null", "pld"] and set(table.frame.replicated) <= {"within", "outside"}
