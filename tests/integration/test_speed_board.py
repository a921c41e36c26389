"""The board's protocol on the tiny model: a draw file's prompts, MT-Bench's second turns after the model's own
answers, Spec-Bench's six tasks as columns, decode speedup, #MAT and ms per token."""
from __future__ import annotations

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from bpdbench import paths
from bpdbench.cli import app
from tests.conftest import seed_calibration

QUESTIONS = [  # Spec-Bench's layout: an MT-Bench block (two turns) then its own tasks (one turn)
    {"question_id": 81, "category": "writing", "turns": ["Write a poem about the sea.", "Now make it rhyme."]},
    {"question_id": 82, "category": "writing", "turns": ["Describe a city at night.", "Shorten it to one line."]},
    {"question_id": 83, "category": "writing", "turns": ["List three fruits.", "Sort them by colour."]},
    {"question_id": 161, "category": "qa", "turns": ["What is the capital of France?"]},
    {"question_id": 162, "category": "qa", "turns": ["Who wrote Hamlet, and when?"]},
    {"question_id": 163, "category": "qa", "turns": ["How far is the moon?"]},
]


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch, calibrated_cache):
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("BPDBENCH_RESULTS", str(tmp_path / "results"))
    seed_calibration(calibrated_cache, tmp_path / "cache")


def test_speed_on_a_draw_with_second_turns(tiny_model_dir, tmp_path):
    data = tmp_path / "questions.jsonl"
    data.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    drawn = tmp_path / "draw.json"      # 83 and 163 are the tune split (each group's tail): never drawn
    drawn.write_text(json.dumps({"task": "spec_bench", "ids": ["161", "81", "162", "82"]}))
    out = tmp_path / "board"
    result = CliRunner().invoke(app, [
        "speed", "--task", "spec_bench", "--data-file", str(data), "--prompts", str(drawn), "--turns", "2",
        "--model", str(tiny_model_dir), "--heads-profile", "init", "--dtype", "float32", "--threads", "1",
        "--methods", "ar,pld,bpd:heads=3", "--repeats", "1", "--max-new-tokens", "8", "--limit", "4",
        "--out", str(out)])
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in (out / "speed.jsonl").read_text().splitlines()]
    ar = [r for r in records if r["method"] == "ar"]
    assert [r["id"] for r in ar] == ["161", "81", "81-t2", "162", "82", "82-t2"]
    assert [r["question"] for r in ar] == ["161", "81", "81", "162", "82", "82"]
    assert [r["turn"] for r in ar] == [1, 1, 2, 1, 1, 2]
    assert [r["subtask"] for r in ar] == ["qa", "mt_bench", "mt_bench", "qa", "mt_bench", "mt_bench"]
    assert all(r["prefill_s"] > 0 and r["identical"] for r in records)
    by_id = {r["id"]: r for r in ar}
    assert by_id["81-t2"]["prompt_tokens"] > by_id["81"]["prompt_tokens"]   # the conversation so far, and turn 2
    csv = pd.read_csv(out / "speed.csv").set_index("method")
    for col in ("decode_speedup_vs_ar", "decode_speedup_ci_low", "decode_speedup_ci_high", "mat", "ms_per_token"):
        assert col in csv.columns
    assert csv.loc["ar", "mat"] == 1.0 and csv.loc["ar", "decode_speedup_vs_ar"] == 1.0
    bpd = csv.loc["bpd:heads=3"]
    a_j = [float(x) for x in str(bpd.accept_per_position).split()]
    assert bpd.mat == pytest.approx(1 + sum(a_j), abs=2e-3)      # #MAT and a_1..a_k agree on the same counters
    assert bpd.ms_per_token == pytest.approx(1000 * bpd.seconds / bpd.tokens)
    by_task = pd.read_csv(out / "speed_by_subtask.csv")
    assert set(by_task.subtask) == {"qa", "mt_bench"}
    assert set(by_task[by_task.subtask == "mt_bench"].n_prompts) == {4}
    config = json.loads((out / "config.json").read_text())
    assert config["config"]["prompts"] == paths.portable(drawn) and config["config"]["turns"] == 2
    assert config["draw"]["ids"] == ["161", "81", "162", "82"] and len(config["draw"]["sha256"]) == 16
