"""The target drafting for itself: qdraft (its weights quantized) and layerskip (its layers skipped).

Logic on tiny models: the int8/int4 kernels compute what their rounding says; every spelling decodes exactly the
greedy output and replays to the same counters; the multi-level draft is token for token the int8 draft; the search
and the profile are recorded; bad spellings are one-line errors. At T > 0 a quantized draft keeps speculative
sampling exact, and the same drafts under a lossy rule fail the test. The real model's agreement and speed are
measured by `bpdbench replay` / `speed` (docs/methods.md), never asserted here."""
from __future__ import annotations

import copy
import re
from collections import Counter

import pytest
import torch

from bpdbench.config import RunConfig
from bpdbench.engine import Limits, TreeScorer, generate, replay
from bpdbench.methods import MethodError
from bpdbench.methods.contract import needs_scorer
from bpdbench.methods.env import Env
from bpdbench.methods.registry import parse
from bpdbench.methods.sps import SINK
from bpdbench.nets.quant import QuantLinear, dequantize_int4, quantize_int4, quantize_int8
from tests.helpers import parse_error

PROMPTS = ([1, 5, 9, 3, 7, 2, 8], [4, 4, 6, 1], [11, 30, 2, 2, 9, 17, 5, 40, 3])
LIMITS = Limits(24)


@pytest.mark.parametrize("shape", [(96, 32), (16, 32), (128, 896)])
def test_kernels_compute_their_rounding(shape):
    """int4: the packed kernel equals the dequantized matrix (bfloat16 accuracy); int8: per-row scales."""
    torch.manual_seed(0)
    w, b, x = torch.randn(*shape) * 0.05, torch.randn(shape[0]) * 0.01, torch.randn(3, shape[1])
    m4 = QuantLinear(w, b, 4, 64)
    q, s, z = quantize_int4(w, m4.group)
    fake = torch.nn.functional.linear(x.bfloat16().float(), dequantize_int4(q, s, z, m4.group), b)
    assert m4.kernel == "int4"
    assert (m4(x.bfloat16()).float() - fake).norm() / fake.norm() < 0.01
    dense = torch.nn.functional.linear(x, w, b)
    assert 0.02 < (m4(x.bfloat16()).float() - dense).norm() / dense.norm() < 0.2     # int4 is not free
    q8, s8 = quantize_int8(w)
    m8 = QuantLinear(w, b, 8)
    fake8 = torch.nn.functional.linear(x.bfloat16().float(), q8.float() * s8[:, None], b)
    assert m8.kernel == "int8" and (m8(x.bfloat16()).float() - fake8).norm() / fake8.norm() < 0.01


def _deep_model():
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=6,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    model = Qwen2ForCausalLM(cfg).eval().requires_grad_(False)
    model.lm_head.weight.mul_(8.0)
    return model


@pytest.fixture(scope="module")
def env(tiny_model_dir, tmp_path_factory):
    """A 6-layer tiny model (layers to skip) with the tiny tokenizer; the tune prompts are xsum's."""
    from bpdbench import models
    torch.set_num_threads(1)
    _, tok = models.load(str(tiny_model_dir), "float32")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BPDBENCH_CACHE", str(tmp_path_factory.mktemp("selfdraft")))
        yield Env(_deep_model(), tok, RunConfig(model=str(tiny_model_dir), task="xsum"), LIMITS, log=lambda m: None)


