"""`hierarchy`: its three databases (the context index, the model history, the corpus table) and the drafter over
them. Tables keep the most frequent continuations per key; the drafter probes in the given order, deduplicates
through the trie and keeps within its candidate budget; a database holding the exact greedy continuation accepts
everything, a random one nothing; output always equals greedy and replay equals real decoding; the history and
corpus builders work on fixtures; bad option values fail when parsed."""
from __future__ import annotations

import random

import numpy as np
import pytest

from bpdbench.config import RunConfig
from bpdbench.engine import DraftContext, Limits, generate
from bpdbench.methods import Env, MethodError, parse
from bpdbench.methods.hierarchy import HierarchyDrafter, _add
from bpdbench.artefacts.formats import SEP, FrequencyTable, stream
from tests.helpers import decode_and_replay, eos_limits, never_written, parse_error, write_corpus

PROMPTS = ([5, 17, 3, 42, 8, 11], [1, 2, 3], [90, 4, 4, 4, 7, 90, 4, 4])


def test_frequency_table_ranks_continuations_and_round_trips(tmp_path):
    docs = [[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 3, 4, 9], [7, 1, 2, 6], [8, 8]]
    t = FrequencyTable.build(stream(docs), sizes=(1, 2), top=2, group=2)
    assert t.lookup([1, 2], 3) == [[3, 4], [3, 5]]           # (3, 4) twice, then (3, 5) before (6) (earlier)
    assert t.lookup([2], 2) == [[3, 4], [3, 5]]
    assert t.lookup([3], 4) == [[4], [5]]                     # cut at the document end, never across it
    assert t.lookup([8], 3) == [[8]] and t.lookup([4, 9], 2) == [] and t.lookup([500], 2) == []
    assert t.lookup([4], 2) == [[9]]                          # 4 ends two documents: only one continuation
    loaded = FrequencyTable.load(t.save(tmp_path / "t.npz"))
    for key in ([1, 2], [2], [3], [8], [7, 1]):
        assert loaded.lookup(key, 3) == t.lookup(key, 3)
    assert FrequencyTable.build(stream(docs), sizes=(2,), min_count=2).lookup([7, 1], 2) == []   # seen once


def test_frequency_table_matches_a_brute_force_count():
    rng = random.Random(0)
    docs = [[rng.randrange(6) for _ in range(rng.randrange(1, 30))] for _ in range(40)]
    t = FrequencyTable.build(stream(docs), sizes=(1, 2, 3), top=3, group=2)
    s = stream(docs).tolist()
    for n in (1, 2, 3):
        counts: dict = {}
        for i in range(len(s) - n):
            key, nxt = tuple(s[i:i + n]), s[i + n]
            if SEP in key or nxt == SEP:
                continue
            cont = tuple((s + [SEP])[i + n: i + n + 2])
            counts.setdefault(key, {}).setdefault(cont, []).append(i + n)
        for key, conts in counts.items():
            ranked = sorted(conts.items(), key=lambda kv: (-len(kv[1]), kv[1][0]))[:3]
            want = []
            for _, starts in ranked:
                c = s[starts[0]: starts[0] + 4]
                want.append(c[: c.index(SEP)] if SEP in c else c)
            assert t.lookup(list(key), 4) == want, key


def test_candidates_deduplicate_through_the_trie():
    found: list[list[int]] = []
    assert _add(found, [1, 2, 3]) and not _add(found, [1, 2]) and not _add(found, [])
    assert not _add(found, [1, 2, 3, 4]) and found == [[1, 2, 3, 4]]     # an extension replaces its prefix
    assert _add(found, [1, 5]) and found == [[1, 2, 3, 4], [1, 5]]


def _table(seqs) -> FrequencyTable:
    return FrequencyTable.build(stream(seqs), sizes=(1, 2, 3))


def test_probing_order_budget_and_sources():
    history = _table([[7, 8, 1, 2], [9, 9, 9, 9]])
    static = _table([[7, 8, 3, 4], [8, 5, 5, 5]])
    ctx = DraftContext([7, 8, 6, 6, 7, 8], None, 100)
    d = HierarchyDrafter("h", "csl", 3, 2, 3, history, static)
    d.reset(ctx.tokens[:4])
    p = d.propose(ctx)
    assert p.paths == [[6, 6], [1, 2], [3, 4]] and d.sources == ["c", "s", "l"]
    d = HierarchyDrafter("h", "lsc", 2, 2, 3, history, static)
    d.reset(ctx.tokens)
    assert d.propose(ctx).paths == [[3, 4], [5, 5]] and d.sources == ["l", "l"]   # (8) -> 5 5 is the 2nd
    d = HierarchyDrafter("h", "c", 3, 4, 3)
    d.reset([])
    assert d.propose(DraftContext([1, 2, 3], None, 100)).paths == [[]]            # nothing found: a plain step
    assert d.propose(DraftContext([1, 2, 1, 2], None, 2)).paths == [[1, 2]]       # the budget caps the length
    assert d.propose(DraftContext([1, 2, 1, 2], None, 0)).paths == [[]]
    d = HierarchyDrafter("h", "c", 3, 4, 3, eos=frozenset({2}))
    assert d.propose(DraftContext([1, 2, 3, 1], None, 9)).paths == [[2]]          # nothing after an EOS


