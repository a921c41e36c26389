"""`cascade` and its MaG bottom level: the lookup pieces do what CS-Drafting's mag.py describes; every shape is
lossless and replays exactly; a perfect bottom level accepts everything and a useless one nothing; the vertical
cascade drafts exactly what the draft model alone drafts, with fewer of its forwards; bad shapes fail in one line
when the spelling is parsed."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from bpdbench.config import RunConfig
from bpdbench.engine import DraftContext, Limits, generate, ratios, replay, teacher_forced
from bpdbench.methods import Env, MethodError, parse
from bpdbench.methods.cascade import AssistedDraftModel, CascadeDrafter
from bpdbench.artefacts.formats import bigram_table, stream
from bpdbench.methods.lookup import MaG, ContextIndex, continuation
from bpdbench.methods.sps import DraftModelDrafter
from tests.conftest import random_heads
from tests.helpers import decode_and_replay, eos_limits, parse_error

PROMPTS = ([5, 17, 3, 42, 8, 11], [1, 2, 3], [90, 4, 4, 4, 7, 90, 4, 4])
VOCAB = 96


def test_context_index_is_incremental_and_excludes_the_tail_itself():
    seq = [1, 2, 3, 1, 2, 4, 1, 2]
    a, b = ContextIndex(3), ContextIndex(3)
    a.reset(seq)
    b.reset(seq[:3])
    for t in seq[3:]:
        b.sync(b.tokens + [t])
    assert a.pos == b.pos
    assert list(a.ends(seq, 2)) == [1, 4]                # (1, 2) ends at 1 and 4; its own end (7) is skipped
    assert list(a.ends(seq, 2, recent=True)) == [4, 1]
    assert a.longest(seq) == 1                           # the longest earlier match is 2 tokens, earliest first
    assert a.longest([7, 7]) is None
    b.sync([9, 9, 9])                                    # another sequence: rebuilt, not appended
    assert b.tokens == [9, 9, 9] and list(b.ends([9, 9, 9], 2)) == [1]


def test_continuation_copies_past_the_end():
    tokens = [5, 6, 7, 5, 6]
    assert continuation(tokens, (), 1, 3) == [7, 5, 6]
    assert continuation(tokens, (), 1, 5) == [7, 5, 6, 7, 5]          # (6) ended at 1: a loop of period 3
    assert continuation(tokens, [8], 4, 4) == [8, 8, 8, 8]            # from the extra tokens on, then itself
    assert continuation([1, 2], [3, 4], 0, 5) == [2, 3, 4, 2, 3]


def test_mag_longest_match_then_bigram():
    index = ContextIndex(4)
    index.reset([10, 11, 12, 13, 20, 11, 12, 14, 30, 11, 12])
    mag = MaG(4, None)
    assert mag.draft(index, [], 3) == [13, 20, 11]      # (11, 12): earliest occurrence, i.e. in the prompt first
    index.reset([10, 11, 12, 13, 20, 11, 12, 14, 30, 10, 11, 12])
    assert mag.draft(index, [], 2) == [13, 20]          # (10, 11, 12) is longer than (11, 12) -> 14
    index.reset([7, 8, 9, 7, 8, 5, 9, 1])
    assert mag.draft(index, [9, 7], 2) == [8, 5]        # the match is for context + extra: (9, 7) -> 8, then 5
    bigram = np.full(50, -1, dtype=np.int32)
    bigram[[40, 41, 42]] = [41, 42, 43]
    index.reset([1, 2, 40])
    assert MaG(4, None).draft(index, [], 3) == []        # no match, no bigram table: nothing
    assert MaG(4, bigram).draft(index, [], 5) == [41, 42, 43]   # the chain stops where the table knows nothing
    assert MaG(4, bigram, frozenset({42})).draft(index, [], 5) == [41, 42]   # cut after EOS


def test_bigram_table_takes_the_most_frequent_successor():
    s = stream([[1, 2, 1, 2, 1, 3], [3, 4], [3, 4, 3, 5]])
    table = bigram_table(s, 8)
    assert table[1] == 2 and table[3] == 4 and table[2] == 1 and table[4] == 3
    assert table[0] == -1 and table[5] == -1             # 5 ends a document: no successor across SEP


def _greedy_bigram(greedy: list[int]) -> np.ndarray:
    """A bigram table that continues the greedy output exactly where its tokens have one successor."""
    return bigram_table(stream([greedy]), VOCAB)


def test_exact_database_accepts_everything_random_accepts_nothing(tiny_model):
    """Logic at the extremes, on a known trajectory G (replay reads the targets from G): a context that holds G
    after the prompt's last n-gram makes every drafted token right; a bigram table that is always wrong, with no
    n-gram match in sight, makes every one wrong. On the model's real greedy output both stay lossless."""
    prompt, truth = [5, 17, 3, 42], list(range(60, 90))
    seeded = prompt + truth + [0] + prompt              # MaG's earliest match of the tail is followed by G
    limits = Limits(len(truth))
    d = CascadeDrafter("c", None, 0, 8, MaG(4, None))
    c = replay(d, seeded, truth, None, limits)
    assert c.accepted == c.drafted > 0 and c.serial_calls == 1 + -(-(len(truth) - 1) // 9)   # 9 tokens a step
    wrong = np.array([(t + 2) % VOCAB for t in range(VOCAB)], dtype=np.int32)   # G's successor is t + 1
    d = CascadeDrafter("c", None, 0, 4, MaG(1, wrong))
    c = replay(d, [1, 2, 3], truth, None, limits)
    assert c.accepted == 0 < c.drafted and c.serial_calls == len(truth)
    for prompt in PROMPTS + (seeded,):
        greedy = generate(tiny_model, None, list(prompt), Limits(30)).tokens
        for drafter in (CascadeDrafter("c", None, 0, 8, MaG(4, None)), CascadeDrafter("c", None, 0, 4, MaG(1, wrong))):
            decode_and_replay(tiny_model, drafter, prompt, Limits(30), greedy)


@pytest.mark.parametrize("eos_at,max_new", [(None, 40), (12, 40), (None, 13)])
def test_vertical_drafts_what_the_draft_model_drafts(tiny_model, noisy_model, eos_at, max_new):
    """The vertical cascade's top level drafts token for token what plain sps drafts, with fewer draft-model
    forwards when MaG guesses right, and the whole cascade is lossless and replays exactly."""
    fewer = 0
    for prompt in PROMPTS:
        limits = eos_limits(tiny_model, prompt, eos_at, max_new)
        greedy = generate(tiny_model, None, list(prompt), limits).tokens
        for draft_model in (tiny_model, noisy_model):
            mag = MaG(4, _greedy_bigram(greedy))
            plain = CascadeDrafter("c", AssistedDraftModel("c", draft_model, 4, None), 4, 4, None)
            vert = CascadeDrafter("c", None, 4, 4, None)
            vert.top = AssistedDraftModel("c", draft_model, 4, lambda out, k: mag.draft(vert.index, out, k))
            a, b = generate(tiny_model, plain, list(prompt), limits), generate(tiny_model, vert, list(prompt), limits)
            assert a.tokens == b.tokens == greedy
            assert a.counters.to_dict() == b.counters.to_dict() and a.step_log == b.step_log
            assert b.counters.to_dict() == replay(vert, list(prompt), greedy, None, limits).to_dict()
            assert vert.top.cache.get_seq_length() == len(vert.top.fed)
            fewer += vert.top.forwards < plain.top.forwards
            sps = generate(tiny_model, DraftModelDrafter("s", draft_model, 4), list(prompt), limits)
            assert sps.counters.to_dict() == a.counters.to_dict()       # the top level alone is sps
    assert fewer > 0


@pytest.mark.parametrize("tree", [False, True])
@pytest.mark.parametrize("split,length", [(1, 1), (2, 6), (3, 8)])
def test_horizontal_heads_then_mag_is_lossless_and_replays(tiny_model, split, length, tree):
    """The heads draft the first `split` positions, MaG continues after them; with `tree`, MaG's own draft from
    the first position is verified beside it in the same trie."""
    heads = random_heads(tiny_model.lm_head, 4, seed=3, std=0.05)
    from bpdbench.methods.lattice import HeadsSource, LatticeDrafter
    limits = Limits(40)
    two = 0
    for prompt in PROMPTS:
        greedy = generate(tiny_model, None, list(prompt), limits).tokens
        d = CascadeDrafter("c", LatticeDrafter("c", HeadsSource(heads, tiny_model.lm_head), split), split, length,
                           MaG(4, _greedy_bigram(greedy)), tree=tree)
        hidden = teacher_forced(tiny_model, list(prompt), greedy)
        real = decode_and_replay(tiny_model, d, prompt, limits, greedy, hidden)
        assert max(s[0] for s in real.step_log) <= length
        d.reset(list(prompt))
        for m in range(1, 8):
            ctx = DraftContext(list(prompt) + greedy[:m], hidden[m - 1], 100)
            d.index.sync(ctx.tokens)
            paths = d.propose(ctx).paths
            top = LatticeDrafter("h", HeadsSource(heads, tiny_model.lm_head), split).propose(ctx).paths[0]
            alone = d.mag.draft(d.index, [], length)
            assert paths[0][:split] == top
            assert paths[0][split:] == d.mag.draft(d.index, top, length - split)[: len(paths[0]) - split]
            assert paths[1:] == ([alone] if tree and alone and alone[: len(paths[0])] != paths[0] else [])
            two += len(paths) == 2
    assert two > 0 or not tree


def test_vertical_with_a_neural_lm_past_its_window(tiny_model):
    """A neural LM whose 64-token window is shorter than the prompt: its first forward rebuilds the window from
    the prompt's end; the vertical cascade still drafts what plain sps drafts."""
    from bpdbench.methods.draft_lm import NeuralDraftLM
    from bpdbench.nets.small_lm import SmallLM, make_config
    torch.manual_seed(0)
    lm = SmallLM(make_config("tiny", 48), torch.arange(0, VOCAB, 2)).eval()
    prompt = [int(t) for t in torch.randint(0, VOCAB, (150,), generator=torch.Generator().manual_seed(3))]
    limits = Limits(40)
    greedy = generate(tiny_model, None, prompt, limits).tokens
    mag = MaG(4, _greedy_bigram(greedy))
    vert = CascadeDrafter("c", None, 4, 4, None)
    vert.top = AssistedDraftModel("c", NeuralDraftLM(lm, VOCAB), 4, lambda out, k: mag.draft(vert.index, out, k))
    out = generate(tiny_model, vert, prompt, limits)
    sps = generate(tiny_model, DraftModelDrafter("s", NeuralDraftLM(lm, VOCAB), 4), prompt, limits)
    assert out.tokens == greedy and out.counters.to_dict() == sps.counters.to_dict()
    assert vert.top.cache.start > 0


BAD = [("cascade:top=heads", "top must be one of"), ("cascade:bottom=ngram", "bottom must be one of"),
       ("cascade:vertical=2", "vertical must be < 2"), ("cascade:bigram=web", "bigram must be one of"),
       ("cascade:split=-1", "split must be >= 0"), ("cascade:length=0", "length must be >= 1"),
       ("cascade:split=5,length=4", "exceeds length=4"), ("cascade:vertical=1", "needs top=sps"),
       ("cascade:top=none,split=2", "needs a top level"), ("cascade:top=none,bottom=none", "draft nothing"),
       ("cascade:top=bpd,model=x", "model= names"), ("cascade:top=sps,threshold=0.3", "belongs to top=bpd"),
       ("cascade:bottom=none,ngram=3", "belong to the MaG"), ("cascade:bottom=lookup,bigram=corpus", "needs bottom=mag"),
       ("cascade:split=0", "split=0"), ("cascade:top=sps,split=2,bottom=none,vertical=1", "needs top=sps"),
       ("cascade:top=none,tree=1", "needs both"), ("cascade:tree=2", "tree must be < 2"),
       ("cascade:tokens=3", "unknown parameter")]


@pytest.mark.parametrize("spelling,expect", BAD, ids=[b[0] for b in BAD])
def test_bad_shapes_fail_when_parsed(spelling, expect):
    assert expect in parse_error(spelling)


def test_registry_shapes_build_and_record_their_shape(loaded, tiny_model_dir, tmp_path, monkeypatch):
    from bpdbench import paths
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path))
    model, tok = loaded
    name = str(tiny_model_dir)
    bigram = np.array([(t * 5 + 1) % 128 for t in range(128)], dtype=np.int32)
    paths.lookup_dir(name).mkdir(parents=True)
    np.save(paths.lookup_dir(name) / "bigram-corpus.npy", bigram)
    heads = random_heads(model.lm_head, 4, seed=3, std=0.05)
    limits = Limits(24)
    env = Env(model, tok, RunConfig(model=name, dtype="float32"), limits, log=lambda m: None, _heads=(heads, {}))
    prompt = [5, 17, 3, 42, 8, 11, 5, 17]
    greedy = generate(model, None, prompt, limits).tokens
    for spelling, shape in [("cascade", {"top": "bpd", "split": 2, "length": 8, "bottom": "mag", "tree": 1}),
                            ("cascade:tree=0", {"top": "bpd", "tree": 0}),
                            ("cascade:top=none,bottom=lookup,length=5", {"top": "none", "split": 0, "length": 5,
                                                                         "tree": 0}),
                            (f"cascade:top=sps,model={name},split=3,vertical=1", {"top": "sps", "vertical": 1}),
                            ("cascade:split=4,bottom=none", {"split": 4, "length": 4, "bottom": "none"})]:
        m = parse(spelling)
        d = env.build(m)
        assert shape.items() <= env.resolved[m.label].items(), (spelling, env.resolved[m.label])
        real = generate(model, d, prompt, limits)
        assert real.tokens == greedy
        if "top=sps" in spelling:                        # the target drafting for itself: its 3 are right
            assert all(a >= min(3, n) for n, a in real.step_log) and real.counters.accepted > 0
            assert ratios(real.counters)["block_efficiency"] > 3
    assert env.resolved["cascade"]["bigram"]["path"].endswith("bigram-corpus.npy")
    with pytest.raises(MethodError, match="only 4"):
        env.build(parse("cascade:split=6"))


def test_the_top_level_is_wrapped_and_declared():
    """The top level is an inner drafter (methods/compose.py): reset and observe reach it, the cascade takes no
    verify feedback, reference or cross-example state; at parse time only the heads' top reads hidden states."""
    from bpdbench.methods.compose import HIDDEN, OBSERVE, RESET, consumes, declared

    class Top:
        name = "top"

        def __init__(self):
            self.calls: list[tuple] = []

        def reset(self, prompt_ids):
            self.calls.append(("reset", list(prompt_ids)))

        def observe(self, tokens):
            self.calls.append(("observe", list(tokens)))

    top = Top()
    d = CascadeDrafter("c", top, 1, 4, MaG(2, None))
    d.reset([1, 2, 3])
    d.observe([4, 5])
    assert top.calls == [("reset", [1, 2, 3]), ("observe", [4, 5])]
    assert consumes(d) == {RESET, OBSERVE} and d.feedback_k == 0 and d.snapshot() is None
    assert HIDDEN in declared(parse("cascade:split=2")) and HIDDEN not in declared(parse("cascade:top=none"))
    assert HIDDEN not in declared(parse("cascade:top=sps"))
