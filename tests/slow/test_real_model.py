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
    """Two XSum examples, 16 new tokens, float32, with the heads `make demo` trained (the `quick` profile, the
    default). Why not the smaller `ci` heads: after the demo, training those was the slowest thing `make test` did
    (124 s cold, 11 s warm, with torch held to its AVX2 kernels on an AMD EPYC), and what is checked here is
    decoding."""
    cfg = RunConfig(task="xsum", limit=2, max_new_tokens=16, dtype="float32", heads_profile="quick",
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
    """T = 1 with the demo's heads: the run records the statistical certificate and AR sampling's timing."""
    cfg = RunConfig(task="xsum", limit=1, max_new_tokens=8, dtype="float32", heads_profile="quick", temperature=1.0,
                    max_prompt_tokens=192, out=str(tmp_path / "sampled"))
    row = execute(prepare(cfg, "run"), log=print)
    assert row["certificate"].startswith("statistical (bpdbench certify --method bpd --temperature 1")
    assert "lossless_rate" not in row and row["new_tokens"] <= 8 and row["speedup_vs_ar"] > 0

