"""`--dtype auto` decides from what the machine does: faked fingerprints with and without bfloat16 units, and the
probe's measured ratio, so the rule is checked on either kind of CPU."""
from __future__ import annotations

import json

import pytest

from bpdbench.config import ConfigError, RunConfig
from bpdbench.hardware import dtype as auto
from bpdbench.hardware.fingerprint import Fingerprint, cpu_flags


def fingerprint(*flags: str, gpu: str | None = None, cap: str | None = None) -> Fingerprint:
    return Fingerprint("Test CPU", tuple(flags), 2, 2, "2.13.0", "5.23.0", "x86_64", gpu, cap)


AVX2 = fingerprint("avx2", "fma")
BF16 = fingerprint("avx2", "fma", "avx512f", "avx512_bf16")


def test_flags_are_read_from_cpuinfo():
    info = "processor: 0\nmodel name: X\nflags : fpu sse avx2 fma avx512f avx512_bf16 amx_tile\n"
    assert cpu_flags(info) == ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile")
    assert cpu_flags("model name: Y\n") == ()


def test_avx2_only_cpu_gets_float32_when_bf16_is_slower():
    choice = auto.decide(AVX2, ratio=3.4)
    assert choice.dtype == "float32" and "emulated" in choice.reason and "3.4x" in choice.reason


def test_bf16_cpu_gets_bfloat16():
    choice = auto.decide(BF16, ratio=0.55)
    assert choice.dtype == "bfloat16" and "avx512_bf16" in choice.reason
    assert auto.decide(BF16, ratio=1.2).dtype == "bfloat16"      # native units: within noise of fp32 still wins
    assert auto.decide(AVX2, ratio=1.2).dtype == "float32"       # emulated: must be clearly faster to be chosen
    faster = auto.decide(AVX2, ratio=0.7)                         # half the bytes of weights can win unaided
    assert faster.dtype == "bfloat16" and "emulated but faster" in faster.reason and "native" not in faster.reason


def test_flags_decide_without_a_probe_and_gpus_by_capability():
    assert auto.decide(AVX2, None).dtype == "float32"
    assert auto.decide(BF16, None).dtype == "bfloat16"
    assert auto.decide(fingerprint(gpu="NVIDIA H100", cap="9.0"), None).dtype == "bfloat16"
    assert auto.decide(fingerprint(gpu="Tesla T4", cap="7.5"), None).dtype == "float32"


def test_fingerprint_key_changes_with_flags_and_threads():
    assert AVX2.key() != BF16.key()
    assert AVX2.key() != fingerprint("avx2", "fma").__class__(**{**AVX2.__dict__, "threads": 1}).key()
    assert AVX2.key() == fingerprint("avx2", "fma").key()


@pytest.mark.parametrize("fp, ratio, want", [(AVX2, 3.0, "float32"), (BF16, 0.6, "bfloat16")])
def test_run_config_resolves_auto_once_and_caches_per_fingerprint(fp, ratio, want, monkeypatch, tmp_path):
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path))
    monkeypatch.setattr(auto, "current", lambda threads=None, device="cpu": fp)
    probes = []
    monkeypatch.setattr(auto, "probe", lambda: probes.append(1) or ratio)
    said = []
    monkeypatch.setattr(auto, "_SAID", set())
    assert auto.resolve("auto", "cpu", log=said.append) == want
    assert auto.resolve("auto", "cpu", log=said.append) == want
    assert len(probes) == 1 and len(said) == 1 and said[0].startswith(f"dtype auto -> {want}: ")
    assert not (tmp_path / "calibration").exists()     # nothing written before a model loads
    auto.persist()
    cached = json.loads((tmp_path / "calibration" / fp.key() / "dtype.json").read_text())
    assert cached["dtype"] == want
    cfg = RunConfig(task="xsum")
    assert cfg.dtype == "auto" and cfg.validate().dtype == want
    assert RunConfig(task="xsum", dtype="float32").validate().dtype == "float32"   # explicit stays explicit


def test_unknown_dtype_is_one_line():
    with pytest.raises(ConfigError, match="unknown dtype 'fp8'; valid: auto, float32"):
        RunConfig(dtype="fp8").validate()
