"""`sam`: the suffix automaton against a brute-force longest earlier match, the static suffix array against brute-force
search, the drafter's choice between the two and its fallback (which stays in sync, hidden states included),
lossless decoding and replay == real decoding for every counter, bad spellings, `tokens=auto`, and the T = 1
statistical certificate with a lossy control that must fail."""
from __future__ import annotations

import json
import random
from collections import Counter

import numpy as np
import pytest
import torch

from bpdbench.experiments.plan import prepare
from bpdbench.engine import DraftContext, Limits, Proposal, SamplingParams, SpeculativeSampling, generate, replay
from bpdbench.engine.replay import teacher_forced
from bpdbench.methods import parse
from bpdbench.artefacts.formats import SEP, stream
from bpdbench.methods.sam import SamDrafter
from bpdbench.artefacts.suffix import SuffixAutomaton, SuffixIndex
from tests.helpers import decode_and_replay, eos_limits, never_written, parse_error
from tests.helpers import FREE_DRAFTING

PROMPTS = ([5, 17, 3, 42, 8, 11], [1, 2, 3], [90, 4, 4, 4, 7, 90, 4, 4])


def brute_match(tokens: list[int]) -> tuple[int, int]:
    """The longest suffix that occurs ending before the last token, and its earliest end."""
    n = len(tokens)
    for size in range(n - 1, 0, -1):
        for end in range(size - 1, n - 1):
            if tokens[end - size + 1: end + 1] == tokens[n - size:]:
                return size, end
    return 0, -1


@pytest.mark.parametrize("alphabet", [2, 3, 6, 40])
def test_automaton_matches_brute_force(alphabet):
    rng = random.Random(alphabet)
    for _ in range(60):
        toks = [rng.randrange(alphabet) for _ in range(rng.randrange(1, 70))]
        sam = SuffixAutomaton()
        for i, t in enumerate(toks):
            sam.extend([t])
            assert sam.match() == brute_match(toks[: i + 1]), (toks, i)
        other = SuffixAutomaton(toks[:5])
        other.sync(toks)                                     # catches up, or rebuilds on another sequence
        assert other.match() == brute_match(toks)
        other.sync([99] + toks)
        assert other.tokens == [99] + toks and other.match() == brute_match([99] + toks)


def test_suffix_index_matches_brute_force(tmp_path):
    rng = random.Random(0)
    for trial in range(40):
        docs = [[rng.randrange(3) for _ in range(rng.randrange(1, 25))] for _ in range(rng.randrange(1, 5))]
        s = stream(docs).tolist()
        idx = SuffixIndex.build(stream(docs), depth=8)
        if trial == 0:
            idx = SuffixIndex.load(idx.save(tmp_path / "i.npz"))
        for _ in range(25):
            pat = [rng.randrange(3) for _ in range(rng.randrange(1, 9))]
            lo, hi = idx.interval(pat)
            assert sorted(idx.sa[lo:hi].tolist()) == [i for i in range(len(s)) if s[i:i + len(pat)] == pat]
            ctx = [rng.randrange(3) for _ in range(rng.randrange(1, 12))]
            n, lo, hi = idx.longest(ctx)
            want = max([k for k in range(1, min(8, len(ctx)) + 1)
                        if any(s[i:i + k] == ctx[-k:] for i in range(len(s)))], default=0)
            assert n == want
            if n:
                first = min(i for i in range(len(s)) if s[i:i + n] == ctx[-n:])
                assert idx.earliest(lo, hi) == first
    idx = SuffixIndex.build(np.array([1, 2, 3, SEP, 1, 2, 4], dtype=np.int32))
    assert idx.read(idx.earliest(*idx.interval([1, 2])) + 2, 5) == [3]      # cut at the document's end


