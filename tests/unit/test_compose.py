"""Composition (methods/compose.py): a wrapper forwards every input of the loop to its inner drafters (reset, observe,
verify feedback with each one's k, hidden states of the steps they sat out, the greedy reference, state across
examples through a JSON round trip); an inner method whose input the wrapper cannot forward is refused at parse time;
what a method declares at parse time is what its built drafter takes; and every method the registry accepts as
SAM's fallback drafts there, on the tiny model: accepted tokens from the fallback's own proposals, lossless, the
stateful ones' state moved. A method registered later fails here until it is given a spelling or a refusal."""
from __future__ import annotations

import json

import pytest
import torch

from bpdbench.config import RunConfig
from bpdbench.engine import DraftContext, Feedback, Limits, Proposal, generate
from bpdbench.engine.tree import build_tree
from bpdbench.methods import REGISTRY, Env, MethodError, parse
from bpdbench.methods.compose import (FEEDBACK, HIDDEN, INPUTS, OBSERVE, REFERENCE, RESET, STATE, Wrapper,
                                      check_inner, consumes, declared)
from tests.helpers import parse_error
from tests.unit.test_replay import PROMPTS, PartlyRightHeads, _artefacts, _suffix_indexes


class Inner:
    """An inner drafter that records what reaches it and drafts one fixed token."""

    def __init__(self, name: str, k: int = 0, reference: bool = False, state=None):
        self.name, self.feedback_k, self.needs_reference, self.state = name, k, reference, state
        self.calls: list[tuple] = []

    def reset(self, prompt_ids):
        self.calls.append(("reset", tuple(prompt_ids)))

    def propose(self, ctx):
        rows = None if ctx.accepted_hidden is None else ctx.accepted_hidden[:, 0].tolist()
        self.calls.append(("propose", rows))
        return Proposal([[7]])

    def observe(self, tokens):
        self.calls.append(("observe", tuple(tokens)))

    def feedback(self, fb):
        self.calls.append(("feedback", tuple(fb.topk.shape)))

    def use_reference(self, tokens):
        self.calls.append(("reference", tuple(tokens)))

    def snapshot(self):
        return None if self.state is None else {"rows": [[1, list(self.state)]]}

    def restore(self, state):
        self.state = list(state["rows"][0][1])


class Alternate(Wrapper):
    """Asks its inner drafters in turn; the others sit the step out."""

    def __init__(self, inners):
        super().__init__()
        self.inners, self.step = inners, 0

    def inner_drafters(self):
        return self.inners

    def propose(self, ctx):
        turn = self.inners[self.step % len(self.inners)]
        self.step += 1
        for d in self.inners:
            if d is not turn:
                self.hold(d, ctx)
        return turn.propose(self.context_for(turn, ctx))


def test_a_wrapper_forwards_every_input():
    a, b, c = Inner("a", k=2, state=[3, 4]), Inner("b"), Inner("c", k=3, reference=True)
    w = Alternate([a, b, c])
    assert w.feedback_k == 3 and w.needs_reference and consumes(w) == {RESET, OBSERVE, FEEDBACK, REFERENCE, STATE}
    w.reset([1, 2])
    w.use_reference([9, 9])
    hidden = torch.arange(6.0)[:, None]
    for step in range(3):                           # a, b, c propose in turn; rows 2 per step
        w.propose(DraftContext([1, 2], None, 5, accepted_hidden=hidden[2 * step: 2 * step + 2]))
        tree = build_tree(2, [[7]])
        w.feedback(Feedback(tree, torch.zeros(len(tree.tokens), 3, dtype=torch.long)))
        w.observe([7, 8])
    assert a.calls[:2] == [("reset", (1, 2)), ("propose", [0.0, 1.0])]
    assert ("propose", [0.0, 1.0, 2.0, 3.0]) in b.calls           # the rows of the step it sat out come first
    assert ("propose", [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]) in c.calls
    assert [x for x in a.calls if x[0] == "feedback"] == [("feedback", (2, 2))] * 3      # its own k, every step
    assert not [x for x in b.calls if x[0] == "feedback"]                               # k = 0: none
    assert [x for x in c.calls if x[0] == "feedback"] == [("feedback", (2, 3))] * 3
    assert all([x for x in d.calls if x[0] == "observe"] == [("observe", (7, 8))] * 3 for d in (a, b, c))
    assert ("reference", (9, 9)) in c.calls and not [x for x in a.calls + b.calls if x[0] == "reference"]
    snap = w.snapshot()
    assert snap == (None, {"rows": [[1, [3, 4]]]}, None, None)
    a.state = [5]
    w.restore(json.loads(json.dumps(snap)))                       # as replay --resume stores it
    assert a.state == [3, 4]
    assert Alternate([Inner("x"), Inner("y")]).snapshot() is None  # nothing kept: not a stateful drafter


def test_an_input_the_wrapper_cannot_forward_is_refused():
    only = (RESET, OBSERVE, HIDDEN)
    check_inner("w", "inner", parse("pld"), only)
    check_inner("w", "inner", parse("bpd:heads=2"), only)
    with pytest.raises(MethodError, match="inner=recycling needs the verify feedback, which w does not pass"):
        check_inner("w", "inner", parse("recycling"), only)
    with pytest.raises(MethodError, match="oracle:k=4 needs the greedy reference"):
        check_inner("w", "inner", parse("oracle:k=4"), only)
    with pytest.raises(MethodError, match="whole decoder"):
        check_inner("w", "inner", parse("hf-pld"), INPUTS)
    assert declared(parse("sam:fallback=none")) == {RESET, OBSERVE}
    assert declared(parse("sam")) == {RESET, OBSERVE, FEEDBACK}                         # SAM[TR]
    assert declared(parse("sam:fallback=oracle;k=4")) == {RESET, OBSERVE, HIDDEN, REFERENCE}
    assert HIDDEN in declared(parse("cascade")) and HIDDEN not in declared(parse("cascade:top=none"))


