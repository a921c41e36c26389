"""Replay equals real decoding, counter for counter, for every registered method (float32, tiny model); the oracle
bounds every drafting rule; analysis helpers."""
from __future__ import annotations

import json

import pytest
import torch

from bpdbench import paths
from bpdbench.config import RunConfig
from bpdbench.engine import (Limits, TreeScorer, generate, layers_of, ratios, replay, teacher_forced,
                             teacher_forced_layers)
from bpdbench.experiments.analysis import h_max, repetition
from bpdbench.nets.heads import Heads
from bpdbench.methods import REGISTRY, Env, parse
from bpdbench.methods.contract import feedback_k, needs_scorer, reads_reference
from bpdbench.nets.small_lm import SmallLM, make_config, save_lm
from tests.drafter_fixtures import copy_cache

PROMPTS = ([5, 17, 3, 42, 8, 11], [1, 2, 3], [90, 4, 4, 4, 7, 90, 4, 4])
VOCAB = 128


class PartlyRightHeads(Heads):
    """Heads that know the greedy continuation and get about two positions in three right, with the right token
    at rank 2 otherwise and a spread of other candidates: acceptance varies, and every rescorer has choices."""

    def __init__(self, reference: dict[tuple, list[int]], n: int = 4, seed: int = 0):
        super().__init__(d=32, num_heads=n)
        self.reference, self.seed = reference, seed      # prompt -> greedy continuation

    def draft_logits(self, hidden, n, lm_head, context=None):
        prompt = next(p for p in self.reference if tuple(context[: len(p)]) == p)
        ref = self.reference[prompt]
        m = len(context) - len(prompt)
        g = torch.Generator().manual_seed(self.seed * 1000 + len(context))
        logits = torch.randn(n, VOCAB, generator=g)
        for i in range(n):
            true = ref[m + i] if m + i < len(ref) else 0
            if (m + 2 * i) % 3:
                logits[i, true] = 6.0
            else:
                logits[i, (true + 1) % VOCAB], logits[i, true] = 6.0, 5.0
        return logits


@pytest.fixture(scope="module")
def setup(tiny_model_dir, tmp_path_factory):
    from bpdbench import models
    torch.set_num_threads(1)
    model, tok = models.load(str(tiny_model_dir), "float32")
    return model, tok


@pytest.fixture(scope="module")
def drafter_cache(trained_drafters):
    """Tiny draft networks (EAGLE, Hydra, Hydra++, Amphista, KOALA...), built once, copied into each test's cache."""
    return trained_drafters[0]


def _artefacts(root, model_name):
    """Tiny stand-ins for every rescorer artefact, where the registry looks for them."""
    for tag in ("neural-s", "neural-m", "neural-l"):
        torch.manual_seed(len(tag))
        lm = SmallLM(make_config(tag[-1], VOCAB), torch.arange(VOCAB)).eval()
        save_lm(lm, paths.rescorer_dir(tag, model_name))
    pairs = [(t, (t * 7 + 3) % VOCAB) for t in range(0, VOCAB, 2)]
    arpa = ["\\data\\", f"ngram 1={VOCAB + 3}", f"ngram 2={len(pairs)}", "", "\\1-grams:", "-1.0\t<unk>\t0",
            "-99\t<s>\t0", "-1.2\t</s>\t0"]
    arpa += [f"{-1.0 - (t % 7) / 3:.3f}\t{t}\t-0.2" for t in range(VOCAB)] + ["", "\\2-grams:"]
    arpa += [f"-0.1\t{a} {b}" for a, b in pairs] + ["", "\\end\\", ""]
    for order in (2, 4):
        path = paths.rescorer_dir(f"ngram{order}", model_name) / f"ngram{order}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(arpa))   # KenLM reads ARPA text as well as its binary format
    _lookup_tables(model_name)


def _lookup_tables(model_name):
    """Tiny stand-ins for the lookup drafters' corpus table, bigram table and quick model history."""
    import random
    import numpy as np
    from bpdbench.artefacts.formats import FrequencyTable, bigram_table, stream
    from bpdbench.train import history
    from bpdbench.train.rescorer import default_corpus_files
    rng = random.Random(1)
    docs = [[rng.randrange(VOCAB) for _ in range(60)] for _ in range(20)]
    files = [str(f) for f in default_corpus_files()]
    FrequencyTable.build(stream(docs), sizes=(2, 3), meta={"source": "corpus", "files": files}).save(
        paths.lookup_dir(model_name) / "static.npz")
    np.save(paths.lookup_dir(model_name) / "bigram-corpus.npy", bigram_table(stream(docs), VOCAB))
    seqs = [[rng.randrange(VOCAB) for _ in range(30)] for _ in range(10)]
    history.history_file(model_name, "quick").write_text(json.dumps(
        {"model": model_name, "profile": "quick", "sequences": len(seqs), "tokens": 300,
         "source": {"kind": "test stand-in"}, "continuations": seqs}))