SPELLINGS = ("qdraft", "qdraft:bits=8,length=3", "qdraft:levels=2,length=5", "qdraft:window=3",
             "qdraft:levels=2,window=5", "qdraft:scales=awq,length=3", "qdraft:rounding=gptq,length=3",
             "qdraft:scales=awq,rounding=gptq,levels=2", "layerskip", "layerskip:skip=2",
             "layerskip:bits=8,length=2", "qdraft:cache=base,length=3", "qdraft:cache=base,bits=8",
             "layerskip:cache=base", "layerskip:bits=8,cache=base,length=3", "qdraft:forward=transformers,length=3",
             "layerskip:forward=transformers,skip=2", "qdraft:cache=base,forward=transformers",
             "qdraft:cache=base,length=5,stop=0.05", "layerskip:skip=2,length=4,stop=0.05",
             "qdraft:rescore=4,length=3", "qdraft:cache=base,rescore=2,length=4")


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_lossless_and_replay_equals_decoding(env, spelling):
    method = parse(spelling)
    for prompt in PROMPTS:
        ref = generate(env.model, None, list(prompt), LIMITS).tokens
        out = generate(env.model, env.build(method), list(prompt), LIMITS)
        assert out.tokens == ref, (spelling, prompt)
        drafter = env.build(method)
        again = replay(drafter, list(prompt), ref, None, LIMITS,
                       scorer=TreeScorer(env.model) if needs_scorer(drafter) else None)
        assert (again.steps, again.accepted, again.accepted_per_head) == \
            (out.counters.steps, out.counters.accepted, out.counters.accepted_per_head)
    assert out.counters.drafted > 0
    rec = env.resolved[method.label]
    if method.get("window"):                       # the draft read the prompt's last `window` tokens only
        d = env.build(method)
        generate(env.model, d, list(PROMPTS[2]), LIMITS)
        cut = len(PROMPTS[2]) - method.get("window")
        assert d.start == (cut if cut > SINK else 0) and len(d.fed) <= method.get("window") + SINK + 24
        assert d.fed[:SINK] == list(PROMPTS[2][:SINK])  # and its first tokens, where attention rests
    prof = rec["profile"]
    assert prof["split"] == "tune" and 0.0 < prof["agreement"] <= 1.0 and prof["cost_steps"] > 0
    if method.name == "layerskip":
        assert rec["skipped"] and 0 not in rec["skipped"]
        assert all(0 < c["agreement"] <= 1 for c in rec["search"]["curve"])
        if method.get("skip"):
            assert len(rec["skipped"]) == method.get("skip")


def test_awq_moves_the_rounding_off_the_large_inputs():
    """A layer whose inputs are large on a few channels: scaling those weight columns up before rounding (and the
    inputs down) cuts the output error; alpha 0 is min/max rounding, so the choice is never worse than it."""
    from bpdbench.nets import awq
    torch.manual_seed(0)
    w, x = torch.randn(64, 128) * 0.05, torch.randn(512, 128)
    x[:, :4] *= 40.0                                           # a few outlier channels, as in real activations
    s, rec = awq.search(w, x, 32, quantize_int4, dequantize_int4)
    assert rec["alpha"] > 0 and rec["error"] < 0.7 * rec["error_minmax"], rec
    layer = QuantLinear(w, None, 4, 32, in_scale=s)
    q, sc, z = quantize_int4(w * s, 32)
    want = torch.nn.functional.linear(x, dequantize_int4(q, sc, z, 32) / s)
    got = layer(x.bfloat16()).float()
    assert (got - want).norm() / want.norm() < 0.02
    plain = QuantLinear(w, None, 4, 32)(x.bfloat16()).float()
    exact = x @ w.T
    assert (got - exact).norm() < (plain - exact).norm()


def test_gptq_spreads_the_rounding_error_where_the_inputs_correlate():
    """Correlated inputs (a few latent factors): rounding column by column with the error pushed onto the columns
    not yet rounded leaves a smaller output error than rounding each weight to its nearest level, with the same
    levels (the layer runs it on the int4 kernel unchanged)."""
    from bpdbench.nets import gptq
    torch.manual_seed(0)
    w = torch.randn(48, 128) * 0.05
    x = torch.randn(1024, 8) @ torch.randn(8, 128) + 0.1 * torch.randn(1024, 128)
    err = lambda parts: float(((x @ dequantize_int4(*parts, 32).T - x @ w.T) ** 2).mean())   # noqa: E731
    parts = gptq.round_int4(w, gptq.hessian(x), 32)
    assert parts[0].min() >= 0 and parts[0].max() <= 15
    assert err(parts) < 0.6 * err(quantize_int4(w, 32)), (err(parts), err(quantize_int4(w, 32)))
    layer = QuantLinear(w, None, 4, 32, parts=parts)
    want = torch.nn.functional.linear(x[:4], dequantize_int4(*parts, 32))
    assert layer.kernel == "int4" and (layer(x[:4].bfloat16()).float() - want).norm() / want.norm() < 0.02


def test_bad_rounding_spellings_are_one_line_errors():
    with pytest.raises(MethodError, match="rounding=gptq rounds the int4 copy") as e:
        parse("qdraft:bits=8,rounding=gptq")
    assert "\n" not in str(e.value)
    with pytest.raises(MethodError, match="drop rounding="):
        parse("qdraft:runtime=gguf,rounding=gptq")


