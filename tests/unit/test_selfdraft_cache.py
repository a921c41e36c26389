"""A self-draft's measured cost is cached only when nothing ran beside its timing: a busy reading is taken again,
kept out of the cache when it stays busy, and a cached reading from before the meter is measured again.

Why: a profile timed under load (1617 ms for a 142 ms step) made a 4-bit draft look as dear as the target, and
every later run on the machine read it from the cache."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from bpdbench.methods import selfdraft


class FakeMeter:
    """Reports the next reading of `readings` as the cores other processes kept busy."""
    readings: list[float] = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.others_cores = FakeMeter.readings.pop(0)
        return False


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path))
    monkeypatch.setattr(selfdraft.contention, "Meter", FakeMeter)
    monkeypatch.setattr(selfdraft, "PAUSE_S", 0.0)
    lines: list[str] = []
    return SimpleNamespace(cfg=SimpleNamespace(model="m", dtype="float32", task="t", threads=1), log=lines.append,
                           lines=lines)


def _measure(calls: list):
    def measure() -> dict:
        calls.append(1)
        return {"draft_ms": 10.0 * len(calls)}
    return measure


def test_a_busy_reading_is_taken_again_and_the_idle_one_cached(env):
    FakeMeter.readings = [1.0, 0.05]
    calls: list = []
    out = selfdraft.cached(env, "k", "profile", _measure(calls))
    assert len(calls) == 2 and out["others_cores"] == 0.05 and out["draft_ms"] == 20.0
    assert selfdraft.cached(env, "k", "profile", _measure(calls)) == out and len(calls) == 2   # from the cache


def test_a_reading_that_stays_busy_is_used_but_not_cached(env):
    FakeMeter.readings = [0.9, 0.9, 0.9]
    calls: list = []
    out = selfdraft.cached(env, "k", "profile", _measure(calls))
    assert len(calls) == 3 and out["others_cores"] == 0.9
    assert any("not cached" in line for line in env.lines)
    FakeMeter.readings = [0.0]
    assert selfdraft.cached(env, "k", "profile", _measure(calls))["others_cores"] == 0.0 and len(calls) == 4


def test_a_cached_reading_from_before_the_meter_is_measured_again(env, tmp_path):
    FakeMeter.readings = [0.0]
    calls: list = []
    selfdraft.cached(env, "k", "profile", _measure(calls))
    (path,) = tmp_path.rglob("*-k.json")
    path.write_text(json.dumps({"draft_ms": 1466.85, "cost_steps": 0.908}))     # no others_cores: unchecked
    FakeMeter.readings = [0.0]
    assert selfdraft.cached(env, "k", "profile", _measure(calls))["draft_ms"] == 20.0 and len(calls) == 2


def test_an_untimed_measurement_is_kept_as_it_is(env, tmp_path):
    FakeMeter.readings = [1.0]
    calls: list = []
    out = selfdraft.cached(env, "k", "calibration", _measure(calls), timed=False)
    assert len(calls) == 1 and "others_cores" not in out
    assert selfdraft.cached(env, "k", "calibration", _measure(calls), timed=False) == out and len(calls) == 1


def test_a_lean_draft_s_profile_is_keyed_by_its_forward_code(monkeypatch):
    """A lean draft's cost follows its forward's code: the key names that code, so a cached profile from other code
    is never read (an unchanged key kept the int4 cost measured before the one-token path, 7% dearer)."""
    import inspect

    from transformers import Qwen2Config, Qwen2ForCausalLM

    from bpdbench.nets import lean
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2)).eval()
    draft = lean.LeanDecoder(model)
    tag = selfdraft.code_tag(draft)
    assert tag.startswith("-") and len(tag) == 9 and selfdraft.code_tag(model) == ""
    source = inspect.getsource(lean)
    with monkeypatch.context() as m:           # words only: a docstring and a comment changed
        m.setattr(inspect, "getsource", lambda mod: source.replace('"""A lean forward', '"""The lean forward', 1)
                  + "\n# a comment\n")
        assert selfdraft.code_tag(draft) == tag
    monkeypatch.setattr(inspect, "getsource", lambda mod: source + "\nCHANGED = 1\n")
    assert selfdraft.code_tag(draft) not in ("", tag)
