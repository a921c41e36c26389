"""A grid's [[train]] blocks as nodes of the artefact graph (artefacts/graph.py): parsed with the trainer's own
checks, so a bad block is one line before anything runs. Here, beside the grid, because the trainer's names and
profiles are training code, which the graph (read by decoding) never imports."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ..artefacts.graph import Artefact
from ..config import ConfigError
from ..nets.registry import get as network
from ..train.network import PROFILES, check, data_for, split_saved
from ..train.profiles import name_of

TRAIN_KEYS = ("networks", "profile", "model", "reports")


def heads_dtype(profile: str) -> str:
    """The dtype a heads profile generates its training data in, on this machine (its dense model is built first)."""
    from ..train.heads import PROFILES as HEADS
    from ..train.pacing import resolve_dtype
    return resolve_dtype(HEADS[profile].gen_dtype, log=lambda m: None)[0]


def trainings(blocks: list, model: str, where: str, results: str) -> list[Artefact]:
    """A grid's [[train]] blocks: the draft networks its results read, trained before any cell, one after another
    (each takes both cores), and each report copied into the results (`reports`, default drafters/training), which
    `bpdbench tables` renders as drafters_training. Why in the grid: the trainings were a shell loop, the one recipe
    of a committed number that was not a grid; and the trainer no longer writes into results/ itself."""
    out: list[Artefact] = []
    for i, block in enumerate(blocks, 1):
        at = f"{where}: [[train]] {i}"
        if not isinstance(block, dict):
            raise ConfigError(f"{where}: write [[train]] blocks (an array of tables), not [train]")
        unknown = sorted(set(block) - set(TRAIN_KEYS))
        if unknown:
            raise ConfigError(f"{at}: unknown key '{unknown[0]}'; valid: {', '.join(TRAIN_KEYS)}")
        names, profile = block.get("networks"), block.get("profile", "quick")
        if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
            raise ConfigError(f"{at}: networks must be a list of draft networks, e.g. [\"hydra\", \"koala-adv\"]")
        if profile not in PROFILES:
            raise ConfigError(f"{at}: profile must be one of {', '.join(PROFILES)}, got {profile!r}")
        reports = block.get("reports", "drafters/training")
        if not isinstance(reports, str) or Path(reports).is_absolute() or ".." in Path(reports).parts:
            raise ConfigError(f"{at}: reports must be a folder inside the results, e.g. \"drafters/training\"")
        for name in names:
            base, adv = split_saved(name)
            try:
                saved = check(base, profile, adv)
            except ValueError as e:
                raise ConfigError(f"{at}: {e}") from None
            who = str(block.get("model", model))
            needs = (out[-1].id,) if out and out[-1].model == who else ()
            out.append(Artefact("network", who, f"{saved}-{profile}", needs,
                                (saved, profile, str(Path(results) / reports))))
    return out


def with_data(networks: list[Artefact]) -> list[Artefact]:
    """Each network's distillation data as a node of its own before it, once per model and budget: the networks of
    one profile share their data, and a grid's dry run says what generating it costs apart from the fit."""
    out: list[Artefact] = []
    made: set[str] = set()
    for a in networks:
        saved, profile = a.build_with[0], a.build_with[1]    # prefill-bench for bench; prefill data with its layers
        data = Artefact("distill", a.model, name_of(data_for(network(split_saved(saved)[0]), PROFILES[profile]).data))
        if data.id not in made:
            made.add(data.id)
            out.append(data)
        out.append(replace(a, needs=a.needs + (data.id,)))
    return out
