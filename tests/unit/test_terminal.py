"""The terminal summary of `run` and `replay`: the reader's columns, certified as exact + near-tie, lost apart."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
from rich.console import Console

from bpdbench.experiments.terminal import certified, replay_table, run_table, run_verdict


def text(table) -> str:
    console = Console(width=200, record=True, markup=False)
    console.print(table)
    return console.export_text()


def test_a_run_of_near_ties_reads_certified_not_zero():
    row = {"method": "bpd", "n_examples": 3, "block_efficiency": 1.25, "lossless_rate": 0.0, "n_exact": 0,
           "n_near_tie": 3, "n_lost": 0, "tokens_per_s": 10.0, "speedup_vs_ar": 1.1}
    shown = text(run_table([row]))
    assert "3 (0 exact + 3 near-tie)" in shown and "1.250" in shown and "1.10" in shown
    assert "lossless_rate" not in shown and "0.000" not in shown
    assert certified(row) == ("3 (0 exact + 3 near-tie)", "0")
    assert run_verdict(row, Path("r")) == f"3 of 3 outputs certified, 0 lost; every column in {Path('r/summary.csv')}"
    lost = {**row, "n_near_tie": 2, "n_lost": 1}
    assert certified(lost) == ("2 (0 exact + 2 near-tie)", "1") and "2 of 3 outputs certified, 1 lost" in \
        run_verdict(lost, Path("r"))


def test_sampled_runs_and_old_files():
    sampled = {"method": "sps", "n_examples": 2, "block_efficiency": 1.4, "temperature": 0.7, "tokens_per_s": 5.0}
    assert certified(sampled) == ("statistical", "n/a") and "T > 0" in run_verdict(sampled, Path("r"))
    old = {"method": "bpd", "n_examples": 2, "n_exact": 1, "n_near_tie": 0, "n_lost": 0, "n_uncertified": 1}
    assert certified(old) == ("1 (1 exact + 0 near-tie), 1 uncertified", "0")
    assert "n/a" in text(run_table([old]))                       # no tokens_per_s recorded


def test_replay_table_is_compact():
    df = pd.DataFrame([{"method": "bpd", "n_examples": 3, "block_efficiency": 1.2, "acceptance_rate": 0.25,
                        "relative_change_pct": 0.0, "draft_repeat_share": 0.3},
                       {"method": "ngram4", "n_examples": 3, "block_efficiency": 1.3, "acceptance_rate": 0.3,
                        "relative_change_pct": 8.33, "draft_repeat_share": 0.2}])
    shown = text(replay_table(df))
    assert "vs bpd (%)" in shown and "+8.3" in shown and "draft_repeat_share" not in shown
