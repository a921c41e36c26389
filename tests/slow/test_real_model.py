"""Smoke run on the real default model (Qwen2.5-Coder-0.5B from PyPI GGUF parts): float32, lossless."""
from __future__ import annotations

import json

import pytest
import torch

from bpdbench.experiments.plan import prepare
from bpdbench import models
from bpdbench.experiments.execute import execute
from tests.conftest import decode
from bpdbench.config import RunConfig

@pytest.fixture(scope="module")
def fp32_model():
    try:
        return models.load(models.DEFAULT_MODEL, "float32")
    except models.ModelError as e:
        pytest.fail(f"default model unavailable: {e}")


@pytest.fixture()
def loads_once(fp32_model, monkeypatch):
    """Commands that load the default model in float32 get the module's copy (loaded through the same
    models.load): loading 0.5B parameters again costs seconds per test and tests nothing new here."""
    load = models.load
    monkeypatch.setattr(models, "load", lambda name, dtype="bfloat16", device="cpu": fp32_model
                        if (name, dtype, device) == (models.DEFAULT_MODEL, "float32", "cpu")
                        else load(name, dtype, device))


def test_ar_matches_transformers_generate(fp32_model):
    model, tok = fp32_model
    ids = tok("def fibonacci(n):", add_special_tokens=False)["input_ids"]
    ours = decode(model, ids, 12).tokens
    hf = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False, temperature=None, top_p=None,
                        top_k=None, eos_token_id=None)[0, len(ids):].tolist()
    assert ours == hf


def test_bpd_smoke_run_is_lossless(loads_once, tmp_path):
    """Two XSum examples, 16 new tokens, float32, with small trained heads (the `ci` profile)."""
    cfg = RunConfig(task="xsum", limit=2, max_new_tokens=16, dtype="float32", heads_profile="ci",
                    max_prompt_tokens=192, out=str(tmp_path / "smoke"))
    row = execute(prepare(cfg, "run"), log=print)
    records = [json.loads(line) for line in (tmp_path / "smoke" / "examples.jsonl").read_text().splitlines()]
    assert len(records) == 2 and row["n_examples"] == 2
    assert row["lossless_rate"] == 1.0, [r["first_divergence"] for r in records]
    assert 0 < row["new_tokens"] <= 32 and row["serial_calls"] <= row["new_tokens"]   # EOS may end one early
    assert 0.0 <= row["rougeL"] <= 1.0


def test_sampling_p_is_what_generate_samples_from(fp32_model):
    """--temperature/--top-k/--top-p mean what they mean in generate(do_sample=True): our warped p equals the
    distribution generate samples its first token from (its processed scores)."""
    from bpdbench.engine import Sampler, SamplingParams
    model, tok = fp32_model
    x = torch.tensor([tok("def fibonacci(n):", add_special_tokens=False)["input_ids"]])
    out = model.generate(x, do_sample=True, temperature=0.7, top_k=50, top_p=0.9, max_new_tokens=1,
                         output_scores=True, return_dict_in_generate=True, repetition_penalty=1.0, min_p=None,
                         typical_p=1.0, eos_token_id=None)
    theirs = torch.softmax(out.scores[0][0].float(), -1)
    with torch.inference_mode():
        ours = Sampler(SamplingParams(0.7, 0.9, 50), 0).probs(model(x).logits[0, -1])
    assert torch.allclose(ours, theirs, atol=1e-6)
    assert 1 < int((ours > 0).sum()) <= 50


def test_sampled_run_smoke(loads_once, tmp_path):
    """T = 1 with the ci heads: the run records the statistical certificate and AR sampling's timing."""
    cfg = RunConfig(task="xsum", limit=1, max_new_tokens=8, dtype="float32", heads_profile="ci", temperature=1.0,
                    max_prompt_tokens=192, out=str(tmp_path / "sampled"))
    row = execute(prepare(cfg, "run"), log=print)
    assert row["certificate"].startswith("statistical (bpdbench certify --method bpd --temperature 1")
    assert "lossless_rate" not in row and row["new_tokens"] <= 8 and row["speedup_vs_ar"] > 0


def test_sam_tr_drafts_more_than_sam_alone(fp32_model, monkeypatch):
    """SAM[TR], sam's published default (Token Recycling below the threshold), against SAM without a fallback,
    replayed on 1 Spec-Bench prompt x 48 tokens in float32 with the real model: the recycling side, fed every verify
    forward's top-k through the wrapper, adds accepted tokens, so block efficiency is higher. The static side is off
    in both (it would be the same in both, and building the corpus index takes a minute on first use). One prompt:
    each of SAM[TR]'s verify steps scores its tree with a forward of the 0.5B model (about half a minute a prompt on
    one thread), and carrying the matrix across examples is tests/unit/test_sam.py's check on the tiny model."""
    from bpdbench.engine import TreeScorer, ratios, replay, teacher_forced
    from bpdbench.experiments.session import open_session
    monkeypatch.setattr(models, "load", lambda *args, **kwargs: fp32_model)     # the module's loaded model
    cfg = RunConfig(task="spec_bench", limit=1, max_new_tokens=48, dtype="float32", max_prompt_tokens=192)
    plan = prepare(cfg, "replay", "sam:static=none,fallback=none,sam:static=none")
    s = open_session(plan, log=print)
    alone, tr = (s.drafter(m) for m in plan.methods)
    assert tr.fallback is not None and alone.fallback is None
    totals = {}
    for ex in s.examples:
        prompt = s.prompt(ex)
        greedy = s.reference.get(prompt, s.limits)[0]
        hidden = teacher_forced(s.model, prompt, greedy, with_prompt=True)
        for key, d in (("alone", alone), ("tr", tr)):
            c = replay(d, prompt, greedy, hidden, s.limits, scorer=TreeScorer(s.model) if d.feedback_k else None)
            totals[key] = c if key not in totals else totals[key].add(c)
    eff = {k: ratios(c)["block_efficiency"] for k, c in totals.items()}
    assert eff["tr"] > eff["alone"], eff              # 1.263 against 1.021 (AMD EPYC, AVX2 only)