def test_longer_match_wins_with_the_static_bias_and_threshold():
    static = SuffixIndex.build(stream([[9, 1, 2, 3, 4, 5, 6, 70, 71, 72]]))
    ctx = [1, 2, 3, 4, 5, 6, 8, 8, 3, 4, 5, 6]            # dyn and static both match "3 4 5 6" (4 tokens)
    d = SamDrafter("s", tokens=3, threshold=2, bias=0, static=static)
    d.reset(ctx[:3])
    assert d.propose(DraftContext(ctx, None, 100)).paths == [[8, 8, 3]] and d.source == "dyn"   # tie: dynamic
    d = SamDrafter("s", tokens=3, threshold=2, bias=0, static=static)
    ctx2 = [50, 4, 5, 6, 51, 3, 4, 5, 6]                   # dyn "4 5 6" (3) < static "3 4 5 6" (4)
    p = d.propose(DraftContext(ctx2, None, 100))
    assert p.paths == [[70, 71, 72]] and p.probs == [[1.0] * 3] and d.source == "static"
    d = SamDrafter("s", tokens=3, threshold=2, bias=1, static=static)
    assert d.propose(DraftContext(ctx2, None, 100)).paths == [[51, 3, 4]] and d.source == "dyn"  # 4 - 1 = 3, tie
    d = SamDrafter("s", tokens=3, threshold=5, bias=0, static=static)
    assert d.propose(DraftContext(ctx2, None, 100)).paths == [[]] and d.source == "none"
    d = SamDrafter("s", tokens=8, threshold=1, bias=0, eos=frozenset({3}))
    assert d.propose(DraftContext([3, 4, 5, 6, 7, 3, 4], None, 100)).paths == [[5, 6, 7, 3]]   # EOS ends it
    assert d.propose(DraftContext([3, 4, 5, 6, 7, 3, 4], None, 2)).paths == [[5, 6]]           # the budget


class HiddenFallback:
    """A fallback that checks it has seen every position's hidden state exactly once, and drafts noise."""
    name = "hidden-fallback"

    def __init__(self, noise: list[int]):
        self.noise, self.rows, self.resets, self.observed, self.calls = noise, 0, 0, 0, 0

    def reset(self, prompt_ids):
        self.rows, self.observed = 0, len(prompt_ids)
        self.resets += 1

    def propose(self, ctx):
        self.calls += 1
        self.rows += 0 if ctx.accepted_hidden is None else ctx.accepted_hidden.shape[0]
        if ctx.accepted_hidden is not None:
            assert self.rows == len(ctx.tokens) - 1
        assert self.observed == len(ctx.tokens)              # every decided token was observed
        return Proposal([self.noise[: 3]], probs=[[1.0] * 3])

    def observe(self, tokens):
        self.observed += len(tokens)


@pytest.mark.parametrize("eos_at,max_new", [(None, 24), (10, 24), (None, 13)])
def test_exact_static_accepts_everything_noise_fallback_nothing(tiny_model, eos_at, max_new):
    """A static index holding exactly prompt + greedy drafts it (the whole context is the longest match); a fallback
    drafting tokens the model never chooses accepts nothing. Lossless, and replay == real decoding, with the hidden
    states the fallback sees in both."""
    for prompt in PROMPTS:
        limits = eos_limits(tiny_model, prompt, eos_at, max_new)
        greedy = generate(tiny_model, None, list(prompt), limits).tokens
        exact = SuffixIndex.build(stream([list(prompt) + greedy]))
        real = decode_and_replay(tiny_model, SamDrafter("s", tokens=6, threshold=1, bias=0, static=exact), prompt,
                                 limits, greedy)
        assert real.counters.accepted == real.counters.drafted > 0
        fb = HiddenFallback(never_written(greedy))
        d = SamDrafter("s", tokens=6, threshold=10_000, static=None, fallback=fb)
        real = generate(tiny_model, d, list(prompt), limits)
        assert real.tokens == greedy and real.counters.accepted == 0 and fb.calls and fb.resets == 1
        hidden = teacher_forced(tiny_model, list(prompt), greedy, with_prompt=True)
        assert replay(d, list(prompt), greedy, hidden, limits).to_dict() == real.counters.to_dict()


def test_fallback_stays_in_sync_when_sam_drafts(tiny_model):
    """Steps alternate between SAM (long repeats) and the fallback; the fallback sees all hidden rows and every
    decided token, in real decoding and in replay, and the counters agree."""
    prompt = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6]
    limits = Limits(40)
    greedy = generate(tiny_model, None, prompt, limits).tokens
    fb = HiddenFallback(never_written(greedy))
    d = SamDrafter("s", tokens=5, threshold=2, static=None, fallback=fb)
    real = generate(tiny_model, d, prompt, limits)
    assert real.tokens == greedy and real.counters.accepted > 0 and fb.calls > 0
    assert real.counters.steps > fb.calls                    # SAM drafted some steps itself
    hidden = teacher_forced(tiny_model, prompt, greedy, with_prompt=True)
    assert replay(d, prompt, greedy, hidden, limits).to_dict() == real.counters.to_dict()


