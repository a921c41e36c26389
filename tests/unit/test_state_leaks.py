"""No state leaks between measurements: `speed` gives every repeat of a prompt the same drafter state, checks itself
with `repeat_drift`, and a drafter that leaks on purpose trips that check; the state a drafter keeps across examples
round-trips through JSON and is put back exactly (engine/state.py), also when `speed --resume` continues a run."""
from __future__ import annotations

import json
import random
import string

import pandas as pd
import pytest
from typer.testing import CliRunner

from bpdbench.cli import app
from bpdbench.engine import DraftContext, EmptyDrafter, Limits, Proposal, generate
from bpdbench.engine.state import keeps_state, restore, snapshot
from bpdbench.experiments import drift
from bpdbench.methods.base import MethodSpec
from bpdbench.methods.recycling import RecyclingDrafter
from bpdbench.methods.spelling import REGISTRY
from tests.conftest import seed_calibration


class LeakyDrafter:
    """Remembers every output it has decoded and drafts it whole when the same prompt comes again; it keeps that
    memory across examples without declaring it (no snapshot/restore), so speed cannot put it back: the first
    decode of a prompt is plain AR, every later one takes about two serial calls."""
    name = "leaky"

    def __init__(self):
        self.seen: dict[tuple[int, ...], list[int]] = {}
        self.prompt: tuple[int, ...] = ()
        self.out: list[int] = []

    def reset(self, prompt_ids: list[int]) -> None:
        self.prompt, self.out = tuple(prompt_ids), []

    def propose(self, ctx: DraftContext) -> Proposal:
        done = len(ctx.tokens) - len(self.prompt)           # tokens decided so far, the base's next one included
        memory = self.seen.get(self.prompt, [])
        return Proposal([memory[done:]]) if memory[done:] else Proposal()

    def observe(self, tokens: list[int]) -> None:
        self.out += tokens
        if len(self.out) > len(self.seen.get(self.prompt, [])):     # a replayed memory is not cut back
            self.seen[self.prompt] = list(self.out)


@pytest.fixture()
def leaky(monkeypatch):
    monkeypatch.setitem(REGISTRY, "leaky", MethodSpec("leaky", "test only: drafts outputs it has seen",
                                                      lambda env, method: LeakyDrafter()))


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch, calibrated_cache):
    """A cache of the test's own, holding the machine's calibration already: what speed measures here is the
    drafters' state, not the calibration's first use (tests/integration/test_speed.py and tests/integration/test_calibration.py test that)."""
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path / "cache"))
    seed_calibration(calibrated_cache, tmp_path / "cache")
    from bpdbench.experiments import speed as speed_module        # a prompt timed beside other work is timed again;
    monkeypatch.setattr(speed_module, "RETIME_BUSY", 0)          # a retry would replay the leak: its own test below


def random_prompts(tmp_path, n: int = 4):
    """Prompts of random characters: the tiny model's outputs for them share few successors, so what recycling
    learns from one output pays on that output's next decode, not on the other prompts' (the leak shows)."""
    rng = random.Random(1)            # none of the first four ends early (an EOS after 2 tokens times nothing)
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"id": f"p{i}", "prompt": "".join(rng.choice(string.ascii_letters + " ")
                                                                            for _ in range(24))}) + "\n"
                            for i in range(n)))
    return path


def speed(model_dir, tmp_path, out, methods: str, *extra, limit: int = 3, repeats: int = 3):
    prompts = random_prompts(tmp_path)
    r = CliRunner().invoke(app, [str(a) for a in (
        "speed", "--task", "prompts", "--data-file", prompts, "--model", model_dir, "--dtype", "float32",
        "--threads", "1", "--methods", methods, "--limit", limit, "--repeats", repeats, "--max-new-tokens", 48,
        "--out", out, *extra)])
    records = ([json.loads(line) for line in (out / "speed.jsonl").read_text().splitlines()]
               if (out / "speed.jsonl").exists() else [])
    return r.exit_code, r.output, records


