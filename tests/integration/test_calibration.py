"""Calibration: cost interpolation on a hand-made curve, measuring on the tiny model, the cache, `calibrate`."""
from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from bpdbench import paths
from bpdbench.cli import app
from bpdbench.hardware import calibration as lib
from bpdbench.hardware.calibration import Calibration


def hand_made() -> Calibration:
    chain = {128: {1: 1.0, 2: 1.2, 4: 1.4, 8: 2.0}, 512: {1: 1.0, 2: 1.4, 4: 1.8, 8: 3.0}}
    tree = {128: {4: 1.6, 8: 2.4}, 512: {4: 2.0, 8: 3.4}}
    return Calibration(model="m", dtype="float32", device="cpu", threads=2, fingerprint={"key": "abc"},
                       step_ms=40.0, contexts=[128, 512], chain=chain, tree=tree, prefill_tok_per_s=100.0,
                       step_ms_by_context={128: 20.0, 512: 40.0}, head={1: 0.05, 8: 0.15, 64: 1.0})


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path / "cache"))


def test_cost_interpolates_and_extrapolates():
    cal = hand_made()
    assert cal.middle == 512
    assert cal.cost(1) == 1.0 and cal.cost(1, context=128) == 1.0
    assert cal.cost(8) == pytest.approx(3.0)                      # default: the middle context
    assert cal.cost(6, context=128) == pytest.approx(1.7)         # halfway between 4 and 8
    assert cal.cost(16, context=128) == pytest.approx(3.2)        # slope of 4 -> 8 continued
    assert cal.cost(4, context=320) == pytest.approx(1.6)         # halfway in context
    assert cal.cost(4, context=10_000) == pytest.approx(1.8)      # clamped to the largest context
    assert cal.cost(4, context=1) == pytest.approx(1.4)
    assert cal.cost(2, tree=True) == pytest.approx(1 + (2.0 - 1) / 3)   # from the root alone (1.0) to tree 4
    assert cal.cost(8, tree=True, context=128) == pytest.approx(2.4)
    assert cal.seconds_for(8) == pytest.approx(0.040 * 3.0)
    assert cal.seconds_for(8, context=128) == pytest.approx(0.020 * 2.0)
    assert cal.break_even(8, draft_ms=4.0) == pytest.approx(3.1)
    assert cal.break_even(8, tree=True) == pytest.approx(3.4)


def test_tree_shape_is_medusa_like():
    assert lib.tree_parents(8) == [-1, 0, 0, 0, 0, 1, 1, 2]
    parents = lib.tree_parents(64)
    assert len(parents) == 64 and parents.count(0) == 4
    from bpdbench.engine.tree import build_tree
    tree = build_tree(0, lib.tree_drafts(64, list(range(100, 164))))
    assert len(tree.tokens) == 64 and not tree.is_chain
    assert sorted(tree.depths) == sorted(_depths(parents))


def _depths(parents):
    d = []
    for p in parents:
        d.append(0 if p < 0 else d[p] + 1)
    return d


def test_measure_on_tiny_model_and_cache_round_trip(tiny_model, monkeypatch):
    monkeypatch.setenv("BPDBENCH_LINEAR", "torch")       # the tiny model runs torch's kernels (not loaded by us)
    cal = lib.measure(tiny_model, "tiny", "float32", "cpu", 1, ns=(1, 2, 4, 8), contexts=(16, 32),
                      tree_ns=(4, 8), repeats=2, log=lambda _: None)
    assert cal.contexts == [16, 32] and cal.step_ms > 0 and cal.prefill_tok_per_s > 0
    for ctx in cal.contexts:
        assert cal.cost(1, context=ctx) == 1.0
        assert set(cal.chain[ctx]) == {1, 2, 4, 8} and set(cal.tree[ctx]) == {4, 8}
        for row in (cal.chain[ctx], cal.tree[ctx]):
            assert all(math.isfinite(v) and v > 0 for v in row.values())
    assert set(cal.head) == set(lib.HEAD_ROWS) and all(v > 0 for v in cal.head.values())
    assert lib.cached("tiny", "float32", "cpu", 1) is None
    path = lib.save(cal)
    assert path == lib.cache_path("tiny", "float32", "cpu", 1)
    assert path.name == f"tiny-float32-cpu-v{lib.VERSION}.json"      # an older recipe's curve sits beside it
    back = lib.cached("tiny", "float32", "cpu", 1)
    assert back == cal
    lib.record_drafting(back, "bpd", 3.5)
    assert lib.cached("tiny", "float32", "cpu", 1).drafting_ms == {"bpd": 3.5}
    assert lib.meta("tiny", "float32", "cpu", 1)["cost16"] == pytest.approx(cal.cost(16))
    assert lib.meta("tiny", "float32", "cpu", 2) is None           # threads are in the key
    said = []
    assert lib.ensure("tiny", "float32", "cpu", 1, log=said.append) == back and not said   # cached: no measuring


