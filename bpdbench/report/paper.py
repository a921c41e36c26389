"""The paper's tables beside the paper: ours next to Kim et al.'s numbers in the paper's task groups, and, under every
table that reproduces one of the paper's, which table or figure that is and how the two setups differ.

Why: a reader put our LAMBADA block efficiency (about 1.1) beside the paper's 3.12 and read a failed reproduction,
when the models differ (a prompted 0.5B with heads distilled on CPU against a 1.5B BPD model fine-tuned per task).
The paper's numbers are read from `../shared/paper/reference_tables.csv` when the tables are rendered, never copied
into code; without that file the tables show ours alone and say so. Groups come from each task's `Task.group`
(tasks/), the one place a task's group is defined; the tests check them against the paper's file.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

import pandas as pd

from .. import paths
from . import load

REFERENCE = paths.REPO.parent / "shared" / "paper" / "reference_tables.csv"
PAPER = "Kim et al., Exploring and Improving Drafts in Blockwise Parallel Decoding (arXiv 2404.09221)"
PAPER_METHOD = {"neural-m": "neural-61m", "oracle:k=16": "oracle-k16"}   # our label -> the paper table's name
LATTICE_METHODS = ["bpd", "neural-m", "ngram4", "16best-0gram", "16best-ngram4", "oracle:k=16"]
NO_CHANGE = ("bpd", "oracle:k=16")      # the paper gives no relative change for these two columns
TASK_ORDER = ["lambada", "squad", "cnn_dailymail", "samsum", "multi_news", "xsum", "newsroom", "mt_bench"]
GROUP_ORDER = ["LM", "QA", "S-SUM", "L-SUM"]
ABSENT = ("The paper's numbers are not beside ours: ../shared/paper/reference_tables.csv was absent when this "
          "table was rendered.")
# What each reproduced table reproduces, named as ../shared/paper.md names it (the paper's own table and figure
# numbers are not in that file, so none is invented here); tables.py writes it under the table.
REPRODUCES = {
    "top16_lattice": "the paper's main table, block efficiency with the top-16 lattice and relative change vs BPD "
                     "(paper.md, Reference results)",
    "top16_lattice_wide": "the paper's main table, block efficiency with the top-16 lattice, in its layout "
                          "(paper.md, Reference results)",
    "oracle_vs_k": "the paper's oracle top-k analysis, oracle block efficiency vs k = 1..16 (paper.md, Analyses: "
                   "Oracle top-k)",
    "efficiency_vs_heads": "the paper's head analysis, block efficiency as heads are added, read with h_max "
                           "(paper.md, Analyses: Head entropy)",
    "entropy": "the paper's per-head entropy figure and h_max (paper.md, Analyses: Head entropy)",
    "repetition": "the paper's consecutive-repetition table, share of identical adjacent draft tokens and mean "
                  "longest run, before and after 2-gram rescoring (paper.md, Analyses: Consecutive repetition)",
    "hardware_utilization": "no table of the paper (paper.md reports block efficiency, not hardware use): the "
                            "paper's methods' block efficiencies turned into bytes and FLOPs per token",
    "medusa_vs_bpd": "Medusa's tree verification (Cai et al. 2024, tree mc_sim_7b_63; paper.md, Medusa details) "
                     "against the paper's linear BPD, the comparison of the paper's open-LLM extension (whose "
                     "Vicuna numbers are not in ../shared/paper)",
    "medusa_trees": "Medusa's tree verification (Cai et al. 2024; paper.md, Medusa details) against the paper's "
                    "linear BPD, the comparison of the paper's open-LLM extension (whose Vicuna numbers are not "
                    "in ../shared/paper)",
}
THEIRS = ("the paper: a 1.5B BPD model fine-tuned per task, h = 9 heads (head 1 the base's next-token head) "
          "trained with it on the task's data, hardware not stated in ../shared/paper.md")


def reference_tables(path: Path | None = None) -> pd.DataFrame | None:
    """The paper's numbers (table, task, group, method, block_efficiency, relative_change_pct); None without it."""
    path = path or REFERENCE
    return pd.read_csv(path) if path.exists() else None


def group(task: str) -> str:
    """The paper's group of a task (LM, QA, S-SUM, L-SUM; CHAT for the chat tasks); "" for one tasks/ lacks."""
    from tasks import TASKS
    return TASKS[task].group if task in TASKS else ""


def _order(task: str) -> tuple:
    g = group(task)
    return (GROUP_ORDER.index(g) if g in GROUP_ORDER else len(GROUP_ORDER), g,
            TASK_ORDER.index(task) if task in TASK_ORDER else len(TASK_ORDER), task)