def test_a_leaking_drafter_trips_the_repeat_check_and_recycling_does_not(tiny_model_dir, tmp_path, leaky):
    out = tmp_path / "speed"
    code, text, records = speed(tiny_model_dir, tmp_path, out, "ar,recycling,leaky")
    assert code == 0, text
    csv = pd.read_csv(out / "speed.csv").set_index("method")
    assert csv.loc["ar", "repeat_drift"] == 1.0
    # the leak: repeats 2..3 of every prompt replay a memorised output in ~2 calls where repeat 1 took 49
    leak = [r for r in records if r["method"] == "leaky"]
    assert all(r["repeat_serial_calls"][1] == r["repeat_serial_calls"][2] <= 3 for r in leak)
    assert csv.loc["leaky", "repeat_drift"] < 0.8, csv.repeat_drift
    assert sum(line.startswith("WARNING: leaky gets faster with repeats") for line in text.splitlines()) == 1
    # recycling: its matrix is put back before every repeat, so every repeat does exactly the same work ...
    rec = [r for r in records if r["method"] == "recycling"]
    assert len(rec) == 3 and all(r["identical"] for r in rec)
    for r in rec:
        assert len(set(r["repeat_serial_calls"])) == 1 and len(set(r["repeat_accepted"])) == 1, r
    assert sum(r["repeat_accepted"][0] for r in rec) > 0        # ... and it did draft from its matrix
    # ... and the warm-up taught it nothing: each prompt saw the state of a run that decoded the prompts before it
    # once, in order, from a cold matrix, which is what replay walks
    r = CliRunner().invoke(app, [str(a) for a in (
        "replay", "--task", "prompts", "--data-file", tmp_path / "prompts.jsonl", "--model", tiny_model_dir,
        "--dtype", "float32", "--methods", "ar,recycling", "--limit", 3, "--max-new-tokens", 48,
        "--out", tmp_path / "replay")])
    assert r.exit_code == 0, r.output
    walked = [json.loads(line) for line in (tmp_path / "replay" / "replay.jsonl").read_text().splitlines()]
    assert [(w["id"], w["recycling"]["serial_calls"]) for w in walked] == [(r["id"], r["serial_calls"]) for r in rec]
    # acceptance per draft position: the first repeat's counters, consistent with its record
    for r in rec:
        assert r["steps"] == r["serial_calls"] - 1 and sum(r["accepted_per_head"]) == r["repeat_accepted"][0]
    positions = csv.loc["recycling", "accept_per_position"].split()
    steps = sum(r["steps"] for r in rec)
    assert float(positions[0]) == pytest.approx(sum(r["accepted_per_head"][0] for r in rec) / steps, abs=1e-3)


def test_without_the_per_repeat_restore_recycling_repeats_do_less_work(tiny_model_dir, tmp_path, monkeypatch):
    """The control: speed timing repeats without putting the state back lets the first repeat teach the second (the
    leak measured on spec_bench), so the checks above can fail."""
    from bpdbench.experiments import speed as speed_module
    plain = speed_module.interleaved
    monkeypatch.setattr(speed_module, "interleaved", lambda fns, repeats, device, before=None, **kw:
                        plain(fns, repeats, device))
    code, text, records = speed(tiny_model_dir, tmp_path, tmp_path / "leak", "ar,recycling", repeats=2, limit=1)
    assert code == 0, text
    calls = next(r["repeat_serial_calls"] for r in records if r["method"] == "recycling")
    assert calls[1] < calls[0], calls


