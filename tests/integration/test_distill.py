"""The features feature drafters see (DraftContext.accepted_hidden) and the cached distillation dataset, on the tiny
float32 model: every decided position's hidden state arrives exactly once, in order, in real decoding (chains and
trees) and in replay; the dataset's rows are the base's own hidden states, next tokens and teacher top-k."""
from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from bpdbench.engine import Limits, Proposal, generate, replay, teacher_forced
from bpdbench.train import distill

PROMPTS = ([5, 17, 3, 42, 8, 11], [1, 2, 3], [90, 4, 4, 4, 7, 90, 4, 4])


class Recorder:
    """Proposes two paths per step (a wrong one first, then the greedy continuation with every third step wrong, so
    acceptance varies and the accepted nodes are not the first path's) and records every accepted_hidden."""
    name = "recorder"

    def __init__(self, greedy: list[int]):
        self.greedy = greedy

    def reset(self, prompt_ids):
        self.start, self.rows, self.steps = len(prompt_ids), [], 0

    def propose(self, ctx):
        assert ctx.accepted_hidden is not None
        assert sum(r.shape[0] for r in self.rows) + ctx.accepted_hidden.shape[0] == len(ctx.tokens) - 1
        assert torch.equal(ctx.accepted_hidden[-1], ctx.hidden)
        self.rows.append(ctx.accepted_hidden.clone())
        self.steps += 1
        m = len(ctx.tokens) - self.start
        right = self.greedy[m: m + 3]
        if self.steps % 3 == 0 and right:
            right = right[:1] + [(right[0] + 1) % 96]
        wrong = [(t + 7) % 96 for t in right]
        return Proposal([wrong, right])

    def observe(self, tokens):
        pass


@pytest.mark.parametrize("prompt", PROMPTS)
def test_accepted_hidden_is_every_position_once(tiny_model, prompt):
    limits = Limits(30)
    greedy = generate(tiny_model, None, list(prompt), limits).tokens
    full = teacher_forced(tiny_model, list(prompt), greedy, with_prompt=True)
    assert full.shape[0] == len(prompt) - 1 + len(greedy)
    real = Recorder(greedy)
    gen = generate(tiny_model, real, list(prompt), limits)
    assert gen.tokens == greedy and 0 < gen.counters.accepted < gen.counters.drafted
    seen = torch.cat(real.rows)
    assert torch.allclose(seen, full[: seen.shape[0]], atol=1e-4)      # incremental vs one forward, fp32
    replayed = Recorder(greedy)
    counters = replay(replayed, list(prompt), greedy, full, limits)
    assert counters.to_dict() == gen.counters.to_dict()
    assert [r.shape[0] for r in replayed.rows] == [r.shape[0] for r in real.rows]
    assert torch.equal(torch.cat(replayed.rows), full[: seen.shape[0]])


def test_replay_without_prompt_rows_starts_at_the_prompts_last_position(tiny_model):
    """teacher_forced's default (no prompt rows): the first proposal sees one row; a feature drafter can tell."""
    prompt, limits = list(PROMPTS[0]), Limits(20)
    greedy = generate(tiny_model, None, prompt, limits).tokens
    rec = Recorder(greedy)
    with pytest.raises(AssertionError):
        replay(rec, prompt, greedy, teacher_forced(tiny_model, prompt, greedy), limits)
    assert rec.rows == [] and rec.steps == 0


@pytest.fixture
def eos_model(tiny_model, monkeypatch):
    monkeypatch.setattr(tiny_model.generation_config, "eos_token_id", 95)
    return tiny_model


def _prompts():
    return [(list(p), cap) for p, cap in zip(PROMPTS * 3, (12, 20, 7, 16, 3, 20, 9, 11, 14))]


def test_rows_are_the_bases_own_states_tokens_and_teacher(eos_model):
    b = distill.Budget(9, 20, None, batch=4, prompt_positions=4, dtype="float32")
    seqs = distill.generate(eos_model, SimpleNamespace(pad_token_id=0), _prompts(), b, log=lambda m: None)
    assert len(seqs) == 9
    for (prompt, cap), s in zip(sorted(_prompts(), key=lambda pg: (pg[1], len(pg[0]))), seqs):   # pool order
        k = s["n_prompt"]
        greedy = s["next_ids"][k:].tolist()
        ref = generate(eos_model, None, prompt, Limits(cap, frozenset({95}))).tokens
        assert greedy == ref and k == min(4, len(prompt) - 1)
        assert s["next_ids"][:k].tolist() == prompt[len(prompt) - k:]
        assert s["positions"].tolist() == list(range(len(prompt) - 1 - k, len(prompt) - 1 + len(greedy)))
        full = teacher_forced(eos_model, prompt, greedy, with_prompt=True)
        assert torch.allclose(s["hidden"].float(), full[s["positions"]], atol=1e-4)
        assert s["top_ids"][k:, 0].tolist() == greedy               # the teacher's top-1 is the greedy choice
        lp = s["top_lp"]
        assert torch.all(lp[:, :-1] >= lp[:, 1:]) and torch.all(lp <= 0)


