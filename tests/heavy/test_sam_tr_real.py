"""SAM[TR] against SAM alone on the real model, in the heavy tier: its tree forwards of the 0.5B model took 42 s
beside the other test worker on an AVX2-only EPYC. That it is lossless and replays exactly is tests/unit/test_sam.py's
check on the tiny model, in `make test`."""
from __future__ import annotations

from bpdbench import models
from bpdbench.config import RunConfig
from bpdbench.experiments.plan import prepare
from tests.slow.test_real_model import fp32_model  # noqa: F401 (the module's float32 model, one fixture)


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
