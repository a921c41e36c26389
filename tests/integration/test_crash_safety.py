"""Nothing lost, nothing silent: torn lines, glued lines, duplicates, two writers, kill -9, truncated prompts,
missing shortlists, corrupt greedy references, and the bfloat16 certificate (exact / near_tie / lost)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from bpdbench.experiments import certificate
from bpdbench.engine import Limits, generate
from bpdbench.store import AppendOnlyJsonl, OutputBusy, OutputLock, read_examples, repair
from tests.conftest import write_prompts
from tests.integration.test_bad_input import base_args, cli, heads_dir, with_opts, write_lines

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("BPDBENCH_RESULTS", str(tmp_path / "results"))


@pytest.fixture()
def run2(tiny_model_dir, tmp_path):
    """A finished 2-example run and the args that made it."""
    prompts = write_prompts(tmp_path, 6)
    args = base_args(prompts, tiny_model_dir, tmp_path / "run")
    code, text = cli(*args)
    assert code == 0, text
    return tmp_path / "run", args


def ids(out: Path) -> list[str]:
    return [json.loads(line)["id"] for line in (out / "examples.jsonl").read_text().splitlines()]


def test_torn_last_line_is_cut_and_resume_appends_cleanly(run2):
    out, args = run2
    with open(out / "examples.jsonl", "a") as f:
        f.write('{"id": "p2", "category": null, "prompt_tok')          # the crash mid-write
    code, text = cli(*with_opts(args, limit="3"))
    assert code == 0 and "torn last line" in text, text
    assert ids(out) == ["p0", "p1", "p2"]
    code, text = cli(*with_opts(args, limit="3"))                      # a second resume finds nothing to fix
    assert code == 0 and "torn last line" not in text and ids(out) == ["p0", "p1", "p2"], text
    summary = pd.read_csv(out / "summary.csv").iloc[0]
    assert summary.n_examples == 3 and summary.n_exact == 3 and summary.n_near_tie == 0 and summary.n_lost == 0


def test_line_glued_by_an_old_crash_keeps_its_record(run2):
    out, args = run2
    p0, p1 = (out / "examples.jsonl").read_text().splitlines()
    (out / "examples.jsonl").write_text(p0 + "\n" + p1[:40] + p1 + "\n")   # fragment + the complete record
    code, text = cli(*with_opts(args, limit="3"))
    assert code == 0, text
    assert ids(out) == ["p0", "p1", "p2"]


def test_duplicate_records_are_counted_once(run2):
    out, args = run2
    first = (out / "examples.jsonl").read_text().splitlines()[0]
    with open(out / "examples.jsonl", "a") as f:
        f.write(first + "\n")
    code, text = cli(*args)
    assert code == 0, text
    assert pd.read_csv(out / "summary.csv").iloc[0].n_examples == 2
    assert [r["id"] for r in read_examples(out / "examples.jsonl")] == ["p0", "p1"]


def test_changing_only_threads_resumes(run2):
    out, args = run2
    code, text = cli(*with_opts(args, threads="1", limit="3"))
    assert code == 0, text
    assert ids(out) == ["p0", "p1", "p2"]


def test_repair_keeps_a_complete_record_missing_its_newline(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"id": "a"}\n{"id": "b"}')
    assert repair(path, log=lambda m: None) == 0
    assert path.read_text() == '{"id": "a"}\n{"id": "b"}\n'


def test_append_only_dedupes_by_key_under_the_commands_one_lock(tmp_path):
    key = lambda r: (r["id"], r["method"])  # noqa: E731  (the speed command's key)
    with OutputLock(tmp_path / "s") as lock:
        with pytest.raises(RuntimeError, match="holds its lock already"):
            OutputLock(tmp_path / "s").acquire()                      # taken once per command, never counted
        with pytest.raises(RuntimeError, match="not this folder"):
            AppendOnlyJsonl(tmp_path / "other", "speed.jsonl", key, lock=lock)
        with AppendOnlyJsonl(tmp_path / "s", "speed.jsonl", key, lock=lock) as f:
            assert len(f.append([{"id": "a", "method": "ar"}, {"id": "a", "method": "bpd"}])) == 2
            assert f.append([{"id": "a", "method": "ar"}]) == []
    lines = (tmp_path / "s" / "speed.jsonl").read_text().splitlines()
    assert len(lines) == 2
    with OutputLock(tmp_path / "s"):         # released: can be taken again
        pass


def test_replay_resume_after_torn_line(tiny_model_dir, tmp_path):
    prompts = write_prompts(tmp_path, 4)
    args = ["replay", "--task", "prompts", "--data-file", prompts, "--model", tiny_model_dir, "--heads-profile",
            "init", "--heads", "2", "--methods", "bpd", "--limit", "2", "--max-new-tokens", "6", "--dtype",
            "float32", "--out", tmp_path / "r"]
    assert cli(*args)[0] == 0
    with open(tmp_path / "r" / "replay.jsonl", "a") as f:
        f.write('{"id": "p2", "new_tok')
    code, text = cli(*with_opts(args, limit="3"), "--resume")
    assert code == 0 and "torn last line" in text, text
    got = [json.loads(line)["id"] for line in (tmp_path / "r" / "replay.jsonl").read_text().splitlines()]
    assert got == ["p0", "p1", "p2"]


def test_second_writer_fails_at_once_and_kill9_loses_nothing(tiny_model_dir, tmp_path):
    """A real process, SIGKILLed after its first record: a second writer is refused naming its pid, and a resume
    ends with every id exactly once."""
    prompts = write_prompts(tmp_path, 200)
    out = tmp_path / "run"
    args = with_opts(base_args(prompts, tiny_model_dir, out), limit="200", max_new_tokens="48")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", "from bpdbench.cli import main; main()", *map(str, args)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while not ((out / "examples.jsonl").exists() and (out / "examples.jsonl").stat().st_size):
            assert proc.poll() is None and time.time() < deadline, "the first writer never wrote a record"
            time.sleep(0.1)
        started = time.time()
        code, text = cli(*args)
        assert code == 2 and f"pid {proc.pid}" in text and "different --out" in text, text
        assert time.time() - started < 5, "the second writer must fail at once, not after loading"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    n = len((out / "examples.jsonl").read_bytes().split(b"\n"))
    code, text = cli(*with_opts(args, limit=str(n + 2)))
    assert code == 0, text
    got = ids(out)
    assert got == [f"p{i}" for i in range(n + 2)], got


def test_overlong_prompt_is_recorded_and_warned_once(tiny_model_dir, tmp_path):
    data = write_lines(tmp_path / "long.jsonl", [{"id": f"l{i}", "prompt": "ab" * 800} for i in range(2)])
    args = base_args(data, tiny_model_dir, tmp_path / "run")
    code, text = cli(*with_opts(args, max_new_tokens="2"))
    assert code == 0, text
    assert text.count("truncated to its last 1024") == 1, text
    recs = read_examples(tmp_path / "run" / "examples.jsonl")
    assert [(r["prompt_tokens"], r["prompt_truncated_from"]) for r in recs] == [(1024, 1600), (1024, 1600)]


def test_missing_shortlist_is_recorded(tiny_model_dir, tmp_path):
    prompts = write_prompts(tmp_path, 2)
    args = with_opts(base_args(prompts, tiny_model_dir, tmp_path / "run"), heads_profile=None,
                     heads_path=heads_dir(tmp_path, corrupt="no-shortlist"))
    code, text = cli(*args)
    assert code == 0 and "shortlist.pt is missing" in text, text
    meta = json.loads((tmp_path / "run" / "config.json").read_text())
    assert meta["resolved"]["heads_files"]["shortlist"].startswith("MISSING")


def test_corrupt_greedy_reference_is_recomputed_not_called_a_near_tie(run2, tmp_path):
    out, args = run2
    files = sorted((tmp_path / "cache" / "greedy").glob("*.json"))
    assert len(files) == 2
    good = [json.loads(f.read_text())["tokens"] for f in files]
    for f in files:
        f.write_text('{"tokens": [1, 2')                                   # torn file
    code, text = cli(*with_opts(args, out=tmp_path / "b"))
    assert code == 0 and text.count("is corrupt") == 2, text
    for f, tokens in zip(files, good):                                     # valid JSON, wrong tokens, no checksum
        f.write_text(json.dumps({"tokens": tokens[:2] + [(tokens[2] + 1) % 96] + tokens[3:]}))
    code, text = cli(*with_opts(args, out=tmp_path / "c"))
    assert code == 0 and text.count("disagrees with greedy decoding") == 2 and "diverges from greedy" not in text, text
    recs = read_examples(tmp_path / "c" / "examples.jsonl")
    assert [r["certificate"] for r in recs] == ["exact", "exact"]
    assert [json.loads(f.read_text())["tokens"] for f in files] == good


def test_real_divergence_fails_loudly_after_writing(run2, tmp_path, monkeypatch):
    from bpdbench.experiments.session import Session
    out, args = run2
    original = Session.decode

    def broken(self, drafter, prompt_ids, *args, **kwargs):   # a KV-cache bug stand-in: token 3 is wrong
        gen = original(self, drafter, prompt_ids, *args, **kwargs)
        gen.tokens[3] = (gen.tokens[3] + 7) % 96
        return gen
    monkeypatch.setattr(Session, "decode", broken)
    code, text = cli(*with_opts(args, out=tmp_path / "lost", dtype="bfloat16"))
    assert code == 1 and "lost" in text.splitlines()[-1], text
    recs = read_examples(tmp_path / "lost" / "examples.jsonl")
    assert [r["certificate"] for r in recs] == ["lost", "lost"]
    assert all(r["first_divergence"] == 3 and r["token_gap"] > r["numeric_diff"] for r in recs)
    assert pd.read_csv(tmp_path / "lost" / "summary.csv").iloc[0].n_lost == 2


@pytest.fixture(scope="module")
def bf16_case(tiny_model):
    import copy
    m = copy.deepcopy(tiny_model).to(torch.bfloat16)
    prompt = [5, 17, 33, 2, 60, 61, 9]
    ref = generate(m, None, prompt, Limits(12)).tokens
    return m, prompt, ref


def test_certificate_exact_and_lost(bf16_case):
    m, prompt, ref = bf16_case
    assert certificate.certify_output(m, prompt, ref, ref, "bfloat16").certificate == "exact"
    logits = certificate._teacher_forced(m, prompt + ref[:4])
    worst = list(ref)
    worst[4] = int(logits.argmin())
    cert = certificate.certify_output(m, prompt, worst[:5], ref, "bfloat16")
    assert cert.certificate == "lost" and cert.token_gap > cert.numeric_diff >= 0
    assert cert.top2_margin <= cert.token_gap


def test_certificate_near_tie_needs_a_measured_difference(bf16_case, monkeypatch):
    m, prompt, ref = bf16_case
    logits = certificate._teacher_forced(m, prompt + ref[:4])
    second = list(ref)
    second[4] = int(logits.topk(2).indices[1])
    real = certificate._teacher_forced
    gap = float(logits.topk(2).values[0] - logits.topk(2).values[1])
    # pretend block and 1-token forwards differ by more than the gap: then, and only then, it is a near-tie
    monkeypatch.setattr(certificate, "_teacher_forced", lambda model, ids: real(model, ids) + 2 * gap + 1)
    assert certificate.certify_output(m, prompt, second[:5], ref, "bfloat16").certificate == "near_tie"
    assert certificate.certify_output(m, prompt, second[:5], ref, "float32").certificate == "lost"


def test_certificate_names_a_wrong_reference(bf16_case):
    m, prompt, ref = bf16_case
    wrong = list(ref)
    wrong[2] = (wrong[2] + 1) % 96
    cert = certificate.certify_output(m, prompt, ref, wrong, "bfloat16")
    assert not cert.reference_ok and "reference" in cert.reason


def test_output_lock_names_the_holder(tmp_path):
    code = ("import sys, time; from bpdbench.store import OutputLock; l = OutputLock(sys.argv[1]); "
            "l.acquire(); print('locked', flush=True); time.sleep(30)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "o")], env=env, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        with pytest.raises(OutputBusy, match=f"pid {proc.pid}"):
            OutputLock(tmp_path / "o").acquire()
    finally:
        proc.kill()
        proc.wait()
    with OutputLock(tmp_path / "o"):        # the kernel released the dead holder's lock
        pass
