"""`replay --resume`: an interrupted or extended replay keeps its finished examples and equals a fresh run, also for
a drafter that learns across examples (Token Recycling), whose state is saved per example and put back."""
from __future__ import annotations

import json
import random

import pandas as pd
from typer.testing import CliRunner

from bpdbench.cli import app


def write_xsum(tmp_path) -> None:
    rng = random.Random(0)
    words = "the cat sat on a mat and then it ran to see the dog who was not happy".split()
    (tmp_path / "data" / "xsum").mkdir(parents=True)
    (tmp_path / "data" / "xsum" / "test.jsonl").write_text("\n".join(json.dumps(
        {"id": str(i), "document": " ".join(rng.choice(words) for _ in range(30)), "summary": "a cat"})
        for i in range(20)) + "\n")


def replay_cli(tmp_path, model_dir, methods: str, out, limit, *extra, new_tokens: int = 10):
    r = CliRunner().invoke(app, ["replay", "--task", "xsum", "--methods", methods, "--k", "4", "--model",
                                 str(model_dir), "--heads-profile", "init", "--heads", "3", "--dtype", "float32",
                                 "--data-dir", str(tmp_path / "data"), "--max-new-tokens", str(new_tokens),
                                 "--limit", str(limit), "--out", str(out), *extra])
    return r.exit_code, r.output


def test_replay_resume_extends_a_run_and_equals_a_fresh_one(tmp_path, monkeypatch, tiny_model_dir):
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    write_xsum(tmp_path)

    def replay(out, limit, *extra):
        return replay_cli(tmp_path, tiny_model_dir, "bpd,16best-0gram,oracle:k=4", out, limit, *extra)

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
    assert not (tmp_path / "resumed" / "replay.state.json").exists()    # no method keeps state: no state file
    code, text = replay("resumed", 4, "--resume", "--heads", "2")   # other heads: refuse, do not mix
    assert code != 0 and "differs in config.heads" in text


def test_a_resumed_replay_of_recycling_equals_the_uninterrupted_one(tmp_path, monkeypatch, tiny_model_dir):
    """Stopped after 2 examples, then after 3 with a crash between example 3's record and its saved state: the
    resumed replay drops example 3, replays it again from the state example 2 left, and equals the uninterrupted
    run record for record. The control: examples 3 and 4 replayed from a cold matrix count otherwise."""
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    write_xsum(tmp_path)

    def replay(out, limit, *extra):
        return replay_cli(tmp_path, tiny_model_dir, "pld,recycling", out, limit, *extra, new_tokens=24)

    def records(out) -> list[dict]:
        return [json.loads(line) for line in (tmp_path / out / "replay.jsonl").read_text().splitlines()]

    assert replay("fresh", 4)[0] == 0
    assert replay("resumed", 2)[0] == 0
    after_two = (tmp_path / "resumed" / "replay.state.json").read_text()
    assert replay("resumed", 3, "--resume")[0] == 0
    (tmp_path / "resumed" / "replay.state.json").write_text(after_two)     # killed before example 3's state
    code, text = replay("resumed", 4, "--resume")
    assert code == 0 and "1 record(s) written after the last saved drafter state" in text, text
    assert records("resumed") == records("fresh")
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "fresh" / "replay.csv"),
                                  pd.read_csv(tmp_path / "resumed" / "replay.csv"))
    assert replay("cold", 2, "--offset", "2")[0] == 0
    assert [r["recycling"] for r in records("cold")] != [r["recycling"] for r in records("fresh")[2:]]
    (tmp_path / "resumed" / "replay.state.json").unlink()        # the state is lost: refuse, never replay it cold
    code, text = replay("resumed", 5, "--resume")
    assert code == 2 and any(line.startswith("error: cannot resume") and "keeps state across examples" in line
                             for line in text.splitlines()), text
