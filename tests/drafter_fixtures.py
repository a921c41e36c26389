"""Tiny draft networks for tests: distillation data from the tiny model (synthetic prompts, fp32), then every
trainer name fitted for a few dozen steps, so the drafters accept some tokens (a random drafter would accept none
and the replay/lossless checks would compare two empty walks)."""
from __future__ import annotations

import random
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from bpdbench.nets.registry import networks

# every registered network (nets/registry.py): those whose inputs the greedy data holds (the final state only) train
# on it, those that read chosen layers (LAYERED: eagle3) on tiny prefill data that keeps EAGLE-3's three
NAMES = tuple(name for name, spec in networks().items() if spec.layers is None)
LAYERED = tuple(name for name, spec in networks().items() if spec.layers is not None)
STEPS = 150
LR = 1e-2       # tiny models learn their cycles in a few hundred steps at this rate; the real profiles keep theirs


def synthetic_prompts(tok, n: int, max_tokens: int, seed: int, gen_tokens: int) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    return [([rng.randrange(2, 96) for _ in range(rng.randrange(4, 20))], gen_tokens) for _ in range(n)]


def tiny_prefill():
    """The tiny model's prefill data with its low, middle and high layers, cut from its own greedy continuations (the
    random tiny model's argmax rarely agrees with real text; its own continuations always do)."""
    from bpdbench.train import prefill
    return replace(prefill.BUDGETS["prefill-ci"], positions=640, chunk=48, shard_positions=200,
                   layers="low-mid-high", sources=("greedy",))


def build_tiny_drafters(model, tok, model_name: str, cache: Path, names=NAMES + LAYERED) -> dict[str, Path]:
    """Train every drafter on the tiny model's distillation data under `cache` (BPDBENCH_CACHE); their folders, by
    trainer name, in the `ci` profile (a variant of it: more data and steps, a higher learning rate, saved where
    `ci` is). Quick-profile copies are made where the methods look by default."""
    from bpdbench import paths
    from bpdbench.train import distill, network

    data = replace(distill.BUDGETS["ci"], n_prompts=24, gen_tokens=24)
    profile = replace(network.PROFILES["ci"], steps=STEPS, data=data)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BPDBENCH_CACHE", str(cache))
        mp.setenv("BPDBENCH_RESULTS", str(cache / "results"))     # module fixtures run before _private_results
        mp.setattr(distill, "prompt_pool", synthetic_prompts)
        mp.setattr("tasks.default_data_dir", lambda: None)
        torch.manual_seed(0)
        distill.build(model_name, data, model, tok, log=lambda m: None)
        out = {}
        for name in names:
            adversarial = 0.1 if name == "koala-hydra" else 0.0     # the adversarial term's path runs too
            p = replace(profile, data=tiny_prefill()) if name in LAYERED else profile
            path = network.train(name, p, model_name, model, tok, log=lambda m: None, adversarial=adversarial, lr=LR)
            out[name + ("-adv" if adversarial else "")] = path
        for name, path in out.items():
            quick = paths.network_dir(model_name, name, "quick")
            shutil.rmtree(quick, ignore_errors=True)
            shutil.copytree(path, quick)
    return out


def copy_cache(src: Path, dst: Path) -> None:
    """The drafters (and data) of one cache into another (tests that set their own BPDBENCH_CACHE)."""
    for sub in ("drafters", "distill"):
        if (src / sub).exists():
            shutil.copytree(src / sub, dst / sub, dirs_exist_ok=True)


def copy_drafters(built: tuple[Path, dict[str, Path]], dst: Path) -> dict[str, Path]:
    """The session's draft networks (`built`: its cache and folders) as a cache of the caller's own, so a module
    that writes into its cache cannot change what another module reads; their folders there, by trainer name.
    Training is seeded per drafter, so a copy holds what training the same names here would have made."""
    src, folders = built
    shutil.copytree(src, dst, dirs_exist_ok=True)
    return {name: dst / path.relative_to(src) for name, path in folders.items()}