def test_dynamic_automaton_follows_a_loop(tiny_model):
    from bpdbench.methods.hierarchy import HierarchyDrafter
    limits = Limits(60)
    for prompt in PROMPTS:
        d = SamDrafter("s", tokens=8, threshold=2, fallback=HierarchyDrafter("h", "c", 2, 4, 3))
        assert decode_and_replay(tiny_model, d, prompt, limits).counters.accepted > 20


@pytest.mark.parametrize("spelling,expect", [("sam:fallback=nope", "unknown method 'nope'"),
                                             ("sam:fallback=pld;tokens=0", "pld: tokens must be >= 1"),
                                             ("sam:fallback=hydra;bogus=1", "hydra: unknown parameter 'bogus'"),
                                             ("sam:fallback=sam", "is sam itself"),
                                             ("sam:fallback=hierarchy;order=x", "order must be one of"),
                                             ("sam:tokens=0", "tokens must be >= 1"),
                                             ("sam:threshold=x", "is not a int"),
                                             ("sam:static=big", "static must be one of"),
                                             ("sam:fallback=ar", "drafts nothing; write fallback=none"),
                                             ("sam:fallback=hf-pld", "whole decoder"),
                                             ("sam:fallback=none;k=2", "none takes no parameters")])
def test_bad_spellings_are_one_line_errors(spelling, expect):
    assert expect in parse_error(spelling)


def test_published_defaults_and_no_fallback(tiny_model, monkeypatch):
    """`sam` is the published configuration (39 draft tokens, threshold 5, bias 5, Token Recycling below it);
    `fallback=none` drafts nothing below the threshold; the old shape is a spelling of its own."""
    from bpdbench.config import RunConfig
    from bpdbench.artefacts import suffix as suffix_index
    from bpdbench.methods import Env
    from bpdbench.methods.recycling import RecyclingDrafter
    index = SuffixIndex.build(stream([[1, 2, 3]]))
    monkeypatch.setattr(suffix_index, "corpus_index", lambda env: (index, {"tokens": 3}))
    env = Env(tiny_model, None, RunConfig(), Limits(8), log=lambda m: None)
    for spelling, shape, fallback in [("sam", (39, 5, 5), RecyclingDrafter), ("sam:fallback=none", (39, 5, 5), None),
                                      ("sam:tokens=9,threshold=4,bias=4,fallback=none", (9, 4, 4), None)]:
        d = env.build(parse(spelling))
        assert (d.tokens, d.threshold, d.bias) == shape and d.static is index, spelling
        assert (type(d.fallback) if fallback else d.fallback) is fallback, spelling
        assert env.resolved[spelling]["fallback"] == ("recycling" if fallback else "none")
        assert d.feedback_k == (8 if fallback else 0)
    assert parse("sam:fallback=none").label == "sam:fallback=none" != parse("sam").label


def run_steps(model, drafter, prompt, limits):
    """Real decoding, with who drafted each step and how many of its tokens were accepted."""
    steps: list[tuple[str, int]] = []
    out = generate(model, drafter, list(prompt), limits,
                   on_step=lambda ev: steps.append((drafter.source, ev.decision.accepted)))
    return out, steps


TR_PROMPTS = PROMPTS + ([5, 6, 7, 8, 5, 6, 7, 9, 5, 6, 7, 8, 5, 6], [11, 12, 13, 11, 12, 14, 40, 41])


def test_sam_tr_is_lossless_replays_exactly_and_drafts_more_than_sam_alone(tiny_model):
    """SAM[TR] (Token Recycling below the threshold) in float32: output == greedy, replay == real decoding for
    every counter (the matrix carried across the examples in both), accepted tokens from the recycling side, and
    a higher block efficiency than SAM without a fallback on the same examples."""
    from bpdbench.engine import TreeScorer, ratios
    from bpdbench.methods.recycling import RecyclingDrafter
    limits = Limits(64)
    tr, twin = (SamDrafter("s", static=None, fallback=RecyclingDrafter("r")) for _ in range(2))
    alone = SamDrafter("s", static=None)
    scorer = TreeScorer(tiny_model)
    totals = {"tr": None, "alone": None}
    from_fallback = 0
    for prompt in TR_PROMPTS:
        greedy = generate(tiny_model, None, list(prompt), limits).tokens
        real, steps = run_steps(tiny_model, tr, prompt, limits)
        assert real.tokens == greedy
        assert replay(twin, list(prompt), greedy, None, limits, scorer=scorer) == real.counters
        from_fallback += sum(a for s, a in steps if s == "fallback")
        base = decode_and_replay(tiny_model, alone, prompt, limits, greedy)
        for key, c in (("tr", real.counters), ("alone", base.counters)):
            totals[key] = c if totals[key] is None else totals[key].add(c)
    assert tr.fallback.rows == twin.fallback.rows and from_fallback > 0
    eff = {k: ratios(c)["block_efficiency"] for k, c in totals.items()}
    assert eff["tr"] > eff["alone"] + 0.5, eff        # 6.0 against 2.0 here


