"""llama-cpp-python's prompt lookup on a prompt past one batch (512 tokens), on the real model: a regression test
for a failure in the prefill. In the heavy tier: two prefills of 700 tokens with every row's logits took 43 s
beside the other test worker on an AVX2-only EPYC, for one argument of one constructor (methods/llamacpp.py:
_build); the rows' own agreement is tests/slow/test_llamacpp_rows.py's, in `make test`. Skipped without llama.cpp
unless BPDBENCH_REQUIRE_LLAMACPP=1."""
from __future__ import annotations

from bpdbench.config import RunConfig
from bpdbench.experiments import speed
from bpdbench.experiments.plan import prepare


def test_the_prompt_lookup_takes_a_prompt_longer_than_a_batch(llamacpp_runtime):
    """llama-cpp-python sizes its logits buffer by its `logits_all` argument (n_batch = 512 rows without it) but turns
    every row's logits on itself when a draft model is given: a RAG or summarization prompt past 512 tokens failed in
    the prefill until the argument was given (methods/llamacpp.py: _build)."""
    from bpdbench.experiments.session import open_session
    cfg = RunConfig(task="spec_bench", limit=1, max_new_tokens=8, max_prompt_tokens=768, threads=2)
    plan = prepare(cfg, "speed", "llamacpp,llamacpp-pld")
    s = open_session(plan, log=print)
    fns, _ = speed.decoders(s, list(plan.methods), print)
    prompt = (s.prompt(s.examples[0]) * 40)[:700]
    assert fns["llamacpp-pld"](prompt, 0).tokens == fns["llamacpp"](prompt, 0).tokens