def test_speed_resume_continues_from_the_state_the_uninterrupted_run_had(tiny_model_dir, tmp_path, monkeypatch):
    """A crash after prompt p2's records were written but before the state it hands on was saved: resuming drops
    p2, measures it again from the state p1 left, and every record does the work of the uninterrupted run's."""
    import shutil
    from bpdbench.experiments import speed as speed_module
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert speed(tiny_model_dir, tmp_path, whole, "ar,recycling", repeats=1)[0] == 0
    save = speed_module.CarriedState.save

    def crash(self, visited, recorded):
        if len(visited) == 3:
            raise RuntimeError("killed")
        save(self, visited, recorded)
    with monkeypatch.context() as m:
        m.setattr(speed_module.CarriedState, "save", crash)
        code, _, records = speed(tiny_model_dir, tmp_path, cut, "ar,recycling", repeats=1)
    assert code != 0 and {r["id"] for r in records} == {"p0", "p1", "p2"}
    shutil.copytree(cut, tmp_path / "lost")
    code, text, records = speed(tiny_model_dir, tmp_path, cut, "ar,recycling", "--resume", repeats=1)
    assert code == 0 and "are dropped and measured again" in text and "resuming: 2 prompts" in text, text
    work = lambda rs: sorted((r["id"], r["method"], r["serial_calls"], r["accepted_per_head"]) for r in rs)  # noqa
    assert work(records) == work(speed(tiny_model_dir, tmp_path, whole, "ar,recycling", "--resume",
                                       repeats=1)[2])
    shutil.rmtree(cut)
    shutil.copytree(tmp_path / "lost", cut)                  # the crashed folder again, p2 still to measure and
    lines = (cut / "speed.jsonl").read_text().splitlines()   # no saved state: refused, not measured cold
    (cut / "speed.jsonl").write_text("".join(line + "\n" for line in lines if json.loads(line)["id"] != "p2"))
    (cut / "speed.state.json").unlink()
    code, text, _ = speed(tiny_model_dir, tmp_path, cut, "ar,recycling", "--resume", repeats=1)
    assert code == 2 and any(line.startswith("error: cannot resume") and "keeps state across examples" in line
                             for line in text.splitlines()), text


def test_snapshot_round_trips_through_json_and_is_never_aliased(tiny_model):
    d = RecyclingDrafter("r")
    generate(tiny_model, d, [5, 6, 7, 8, 5, 6], Limits(20))
    state = snapshot(d)
    assert keeps_state(d) and state and d.rows
    rows = {t: list(row) for t, row in d.rows.items()}
    generate(tiny_model, d, [40, 41, 42], Limits(20))
    assert d.rows != rows
    restore(d, json.loads(json.dumps(state)))
    assert d.rows == rows
    restore(d, state)
    d.rows[next(iter(rows))] = [-1]                          # the live matrix learning (feedback replaces rows) ...
    restore(d, state)
    assert d.rows == rows                                    # ... never reaches the snapshot
    assert snapshot(RecyclingDrafter("r", persist=False)) is None and snapshot(EmptyDrafter()) is None
    restore(EmptyDrafter(), state)                          # a drafter without the protocol: nothing happens


def _records(times: dict) -> list[dict]:
    return [{"id": pid, "category": cat, "method": m, "tokens": 10, "serial_calls": 10, "median_s": t[0],
             "spread": 0.0, "identical": True, "first_divergence": None, "certificate": "exact",
             "diverged_tokens": 0, "times": t} for (pid, cat, m), t in times.items()]


def test_repeat_drift_is_the_methods_repeat_ratio_over_ars():
    from bpdbench.experiments.speed import summarize
    times = {("a", "x", "ar"): [1.0, 1.1, 0.9], ("b", "x", "ar"): [2.0, 2.0, 2.0], ("c", "y", "ar"): [1.0, 0.8, 0.8],
             ("a", "x", "m"): [1.0, 0.5, 0.3], ("b", "x", "m"): [2.0, 1.0, 1.0], ("c", "y", "m"): [1.0, 0.8, 0.8]}
    df = summarize(_records(times)).set_index("method")
    # per prompt: ar 1.0, 1.0, 0.8 -> median 1.0; m 0.4, 0.5, 0.8 -> median 0.5
    assert df.loc["ar", "repeat_ratio"] == pytest.approx(1.0) and df.loc["ar", "repeat_drift"] == pytest.approx(1.0)
    assert df.loc["m", "repeat_ratio"] == pytest.approx(0.5) and df.loc["m", "repeat_drift"] == pytest.approx(0.5)
    logs: list[str] = []
    assert drift.warn_drift(df.reset_index(), logs.append) == ["m"] and len(logs) == 1
    by_cat = summarize(_records(times), ("category", "method")).set_index(["category", "method"])
    assert by_cat.loc[("x", "m"), "repeat_drift"] == pytest.approx(0.45 / 1.0)   # against ar of the same category
    assert by_cat.loc[("y", "m"), "repeat_drift"] == pytest.approx(1.0)
    one = summarize(_records({k: v[:1] for k, v in times.items()}))
    assert one.repeat_drift.isna().all() and not drift.warn_drift(one, logs.append)   # repeats < 2: NaN, no warning