class Recording:
    """Wraps a drafter that learns from verify forwards and records every tree it is handed."""

    def __init__(self, inner):
        self.inner, self.name, self.feedback_k, self.trees = inner, inner.name, inner.feedback_k, []

    def reset(self, prompt_ids):
        self.inner.reset(prompt_ids)

    def propose(self, ctx):
        return self.inner.propose(ctx)

    def feedback(self, fb):
        self.trees.append(fb.tree)
        self.inner.feedback(fb)

    def observe(self, tokens):
        self.inner.observe(tokens)


def test_recycling_learns_from_the_chains_sam_drafts(tiny_model):
    """Every verify forward reaches the recycling fallback, SAM's own chains included (the authors' SAM[TR]
    updates the matrix from every forward): after a step SAM drafted, every token of its chain has a row."""
    from bpdbench.methods.recycling import RecyclingDrafter
    rec = Recording(RecyclingDrafter("r"))
    d = SamDrafter("s", static=None, threshold=2, fallback=rec)
    _, steps = run_steps(tiny_model, d, TR_PROMPTS[3], Limits(48))
    assert len(rec.trees) == len(steps)                             # every step, whoever drafted
    sam_steps = [(t, s) for t, (s, _) in zip(rec.trees, steps) if s == "dyn"]
    assert sam_steps and all(t.is_chain for t, _ in sam_steps)
    assert all(tok in rec.inner.rows for t, _ in sam_steps for tok in t.tokens)


def test_lookahead_fallback_advances_only_on_its_own_steps(tiny_model):
    """A Lookahead fallback gets the feedback of every forward; a tree without its window (SAM drafted) leaves the
    window as it was, its own steps move it one level; lossless, and replay == real decoding."""
    from bpdbench.engine import TreeScorer
    from bpdbench.methods.lookahead import LookaheadDrafter
    limits = Limits(48)
    prompt = TR_PROMPTS[3]
    la = LookaheadDrafter("l", 3, 4, 2)
    d = SamDrafter("s", static=None, threshold=2, fallback=la)
    levels: list[tuple[str, int, int]] = []         # (who drafted, window levels before the step, after it)
    before = [1]                                    # reset gives level 0

    def track(_):
        levels.append((d.source, before[0], len(la.levels)))
        before[0] = len(la.levels)
    greedy = generate(tiny_model, None, list(prompt), limits).tokens
    real = generate(tiny_model, d, list(prompt), limits, on_step=track)
    assert real.tokens == greedy
    own = [(b, a) for s, b, a in levels if s == "fallback"]
    sam = [(b, a) for s, b, a in levels if s == "dyn"]
    assert own and sam and len(la.levels) == 3
    assert all(a == b for b, a in sam)                              # SAM's chains: the window waits
    assert all(a == min(b + 1, 3) for b, a in own)                  # its own steps: one level more (up to n - 1)
    assert la.pool                                                  # and full columns became n-grams
    again = SamDrafter("s", static=None, threshold=2, fallback=LookaheadDrafter("l", 3, 4, 2))
    assert replay(again, list(prompt), greedy, None, limits, scorer=TreeScorer(tiny_model)) == real.counters


def test_state_across_examples_is_the_fallbacks(tiny_model):
    """SAM keeps nothing across examples itself; with a persistent recycling matrix its snapshot is (None, the
    matrix), which survives JSON and puts the matrix back; without a fallback there is nothing to keep."""
    from bpdbench.methods.recycling import RecyclingDrafter
    d = SamDrafter("s", static=None, fallback=RecyclingDrafter("r"))
    generate(tiny_model, d, list(TR_PROMPTS[3]), Limits(24))
    snap = d.snapshot()
    assert snap is not None and snap[0] is None and snap[1] == d.fallback.snapshot()
    rows = dict(d.fallback.rows)
    d.fallback.rows = {}
    d.restore(json.loads(json.dumps(snap)))
    assert d.fallback.rows == rows
    assert SamDrafter("s", static=None).snapshot() is None
    assert SamDrafter("s", static=None, fallback=RecyclingDrafter("r", persist=False)).snapshot() is None


