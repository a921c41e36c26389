"""`bpdbench speed --methods ar,null,ar:rows=3,ar:rows=auto` on a tiny model: `null` is an ordinary row beside the
baseline `ar`, the padded rows decode greedy's tokens, and `rows=auto`'s choice is recorded like every auto shape."""
from __future__ import annotations

import json

from typer.testing import CliRunner

from bpdbench.cli import app
from bpdbench.hardware import calibration
from bpdbench.hardware.shapes import cheapest_rows
from bpdbench.store import read_table
from tests.conftest import seed_calibration, write_prompts

METHODS = ["ar", "null", "ar:rows=3", "ar:rows=auto"]


def test_null_and_padded_rows_are_ordinary_rows(tiny_model_dir, calibrated_cache, tmp_path, monkeypatch):
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("BPDBENCH_RESULTS", str(tmp_path / "results"))
    seed_calibration(calibrated_cache, tmp_path / "cache")
    out = tmp_path / "speed"
    result = CliRunner().invoke(app, [str(a) for a in (
        "speed", "--task", "prompts", "--data-file", write_prompts(tmp_path, 2), "--model", tiny_model_dir,
        "--heads-profile", "init", "--dtype", "float32", "--threads", "1", "--methods", ",".join(METHODS),
        "--limit", "2", "--repeats", "1", "--max-new-tokens", "12", "--out", out)])
    assert result.exit_code == 0, result.output
    csv = read_table(out / "speed.csv").set_index("method")        # pandas' read_csv reads `null` as missing
    assert list(csv.index) == METHODS and (csv.n_identical == 2).all(), result.output   # float32: exact
    assert csv.loc["ar", "speedup_vs_ar"] == 1.0 and csv.loc["null", "speedup_vs_ar"] > 0     # null: timed, not 1 by fiat
    assert csv.loc["null", "block_efficiency"] == 1.0 and csv.loc["ar:rows=3", "block_efficiency"] >= 1.0
    records = [json.loads(line) for line in (out / "speed.jsonl").read_text().splitlines()]
    null = [r for r in records if r["method"] == "null"]
    assert len(null) == 2 and all(r["identical"] and r["verified"] == r["serial_calls"] - 1 for r in null)
    padded = [r for r in records if r["method"] == "ar:rows=3"]
    assert all(r["verified"] > r["serial_calls"] - 1 for r in padded)          # each step scored filler rows
    resolved = json.loads((out / "config.json").read_text())["resolved"]["methods"]
    cal = calibration.cached(str(tiny_model_dir), "float32", "cpu", 1)
    expect = cheapest_rows({n: cal.unfitted(n) for n in range(2, 9)})
    auto = resolved["ar:rows=auto"]
    assert auto["auto"]["params"] == expect.params and auto["auto"]["draft_nothing"] == expect.draft_nothing
    assert auto.get("draft_nothing", False) == expect.draft_nothing
    assert "calibration" in auto["auto"]["heldout"]["source"]