def _suffix_indexes(monkeypatch, refs):
    """Stand-ins for sam's corpus index (random documents) and rest's datastore (the greedy texts, so it accepts)."""
    import random
    from bpdbench.artefacts import suffix as suffix_index
    from bpdbench.artefacts.formats import stream
    rng = random.Random(2)
    corpus = suffix_index.SuffixIndex.build(stream([[rng.randrange(VOCAB) for _ in range(60)] for _ in range(20)]))
    store = suffix_index.SuffixIndex.build(stream([list(p) + g for p, g in refs.items()]))
    monkeypatch.setattr(suffix_index, "corpus_index", lambda env: (corpus, {"tokens": len(corpus.tokens)}))
    monkeypatch.setattr(suffix_index, "datastore_index", lambda env, profile: (store, {"tokens": len(store.tokens)}))


def all_methods(model_dir) -> list[str]:
    out = []
    for name, spec in REGISTRY.items():
        if spec.external:
            continue
        out.append({"hf-lm": f"hf-lm:model={model_dir}", "oracle": "oracle:k=4",
                    "sps": f"sps:model={model_dir}"}.get(name, name))
    return out + ["bpd:heads=2", "bpd:threshold=0.3", "medusa:tree=auto", "ngram4:alpha=2", "pld:tokens=3,ngram=1",
                  f"sps:model={model_dir},gamma=2,schedule=heuristic", "cascade:top=none,bottom=lookup,length=4",
                  f"cascade:top=sps,model={model_dir},split=3,vertical=1", "cascade:split=3,threshold=0.2",
                  "hierarchy:order=lsc,candidates=2,length=3", "hierarchy:order=c,ngram=1",
                  "eagle:tree=3", "hydra:tree=2",
                  "koala:base=hydra,adv=1,refine=ngram4", "recycling:nodes=8,k=2,persist=0",
                  "lookahead:window=3,ngram=3,guesses=2", "sam:threshold=2,fallback=hierarchy;order=c",
                  "sam:fallback=bpd;heads=2", "sam:threshold=3,fallback=lookahead;window=3;ngram=3;guesses=2",
                  "sam:threshold=3,fallback=oracle;k=4", "sam:tokens=9,threshold=4,bias=4,fallback=none",
                  "rest:nodes=8,span=4", "ar:rows=4"]


SETTINGS = [(None, 40), (12, 40), (None, 13)]     # (EOS at this greedy position of the first prompt, max_new)


def tiny_world(model, tok, model_dir, drafter_cache, cache, monkeypatch, eos_at, max_new):
    """An Env on the tiny model with every artefact a registered method needs (stand-ins, tiny draft networks,
    heads that know the greedy continuation), its limits, and per prompt the greedy output and a replay memo."""
    monkeypatch.setenv("BPDBENCH_CACHE", str(cache))
    name = str(model_dir)
    _artefacts(cache, name)
    copy_cache(drafter_cache, cache)
    refs = {tuple(p): generate(model, None, list(p), Limits(max_new)).tokens for p in PROMPTS}
    eos = frozenset() if eos_at is None else frozenset({refs[tuple(PROMPTS[0])][eos_at]})
    _suffix_indexes(monkeypatch, refs)
    limits = Limits(max_new, eos)
    heads = PartlyRightHeads(refs)
    meta = {"heldout": {"top1": [0.6, 0.5, 0.4, 0.3], "top16": [0.9, 0.8, 0.7, 0.6]}}
    cfg = RunConfig(model=name, heads=4, k=4, alpha_file=str(cache / "alpha.json"))
    env = Env(model, tok, cfg, limits, log=lambda m: None, _heads=(heads, meta))
    memos = {tuple(p): {} for p in PROMPTS}     # shared by every method, as `bpdbench replay` shares it
    # the greedy reference depends only on the prompt and the limits: one decode per prompt serves every method
    greedies = {tuple(p): generate(model, None, list(p), limits).tokens for p in PROMPTS}
    return env, limits, greedies, memos