def test_the_drift_warning_tells_a_state_leak_from_a_timing_effect():
    """A leak changes what later repeats decide (fewer serial calls); a warm cache or a noisy machine does not."""
    from bpdbench.experiments.speed import summarize
    times = {("a", "x", "ar"): [1.0, 1.0], ("b", "x", "ar"): [2.0, 2.0],
             ("a", "x", "m"): [1.0, 0.5], ("b", "x", "m"): [2.0, 1.0]}
    decided = {"ar": ([10, 10], [0, 0]), "m": ([10, 10], [5, 5])}
    timing = [{**r, "repeat_serial_calls": decided[r["method"]][0], "repeat_accepted": decided[r["method"]][1]}
              for r in _records(times)]
    leak = [{**r, "repeat_serial_calls": [10, 6], "repeat_accepted": [5, 9]} if r["method"] == "m" else r
            for r in timing]
    for records, same, words in ((timing, 1.0, "no drafter state reached its decisions"),
                                 (leak, 0.0, "state kept between repeats")):
        df = summarize(records)
        logs: list[str] = []
        assert drift.warn_drift(df, logs.append) == ["m"] and words in logs[0], logs
        assert df.set_index("method").loc["m", "repeat_same_decisions"] == same


def test_a_prompt_timed_on_a_busy_machine_is_timed_again_from_the_same_state(tiny_model_dir, tmp_path, monkeypatch):
    """The leaderboard is accumulated over sittings: a prompt that another process slowed is timed again (the
    contention meter says busy for the first try of the second prompt here), from the state it started from, so
    recycling's records equal an undisturbed run's and only the retry's meter reading is kept."""
    from bpdbench.experiments import speed as speed_module
    from bpdbench.hardware import contention
    monkeypatch.setattr(speed_module, "RETIME_PAUSE_S", 0.0)
    monkeypatch.setattr(speed_module, "RETIME_BUSY", 2)
    code, text, calm = speed(tiny_model_dir, tmp_path, tmp_path / "calm", "ar,recycling", repeats=2)
    assert code == 0, text
    readings = iter([0.0, 1.5] + [0.0] * 10)          # prompt 1: idle; prompt 2: busy, then idle
    from types import SimpleNamespace

    from bpdbench.hardware import timing              # the per-call meter keeps the real one (this is the prompt's)
    monkeypatch.setattr(timing, "contention", SimpleNamespace(Meter=contention.Meter, is_busy=contention.is_busy,
                                                              describe=contention.describe))

    class Meter(contention.Meter):
        def __exit__(self, *exc):
            super().__exit__(*exc)
            self.others_cores = next(readings)
    monkeypatch.setattr(contention, "Meter", Meter)
    code, text, busy = speed(tiny_model_dir, tmp_path, tmp_path / "busy", "ar,recycling", repeats=2)
    assert code == 0, text
    assert sum("timing it again (1/2)" in line for line in text.splitlines()) == 1, text
    work = lambda rs: [(r["id"], r["method"], r["repeat_serial_calls"], r.get("repeat_accepted")) for r in rs]  # noqa
    assert work(busy) == work(calm)
    assert all(r["others_cores"] == 0.0 for r in busy)


