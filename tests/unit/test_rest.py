"""`rest`: the trie of the most frequent continuation prefixes against a brute-force count, the longest-span retrieval,
a datastore holding the exact greedy text accepts everything and a misleading one nothing (lossless, replay == real
for every counter), bad spellings, the datastore builder (corpus + model history, cached) and `nodes=auto`."""
from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest

from bpdbench.experiments.plan import prepare
from bpdbench.engine import DraftContext, Limits, generate
from bpdbench.methods import parse
from bpdbench.artefacts.formats import SEP, stream
from bpdbench.methods.rest import RestDrafter, top_prefixes
from bpdbench.artefacts.suffix import SuffixIndex
from tests.helpers import decode_and_replay, eos_limits, never_written, parse_error, write_corpus
from tests.helpers import FREE_DRAFTING

PROMPTS = ([5, 17, 3, 42, 8, 11], [1, 2, 3], [90, 4, 4, 4, 7])


def brute_top(rows: list[list[int]], nodes: int, eos: set[int]) -> set[tuple[int, ...]]:
    counts: Counter = Counter()
    first: dict = {}
    for i, row in enumerate(rows):
        cut = []
        for t in row:
            if t == SEP:
                break
            cut.append(t)
            if t in eos:
                break
        for d in range(1, len(cut) + 1):
            counts[tuple(cut[:d])] += 1
            first.setdefault(tuple(cut[:d]), i)
    ranked = sorted(counts, key=lambda p: (-counts[p], len(p), first[p]))
    return set(ranked[:nodes])


@pytest.mark.parametrize("seed", range(30))
def test_top_prefixes_match_a_brute_force_count(seed):
    rng = random.Random(seed)
    rows = [[rng.choice([0, 1, 2, SEP]) if rng.random() < 0.2 else rng.randrange(3) for _ in range(5)]
            for _ in range(rng.randrange(1, 40))]
    nodes, eos = rng.choice([4, 8, 64]), rng.choice([set(), {2}])
    paths = top_prefixes(np.array(rows), nodes, np.array(sorted(eos), dtype=np.int64))
    kept = {tuple(p[:d]) for p in paths for d in range(1, len(p) + 1)}
    assert kept == brute_top(rows, nodes, eos)
    assert len(kept) == sum(1 for _ in kept) <= nodes
    assert all(not any(q[: len(p)] == p and q != p for q in paths) for p in paths)   # leaves only


def test_longest_span_and_its_continuations():
    index = SuffixIndex.build(stream([[1, 2, 3, 4, 5], [9, 2, 3, 4, 6], [7, 3, 4, 8], [3, 4, 8, 1]]))
    d = RestDrafter("r", index, nodes=8, span=16, length=2)
    p = d.propose(DraftContext([0, 1, 2, 3, 4], None, 100))
    assert d.matched == 4 and p.paths == [[5]] and p.probs == [[1.0]]          # "1 2 3 4" occurs: one continuation
    p = d.propose(DraftContext([0, 2, 3, 4], None, 100))
    assert d.matched == 3 and sorted(p.paths) == [[5], [6]]
    p = d.propose(DraftContext([0, 0, 3, 4], None, 100))                     # "3 4": 8 twice, then 5 and 6
    assert d.matched == 2 and p.paths[0] == [8, 1] and sorted(p.paths[1:]) == [[5], [6]]
    assert RestDrafter("r", index, nodes=4, length=2).propose(DraftContext([0, 0, 3, 4], None, 100)).paths[0] == [8, 1]
    assert d.propose(DraftContext([0, 4], None, 100)).paths == [[]] and d.matched == 0   # a span is >= 2 tokens
    assert d.propose(DraftContext([0, 0, 3, 4], None, 1)).paths[0] == [8]              # the budget
    assert RestDrafter("r", index, 8, 16, 2, eos=frozenset({8})).propose(
        DraftContext([0, 3, 4], None, 100)).paths[0] == [8]                            # nothing after an EOS


@pytest.mark.parametrize("eos_at,max_new", [(None, 10), (6, 10)])
def test_exact_datastore_accepts_everything_misleading_one_nothing(tiny_model, eos_at, max_new):
    """Context <= 16 tokens: the whole context is the longest span, and in a datastore of prompt + greedy it occurs
    once, so the draft is the greedy continuation. A datastore whose spans all continue with tokens the model never
    chooses drafts and accepts nothing. Both lossless; replay == real decoding."""
    for prompt in PROMPTS:
        limits = eos_limits(tiny_model, prompt, eos_at, max_new)
        greedy = generate(tiny_model, None, list(prompt), limits).tokens
        d = RestDrafter("r", SuffixIndex.build(stream([list(prompt) + greedy])), nodes=16, eos=limits.eos_ids)
        real = decode_and_replay(tiny_model, d, prompt, limits, greedy)
        assert real.counters.accepted == real.counters.drafted > 0
        seq = list(prompt) + greedy
        others = never_written(greedy)
        rng = random.Random(len(prompt))
        docs = [[a, b] + rng.sample(others, 3) for a, b in zip(seq, seq[1:])] * 2
        real = decode_and_replay(tiny_model, RestDrafter("r", SuffixIndex.build(stream(docs)), nodes=8), prompt,
                                 limits, greedy)
        assert real.counters.accepted == 0 and real.counters.drafted > 0