def replay_equals_real(env, spelling: str, greedies: dict, memos: dict) -> int:
    """Real decoding of every prompt equals greedy decoding, and replay of the same drafter emits the same steps
    and counters; returns the draft tokens accepted."""
    model, limits = env.model, env.limits
    method = parse(spelling)
    drafter = env.build(method)
    # a drafter that learns from verify forwards (recycling keeps its matrix across examples) walks the
    # replays as its own instance, as a run and a replay of the same examples each would
    twin = env.build(method) if feedback_k(drafter) else drafter
    scorer = TreeScorer(model) if needs_scorer(drafter) else None     # the verify's top-k, or the base's cache
    accepted = 0
    for prompt in PROMPTS:
        greedy = list(greedies[tuple(prompt)])
        if reads_reference(drafter):
            drafter.use_reference(greedy)
        # the context too: real decoding's events once held the step's new tokens already (engine/loop.py)
        seen = {"real": [], "replay": []}
        log = lambda key: lambda ev: seen[key].append(       # noqa: E731 (past EOS, replay knows no bonus)
            (ev.proposal.paths, ev.decision.path, ev.decision.accepted, ev.produced, list(ev.context.tokens)))
        real = generate(model, drafter, list(prompt), limits, on_step=log("real"))
        assert real.tokens == greedy, spelling
        hidden = teacher_forced(model, list(prompt), greedy, with_prompt=True)   # feature drafters' prefill
        layers = layers_of(twin)                # a drafter that reads chosen layers (eagle3) replays with them
        states = None if layers is None else \
            teacher_forced_layers(model, list(prompt), greedy, layers.indices, with_prompt=True)[1]
        sim = replay(twin, list(prompt), greedy, hidden, limits, memo=memos[tuple(prompt)], scorer=scorer,
                     on_step=log("replay"), layer_states=states)
        assert sim.to_dict() == real.counters.to_dict(), (spelling, prompt)
        assert seen["real"] == seen["replay"] and len(seen["real"]) == real.counters.steps, (spelling, prompt)
        accepted += real.counters.accepted
    return accepted


@pytest.mark.parametrize("eos_at,max_new", SETTINGS)
def test_replay_equals_real_for_every_method(setup, tiny_model_dir, drafter_cache, tmp_path, monkeypatch, eos_at,
                                             max_new):
    pytest.importorskip("kenlm")
    model, tok = setup
    env, limits, greedies, memos = tiny_world(model, tok, tiny_model_dir, drafter_cache, tmp_path, monkeypatch,
                                              eos_at, max_new)
    checked = []
    for spelling in all_methods(tiny_model_dir):
        accepted = replay_equals_real(env, spelling, greedies, memos)
        assert accepted > 0 or parse(spelling).name in ("ar", "null"), spelling   # not two empty walks compared
        checked.append(parse(spelling).label)
    assert {parse(m).name for m in checked} == {n for n, s in REGISTRY.items() if not s.external}
    from bpdbench.artefacts.cache import listing, unowned
    assert listing(tmp_path) and unowned(tmp_path) == []   # every file the methods made is a registered artefact's


def test_perfect_and_wrong_drafts_at_the_extremes(setup):
    """Perfect drafts accept everything, wrong drafts nothing; replay agrees with both."""
    model, tok = setup
    prompt, limits = list(PROMPTS[0]), Limits(40)
    greedy = generate(model, None, prompt, limits).tokens

    class Scripted:
        name = "scripted"

        def __init__(self, shift):
            self.shift = shift

        def reset(self, prompt_ids):
            self.start = len(prompt_ids)

        def propose(self, ctx):
            from bpdbench.engine import Proposal
            m = len(ctx.tokens) - self.start
            return Proposal([[(t + self.shift) % VOCAB for t in greedy[m: m + 4]]])

        def observe(self, tokens):
            pass

    hidden = teacher_forced(model, prompt, greedy)
    for shift, calls in ((0, 1 + 8), (1, 40)):
        real = generate(model, Scripted(shift), prompt, limits)
        assert real.tokens == greedy and real.counters.serial_calls == calls
        assert replay(Scripted(shift), prompt, greedy, hidden, limits).to_dict() == real.counters.to_dict()


def test_oracle_bounds_and_grows_with_k(setup):
    model, tok = setup
    prompt, limits = list(PROMPTS[0]), Limits(60)
    greedy = generate(model, None, prompt, limits).tokens
    heads = PartlyRightHeads({tuple(prompt): greedy})
    env = Env(model, tok, RunConfig(model="tiny", heads=4, k=4), limits, log=lambda m: None, _heads=(heads, {}))
    hidden = teacher_forced(model, prompt, greedy)

    def eff(spelling):
        d = env.build(parse(spelling))
        if reads_reference(d):
            d.use_reference(greedy)
        return ratios(replay(d, prompt, greedy, hidden, limits))["block_efficiency"]
    oracle = [eff(f"oracle:k={k}") for k in (1, 2, 8, VOCAB)]
    assert oracle == sorted(oracle) and oracle[0] == eff("bpd")
    assert oracle[-1] == 60 / (1 + -(-59 // 5))   # k = vocabulary: every greedy token is in the lattice
    assert eff("16best-0gram:k=8") <= oracle[2] and eff("medusa") <= oracle[-1]


def test_repetition_and_h_max():
    stats = repetition([[1, 1, 1, 2], [3, 4, 5, 6]])
    assert stats["repeat_share"] == 2 / 6 and stats["mean_max_run"] == 2.0
    assert h_max([1.0, 2.0, 3.0, 2.5, 4.0]) == 3
    assert h_max([3.0, 2.0]) == 1
