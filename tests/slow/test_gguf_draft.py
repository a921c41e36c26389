"""`qdraft:runtime=gguf` on the real model: the target's own GGUF file, run by llama.cpp, drafts for the float32
target. Decoding equals greedy, replay equals real decoding step by step, and the drafts are accepted (the file is
the target's own weights, so agreement is high). Skipped without llama.cpp unless BPDBENCH_REQUIRE_LLAMACPP=1
(`make test` sets it after `make llamacpp`), which turns the skip into a failure."""
from __future__ import annotations

from bpdbench import models
from bpdbench.config import RunConfig
from bpdbench.experiments.plan import prepare


def test_the_gguf_draft_is_lossless_replays_as_it_decodes_and_is_accepted(llamacpp_runtime, monkeypatch):
    from bpdbench.engine import generate, ratios, replay, teacher_forced
    from bpdbench.experiments.session import open_session
    fp32 = models.load(models.DEFAULT_MODEL, "float32")
    monkeypatch.setattr(models, "load", lambda *a, **k: fp32)
    cfg = RunConfig(task="spec_bench", limit=1, max_new_tokens=32, dtype="float32", max_prompt_tokens=192)
    plan = prepare(cfg, "replay", "qdraft:runtime=gguf,length=4")
    s = open_session(plan, log=print)
    (method,) = plan.methods
    ex = s.examples[0]
    prompt = s.prompt(ex)
    greedy = s.reference.get(prompt, s.limits)[0]
    real = generate(s.model, s.drafter(method), list(prompt), s.limits)
    assert real.tokens == greedy
    hidden = teacher_forced(s.model, list(prompt), greedy, with_prompt=True)
    sim = replay(s.drafter(method), list(prompt), greedy, hidden, s.limits)
    assert sim.to_dict() == real.counters.to_dict()
    assert ratios(real.counters)["block_efficiency"] > 2.0, real.counters.to_dict()
    prof = s.env.resolved[method.label]["profile"]
    assert prof["agreement"] > 0.8 and 0 < prof["cost_steps"] < 1, prof
