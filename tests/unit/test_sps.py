"""`sps`: speculative decoding with a draft model. Lossless in our loop whatever the draft model is; a model drafting
for itself accepts everything (so block efficiency follows from γ alone); replay equals real decoding; the heuristic
γ schedule grows and shrinks as transformers' does; the registry spelling builds, and bad setups fail in one line."""
from __future__ import annotations

import re

import pytest
import torch

from bpdbench.config import RunConfig
from bpdbench.engine import DraftContext, Limits, generate, ratios, replay
from bpdbench.methods import Env, MethodError, parse
from bpdbench.methods.sps import DraftModelDrafter
from tests.conftest import make_tiny_model
from tests.helpers import parse_error

PROMPTS = ([5, 17, 3, 42, 8, 11], [1, 2, 3], [90, 4, 4, 4, 7, 90, 4, 4])


@pytest.fixture(scope="module")
def other_model():
    """Same vocabulary as `tiny_model`, different weights: drafts that are sometimes wrong."""
    torch.set_num_threads(1)
    return make_tiny_model(vocab=96, seed=1)


def _cache_in_step(d: DraftModelDrafter) -> None:
    """The draft cache holds exactly `fed`, a prefix of the decided context."""
    assert d.cache.get_seq_length() == len(d.fed)
    assert d.decided[: len(d.fed)] == d.fed


