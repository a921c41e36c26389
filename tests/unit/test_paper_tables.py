"""The paper's tables beside the paper (report/paper.py): the paper's numbers on the rendered pages are the ones in
../shared/paper/reference_tables.csv, each task in the paper's group, ours against the paper's computed from both;
every table that reproduces one of the paper's names it and says how the setups differ; without the paper's file
the lattice table shows ours alone and says so."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from bpdbench.report import paper, tables

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "results" / "tables"
# every table of results/tables/ that reproduces a table or figure of the paper (or answers one of its analyses)
REPRODUCED = ["top16_lattice", "top16_lattice_wide", "oracle_vs_k", "efficiency_vs_heads", "entropy", "repetition",
              "hardware_utilization", "medusa_vs_bpd", "medusa_trees"]
OURS = {v: k for k, v in paper.PAPER_METHOD.items()}            # the paper's method name -> our label


def reference() -> pd.DataFrame:
    ref = paper.reference_tables()
    if ref is None:
        pytest.skip("../shared/paper/reference_tables.csv is absent: no paper numbers to check the pages against")
    return ref[ref.table == "top16_lattice"]


def markdown_rows(text: str) -> list[dict[str, str]]:
    """The first Markdown table of a page as dicts, header -> cell."""
    lines = [x for x in text.splitlines() if x.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in x.strip("|").split("|")))) for x in lines[2:]]


def check_wide_page(text: str, ref: pd.DataFrame, ours: pd.DataFrame) -> None:
    """Every paper number on the page equals the file's, in the file's group; ours vs paper is ours / paper - 1."""
    rows = {(r["task"], r["row"]): r for r in markdown_rows(text)}
    for p in ref.itertuples():
        label = OURS.get(p.method, p.method)
        cell = rows[(p.task, "paper")]
        assert cell["group"] == p.group, (p.task, cell["group"], p.group)
        m = re.fullmatch(r"([\d.]+)(?: \(([+-][\d.]+)%\))?", cell[label])
        assert m, (p.task, label, cell[label])
        assert float(m.group(1)) == p.block_efficiency, (p.task, label, cell[label])
        want = None if pd.isna(p.relative_change_pct) else p.relative_change_pct
        assert (None if m.group(2) is None else float(m.group(2))) == want, (p.task, label, cell[label])
        mine = ours[(ours.task == p.task) & (ours.method == label)]
        if mine.empty:
            assert rows[(p.task, "ours")][label] == "not run"
        else:
            change = 100 * (mine.block_efficiency.iloc[0] / p.block_efficiency - 1)
            assert rows[(p.task, "ours vs paper")][label] == f"{change:+.1f}%", (p.task, label)
    groups = [r["group"] for r in markdown_rows(text)]
    order = [g for g in dict.fromkeys(groups) if g in paper.GROUP_ORDER]
    assert order == [g for g in paper.GROUP_ORDER if g in groups]              # the paper's group order


def check_long_table(df: pd.DataFrame, ref: pd.DataFrame) -> None:
    for r in df.itertuples():
        p = ref[(ref.task == r.task) & (ref.method == paper.PAPER_METHOD.get(r.method, r.method))]
        if p.empty:
            assert pd.isna(r.paper_block_efficiency)
            continue
        assert r.group == p.group.iloc[0] and r.paper_block_efficiency == p.block_efficiency.iloc[0], r
        assert abs(r.ours_vs_paper_pct - 100 * (r.block_efficiency / r.paper_block_efficiency - 1)) < 0.01, r


def test_the_committed_lattice_pages_carry_the_papers_numbers_in_its_groups():
    ref = reference()
    long = pd.read_csv(COMMITTED / "top16_lattice.csv")
    check_long_table(long, ref)
    check_wide_page((COMMITTED / "top16_lattice_wide.md").read_text(), ref, long)
    assert set(ref.task) <= {r["task"] for r in markdown_rows((COMMITTED / "top16_lattice_wide.md").read_text())}


def test_every_committed_reproduced_table_names_the_papers_table_and_the_setups():
    for name in REPRODUCED:
        text = (COMMITTED / f"{name}.md").read_text()
        assert f"\nReproduces: {paper.REPRODUCES[name]}; {paper.PAPER}.\n" in text, name
        (setup,) = [x for x in text.splitlines() if x.startswith("Setups differ: ")]
        for what in ("ours: ", "heads", "greedy positions", " on ", "the paper: "):        # model, heads, training,
            assert what in setup, (name, what, setup)                                      # hardware, theirs
        assert "not recorded" not in setup, (name, setup)


def replay_folder(root: Path, task: str, rows: dict[str, float]) -> None:
    d = root / "replay" / task
    d.mkdir(parents=True)
    pd.DataFrame([{"task": task, "method": m, "n_examples": 4, "block_efficiency": v} for m, v in rows.items()]
                 ).to_csv(d / "replay.csv", index=False)
    (d / "config.json").write_text(json.dumps({
        "config": {"task": task, "model": "tiny", "heads": 4, "heads_profile": "init", "dtype": "float32",
                   "threads": 1}, "environment": {"processor": "Test CPU", "dtype": "float32", "threads": 1},
        "heads": {"profile": "init", "greedy_positions": 1234, "heldout": {"top1": [0.5, 0.2]}},
        "methods": list(rows)}))


@pytest.fixture()
def results(tmp_path):
    replay_folder(tmp_path, "xsum", {"bpd": 1.2, "ngram4": 1.26, "oracle-k16": 1.5})
    replay_folder(tmp_path, "samsum", {"bpd": 1.1, "16best-0gram": 1.3})
    return tmp_path


def test_rendered_pages_beside_the_paper(results):
    ref = reference()
    tables.build(results)
    out = results / "tables"
    long = pd.read_csv(out / "top16_lattice.csv")
    assert list(long.group) == ["S-SUM", "S-SUM", "L-SUM", "L-SUM", "L-SUM"]     # samsum before xsum: the groups
    check_long_table(long, ref)
    wide = (out / "top16_lattice_wide.md").read_text()
    check_wide_page(wide, ref, long)
    assert "Setups differ: ours: tiny, " in wide and "4 Medusa-1 heads" in wide and "1,234 greedy positions" in wide
    assert "held-out top-1 at depth 1 0.50" in wide and "Test CPU" in wide and paper.ABSENT not in wide


def test_without_the_papers_file_ours_stand_alone_and_say_so(results, monkeypatch):
    monkeypatch.setattr(paper, "REFERENCE", results / "absent.csv")
    tables.build(results)
    wide = (results / "tables" / "top16_lattice_wide.md").read_text()
    assert {r["row"] for r in markdown_rows(wide)} == {"ours"} and "multi_news" not in wide
    assert wide.count(paper.ABSENT) == 1 and "paper_block_efficiency" not in (results / "tables" /
                                                                              "top16_lattice.md").read_text()


def test_a_task_in_the_wrong_group_is_caught(results, monkeypatch):
    ref = reference()
    monkeypatch.setattr(paper, "group", lambda task: {"xsum": "S-SUM"}.get(task, "L-SUM"))
    with pytest.raises(AssertionError):
        check_long_table(paper.lattice_table(results), ref)