@pytest.mark.parametrize("eos_at,max_new", [(None, 40), (12, 40), (None, 13)])
def test_exact_history_accepts_everything_random_accepts_nothing(tiny_model, eos_at, max_new):
    """A model history that holds the greedy continuation (as 3-gram keys) drafts it; a random one drafts tokens
    the model never chooses. Both are lossless and replay exactly."""
    rng, drafted = random.Random(0), 0
    for prompt in PROMPTS:
        limits = eos_limits(tiny_model, prompt, eos_at, max_new)
        greedy = generate(tiny_model, None, list(prompt), limits).tokens
        exact = FrequencyTable.build(stream([list(prompt) + greedy]), sizes=(3,), top=1)
        d = HierarchyDrafter("h", "s", 1, 6, 3, history=exact)
        real = decode_and_replay(tiny_model, d, prompt, limits, greedy)
        if len(set(zip(prompt[-2:] + greedy, prompt[-1:] + greedy[1:], greedy[1:]))) == len(greedy) - 1:
            assert real.counters.accepted == real.counters.drafted > 0              # no 3-gram is ambiguous
        others = never_written(greedy)
        noise = [[rng.choice(others + list(prompt)) for _ in range(400)]]   # keys match, drafts never can
        d = HierarchyDrafter("h", "sl", 3, 4, 3, history=_table(noise), static=_table(noise))
        real = decode_and_replay(tiny_model, d, prompt, limits, greedy)
        assert real.counters.accepted == 0
        drafted += real.counters.drafted
    assert drafted > 0


def test_context_database_follows_a_loop(tiny_model):
    """The context database alone (most recent occurrence, copied forward) on the tiny model, whose greedy
    outputs loop: lossless, replays exactly, and accepts most of a loop."""
    limits = Limits(60)
    for prompt in PROMPTS:
        real = decode_and_replay(tiny_model, HierarchyDrafter("h", "c", 3, 5, 3), prompt, limits)
        assert real.counters.accepted > 20


@pytest.mark.parametrize("spelling,expect", [("hierarchy:order=cx", "order must be one of"),
                                             ("hierarchy:order=cc", "order must be one of"),
                                             ("hierarchy:candidates=0", "candidates must be >= 1"),
                                             ("hierarchy:length=0", "length must be >= 1"),
                                             ("hierarchy:history=huge", "history must be one of"),
                                             ("hierarchy:ngram=x", "is not a int"),
                                             ("hierarchy:tokens=3", "unknown parameter")])
def test_bad_options_fail_when_parsed(spelling, expect):
    assert expect in parse_error(spelling)


def test_builders_on_fixtures(loaded, tiny_model_dir, tmp_path, monkeypatch):
    """The corpus table (from a fixture corpus) and the ci model history (the tiny model's greedy continuations
    on the held-out prompt pool) are built on first use, cached, recorded in the resolved config, and the history
    holds exactly what greedy decoding in our loop produces for those prompts."""
    from bpdbench.train import history
    from bpdbench.train.greedy import prompt_pool
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path / "cache"))
    model, tok = loaded
    name = str(tiny_model_dir)
    cfg = RunConfig(model=name, dtype="float32", data_dir=str(write_corpus(tmp_path / "data")))
    env = Env(model, tok, cfg, Limits(16), log=lambda m: None)
    m = parse("hierarchy:history=ci")
    d = env.build(m)
    info = env.resolved[m.label]
    assert info["history"]["profile"] == "ci" and info["history"]["tokens"] > 0
    assert info["static"]["tokens"] > 0 and info["static"]["keys"]["3"] > 0
    enc = lambda text: tok(text, add_special_tokens=False)["input_ids"]   # noqa: E731
    assert d.static.lookup(enc("dog")[-3:], 4) == [enc(" sat on")[:4]]   # what follows "dog" in the corpus
    ids = enc("the dog sat on the")
    seqs, meta = history.load(history.history_file(name, "ci"))
    p = history.PROFILES["ci"]
    prompts = prompt_pool(tok, p.n_prompts, p.max_prompt_tokens, p.seed, p.gen_tokens)
    assert meta["sequences"] == len(seqs) == len(prompts)
    eos = frozenset({model.generation_config.eos_token_id})
    expected = sorted(generate(model, None, ids_, Limits(cap, eos)).tokens for ids_, cap in prompts)
    assert sorted(seqs) == expected
    cfg2 = cfg.replace(auto_train=False)
    env2 = Env(model, tok, cfg2, Limits(16), log=lambda m: None)
    with pytest.raises(MethodError, match="build-history --profile quick"):
        env2.build(parse("hierarchy"))
    prompt = ids
    greedy = generate(model, None, prompt, Limits(16, eos)).tokens
    assert generate(model, d, prompt, Limits(16, eos)).tokens == greedy