def lattice_table(results: Path) -> pd.DataFrame:
    """One row per task and lattice method we replayed: ours with its change vs our BPD, the paper's number and its
    change vs the paper's BPD where the paper has the task, and ours against the paper's (`ours_vs_paper_pct`)."""
    ours = load.table(results, "replay", "replay.csv")
    if ours.empty:
        return ours
    ours = ours[ours.method.isin(LATTICE_METHODS)]
    ref = reference_tables()
    rows = []
    for (task, method), g in ours.groupby(["task", "method"], sort=False):
        r = g.iloc[-1]
        row = {"group": group(task), "task": task, "method": method, "n_examples": int(r.n_examples),
               "block_efficiency": round(float(r.block_efficiency), 3)}
        base = ours[(ours.task == task) & (ours.method == "bpd")]
        if method not in NO_CHANGE and not base.empty:
            row["relative_change_pct"] = round(100 * (r.block_efficiency / base.block_efficiency.iloc[-1] - 1), 2)
        p = _paper(ref, task, method)
        if p is not None:
            row["paper_block_efficiency"] = p.block_efficiency
            row["paper_relative_change_pct"] = p.relative_change_pct
            row["ours_vs_paper_pct"] = round(100 * (row["block_efficiency"] / p.block_efficiency - 1), 2)
        rows.append(row)
    if not rows:                         # replays of other methods only (or of other settings: bpd:heads=3)
        return pd.DataFrame()
    df = pd.DataFrame(rows)
    df["_t"] = df.task.map(_order)
    df["_m"] = df.method.map(LATTICE_METHODS.index)
    return df.sort_values(["_t", "_m"]).drop(columns=["_t", "_m"]).reset_index(drop=True)


def _paper(ref: pd.DataFrame | None, task: str, method: str) -> pd.Series | None:
    if ref is None:
        return None
    p = ref[(ref.table == "top16_lattice") & (ref.task == task) & (ref.method == PAPER_METHOD.get(method, method))]
    return p.iloc[0] if not p.empty else None


def lattice_wide(df: pd.DataFrame) -> pd.DataFrame:
    """The paper's layout in its groups: per task a row of ours (change vs our BPD), a row of the paper's (change vs
    its BPD) and a row of ours against the paper's; the paper's tasks we did not replay stay, marked "not run"."""
    ref = reference_tables()
    tasks = list(dict.fromkeys([*df.task, *(ref[ref.table == "top16_lattice"].task if ref is not None else [])]))
    cols = LATTICE_METHODS if ref is not None else [m for m in LATTICE_METHODS if m in set(df.method)]
    ours = df.set_index(["task", "method"])
    rows = []
    for task in sorted(tasks, key=_order):
        mine = {m: ours.loc[(task, m)] for m in cols if (task, m) in ours.index}
        theirs = {m: p for m in cols if (p := _paper(ref, task, m)) is not None}
        key = {"group": group(task), "task": task}
        rows.append({**key, "row": "ours", **{m: _cell(mine[m].block_efficiency, mine[m].get("relative_change_pct"))
                                               if m in mine else "not run" for m in cols}})
        if ref is None:
            continue
        rows.append({**key, "row": "paper", **{m: _cell(theirs[m].block_efficiency, theirs[m].relative_change_pct)
                                                if m in theirs else "not in the paper" for m in cols}})
        rows.append({**key, "row": "ours vs paper",
                     **{m: f"{100 * (mine[m].block_efficiency / theirs[m].block_efficiency - 1):+.1f}%"
                        if m in mine and m in theirs else "" for m in cols}})
    return pd.DataFrame(rows, columns=["group", "task", "row", *cols])


def _cell(value: float, change: float | None) -> str:
    return f"{value:.2f}" + (f" ({change:+.2f}%)" if change is not None and pd.notna(change) else "")


def setup_line(folders: Iterable[load.ResultFolder]) -> str:
    """How our setup differs from the paper's, from what the folders' config.json recorded: model, heads (number,
    how and on what they were trained, their held-out top-1 at depth 1), dtype and hardware."""
    folders = list(folders)

    def values(get) -> str:
        found = list(dict.fromkeys(str(v) for f in folders if (v := get(f)) not in (None, "")))
        return " / ".join(found) if found else "not recorded"

    def trained(f: load.ResultFolder) -> str | None:
        h = f.heads_info
        if not h.get("greedy_positions"):
            return None
        top1 = (h.get("heldout") or {}).get("top1") or []
        return (f"{h['greedy_positions']:,} greedy positions (profile {h.get('profile')}"
                + (f", held-out top-1 at depth 1 {top1[0]:.2f}" if top1 else "") + ")")

    ours = (f"ours: {values(lambda f: f.model)}, prompted (instruction-tuned, not fine-tuned per task), "
            f"{values(lambda f: f.heads)} Medusa-1 heads beside the base's own next-token head (the paper counts "
            f"that one in h), distilled from the frozen base on {values(trained)}, {values(lambda f: f.dtype)} on "
            f"{values(lambda f: f.environment.get('processor'))}, threads {values(lambda f: f.threads)}")
    return (f"Setups differ: {ours}; {THEIRS}. These numbers count calls and tokens, not seconds: the hardware "
            "enters them only through the dtype's rounding.")


def notes(name: str, results: Path, area: str) -> list[str]:
    """The lines under a reproduced table: what it reproduces, and how the setups differ (from `area`'s folders)."""
    lines = [f"Reproduces: {REPRODUCES[name]}; {PAPER}.", setup_line(load.folders(results, area))]
    if name.startswith("top16_lattice") and reference_tables() is None:
        lines.append(ABSENT)
    return lines
