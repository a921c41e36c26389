"""Replay agrees with real decoding (float32), and the oracle bounds every drafting rule."""
from __future__ import annotations

import torch

from bpdbench import decoding, replay
from bpdbench.metrics import ratios
from rescorers.kbest import KBestRescorer
from tests.conftest import random_heads

PROMPT = [5, 17, 3, 42, 8, 11]


def noisy_heads(tiny_model, seed=4, n=4):
    return random_heads(tiny_model.lm_head, n, seed=seed, std=0.3)


def test_replay_matches_real_decoding(tiny_model):
    heads = noisy_heads(tiny_model)
    for prompt in (PROMPT, [1, 2, 3], [90, 4, 4, 4, 7]):
        real = decoding.generate(tiny_model, prompt, 40, set(), heads=heads, n_heads=4)
        traj = replay.trajectory(tiny_model, heads, prompt, real.tokens, 4, k_max=8)
        sim = replay.simulate(traj, replay.top1, k=1)
        assert (sim.serial_calls, sim.accepted, sim.hist) == (real.counters.serial_calls, real.counters.accepted,
                                                               real.counters.hist)
        rescorer = KBestRescorer("16best-0gram", p=4)
        real_k = decoding.generate(tiny_model, prompt, 40, set(), heads=heads, n_heads=4, rescorer=rescorer, k=3)
        assert real_k.tokens == real.tokens
        sim_k = replay.simulate(traj, rescorer.refine, k=3)
        assert (sim_k.serial_calls, sim_k.accepted) == (real_k.counters.serial_calls, real_k.counters.accepted)


def test_oracle_bounds_and_grows_with_k(tiny_model):
    heads = noisy_heads(tiny_model)
    gen = decoding.generate(tiny_model, PROMPT, 60, set())
    traj = replay.trajectory(tiny_model, heads, PROMPT, gen.tokens, 4, k_max=96)
    eff = [ratios(replay.oracle(traj, k))["block_efficiency"] for k in (1, 2, 8, 96)]
    assert eff == sorted(eff)
    assert eff[0] == ratios(replay.simulate(traj, replay.top1, 1))["block_efficiency"]
    assert eff[-1] == 60 / (1 + -(-59 // 5))  # k = vocabulary: every greedy token is in the lattice
    kbest = replay.simulate(traj, KBestRescorer("k", p=8).refine, k=8)
    assert ratios(kbest)["block_efficiency"] <= eff[2]


def test_repetition_and_h_max():
    stats = replay.repetition([[1, 1, 1, 2], [3, 4, 5, 6]])
    assert stats["repeat_share"] == 2 / 6 and stats["mean_max_run"] == 2.0
    assert replay.h_max([1.0, 2.0, 3.0, 2.5, 4.0]) == 3
    assert replay.h_max([3.0, 2.0]) == 1