def test_a_speed_run_is_never_resumed_on_another_machine_or_commit(tiny_model_dir, tmp_path):
    """Timings belong to a machine and to the code that made them: a folder begun elsewhere (another fingerprint)
    or by another commit is refused in one line, not silently extended."""
    out = tmp_path / "speed"
    code, text, _ = speed(tiny_model_dir, tmp_path, out, "ar,pld", limit=1, repeats=1)
    assert code == 0, text
    config = json.loads((out / "config.json").read_text())
    for field, value in (("fingerprint", "0123456789ab"), ("git_commit", "0" * 40)):
        changed = json.loads(json.dumps(config))
        changed["environment"][field] = value
        (out / "config.json").write_text(json.dumps(changed))
        code, text, _ = speed(tiny_model_dir, tmp_path, out, "ar,pld", "--resume", limit=1, repeats=1)
        assert code != 0 and f"differs in environment.{field}" in text, text
    (out / "config.json").write_text(json.dumps(config))
    code, text, records = speed(tiny_model_dir, tmp_path, out, "ar,pld", "--resume", limit=1, repeats=1)
    assert code == 0 and "resuming: 1 prompts already measured" in text and len(records) == 2, text


def test_the_interleaved_order_rotates_each_round():
    """Each method's place in the round moves: in a fixed order ar always ran first, right after the peers."""
    from bpdbench.experiments.timing import interleaved
    order: list[str] = []
    runs = interleaved({m: (lambda m=m: order.append(m) or m) for m in "abcdef"}, 3)
    assert order == list("abcdef") + list("cdefab") + list("efabcd")
    assert {m: [out for _, out in rs] for m, rs in runs.items()} == {m: [m] * 3 for m in "abcdef"}


def test_a_seeded_order_is_random_per_round_and_reproducible():
    """`speed` seeds each prompt's rounds: every method gets every place alike over a board (no method always
    first, or always right after the peers), and the same seed gives the same order again."""
    from bpdbench.experiments.timing import interleaved

    def orders(seed: int) -> list[list[str]]:
        order: list[str] = []
        interleaved({m: (lambda m=m: order.append(m) or m) for m in "abcdefghij"}, 2, order_seed=seed)
        return [order[:10], order[10:]]
    assert orders(3) == orders(3) and orders(3) != orders(4)
    assert all(sorted(o) == list("abcdefghij") for o in orders(3))
    firsts = [o[0] for seed in range(200) for o in orders(seed)]
    assert all(20 <= firsts.count(m) <= 60 for m in "abcdefghij")      # 40 expected each
    after_j = [o[o.index("j") + 1] for seed in range(200) for o in orders(seed) if o[-1] != "j"]
    assert after_j.count("a") < len(after_j) / 4                       # the control: a rotation puts a after j


def test_a_call_timed_on_a_busy_machine_is_timed_again_from_the_same_state(monkeypatch):
    """One busy call (a test run beside the first round made ar's first repeat 54.5 s against 13.5 s while the
    prompt's meter, averaged over half an hour, stayed under its threshold) is timed again, after `before` puts the
    state back; a call still busy after the last try is kept. The control: without retimes it is kept at once."""
    from bpdbench.hardware import timing

    readings: list[float] = []

    class Meter:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.others_cores = readings.pop(0) if readings else 0.0
            return False
    monkeypatch.setattr(timing.contention, "Meter", Meter)
    calls, befores, lines = [], [], []
    fns = {m: (lambda m=m: calls.append(m) or m) for m in "ab"}
    readings[:] = [0.0, 0.9, 0.0]                    # round 1: a idle, b busy, then b again idle
    runs = timing.interleaved(fns, 1, before=befores.append, retimes=2, pause_s=0, log=lines.append)
    assert calls == ["a", "b", "b"] and befores == ["a", "b", "b"] and [len(r) for r in runs.values()] == [1, 1]
    assert len(lines) == 1 and lines[0].startswith("b: timed while other processes kept 0.90 cores busy")
    calls.clear()
    readings[:] = [0.9, 0.9, 0.9]                    # busy on every try: kept after the last
    timing.interleaved({"a": fns["a"]}, 1, retimes=2, pause_s=0)
    assert calls == ["a", "a", "a"]
    calls.clear()
    readings[:] = [0.9]
    timing.interleaved({"a": fns["a"]}, 1, pause_s=0)   # the control: no retimes, the busy call is kept
    assert calls == ["a"]
