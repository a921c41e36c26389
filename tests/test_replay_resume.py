"""`replay --resume`: an interrupted or extended replay keeps its finished examples and equals a fresh run."""
from __future__ import annotations

import json
import random

import pandas as pd
from typer.testing import CliRunner

from bpdbench.cli import app


def test_replay_resume_extends_a_run_and_equals_a_fresh_one(tmp_path, monkeypatch, tiny_model_dir):
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    rng = random.Random(0)
    words = "the cat sat on a mat and then it ran to see the dog who was not happy".split()
    (tmp_path / "data" / "xsum").mkdir(parents=True)
    (tmp_path / "data" / "xsum" / "test.jsonl").write_text("\n".join(json.dumps(
        {"id": str(i), "document": " ".join(rng.choice(words) for _ in range(30)), "summary": "a cat"})
        for i in range(20)) + "\n")

    def replay(out, limit, *extra):
        r = CliRunner().invoke(app, ["replay", "--task", "xsum", "--methods", "bpd,16best-0gram,oracle:k=4", "--k",
                                     "4", "--model", str(tiny_model_dir), "--heads-profile", "init", "--heads", "3",
                                     "--dtype", "float32", "--data-dir", str(tmp_path / "data"),
                                     "--max-new-tokens", "10", "--limit", str(limit), "--out", out, *extra])
        return r.exit_code, r.output

    assert replay("fresh", 4)[0] == 0
    assert replay("resumed", 2)[0] == 0
    lines = (tmp_path / "resumed" / "replay.jsonl").read_text().splitlines()
    with open(tmp_path / "resumed" / "replay.jsonl", "a") as f:
        f.write('{"id": "2", "new_tok')   # a crash mid-write leaves a torn last line
    code, text = replay("resumed", 4, "--resume")
    assert code == 0 and "resuming: 2 examples already replayed" in text, text
    assert (tmp_path / "resumed" / "replay.jsonl").read_text().splitlines()[:2] == lines
    fresh, resumed = pd.read_csv(tmp_path / "fresh" / "replay.csv"), pd.read_csv(tmp_path / "resumed" / "replay.csv")
    pd.testing.assert_frame_equal(fresh, resumed)
    assert (resumed.n_examples == 4).all()
    code, text = replay("resumed", 4, "--resume", "--heads", "2")   # other heads: refuse, do not mix
    assert code != 0 and "differs in config.heads" in text
