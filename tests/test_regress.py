"""Regression comparison logic: block efficiency tolerance, losslessness, wide speedup band."""
from __future__ import annotations

from bpdbench.experiments.regress import compare

BASE = {"tolerance": {"block_efficiency_abs": 0.05, "speedup_factor": 3.0},
        "results": {"xsum/bpd": {"block_efficiency": 1.30, "lossless_rate": 1.0, "speedup_vs_ar": 1.2}}}


def run(be=1.30, lossless=1.0, speedup=1.2):
    return {"xsum/bpd": {"block_efficiency": be, "lossless_rate": lossless, "speedup_vs_ar": speedup}}


def test_identical_numbers_pass():
    assert compare(BASE, run()) == []


def test_block_efficiency_drift_fails():
    (msg,) = compare(BASE, run(be=1.24))
    assert "block efficiency 1.2400 vs baseline 1.3000" in msg
    assert compare(BASE, run(be=1.34)) == []


def test_lost_tokens_fail():
    assert any("lossless_rate" in f for f in compare(BASE, run(lossless=0.5)))


def test_speedup_band_is_wide_but_finite():
    assert compare(BASE, run(speedup=0.5)) == []
    assert any("speedup" in f for f in compare(BASE, run(speedup=0.3)))


def test_missing_entry_fails():
    assert compare(BASE, {}) == ["xsum/bpd: missing from the current run"]


def test_unmeasured_speedup_is_skipped_not_failed():
    """A cached greedy reference leaves the speedup unmeasured (NaN or None) on either side: not a regression."""
    nan_base = {**BASE, "results": {"xsum/bpd": {**BASE["results"]["xsum/bpd"], "speedup_vs_ar": float("nan")}}}
    assert compare(nan_base, run(speedup=0.1)) == []
    assert compare(BASE, run(speedup=float("nan"))) == []
    assert compare(BASE, run(speedup=None)) == []