@pytest.mark.parametrize("spelling,expect", [("rest:nodes=3", "nodes must be >= 4"),
                                             ("rest:nodes=65", "nodes must be < 65"),
                                             ("rest:nodes=many", "is not a int or auto"),
                                             ("rest:span=1", "span must be >= 2"),
                                             ("rest:history=huge", "history must be one of"),
                                             ("rest:tokens=3", "unknown parameter")])
def test_bad_spellings_are_one_line_errors(spelling, expect):
    assert expect in parse_error(spelling)


def test_datastore_and_corpus_index_are_built_once_and_cached(tiny_model_dir, tmp_path, monkeypatch):
    """rest's datastore (fixture corpus + the tiny model's ci history) and sam's corpus index are built on first use,
    cached, reused, recorded in the resolved config and listed by `bpdbench methods`; decoding stays lossless."""
    import torch
    from bpdbench import models
    from bpdbench.experiments.session import register_builders
    from bpdbench.config import RunConfig
    from bpdbench.methods import Env
    from bpdbench.artefacts import suffix as suffix_index
    from bpdbench.methods.registry import REGISTRY
    torch.set_num_threads(1)
    register_builders()        # the history builder a first use calls, as every command registers it
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path / "cache"))
    model, tok = models.load(str(tiny_model_dir), "float32")
    name = str(tiny_model_dir)
    cfg = RunConfig(model=name, dtype="float32", data_dir=str(write_corpus(tmp_path / "data")))
    assert ("corpus suffix index", False) in [(r.what, r.ok) for r in REGISTRY["sam"].needs(name, cfg)]
    logs: list[str] = []
    env = Env(model, tok, cfg, Limits(16), log=logs.append)
    rest, sam = parse("rest:history=ci"), parse("sam:fallback=hierarchy;order=c")
    d = env.build(rest)
    s = env.build(sam)
    info = env.resolved[rest.label]["datastore"]
    assert info["source"] == "corpus+history" and info["profile"] == "ci" and info["tokens"] > 0
    assert env.resolved[sam.label]["fallback"] == "hierarchy:order=c" and env.resolved[sam.label]["static"]["tokens"]
    assert suffix_index.datastore_file(name, "ci").exists() and suffix_index.corpus_file(name).exists()
    enc = lambda text: tok(text, add_special_tokens=False)["input_ids"]   # noqa: E731
    ids = enc("the dog sat on")
    assert d.propose(DraftContext(ids, None, 100)).paths[0][:3] == enc(" the log")[:3]
    built = sum("building the suffix index" in m for m in logs)
    env2 = Env(model, tok, cfg, Limits(16), log=logs.append)
    env2.build(rest)
    env2.build(sam)
    assert sum("building the suffix index" in m for m in logs) == built == 2              # cached
    assert ("corpus suffix index", True) in [(r.what, r.ok) for r in REGISTRY["sam"].needs(name, cfg)]
    eos = frozenset({model.generation_config.eos_token_id})
    greedy = generate(model, None, ids, Limits(16, eos)).tokens
    for drafter in (d, s):
        assert generate(model, drafter, ids, Limits(16, eos)).tokens == greedy


def test_auto_nodes_resolves_through_the_replay(tiny_model_dir, tmp_path, monkeypatch):
    """rest:nodes=auto: one replay per trie budget on held-out examples, priced with the machine's costs (flat
    here), resolved into a concrete budget under the auto label; the drafter decodes losslessly."""
    from conftest import write_prompts
    from bpdbench.config import RunConfig
    from bpdbench.experiments import autoshape, session
    from bpdbench.hardware.shapes import TableCost
    from bpdbench.artefacts import suffix as suffix_index
    from bpdbench.methods import parse_list
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(autoshape, "cost_model", lambda s: TableCost({64: 1.0}, step_ms=1e9))
    monkeypatch.setattr(autoshape, "step_clock", lambda s, context=64: FREE_DRAFTING)     # drafting free
    monkeypatch.setattr(autoshape, "N_EXAMPLES", 3)
    run = RunConfig(task="prompts", data_file=str(write_prompts(tmp_path, 12)), model=str(tiny_model_dir),
                    dtype="float32", max_new_tokens=24, limit=3)
    (m,) = parse_list("rest:nodes=auto")
    s = session.open_session(prepare(run, "replay", [m], log=lambda _: None), lambda _: None)
    examples, _ = autoshape.heldout(s)
    seqs = [p + s.reference.get(p, s.limits)[0] for _, p in examples]
    index = SuffixIndex.build(stream(seqs))
    monkeypatch.setattr(suffix_index, "datastore_index", lambda env, profile: (index, {"tokens": len(index.tokens)}))
    d = s.drafter(m)
    rec = s.env.resolved[m.label]
    assert d.name == m.label and rec["nodes"] == rec["auto"]["params"]["nodes"] == d.nodes in (4, 8, 16, 32, 64)
    for _, prompt in examples:
        assert s.decode(d, prompt).tokens == s.reference.get(prompt, s.limits)[0]