def test_build_is_cached_atomic_and_loads(eos_model, tmp_path, monkeypatch):
    import tasks
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path))
    monkeypatch.setattr(distill, "prompt_pool", lambda tok, n, max_tokens, seed, gen: _prompts())
    monkeypatch.setattr(tasks, "default_data_dir", lambda: None)
    tok = SimpleNamespace(pad_token_id=0)
    budget = distill.Budget(9, 20, None, batch=4, prompt_positions=4, dtype="float32", eval_every=3, name="ci")
    out = distill.build("tiny", budget, eos_model, tok, log=lambda m: None)
    assert out == distill.path_for("tiny", "ci") and not out.with_name(out.name + ".tmp").exists()
    ds = distill.load(out)
    assert ds.meta["sequences"] == 9 and ds.meta["budget_name"] == "ci" and ds.hidden.dtype == torch.bfloat16
    assert ds.meta["dtype"] == "float32" and ds.meta["truncated_by_time"] is False
    assert ds.meta["environment"]["device"] == "cpu"                # where it was generated (the caller's model)
    assert "quality_warning" not in ds.meta                         # every prompt, as the budget says
    held, train = ds.split(True), ds.split(False)
    assert held == [0, 3, 6] and sorted(held + train) == list(range(9))
    mask = ds.greedy_mask()
    assert int(mask.sum()) == ds.meta["greedy_positions"] == sum(
        int(ds.offsets[s + 1] - ds.offsets[s] - ds.n_prompt[s]) for s in range(9))
    short = ds.shortlist(3, {95})
    assert 95 in short.tolist() and short.tolist() == sorted(short.tolist())
    assert int(ds.rank[0]) == 95                                    # EOS ranks first
    seq = ds.sequences([1])[0]
    assert seq[0].shape[0] == seq[1].shape[0] == int(ds.offsets[2] - ds.offsets[1])
    calls = []
    monkeypatch.setattr(distill, "build", lambda *a, **k: calls.append(a))
    assert distill.ensure("tiny", "ci", eos_model, tok).meta["rows"] == ds.meta["rows"] and not calls


def test_generation_device_is_the_flag_else_the_callers_model_else_the_cpu(tiny_model):
    """A run's first-use training generates where the run decodes; `--device` overrides; nothing given is the CPU."""
    from bpdbench.train.greedy import base_on, device_for
    model = tiny_model
    assert device_for(None) == "cpu" and device_for(None, model) == str(model.device) == "cpu"
    assert device_for("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    assert base_on("not-a-model", "float32", "cpu", model, "tok") == (model, "tok")    # reused, never reloaded
    with pytest.raises(Exception, match="not-a-model"):
        base_on("not-a-model", "bfloat16", "cpu", model, "tok")                       # another dtype: loads


def test_missing_or_corrupt_data_is_one_line(tmp_path):
    with pytest.raises(FileNotFoundError, match="bpdbench distill-data"):
        distill.load(tmp_path / "none")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / distill.FILE).write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(FileNotFoundError, match="truncated or corrupt"):
        distill.load(tmp_path / "bad")


def test_a_budget_object_that_changed_builds_again_and_states_can_stay_as_made(eos_model, tmp_path, monkeypatch):
    """The heads' budgets are objects derived from their profile: cached data made with other settings under the same
    name is built again (said in one line), the same settings load the cache, and `states="made"` keeps fp32 states."""
    import tasks
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path))
    monkeypatch.setattr(distill, "prompt_pool", lambda tok, n, max_tokens, seed, gen: _prompts()[:n])
    monkeypatch.setattr(tasks, "default_data_dir", lambda: None)
    tok = SimpleNamespace(pad_token_id=0)
    budget = distill.Budget(6, 20, None, batch=4, prompt_positions=4, dtype="float32", states="made", name="heads-t")
    first = distill.ensure("tiny", budget, eos_model, tok, log=lambda m: None)
    assert first.hidden.dtype == torch.float32 and first.meta["hidden_dtype"] == "float32"
    assert first.meta["sequences"] == 6
    calls, lines = [], []
    real_build = distill.build
    monkeypatch.setattr(distill, "build", lambda *a, **k: calls.append(a) or real_build(*a, **k))
    assert distill.ensure("tiny", budget, eos_model, tok, log=lines.append).meta["sequences"] == 6 and not calls
    bigger = distill.ensure("tiny", replace(budget, n_prompts=9), eos_model, tok, log=lines.append)
    assert len(calls) == 1 and bigger.meta["sequences"] == 9
    assert any("made with another budget (n_prompts)" in m for m in lines)
    assert distill.ensure("tiny", "heads-t", eos_model, tok).meta["sequences"] == 9 and len(calls) == 1


