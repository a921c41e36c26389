"""Smoke run on the real default model (Qwen2.5-Coder-0.5B from PyPI GGUF parts): float32, lossless."""
from __future__ import annotations

import json

import pytest
import torch

from bpdbench import models
from bpdbench.experiments import run as runner
from tests.conftest import decode
from bpdbench.config import RunConfig

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fp32_model():
    try:
        return models.load(models.DEFAULT_MODEL, "float32")
    except models.ModelError as e:
        pytest.fail(f"default model unavailable: {e}")


def test_ar_matches_transformers_generate(fp32_model):
    model, tok = fp32_model
    ids = tok("def fibonacci(n):", add_special_tokens=False)["input_ids"]
    ours = decode(model, ids, 12).tokens
    hf = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False, temperature=None, top_p=None,
                        top_k=None, eos_token_id=None)[0, len(ids):].tolist()
    assert ours == hf


def test_bpd_smoke_run_is_lossless(fp32_model, tmp_path):
    """Two XSum examples, 16 new tokens, float32, with small trained heads (the `ci` profile)."""
    cfg = RunConfig(task="xsum", limit=2, max_new_tokens=16, dtype="float32", heads_profile="ci",
                    out=str(tmp_path / "smoke"))
    row = runner.run(cfg, log=print)
    records = [json.loads(line) for line in (tmp_path / "smoke" / "examples.jsonl").read_text().splitlines()]
    assert len(records) == 2 and row["n_examples"] == 2
    assert row["lossless_rate"] == 1.0, [r["first_divergence"] for r in records]
    assert row["new_tokens"] == 32 and row["serial_calls"] <= 32
    assert 0.0 <= row["rougeL"] <= 1.0