@pytest.mark.serial        # a curve timed beside another worker is busy, so the second call measures it again
def test_calibrate_show_writes_png_and_json(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(lib, "CONTEXTS", (16, 48))
    monkeypatch.setattr(lib, "NS", (1, 2, 4, 8))
    monkeypatch.setattr(lib, "TREE_NS", (4, 8))
    out = tmp_path / "cal"
    result = CliRunner().invoke(app, ["calibrate", "--model", str(tiny_model_dir), "--dtype", "float32",
                                      "--threads", "1", "--show", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "calibrating" in result.output and "chain @16" in result.output
    (png,) = out.glob("*.png")
    (js,) = out.glob("*.json")
    assert png.stat().st_size > 1000
    cal = Calibration.from_dict(json.loads(js.read_text()))
    assert cal.contexts == [16, 48] and cal.cost(1) == 1.0
    again = CliRunner().invoke(app, ["calibrate", "--model", str(tiny_model_dir), "--dtype", "float32",
                                     "--threads", "1"])
    assert again.exit_code == 0 and "calibrating" not in again.output     # cached


@pytest.mark.parametrize("args, word", [(["--dtype", "float8"], "dtype"),
                                        (["--model", "nope", "--dtype", "float32"], "model"),
                                        (["--device", "tpu", "--dtype", "float32"], "device")])
def test_calibrate_bad_input_is_one_line(args, word, monkeypatch):
    def no_load(*a, **k):
        raise AssertionError("model loaded")
    monkeypatch.setattr("bpdbench.models.load", no_load)
    result = CliRunner().invoke(app, ["calibrate", *args])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and word in lines[0]


def test_results_record_the_cached_calibration(tiny_model_dir, tmp_path):
    from tests.conftest import write_prompts
    prompts = write_prompts(tmp_path, 2)

    def run(out):
        result = CliRunner().invoke(app, ["run", "--task", "prompts", "--data-file", str(prompts), "--model",
                                          str(tiny_model_dir), "--method", "ar", "--limit", "1", "--max-new-tokens",
                                          "4", "--dtype", "float32", "--threads", "1", "--out", str(out)])
        assert result.exit_code == 0, result.output
        return json.loads((out / "config.json").read_text())["calibration"]

    assert run(tmp_path / "a") is None                               # never measured from a result
    cal = hand_made()
    cal.model, cal.threads = str(tiny_model_dir), 1
    from bpdbench.hardware import kernels
    cal.linear = kernels.choose("float32", "cpu", 1).backend          # what the run's model loads with
    path = lib.save(cal)
    from bpdbench.store import seal                                   # the curve by its key and content hash
    assert run(tmp_path / "b") == {"file": f"{paths.portable(path)}#sha256={seal.content_hash(path)[:16]}", "key": "abc",
                                   "step_ms": 40.0, "cost16": cal.cost(16), "measured_at": "", "others_cores": None}


def test_costs_divide_by_the_step_of_their_own_round():
    from bpdbench.hardware.forward_timing import ONE, costs
    rounds = [{ONE: [1.0, 1.0, 1.0], ("chain", 4): [2.0]}, {ONE: [3.0, 3.0, 3.0], ("chain", 4): [6.0]},
              {ONE: [1.0, 1.0, 1.0], ("chain", 4): [2.0], ("chain", 64): [9.0]}]   # load tripled in round 2
    step, cost = costs(rounds)
    assert step == 1.0 and cost[ONE] == 1.0
    assert cost[("chain", 4)] == 2.0 and cost[("chain", 64)] == 9.0


def test_the_cost_curve_is_read_through_its_monotone_fit():
    from bpdbench.hardware.calibration import monotone
    raw = {1: 1.0, 2: 0.77, 3: 0.88, 4: 0.91, 8: 1.13, 24: 2.68, 32: 5.86, 48: 3.48, 64: 4.53}
    fit = monotone(raw)
    xs = sorted(fit)
    assert all(fit[a] <= fit[b] + 1e-12 for a, b in zip(xs, xs[1:]))       # never cheaper with more tokens
    assert fit[2] == 1.0 and fit[8] == 1.13 and fit[24] == 2.68             # a dip floors at one step
    assert 3.48 < fit[48] < 5.86 and fit[32] == fit[48] == fit[64]          # a spike is pooled with what follows
    ok = {1: 1.0, 8: 1.2, 16: 1.5, 64: 4.0}
    assert monotone(ok) == ok                                               # a clean curve is unchanged


def test_a_fast_machine_spends_its_calibration_time_on_more_rounds():
    from bpdbench.hardware.calibration import LONG_ROUNDS_MIN, MAX_REPEATS, REPEATS, plan_repeats
    assert plan_repeats(200.0) == (REPEATS, LONG_ROUNDS_MIN)  # a slow machine: what it needs anyway
    assert plan_repeats(90.0) == (5, LONG_ROUNDS_MIN)         # 150 s / 90 s x 3 rounds; long shapes never once
    assert plan_repeats(0.5) == (MAX_REPEATS, MAX_REPEATS // 3)


def test_a_lazily_projected_tree_costs_the_full_tree_less_the_rows_it_skips(tmp_path):
    """A wide tree's greedy verify projects only its inner nodes: the calibrated full-tree cost less the measured
    projection of the skipped rows; a calibration cached before the projection was measured is measured again."""
    cal = hand_made()
    full = cal.cost(8, tree=True)
    assert cal.cost(8, tree=True, rows=8) == full and cal.cost(8, tree=True, rows=None) == full
    assert cal.cost(8, tree=True, rows=1) == pytest.approx(full - 0.15 + 0.05)
    assert cal.cost(8, tree=True, rows=4) == pytest.approx(full - 0.15 + 0.05 + 3 / 7 * 0.10)
    lib.save(cal, lib.cache_path("m", "float32", "cpu", 2))
    assert lib.cached("m", "float32", "cpu", 2) == cal
    old = Calibration.from_dict({**cal.to_dict(), "head": {}})
    lib.save(old, lib.cache_path("m", "float32", "cpu", 2))
    assert lib.cached("m", "float32", "cpu", 2) is None
    noisy = Calibration.from_dict({**cal.to_dict(), "version": 1})     # its projection timed size after size
    lib.save(noisy, lib.cache_path("m", "float32", "cpu", 2))
    assert noisy.version == 1 and lib.cached("m", "float32", "cpu", 2) is None


def test_a_calibration_measured_beside_other_work_is_measured_again(monkeypatch):
    """A curve timed while another process kept a core busy has a slower step and a flatter curve than the
    machine's own; every prediction and `auto` size would read it, so the next use measures it again, once."""
    from dataclasses import replace
    idle, busy = replace(hand_made(), others_cores=0.05), replace(hand_made(), others_cores=0.9)
    assert busy.busy and not idle.busy and not hand_made().busy        # older files (no meter): trusted
    assert Calibration.from_dict(json.loads(json.dumps(busy.to_dict()))).others_cores == 0.9
    measured = []
    monkeypatch.setattr(lib, "estimate_seconds", lambda *a, **k: 1.0)
    monkeypatch.setattr(lib, "measure", lambda *a, **k: measured.append(1) or idle)
    monkeypatch.setattr(lib, "cached", lambda *a: busy)
    said = []
    assert lib.ensure("m", "float32", "cpu", 2, model=object(), log=said.append) is idle and measured == [1]
    assert any("measured while other processes kept 0.90 cores busy" in s for s in said)
    monkeypatch.setattr(lib, "cached", lambda *a: idle)
    assert lib.ensure("m", "float32", "cpu", 2, model=object(), log=said.append) is idle and measured == [1]


@pytest.mark.serial
def test_the_contention_meter_sees_another_busy_process():
    import subprocess
    import sys
    import time

    from bpdbench.hardware.contention import Meter, is_busy
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)                                       # the child is running before the interval starts
        with Meter() as m:
            time.sleep(1.5)
    finally:
        spin.kill()
    if math.isnan(m.others_cores):
        pytest.skip("no /proc/stat here")
    assert m.others_cores > 0.6 and is_busy(m.others_cores)
    with Meter() as mine:                                   # our own work is not counted as others'
        t = time.process_time()
        while time.process_time() - t < 1.0:
            pass
    assert mine.others_cores < m.others_cores - 0.5


def test_the_row_blocking_edge_keeps_auto_off_the_trees_just_past_it():
    """On an Intel Xeon with AMX (bfloat16, 2 threads) a forward over 17-64 tokens costs 1.6-1.8 steps and one over
    16 about 1.3. The curve this machine had (16, 32 and 64 nodes measured, interpolated between) made 17-31 nodes
    look cheap, and `auto` chose such trees (hydra:tree=auto verified 16.6 tokens a step, predicted 1.63x, measured
    1.23x). With the edge measured, the best tree stays within 16 scored tokens; the control, the old curve, picks
    one past the edge."""
    from bpdbench.hardware.shapes import best_tree

    def curve(tree: dict) -> Calibration:
        return Calibration(model="m", dtype="bfloat16", device="cpu", threads=2, fingerprint={"key": "abc"},
                           step_ms=65.0, contexts=[512], chain={512: {1: 1.0, 16: 1.13, 17: 1.5, 64: 1.8}},
                           tree={512: tree}, prefill_tok_per_s=500.0)
    old = curve({4: 1.19, 8: 1.18, 16: 1.29, 32: 1.43, 64: 1.76})        # this machine's, measured at 01:37
    edge = curve({4: 1.19, 8: 1.18, 12: 1.2, 16: 1.29, 17: 1.62, 20: 1.7, 24: 1.68, 32: 1.66, 48: 1.7, 64: 1.8})
    assert 17 in lib.TREE_NS and 16 in lib.TREE_NS and 17 in lib.NS
    p = [[0.5, 0.2, 0.1, 0.05], [0.5, 0.2, 0.1], [0.5, 0.2], [0.4, 0.1], [0.4]]
    assert best_tree(p, edge).params["nodes"] + 1 <= 16
    assert 17 <= best_tree(p, old).params["nodes"] + 1 <= 32
