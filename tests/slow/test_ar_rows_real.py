"""`ar:rows=4` on the real default model: a decode step's forward padded to 4 rows gives greedy decoding's tokens, in
float32 exactly and in bfloat16 exactly or at a certified near-tie (a 4-row and a 1-row forward round differently),
never a lost token. One prompt, 16 new tokens."""
from __future__ import annotations

import pytest

from bpdbench import models
from bpdbench.config import RunConfig
from bpdbench.engine import Limits, generate
from bpdbench.experiments.certificate import certify_output
from bpdbench.methods import Env, parse

ROWS = 4


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_padded_rows_are_greedy_or_a_certified_near_tie(dtype):
    try:
        model, tok = models.load(models.DEFAULT_MODEL, dtype)
    except models.ModelError as e:
        pytest.fail(f"default model unavailable: {e}")
    text = "def fibonacci(n):\n    if n < 2:\n        return n\n    return"
    prompt = tok(text, add_special_tokens=False)["input_ids"]
    limits = Limits(16)
    greedy = generate(model, None, prompt, limits).tokens
    method = parse(f"ar:rows={ROWS}")
    drafter = method.spec.build(Env(model, tok, RunConfig(dtype=dtype), limits, log=lambda m: None), method)
    out = generate(model, drafter, prompt, limits)
    assert out.counters.drafted > 0 and max(n for n, _, _ in out.verify_log) == ROWS
    cert = certify_output(model, prompt, out.tokens, greedy, dtype, width=ROWS - 1)
    assert cert.certificate in (("exact",) if dtype == "float32" else ("exact", "near_tie")), cert