# ---- every method the registry has, as SAM's fallback --------------------------------------------------------

# name -> its spelling as a fallback ({dir}: the tiny model's folder), or why SAM refuses it (checked at parse
# time). Every registered name must be in one of the two: a new method forces a decision here.
FALLBACKS = {"bpd": "bpd", "ngram2": "ngram2", "ngram4": "ngram4", "16best-0gram": "16best-0gram",
             "16best-ngram4": "16best-ngram4", "neural-s": "neural-s", "neural-m": "neural-m",
             "neural-l": "neural-l", "hf-lm": "hf-lm;model={dir}", "medusa": "medusa",
             "medusa-neural-m": "medusa-neural-m", "oracle": "oracle;k=4", "pld": "pld", "sps": "sps;model={dir}",
             "cascade": "cascade", "hierarchy": "hierarchy", "recycling": "recycling", "lookahead": "lookahead",
             "rest": "rest", "eagle": "eagle", "eagle3": "eagle3", "hydra": "hydra", "hydra++": "hydra++", "amphista": "amphista",
             "koala": "koala", "qdraft": "qdraft", "layerskip": "layerskip", "hybrid": "hybrid;retrieval=pld"}
REFUSED = {"ar": "drafts nothing", "null": "drafts nothing", "sam": "is sam itself", "hf-greedy": "whole decoder",
           "hf-pld": "whole decoder", "hf-assisted": "whole decoder", "llamacpp": "whole decoder",
           "llamacpp-pld": "whole decoder"}
KENLM = ("ngram2", "ngram4", "16best-ngram4")          # n-gram rescoring runs on KenLM (installed by `make test`)
# the state a fallback that learns from the verify forward keeps, moved by decoding (rows filled, window advanced)
MOVED = {"recycling": lambda d: len(d.rows) > 0,
         "lookahead": lambda d: len(d.levels) == d.ngram - 1 and len(d.pool) > 0}


def test_every_registered_method_is_decided():
    assert set(FALLBACKS) | set(REFUSED) == set(REGISTRY), "give the new method a fallback spelling or a refusal"
    assert not set(FALLBACKS) & set(REFUSED)


@pytest.fixture(scope="module")
def world(tiny_model_dir, tmp_path_factory, trained_drafters):
    """The tiny model with every artefact any method needs (test_replay's stand-ins, tiny draft networks) and
    heads that know the greedy continuation, so heads-based fallbacks accept."""
    from bpdbench import models
    from tests.drafter_fixtures import copy_drafters
    torch.set_num_threads(1)
    model, tok = models.load(str(tiny_model_dir), "float32")
    root = tmp_path_factory.mktemp("compose")
    limits = Limits(40)
    with pytest.MonkeyPatch.context() as mp:
        copy_drafters(trained_drafters, root)
        mp.setenv("BPDBENCH_CACHE", str(root))
        _artefacts(root, str(tiny_model_dir))
        refs = {tuple(p): generate(model, None, list(p), limits).tokens for p in PROMPTS}
        _suffix_indexes(mp, refs)
        cfg = RunConfig(model=str(tiny_model_dir), heads=4, k=4, alpha_file=str(root / "alpha.json"))
        meta = {"heldout": {"top1": [0.6, 0.5, 0.4, 0.3], "top16": [0.9, 0.8, 0.7, 0.6]}}
        env = Env(model, tok, cfg, limits, log=lambda m: None, _heads=(PartlyRightHeads(refs), meta))
        yield env, refs


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_accepted_fallback_drafts_inside_sam(world, tiny_model_dir, name):
    """The method alone takes what it declares; inside SAM (its defaults, no static side) it takes all of that
    through SAM; decoding stays lossless; some accepted tokens are the fallback's own proposals; a fallback that
    learns from the verify forward has moved its state."""
    if name in REFUSED:
        assert REFUSED[name] in parse_error(f"sam:fallback={name}")
        return
    if name in KENLM:
        pytest.importorskip("kenlm")
    env, refs = world
    inner = parse(FALLBACKS[name].format(dir=tiny_model_dir).replace(";", ":", 1).replace(";", ","))
    alone = env.build(inner)
    took, said = consumes(alone, inner), declared(inner)
    assert took & {FEEDBACK, REFERENCE} == said & {FEEDBACK, REFERENCE}, (name, took, said)
    assert HIDDEN not in took or HIDDEN in said, (name, took, said)
    sam_method = parse(f"sam:static=none,fallback={FALLBACKS[name].format(dir=tiny_model_dir)}")
    sam = env.build(sam_method)
    fb = sam.fallback
    assert type(fb) is type(alone) and consumes(sam) >= took - {STATE} and declared(sam_method) >= said
    assert sam.needs_hidden == (HIDDEN in said)
    from_fallback = drafted_by_sam = 0
    for prompt in PROMPTS:
        greedy = refs[tuple(prompt)]
        sam.use_reference(greedy)                   # what the session does for drafters that need it
        steps = []
        out = generate(env.model, sam, list(prompt), env.limits,
                       on_step=lambda ev: steps.append((sam.source, ev.decision.accepted)))
        assert out.tokens == greedy, (name, prompt)
        from_fallback += sum(a for s, a in steps if s == "fallback")
        drafted_by_sam += sum(s in ("dyn", "static") for s, _ in steps)
    assert from_fallback > 0, name
    assert drafted_by_sam > 0, name                 # the fallback also sat steps out, and still drafted
    assert (FEEDBACK in took) == (name in MOVED), "say how this fallback's learnt state shows it moved"
    if name in MOVED:
        assert MOVED[name](fb), name