def test_generation_stops_at_the_positions_target_not_at_a_time(eos_model, monkeypatch):
    """A budget is a size: generation stops once its greedy positions exist, however slow the clock says it is."""
    from bpdbench.train import pacing
    clock = iter(range(0, 10**9, 10**5))                            # every call: 100,000 s later
    monkeypatch.setattr(pacing.time, "time", lambda: next(clock))
    monkeypatch.setattr(pacing.time, "perf_counter", lambda: next(clock))   # the first batch's rates too
    b = distill.Budget(9, 20, 25, batch=2, prompt_positions=4, dtype="float32")
    lines = []
    pacer = pacing.Pacer("t", b.greedy_positions, lines.append)
    seqs = distill.generate(eos_model, SimpleNamespace(pad_token_id=0), _prompts(), b, lines.append, pacer)
    n = [len(s["next_ids"]) - s["n_prompt"] for s in seqs]
    assert sum(n) >= 25 and sum(n[:-2]) < 25 and len(seqs) < 9       # the batch that crossed it was the last
    assert not pacer.truncated_by_time and pacer.source == "first batch"
    assert any("expected" in m and "(first batch)" in m for m in lines)


def test_safety_cap_stops_loudly_and_the_data_records_it(eos_model, tmp_path, monkeypatch):
    """Past 3x the expected time generation stops with a WARNING, and meta.json says truncated_by_time and warns."""
    import tasks
    from bpdbench.train import pacing
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path))
    monkeypatch.setattr(distill, "prompt_pool", lambda tok, n, max_tokens, seed, gen: _prompts())
    monkeypatch.setattr(tasks, "default_data_dir", lambda: None)
    monkeypatch.setattr(distill, "predict_seconds", lambda *a: 1e-6)  # a calibration that promises far too much
    budget = distill.Budget(9, 20, 10**6, batch=2, prompt_positions=4, dtype="float32", name="ci")
    lines = []
    ds = distill.load(distill.build("tiny", budget, eos_model, SimpleNamespace(pad_token_id=0), log=lines.append))
    assert ds.meta["truncated_by_time"] is True and ds.meta["expected_from"] == "calibration"
    assert "safety time cap" in ds.meta["quality_warning"] and ds.meta["sequences"] < 9
    assert any(m.startswith("WARNING:") and "safety cap" in m for m in lines)
    assert any(m.startswith("WARNING:") and "meta.json" in m for m in lines)


def test_drafter_below_the_floor_warns_and_a_run_with_it_says_and_records_it(tiny_model_dir, tmp_path, monkeypatch):
    """A drafter whose held-out depth-1 top-1 is below the floor carries a quality_warning in its report; a run that
    uses it logs `WARNING:` once and records the warning in config.json and in its summary row."""
    from dataclasses import replace

    import pandas as pd
    from typer.testing import CliRunner

    import tasks
    from bpdbench import models
    from bpdbench.cli import app
    from bpdbench.train import network, pacing
    from tests.conftest import write_prompts
    from tests.drafter_fixtures import synthetic_prompts
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("BPDBENCH_RESULTS", str(tmp_path / "results"))
    monkeypatch.setattr(distill, "prompt_pool", synthetic_prompts)
    monkeypatch.setattr(tasks, "default_data_dir", lambda: None)
    monkeypatch.setattr(pacing, "QUALITY_FLOOR", 1.0)
    data = replace(distill.BUDGETS["ci"], n_prompts=12, gen_tokens=12)
    profile = replace(network.PROFILES["ci"], steps=5, data=data)     # saved where `ci` is: hydra:profile=ci finds it
    name = str(tiny_model_dir)
    model, tok = models.load(name, "float32")
    lines = []
    path = network.train("hydra", profile, name, model, tok, log=lines.append)
    report = json.loads((path / "report.json").read_text())
    warning = report["quality_warning"]
    assert "below the quality floor" in warning and report["data"]["dtype"] == "float32"
    assert any(m.startswith("WARNING:") and warning in m for m in lines)
    result = CliRunner().invoke(app, [str(a) for a in (
        "run", "--task", "prompts", "--data-file", write_prompts(tmp_path, 3), "--model", name, "--method",
        "hydra:profile=ci", "--limit", "2", "--max-new-tokens", "8", "--dtype", "float32", "--out", tmp_path / "r")])
    assert result.exit_code == 0, result.output
    assert len([m for m in result.output.splitlines() if m.startswith("WARNING:") and warning in m]) == 1
    config = json.loads((tmp_path / "r" / "config.json").read_text())
    assert config["resolved"]["quality_warning"] == warning
    assert pd.read_csv(tmp_path / "r" / "summary.csv").iloc[0].quality_warning == warning


def test_first_batch_prediction_uses_its_rates_not_its_positions():
    """The first batch holds the shortest caps (batches are sorted by cap): its positions per second would predict
    several times too long; its prefill and step rates applied to the pool's mean prompt and cap do not."""
    from bpdbench.train import pacing
    prompts = [([1] * 10, 4)] * 2 + [([1] * 30, 100)] * 2            # mean prompt 20 tokens, mean cap 52
    clock = {"prefill_s": 2.0, "prompt_tokens": 20, "steps": 4, "decode_s": 4.0}   # 0.1 s/token, 1 s/step
    got = pacing.predict_from_batch(clock, positions=1000, batch=2, prompts=prompts)
    batches = -(-1000 // (2 * 52 * pacing.FILL))
    assert got == pytest.approx(batches * (2 * 20 * 0.1 + 52 * 1.0))
    assert pacing.predict_from_batch({}, 1000, 2, prompts) is None
