"""The one fit loop on each device a session has (`--device cuda`, `make gpu-train`): every objective's batch crosses
from the CPU, where the data stays, to where the model runs, and the weights come back as the CPU's artefact.

Why a test of its own: CI has CPUs only, so nothing else would notice a host tensor meeting a device tensor in a
batch, the loss or the held-out agreement. `make gpu-check` runs it with BPDBENCH_TEST_DEVICES=cpu,cuda; elsewhere
it runs on the CPU, where it also holds that naming the CPU changes nothing."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from bpdbench.nets.checkpoint import load
from bpdbench.train import distill, heads, network
from bpdbench.train.fit import FitConfig, check_clock, on_device
from tests.drafter_fixtures import tiny_prefill
from tests.unit.test_device import DEVICES
from tests.unit.test_drafters import tiny  # noqa: F401 (the trained tiny drafters, one fixture)

# one network per objective (train/objectives.OBJECTIVES): positional, unrolled over chosen layers, prefix
OBJECTIVE_NETWORKS = ("hydra", "eagle3", "hydra++")
STEPS = 6


def _profile(name: str):
    data = tiny_prefill() if name == "eagle3" else replace(distill.BUDGETS["ci"], n_prompts=24, gen_tokens=24)
    return replace(network.PROFILES["ci"], steps=STEPS, data=data)


def _skip_missing(device: str) -> None:
    if device.startswith("cuda") and not torch.cuda.is_available():
        pytest.skip(f"{device}: torch {torch.__version__} sees no CUDA device")


@pytest.mark.parametrize("device", DEVICES)
def test_each_objective_fits_on_the_device_and_saves_the_cpus_artefact(device, tiny, tmp_path, monkeypatch):
    _skip_missing(device)
    model, tok, name, cache, _ = tiny
    monkeypatch.setenv("BPDBENCH_CACHE", str(cache))
    embed, lm = model.model.embed_tokens.weight, model.lm_head.weight
    for net in OBJECTIVE_NETWORKS:
        path = network.train(net, _profile(net), name, model, tok, log=lambda m: None, out=tmp_path / net,
                             device=device)
        report = json.loads((path / "report.json").read_text())
        assert report["fit_config"]["device"] == device and report["environment"]["device"] == device, net
        assert report["fit"]["steps"] == STEPS and report["heldout"]["positions"] > 0, net
        assert all(v == v for v in report["fit"]["final"].values()), (net, report["fit"]["final"])   # no NaN
        loaded, _ = load(path, embed, lm)
        assert {p.device.type for p in loaded.parameters()} == {"cpu"}, net
        if device == "cpu":       # naming the CPU is the default path: the same weights, bit for bit
            again = network.train(net, _profile(net), name, model, tok, log=lambda m: None,
                                  out=tmp_path / f"{net}-default")
            assert json.loads((again / "report.json").read_text())["heldout"] == report["heldout"], net
            default, _ = load(again, embed, lm)
            assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(),
                                                         default.state_dict().values())), net


@pytest.mark.parametrize("device", DEVICES)
def test_the_heads_fit_on_the_device_and_come_back_on_the_cpu(device, tiny, monkeypatch):
    _skip_missing(device)
    model, _, name, cache, _ = tiny
    monkeypatch.setenv("BPDBENCH_CACHE", str(cache))
    ds = distill.load(distill.path_for(name, "ci"))
    p = replace(heads.PROFILES["ci"], steps=STEPS, num_heads=3, shortlist=64)
    seqs = ds.split(held_out=False)
    lm_w = model.lm_head.weight.detach().float()
    w, b, stats = heads.fit(lm_w, ds, seqs, ds.shortlist(64), p, lambda m: None, device)
    assert w.device.type == b.device.type == "cpu" and w.shape[0] == 3 and stats["steps"] == STEPS
    assert torch.isfinite(w).all() and w.abs().sum() > 0          # it moved off Medusa's zero init
    if device == "cpu":
        w0, b0, _ = heads.fit(lm_w, ds, seqs, ds.shortlist(64), p, lambda m: None)
        assert torch.equal(w, w0) and torch.equal(b, b0)


def test_an_accelerators_fit_counts_wall_seconds():
    check_clock(FitConfig(8400.0, 0, 1e-3, 4))                              # the CPU's core-seconds
    check_clock(FitConfig(100.0, 0, 1e-3, 4, clock="wall", device="cuda"))
    check_clock(FitConfig(None, 12, 1e-3, 4, device="cuda"))                 # steps count on any device
    with pytest.raises(ValueError, match="counts wall seconds") as e:
        check_clock(FitConfig(8400.0, 0, 1e-3, 4, device="cuda"))
    assert "\n" not in str(e.value)
    bench = network.PROFILES["bench"]
    assert bench.device_seconds and bench.device_seconds * 4 <= 480        # four fits leave the data its minutes
    assert heads.PROFILES["bench"].device_seconds == bench.device_seconds   # compared at one budget, as on the CPU
    cfg = network.fit_config(bench, network.networks.get("eagle3").defaults, 0.0, "cpu")
    assert (cfg.seconds, cfg.clock, cfg.device) == (bench.cpu_seconds, "cpu", "cpu")
    # one rule moves any recipe to an accelerator (network.fit_config and heads.fit both call it)
    moved = on_device(FitConfig(8400.0, 0, 1e-3, 4, bf16=False), "cuda", 100.0)
    assert (moved.seconds, moved.clock, moved.bf16, moved.device) == (100.0, "wall", True, "cuda")
    check_clock(moved)
    assert on_device(FitConfig(None, 12, 1e-3, 4), "cuda", 100.0).seconds is None   # counted steps stay counted
    assert on_device(FitConfig(8400.0, 0, 1e-3, 4), "cpu", 100.0) == FitConfig(8400.0, 0, 1e-3, 4)