@pytest.mark.parametrize("gamma", [1, 3, 4])
def test_self_drafting_accepts_everything(tiny_model, gamma):
    prompt, limits = list(PROMPTS[0]), Limits(40)
    greedy = generate(tiny_model, None, prompt, limits)
    d = DraftModelDrafter("sps", tiny_model, gamma)
    real = generate(tiny_model, d, prompt, limits)
    assert real.tokens == greedy.tokens
    c = real.counters
    assert c.accepted == c.drafted > 0
    steps = -(-(40 - 1) // (gamma + 1))                       # the prefill decides one token, each step γ + 1
    assert c.serial_calls == 1 + steps
    assert ratios(c)["block_efficiency"] == 40 / (1 + steps)
    _cache_in_step(d)


def test_other_model_is_lossless_and_accepts_less(tiny_model, other_model):
    limits = Limits(40)
    for prompt in PROMPTS:
        greedy = generate(tiny_model, None, list(prompt), limits)
        same = generate(tiny_model, DraftModelDrafter("sps", tiny_model, 4), list(prompt), limits)
        d = DraftModelDrafter("sps", other_model, 4)
        other = generate(tiny_model, d, list(prompt), limits)
        assert other.tokens == same.tokens == greedy.tokens
        assert other.counters.accepted < other.counters.drafted
        assert other.counters.accepted < same.counters.accepted
        _cache_in_step(d)


def test_probs_are_the_draft_softmax(other_model):
    d = DraftModelDrafter("sps", other_model, 3)
    ctx = [5, 17, 3, 42]
    d.reset(ctx[:-1])
    d.observe(ctx[-1:])
    p = d.propose(DraftContext(ctx, None, 10))
    assert len(p.paths[0]) == 3 and len(p.probs[0]) == 3
    with torch.inference_mode():
        seq = ctx + p.paths[0]
        logits = other_model(input_ids=torch.tensor([seq])).logits[0].float()
    for i, t in enumerate(p.paths[0]):
        q = torch.softmax(logits[len(ctx) - 1 + i], -1)
        assert int(q.argmax()) == t
        assert p.probs[0][i] == pytest.approx(float(q[t]), rel=1e-4)


def test_budget_is_respected(other_model):
    d = DraftModelDrafter("sps", other_model, 4)
    d.reset([1, 2])
    d.observe([3])
    assert d.propose(DraftContext([1, 2, 3], None, 0)).paths == [[]]
    assert len(d.propose(DraftContext([1, 2, 3], None, 2)).paths[0]) == 2


def test_a_confidence_stop_ends_each_draft_after_its_first_doubtful_token(tiny_model, other_model):
    """`stop=p` (transformers' assistant_confidence_threshold): a draft ends after the first token of draft
    probability below p, never before; output stays greedy, replay equals decoding, and fewer tokens are drafted.
    The threshold is the median of the draft's own probabilities, so both branches happen."""
    limits = Limits(40)
    seen: list[float] = []
    for prompt in PROMPTS:
        d = DraftModelDrafter("sps", other_model, 6)
        d.reset(list(prompt[:-1]))
        d.observe(list(prompt[-1:]))
        seen += d.propose(DraftContext(list(prompt), None, 40)).probs[0]
    stop = sorted(seen)[len(seen) // 2]
    shorter = 0
    for prompt in PROMPTS:
        greedy = generate(tiny_model, None, list(prompt), limits).tokens
        full = generate(tiny_model, DraftModelDrafter("sps", other_model, 6), list(prompt), limits)
        d = DraftModelDrafter("sps", other_model, 6, stop=stop)
        proposals, propose = [], d.propose

        def recorded(ctx: DraftContext):
            out = propose(ctx)
            if out.probs:                                     # nothing proposed once the budget is spent
                proposals.append((out.probs[0], ctx.budget))
            return out
        d.propose = recorded
        real = generate(tiny_model, d, list(prompt), limits)
        assert real.tokens == full.tokens == greedy
        for probs, budget in proposals:
            assert all(q >= stop for q in probs[:-1]) and (probs[-1] < stop or len(probs) == min(6, budget)), probs
            shorter += probs[-1] < stop and len(probs) < min(6, budget)
        assert replay(d, list(prompt), greedy, None, limits).to_dict() == real.counters.to_dict()
        assert real.counters.drafted <= full.counters.drafted
    assert shorter > 0
    always = DraftModelDrafter("sps", other_model, 6, stop=0.999)     # a random draft is never that sure
    out = generate(tiny_model, always, list(PROMPTS[0]), limits)
    assert out.tokens == generate(tiny_model, None, list(PROMPTS[0]), limits).tokens
    assert out.counters.drafted == out.counters.steps - 1          # one token a step; the last step's budget is 0


@pytest.mark.parametrize("spelling,expect", [("sps:gamma=auto,stop=0.4", "gamma=auto sizes a fixed-length draft"),
                                             ("sps:stop=1", "stop must be < 1"),
                                             ("sps:stop=-0.1", "stop must be >= 0")])
def test_bad_stops_are_one_line_errors(spelling, expect):
    assert re.search(expect, parse_error(spelling))


@pytest.mark.parametrize("schedule", ["fixed", "heuristic"])
@pytest.mark.parametrize("eos_at,max_new", [(None, 40), (12, 40), (None, 13)])
def test_replay_equals_real(tiny_model, other_model, noisy_model, schedule, eos_at, max_new):
    partial = 0
    for draft in (tiny_model, other_model, noisy_model):
        for prompt in PROMPTS:
            ref = generate(tiny_model, None, list(prompt), Limits(max_new)).tokens
            limits = Limits(max_new, frozenset() if eos_at is None else frozenset({ref[eos_at]}))
            greedy = generate(tiny_model, None, list(prompt), limits).tokens
            d = DraftModelDrafter("sps", draft, 3, schedule)
            real = generate(tiny_model, d, list(prompt), limits)
            assert real.tokens == greedy
            sim = replay(d, list(prompt), greedy, None, limits)
            assert sim.to_dict() == real.counters.to_dict(), (schedule, prompt)
            partial += 0 < real.counters.accepted < real.counters.drafted
    assert partial > 0                                     # some walks roll the draft cache back mid-draft


def test_heuristic_grows_after_full_acceptance_and_shrinks_after_rejection(tiny_model, other_model, noisy_model):
    d = DraftModelDrafter("sps", other_model, 4, "heuristic")
    d.reset([1, 2])
    d.observe([3])
    assert d.gamma == 4                                    # the prefill's token says nothing about acceptance
    draft = d.propose(DraftContext([1, 2, 3], None, 100)).paths[0]
    assert len(draft) == 4
    d.observe(draft + [7])                                 # all 4 accepted, then the bonus
    assert d.gamma == 6
    _cache_in_step(d)
    ctx = [1, 2, 3] + draft + [7]
    draft = d.propose(DraftContext(ctx, None, 100)).paths[0]
    assert len(draft) == 6
    d.observe(draft[:2] + [(draft[2] + 1) % 96])          # 2 of 6 accepted
    assert d.gamma == 5
    _cache_in_step(d)
    for _ in range(8):                                     # every draft rejected outright: γ falls to 1 and stays
        ctx = d.decided
        draft = d.propose(DraftContext(list(ctx), None, 100)).paths[0]
        d.observe([(draft[0] + 1) % 96])
        _cache_in_step(d)
    assert d.gamma == 1
    d.reset([1, 2])
    assert d.gamma == 4 and d.cache.get_seq_length() == 0
    # In the loop: self-drafting accepts everything, so γ only grows, and fewer steps than fixed γ are needed.
    limits = Limits(60)
    heur = generate(tiny_model, DraftModelDrafter("sps", tiny_model, 2, "heuristic"), list(PROMPTS[0]), limits)
    fixed = generate(tiny_model, DraftModelDrafter("sps", tiny_model, 2), list(PROMPTS[0]), limits)
    assert heur.tokens == fixed.tokens
    assert [s[0] for s in heur.step_log][:3] == [2, 4, 6]
    assert heur.counters.serial_calls < fixed.counters.serial_calls
    d = DraftModelDrafter("sps", noisy_model, 4, "heuristic")    # partial acceptance: γ goes both ways
    noisy = generate(tiny_model, d, list(PROMPTS[1]), limits)
    assert noisy.tokens == generate(tiny_model, None, list(PROMPTS[1]), limits).tokens
    gammas = [s[0] for s in noisy.step_log]
    assert any(b > a for a, b in zip(gammas, gammas[1:])) and any(b < a for a, b in zip(gammas, gammas[1:]))


def _env(loaded, model_name: str, limits: Limits) -> Env:
    model, tok = loaded
    return Env(model, tok, RunConfig(model=model_name, dtype="float32"), limits, log=lambda m: None)


def test_registry_builds_and_runs(loaded, tiny_model_dir):
    limits = Limits(20)
    env = _env(loaded, "tiny-target", limits)                # a different name: the draft model is loaded
    method = parse(f"sps:model={tiny_model_dir},gamma=3")
    drafter = env.build(method)
    assert drafter.model is not env.model
    assert env.resolved[method.label] == {"draft_model": str(tiny_model_dir), "gamma": 3, "schedule": "fixed"}
    prompt = [5, 17, 3, 42, 8, 11]
    greedy = generate(env.model, None, prompt, limits)
    real = generate(env.model, drafter, prompt, limits)
    assert real.tokens == greedy.tokens and real.counters.accepted == real.counters.drafted > 0
    same = _env(loaded, str(tiny_model_dir), limits)          # drafting for itself shares the weights
    assert same.build(parse(f"sps:model={tiny_model_dir}")).model \
        is same.model


def _one_line_error(env: Env, spelling: str) -> str:
    method = parse(spelling)
    with pytest.raises(MethodError) as e:
        env.build(method)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_missing_model_bad_model_and_tokenizer_mismatch(loaded, tiny_model_dir, tmp_path, monkeypatch):
    env = _env(loaded, "tiny-target", Limits(20))
    assert "sps:model=" in _one_line_error(env, "sps")
    assert "sps:model=" in _one_line_error(env, f"sps:model={tmp_path / 'nothing-here'}")
    with pytest.raises(MethodError):
        parse("sps:model=x,schedule=adaptive")

    class OtherTok:
        def get_vocab(self) -> dict[str, int]:
            return {"a": 0, "b": 1}

    from bpdbench import models
    monkeypatch.setattr(models, "load", lambda *a, **k: (loaded[0], OtherTok()))
    assert "tokenizer" in _one_line_error(env, f"sps:model={tiny_model_dir}")


def test_neural_lm_drafts_losslessly_across_its_window(tiny_model, tmp_path):
    """A neural LM (rescorers/neural.py, the tiny size: a 64-token window) as the draft model: output equals greedy
    even when the context outgrows the LM's window and its cache is rebuilt mid-example, and its drafts carry
    probabilities, with nothing drafted outside its shortlist."""
    from bpdbench.methods.draft_lm import NeuralDraftLM
    from bpdbench.nets.small_lm import SmallLM, make_config

    torch.manual_seed(0)
    shortlist = torch.arange(0, 96, 2)
    lm = SmallLM(make_config("tiny", len(shortlist)), shortlist).eval()
    drafter = DraftModelDrafter("sps", NeuralDraftLM(lm, 96), gamma=3)
    prompt = [int(t) for t in torch.randint(0, 96, (50,), generator=torch.Generator().manual_seed(3))]
    limits = Limits(40)
    ar = generate(tiny_model, None, prompt, limits)
    g = generate(tiny_model, drafter, prompt, limits)
    assert g.tokens == ar.tokens
    assert drafter.cache.start > 0                       # 50 + 40 tokens > 64: the window moved
    assert replay(drafter, prompt, ar.tokens, None, limits).to_dict() == g.counters.to_dict()
    proposal = drafter.propose(DraftContext(prompt + ar.tokens[:5], None, 3))
    assert all(t % 2 == 0 for t in proposal.paths[0]) and all(0 < q <= 1 for q in proposal.probs[0])
