"""The replication check: the board's rows measured again on a disjoint draw, within or outside their interval."""
from __future__ import annotations

import pandas as pd

from bpdbench.report import replication


def _csv(rows):
    return pd.DataFrame(rows, columns=["method", "speedup_vs_ar", "speedup_ci_low", "speedup_ci_high", "n_prompts"])


def test_a_replicated_speedup_inside_the_interval_is_within_and_outside_is_outside():
    board = _csv([("ar", 1.0, 1.0, 1.0, 56), ("a", 1.50, 1.40, 1.60, 56), ("b", 1.20, 1.15, 1.25, 56),
                  ("c", 1.1, float("nan"), float("nan"), 1)])
    again = _csv([("ar", 1.0, 1.0, 1.0, 14), ("a", 1.55, 1.3, 1.7, 14), ("b", 1.30, 1.2, 1.4, 14),
                  ("c", 1.1, 1.0, 1.2, 14), ("d", 2.0, 1.9, 2.1, 14)])
    out = replication.compare(board, again).set_index("method")
    assert list(out.index) == ["a", "b", "c"]        # ar and rows the board lacks are left out
    assert out.loc["a", "verdict"] == "within" and out.loc["b", "verdict"] == "outside"
    assert out.loc["c", "verdict"] == "n/a"


def test_the_replication_folder_sits_beside_the_board(tmp_path):
    board = tmp_path / "leaderboard-x" / "spec_bench-board"
    board.mkdir(parents=True)
    _csv([("ar", 1.0, 1.0, 1.0, 56), ("a", 1.5, 1.4, 1.6, 56)]).to_csv(board / "speed.csv", index=False)
    assert replication.table(board) is None
    again = board.with_name("spec_bench-replication")
    again.mkdir()
    _csv([("ar", 1.0, 1.0, 1.0, 14), ("a", 1.7, 1.6, 1.8, 14)]).to_csv(again / "speed.csv", index=False)
    shown = replication.table(board)
    assert shown.to_dict("records") == [{"method": "a", "board speedup [95% CI]": "1.50 [1.40, 1.60]",
                                         "replication [95% CI]": "1.70 [1.60, 1.80]", "prompts": 14,
                                         "replicated": "outside"}]
    assert replication.partner(tmp_path / "leaderboard-x" / "spec_bench") is None