def test_awq_scales_are_chosen_on_the_train_split_and_recorded(env):
    m = parse("qdraft:scales=awq")
    env.build(m)
    rec = env.resolved[m.label]["scales"]
    assert rec["scales"] == "awq" and rec["split"] == "train" and rec["seen"]["split"] == "train"
    assert rec["mean_error"] <= rec["mean_error_minmax"] and rec["layers"] == 6 * 7 + 1
    import tasks
    task = tasks.get_task("xsum")
    split = tasks.split_of(task, tasks.load_examples(task, tasks.default_data_dir()))
    assert {split[i] for i in rec["seen"]["ids"]["xsum"]} == {"train"}
    assert env.resolved[m.label]["profile"]["agreement"] > 0


def test_a_calibrated_choice_is_cached_per_recipe(env, monkeypatch):
    """A cached choice is read back only under the recipe it was made with: fewer calibration rows choose again
    into a file of their own, and the record names its recipe."""
    from bpdbench import paths
    from bpdbench.methods import calibrated
    from bpdbench.nets import awq
    m = parse("qdraft:scales=awq")
    env.build(m)
    first = env.resolved[m.label]["scales"]["recipe"]
    folder = paths.cache_root() / "selfdraft" / "scales"
    assert [p.name.endswith(f"-awq-nearest-{first}.pt") for p in folder.glob("*-int4-g32-awq-nearest-*")] == [True]
    monkeypatch.setattr(awq, "ROWS", awq.ROWS // 2)
    for key in [k for k in env.cache if isinstance(k, tuple) and k[:1] == ("calibrated",)]:
        del env.cache[key]
    env.build(m)
    second = env.resolved[m.label]["scales"]["recipe"]
    assert second != first and second == calibrated.recipe()
    assert sorted(p.name[-11:-3] for p in folder.glob("*-int4-g32-awq-nearest-*")) == sorted([first, second])


def test_a_cached_gptq_rounding_reads_back_what_was_chosen(env):
    """The rounding kept on disk (two levels per byte) is the rounding chosen: read back, every level, scale and
    zero is equal."""
    from bpdbench.methods import calibrated
    is_linear = lambda m: isinstance(m, torch.nn.Linear)      # noqa: E731
    for key in [k for k in env.cache if isinstance(k, tuple) and k[:1] == ("calibrated",)]:
        del env.cache[key]
    chosen = calibrated.calibrated(env, 4, 32, "minmax", "gptq", is_linear)
    env.cache.pop(("calibrated", 4, 32, "minmax", "gptq"))
    read = calibrated.calibrated(env, 4, 32, "minmax", "gptq", is_linear)
    assert chosen[1] is not read[1] and chosen[1].keys() == read[1].keys()
    for name, parts in chosen[1].items():
        assert all(torch.equal(a, b) for a, b in zip(parts, read[1][name])), name
    assert chosen[2] == read[2]


def test_quantization_costs_agreement_and_drafts_accept(env):
    """int8 agrees with the target more than int4 (the tune split, teacher-forced), and both drafts accept."""
    got = {}
    for spelling in ("qdraft:bits=8", "qdraft:bits=4"):
        m = parse(spelling)
        d = env.build(m)
        got[spelling] = env.resolved[m.label]["profile"]["agreement"]
        out = generate(env.model, d, list(PROMPTS[0]), LIMITS)
        assert out.counters.accepted > 0, spelling
    assert got["qdraft:bits=8"] > got["qdraft:bits=4"], got


def test_multi_level_drafts_what_int8_drafts(env):
    """levels=2: int4 guesses checked by int8 give the int8 chain exactly, in fewer int8 forwards."""
    from bpdbench.engine import DraftContext
    two, one = parse("qdraft:levels=2,length=6"), parse("qdraft:bits=8,length=6")
    a, b = env.build(two), env.build(one)
    for prompt in PROMPTS:
        a.reset(list(prompt)), b.reset(list(prompt))
        ctx = DraftContext(list(prompt), None, 6)
        assert a.propose(ctx).paths == b.propose(ctx).paths
    assert a.forwards < 6 * len(PROMPTS)


def test_a_draft_on_the_base_cache_accepts_all_of_itself_and_leaves_the_cache_as_verified(env):
    """cache=base at both extremes: the base drafting on its own cache is accepted whole (so the cache it read is the
    verified one, exactly), a random model of the same shape on that cache is accepted almost never, and neither
    changes what the base decodes; the drafter declares what it takes, and a wrapper passes it on."""
    from bpdbench.methods.contract import Input, takes
    from bpdbench.methods.sps import BaseCacheDrafter
    torch.manual_seed(1)
    other = type(env.model)(env.model.config).eval().requires_grad_(False)
    for prompt in PROMPTS:
        ref = generate(env.model, None, list(prompt), LIMITS)
        itself = generate(env.model, BaseCacheDrafter("self", env.model, 4), list(prompt), LIMITS)
        assert itself.tokens == ref.tokens and itself.counters.accepted == itself.counters.drafted > 0
        rand = generate(env.model, BaseCacheDrafter("random", other, 4), list(prompt), LIMITS)
        assert rand.tokens == ref.tokens and rand.counters.accepted <= rand.counters.drafted // 4
    with pytest.raises(ValueError, match="base's KV cache"):
        replay(BaseCacheDrafter("self", env.model, 4), list(PROMPTS[0]), ref.tokens, None, LIMITS)
    assert Input.BASE_CACHE in takes(BaseCacheDrafter("self", env.model, 4))
    method = parse("sam:static=none,fallback=qdraft;cache=base;bits=8")
    assert Input.BASE_CACHE in method.spec.inputs(method)
    sam = env.build(method)
    assert sam.needs_base_cache and Input.BASE_CACHE in takes(sam, method)
    steps: list[tuple[str, int]] = []
    for prompt in PROMPTS:
        out = generate(env.model, sam, list(prompt), LIMITS,
                       on_step=lambda ev: steps.append((sam.source, ev.decision.accepted)))
        assert out.tokens == generate(env.model, None, list(prompt), LIMITS).tokens
    assert sum(a for source, a in steps if source == "fallback") > 0, steps


@pytest.mark.parametrize("spelling,expect", [("qdraft:cache=base,runtime=gguf", "drop runtime=gguf"),
                                             ("qdraft:cache=base,levels=2", "drop levels=2"),
                                             ("qdraft:cache=base,window=8", "drop window="),
                                             ("qdraft:bits=5", "bits must be one of 4, 8"),
                                             ("qdraft:levels=2,bits=4", "levels=2 is int4 drafting for int8"),
                                             ("qdraft:levels=3", "levels must be < 3"),
                                             ("layerskip:skip=0", "skip must be >= 1"),
                                             ("qdraft:runtime=gguf,forward=lean", "drop forward="),
                                             ("layerskip:forward=fast", "forward must be one of"),
                                             ("qdraft:length=auto,stop=0.4", "length=auto sizes a fixed-length"),
                                             ("layerskip:length=auto,stop=0.4", "pass length=N with stop="),
                                             ("qdraft:levels=2,stop=0.4", "drop stop= or levels="),
                                             ("qdraft:rescore=8,forward=transformers", "drop rescore= or forward"),
                                             ("qdraft:runtime=gguf,rescore=8", "drop rescore="),
                                             ("qdraft:rescore=-1", "rescore must be >= 0")])
def test_bad_spellings_are_one_line_errors(spelling, expect):
    assert re.search(expect, parse_error(spelling))


@pytest.mark.parametrize("spelling", ["qdraft:length=3", "layerskip:skip=2,length=3"])
def test_the_lean_forward_drafts_what_the_library_drafts(env, spelling):
    """The default lean forward (nets/lean.py) and transformers' forward of the same draft: recorded as such,
    the same agreement on the tune split, and the same drafts on every prompt (tests/unit/test_lean.py checks the
    logits)."""
    lean, lib = parse(spelling), parse(spelling + ",forward=transformers")
    runs = []
    for m in (lean, lib):
        drafter = env.build(m)
        runs.append([generate(env.model, drafter, list(p), LIMITS).counters.accepted for p in PROMPTS])
    a, b = env.resolved[lean.label], env.resolved[lib.label]
    assert (a["forward"], b["forward"]) == ("lean", "transformers")
    assert abs(a["profile"]["agreement"] - b["profile"]["agreement"]) < 0.02
    assert runs[0] == runs[1]


def test_too_many_skipped_layers_is_refused(env):
    m = parse("layerskip:skip=6")
    with pytest.raises(MethodError, match="pass skip <= 5"):
        env.build(m)


@pytest.mark.parametrize("sharpen,cache,stop,rescore", [(1.0, "own", 0.0, 0), (0.3, "own", 0.0, 0),
                                                        (1.0, "base", 0.0, 0), (0.3, "own", 0.8, 0),
                                                        (1.0, "base", 0.0, 2)])
def test_sampling_with_a_quantized_draft_is_exact_and_a_lossy_rule_fails(sharpen, cache, stop, rescore):
    """T > 0 (tests/unit/test_sampling.py's Markov target): q from the target's int4 copy, sampled and reported in
    full; the first three tokens follow the target (chi-square, false alarm 1e-3); the same drafts accepted
    always fail at p < 1e-6. A sharpened draft (sampled at T x 0.3) is as exact: the rule corrects any q; so is
    the copy drafting on the target's own cache (`cache=base`), and a sharpened one whose drafts end at its first
    sample of q below 0.8 (`stop=0.8`: the length is a function of the draft's own samples; sharpened, so that
    the control still fails where the stop keeps only confident drafts), and one whose top 2 are rescored by the
    target's rows (`rescore=2`: q is the int4 scores with two of them replaced, still a distribution)."""
    from tests.unit.test_sampling import PARAMS, PROMPT, TARGET, exact_joint
    from bpdbench.engine.sampling import SpeculativeSampling
    from bpdbench.methods.sps import BaseCacheDrafter
    from bpdbench.methods.sps import DraftModelDrafter
    from bpdbench.stats import goodness_of_fit
    torch.set_num_threads(1)
    draft = copy.copy(TARGET)
    draft.lm_head = QuantLinear(TARGET.lm_head.weight, None, 4, 110)      # one scale per row: q differs from p
    assert draft.lm_head.group == 110
    if rescore:
        from bpdbench.nets.lean import RescoredHead
        draft.lm_head = RescoredHead(draft.lm_head, TARGET.lm_head.weight, None, rescore)

    def sample(n: int, rule: str, seed: int) -> Counter:
        counts: Counter = Counter()
        d = (DraftModelDrafter if cache == "own" else BaseCacheDrafter)("qdraft", draft, gamma=3, sharpen=sharpen,
                                                                         stop=stop)
        drafted, cut, propose = 0, 0, d.propose

        def counted(ctx):                           # proposals the stop cut short of what the budget allowed
            nonlocal cut
            out = propose(ctx)
            cut += 0 < len(out.paths[0]) < min(3, ctx.budget)
            return out
        d.propose = counted
        for i in range(n):
            with torch.inference_mode():
                gen = generate(TARGET, d, list(PROMPT), Limits(4), SpeculativeSampling(PARAMS, seed + i, rule))
            counts[tuple(gen.tokens[:3])] += 1
            drafted += gen.counters.drafted
        assert drafted >= (n if stop else 2 * n) and (cut > 0) == bool(stop), (drafted, cut)
        return counts
    # (seeds 0..4999 are a 1e-3 event for AR sampling itself on this stub, p = 0.0008: another stream)
    fit = goodness_of_fit(sample(5000, "exact", 10**5), exact_joint())
    assert fit.cells > 30 and fit.p_value > 1e-3, fit
    control = goodness_of_fit(sample(2000, "always-accept", 10**6), exact_joint())
    assert control.p_value < 1e-6, control


def test_runtime_gguf_is_refused_in_one_line_before_the_model_loads(tmp_path):
    """The GGUF draft runs a registered model's own file (tests/slow/test_gguf_draft.py runs it): a local folder,
    or quantization parameters it does not use, are refused when parsed or at preflight."""
    from bpdbench.config import RunConfig
    from bpdbench.methods import MethodError, parse
    from bpdbench.methods.qdraft import _preflight
    with pytest.raises(MethodError, match="registered model"):
        _preflight(parse("qdraft:runtime=gguf"), RunConfig(model=str(tmp_path)))
    with pytest.raises(MethodError, match="drop bits="):
        parse("qdraft:runtime=gguf,bits=8")
    with pytest.raises(MethodError, match="add runtime=gguf"):
        parse("qdraft:quant=q4_0")
    with pytest.raises(MethodError, match="quant"):
        parse("qdraft:runtime=gguf,quant=q3_k")
    assert parse("qdraft:runtime=gguf,quant=q4_0").get("quant") == "q4_0"
    _preflight(parse("qdraft:bits=8"), RunConfig(model=str(tmp_path)))       # the torch runtime: nothing to check

