"""Sampling through the commands, on the tiny random model: `run`, `speed` and `certify` at T > 0, and greedy results
unchanged by the new options. The exactness of the rule itself is tested in test_sampling.py."""
from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from bpdbench.engine import Limits, SamplingParams, SpeculativeSampling, generate
from tests.conftest import make_tiny_model, write_prompts
from tests.integration.test_bad_input import cli


@pytest.fixture()
def prompts(tmp_path):
    return write_prompts(tmp_path, 3)


def _run(model, prompts, out, *extra):
    return cli("run", "--task", "prompts", "--data-file", prompts, "--model", model, "--heads-profile", "init",
               "--heads", "2", "--limit", "3", "--max-new-tokens", "10", "--dtype", "float32", "--out", out, *extra)


def _records(out):
    return [json.loads(x) for x in (out / "examples.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("method", ["bpd", "medusa"])
def test_run_at_temperature_records_the_statistical_certificate(tiny_model_dir, prompts, tmp_path, method):
    code, text = _run(tiny_model_dir, prompts, tmp_path / "a", "--method", method, "--temperature", "0.8",
                      "--top-k", "20", "--seed", "5")
    assert code == 0, text
    summary = pd.read_csv(tmp_path / "a" / "summary.csv").iloc[0]
    assert "lossless_rate" not in summary and "n_lost" not in summary      # no fake greedy certificate
    assert summary.certificate.startswith(f"statistical (bpdbench certify --method {method}:heads=2 --temperature 0.8 "
                                          f"--top-k 20")
    assert summary.temperature == 0.8 and summary.top_k == 20 and summary.seed == 5
    assert summary.speedup_vs_ar > 0
    recs = _records(tmp_path / "a")
    assert [r["seed"] for r in recs] == [5, 6, 7]                           # seed + example index
    assert all(r["certificate"] == "statistical" and r["ref_new_tokens"] for r in recs)
    cfg = json.loads((tmp_path / "a" / "config.json").read_text())
    assert cfg["resolved"]["sampling"]["warpers"] == ["TemperatureLogitsWarper", "TopKLogitsWarper"]
    # same seed: the same draws; another seed: other outputs
    code, _ = _run(tiny_model_dir, prompts, tmp_path / "b", "--method", method, "--temperature", "0.8",
                   "--top-k", "20", "--seed", "5")
    assert code == 0 and [r["output_ids"] for r in _records(tmp_path / "b")] == [r["output_ids"] for r in recs]
    code, _ = _run(tiny_model_dir, prompts, tmp_path / "c", "--method", method, "--temperature", "0.8",
                   "--top-k", "20", "--seed", "99")
    assert code == 0 and [r["output_ids"] for r in _records(tmp_path / "c")] != [r["output_ids"] for r in recs]


def test_greedy_run_is_unchanged_by_the_options(tiny_model_dir, prompts, tmp_path):
    """Unset or temperature 0: greedy, certified per example, and the summary has no sampling columns."""
    code, text = _run(tiny_model_dir, prompts, tmp_path / "g", "--method", "bpd")
    assert code == 0, text
    code, text = _run(tiny_model_dir, prompts, tmp_path / "z", "--method", "bpd", "--temperature", "0")
    assert code == 0, text
    g, z = pd.read_csv(tmp_path / "g" / "summary.csv"), pd.read_csv(tmp_path / "z" / "summary.csv")
    assert g.lossless_rate.iloc[0] == 1.0 and "temperature" not in g.columns and "certificate" not in g.columns
    assert [r["output_ids"] for r in _records(tmp_path / "g")] == [r["output_ids"] for r in _records(tmp_path / "z")]


def test_prefill_memo_changes_nothing(tiny_model):
    """certify computes a prompt's forward once; greedy and seeded sampled outputs are the same without it."""
    prompt, memo = [5, 17, 3, 42, 8], {}
    for _ in range(2):
        assert generate(tiny_model, None, prompt, Limits(8), memo=memo).tokens == \
            generate(tiny_model, None, prompt, Limits(8)).tokens
        params = SamplingParams(temperature=1.0)
        assert generate(tiny_model, None, prompt, Limits(8), SpeculativeSampling(params, 3), memo=memo).tokens == \
            generate(tiny_model, None, prompt, Limits(8), SpeculativeSampling(params, 3)).tokens


def test_speed_at_temperature_is_per_token_and_skips_transformers_loops(tiny_model_dir, prompts, tmp_path):
    code, text = cli("speed", "--task", "prompts", "--data-file", prompts, "--model", tiny_model_dir,
                     "--heads-profile", "init", "--heads", "2", "--methods", "ar,bpd,sps:model=" + str(tiny_model_dir)
                     + ",hf-greedy", "--limit", "2", "--repeats", "2", "--max-new-tokens", "8",
                     "--dtype", "float32", "--temperature", "1", "--out", tmp_path / "s")
    assert code == 0, text
    df = pd.read_csv(tmp_path / "s" / "speed.csv").set_index("method")
    assert "hf-greedy" not in df.index and "skipping hf-greedy" in text
    assert (df.n_identical == df.n_prompts).all()           # same seed in every repeat: the same draws
    recs = [json.loads(x) for x in (tmp_path / "s" / "speed.jsonl").read_text().splitlines()]
    assert all(r["sampled"] for r in recs)
    ar = sum(r["median_s"] for r in recs if r["method"] == "ar") / sum(r["tokens"] for r in recs
                                                                        if r["method"] == "ar")
    bpd = [r for r in recs if r["method"] == "bpd:heads=2"]
    per_token = sum(r["median_s"] for r in bpd) / sum(r["tokens"] for r in bpd)
    assert df.loc["bpd:heads=2", "speedup_vs_ar"] == pytest.approx(ar / per_token)


def test_certify_passes_exact_and_catches_always_accept(tiny_model_dir, prompts, tmp_path):
    """The tiny model's random heads draft badly, so always-accept changes the distribution a lot."""
    code, text = cli("certify", "--task", "prompts", "--data-file", prompts, "--model", tiny_model_dir,
                     "--heads-profile", "init", "--heads", "2", "--limit", "2", "--dtype", "float32",
                     "--method", "bpd", "--temperature", "1", "--samples", "200", "--positions", "3",
                     "--rules", "exact,always-accept", "--out", tmp_path / "c")
    assert code == 0, text
    assert "bpd:heads=2 rule=exact: PASS" in text and "rule=always-accept (lossy control): detected as lossy" in text
    res = json.loads((tmp_path / "c" / "certify.json").read_text())
    fams = {f["rule"]: f for f in res["families"]}
    assert fams["exact"]["passed"] and not fams["always-accept"]["passed"]
    tests = pd.read_csv(tmp_path / "c" / "certify.csv")
    assert len(tests) == 2 * 2 * 3 and set(tests.position) == {1, 2, 3}
    assert res["samples"] == 200 and res["environment"]["dtype"] == "float32"
    samples = [json.loads(x) for x in (tmp_path / "c" / "samples.jsonl").read_text().splitlines()]
    assert {s["side"] for s in samples} == {"ar|exact", "bpd:heads=2|exact", "bpd:heads=2|always-accept"}


def test_sps_drafts_are_samples_from_q(tiny_model_dir):
    """At T > 0 sps reports q for every drafted token, and q is its warped distribution."""
    from bpdbench.engine import DraftContext
    from bpdbench.engine.sampling import Sampler
    from bpdbench.methods.sps import DraftModelDrafter
    draft = make_tiny_model(vocab=96, seed=1)
    d = DraftModelDrafter("sps", draft, 3)
    ctx = [5, 17, 3, 42]
    d.reset(ctx[:-1])
    d.observe(ctx[-1:])
    sampler = Sampler(SamplingParams(temperature=0.7, top_p=0.9), 0)
    p = d.propose(DraftContext(ctx, None, 10, sampler=sampler))
    assert p.dists is not None and p.dists[0].shape == (3, 96)
    with torch.inference_mode():
        logits = draft(input_ids=torch.tensor([ctx + p.paths[0]])).logits[0].float()
    for i, t in enumerate(p.paths[0]):
        q = Sampler(SamplingParams(temperature=0.7, top_p=0.9), 0).probs(logits[len(ctx) - 1 + i])
        assert torch.allclose(p.dists[0][i], q, atol=1e-5) and q[t] > 0


def test_sampling_table_pivots_temperatures(tmp_path):
    from bpdbench.report.tables import sampling_table
    rows = {"bpd-T0": (None, 1.5, 1.1), "bpd-T0.7": (0.7, 1.3, 0.9), "bpd-T1": (1.0, 1.2, 0.8)}
    for name, (t, be, sp) in rows.items():
        d = tmp_path / "sampling" / "xsum" / name
        d.mkdir(parents=True)
        pd.DataFrame([{"task": "xsum", "method": "bpd", "temperature": t, "block_efficiency": be,
                       "speedup_vs_ar": sp, "n_examples": 3}]).to_csv(d / "summary.csv", index=False)
    df = sampling_table(tmp_path).iloc[0]
    assert (df["BE T=0"], df["BE T=0.7"], df["BE T=1"]) == (1.5, 1.3, 1.2)
    assert (df["speedup T=0"], df["speedup T=1"], df.n_examples) == (1.1, 0.8, 3)


def test_sampling_table_sets_quality_beside_ar_sampling(tmp_path):
    from bpdbench.report.tables import sampling_table
    rows = {"bpd-T0": (None, 0.30, None), "bpd-T0.7": (0.7, 0.25, 0.27)}
    for name, (t, q, ar_q) in rows.items():
        d = tmp_path / "sampling" / "xsum" / name
        d.mkdir(parents=True)
        row = {"task": "xsum", "method": "bpd", "temperature": t, "block_efficiency": 1.2, "speedup_vs_ar": 1.0,
               "n_examples": 3, "rougeL": q}
        if ar_q is not None:
            row["ar_rougeL"] = ar_q
        pd.DataFrame([row]).to_csv(d / "summary.csv", index=False)
    df = sampling_table(tmp_path).iloc[0]
    assert (df["rougeL T=0"], df["AR rougeL T=0"]) == (0.30, 0.30)      # greedy: the outputs are AR's own
    assert (df["rougeL T=0.7"], df["AR rougeL T=0.7"]) == (0.25, 0.27)