def test_nested_spelling_round_trips():
    m = parse("sam:fallback=hierarchy;candidates=2;length=4,tokens=auto")
    assert m.label == "sam:tokens=auto,fallback=hierarchy;candidates=2;length=4" and m.auto == ["tokens"]
    assert parse(m.label).label == m.label
    assert parse("sam:fallback=hydra:tree=4").label == "sam:fallback=hydra;tree=4"


@pytest.fixture
def session_for(tiny_model_dir, tmp_path, monkeypatch):
    from conftest import write_prompts
    from bpdbench.config import RunConfig
    from bpdbench.experiments import autoshape, session
    from bpdbench.hardware.shapes import TableCost
    from bpdbench.methods import parse_list
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(autoshape, "cost_model", lambda s: TableCost({64: 1.0}, step_ms=1e9))
    monkeypatch.setattr(autoshape, "step_clock", lambda s, context=64: FREE_DRAFTING)     # drafting free
    monkeypatch.setattr(autoshape, "N_EXAMPLES", 3)
    prompts = write_prompts(tmp_path, 12)

    def make(methods: str):
        run = RunConfig(task="prompts", data_file=str(prompts), model=str(tiny_model_dir), dtype="float32",
                        max_new_tokens=24, heads_profile="init", limit=3)
        ms = parse_list(methods)
        return session.open_session(prepare(run, "replay", ms, log=lambda m: None), lambda m: None), ms
    return make


def test_auto_tokens_with_a_hidden_state_fallback(session_for):
    """sam:tokens=auto with a heads fallback (bpd, drafts from hidden states): measured by replay with the hidden
    states, resolved, recorded, and lossless; the inner method is built through the session."""
    s, (m,) = session_for("sam:static=none,tokens=auto,fallback=bpd;heads=2")
    d = s.drafter(m)
    rec = s.env.resolved[m.label]
    assert d.needs_hidden and d.fallback is not None and rec["fallback"] == "bpd:heads=2"
    assert rec["tokens"] == rec["auto"]["params"]["tokens"] == d.tokens and 1 <= d.tokens <= 16
    for ex in s.examples:
        prompt = s.prompt(ex)
        assert s.decode(d, prompt).tokens == s.reference.get(prompt, s.limits)[0]


# ---- T > 0: the statistical certificate (the setting of tests/unit/test_sampling.py) ---------------------------------

def test_sampling_certificate_with_a_lossy_control():
    """SAM's point-mass drafts under speculative sampling: the first three tokens follow the target's warped
    distribution (chi-square, false-alarm 1e-3); the same drafts with always-accept fail at p < 1e-6. A static
    index holding every bigram makes SAM draft at every step (threshold 1), so the drafts decide tokens 2-3."""
    from tests.unit.test_sampling import PARAMS, TARGET, V, exact_joint
    from bpdbench.stats import goodness_of_fit
    torch.set_num_threads(1)
    rng = random.Random(3)
    corpus = [rng.randrange(V) for _ in range(600)]
    static = SuffixIndex.build(stream([corpus]))
    prompt = [1, 5, 3, 7]                                     # the stub conditions on the last two tokens (3, 7)

    def sample(n: int, rule: str, seed: int) -> Counter:
        counts: Counter = Counter()
        d = SamDrafter("s", tokens=3, threshold=1, bias=0, static=static)
        drafted = 0
        for i in range(n):
            with torch.inference_mode():
                gen = generate(TARGET, d, list(prompt), Limits(4), SpeculativeSampling(PARAMS, seed + i, rule))
            counts[tuple(gen.tokens[:3])] += 1
            drafted += gen.counters.drafted
        assert drafted >= 2 * n                   # the first step drafts the 2 tokens it can keep, every time
        return counts
    fit = goodness_of_fit(sample(6000, "exact", 0), exact_joint())
    assert fit.cells > 30 and fit.p_value > 1e-3, fit
    control = goodness_of_fit(sample(2000, "always-accept", 10**6), exact_joint())
    assert control.p_value < 1e-6, control
