"""The registry of commands: one `CommandSpec` (experiments/command.py) per command that runs a Plan, with the work
each one does inside its folder's lock and session, and what it prints after.

Why a registry: the CLI (`prepare` then `execute`), the sweep (a grid's [[speed]] block, whether a cell is finished)
and resume all ask the same questions of a command; each answer is a field here, never a test of its name. A new
command is one entry and its body. `bpdbench regress` is no Plan (it runs a grid of its own) and is not here.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from ..config import ConfigError, RunConfig
from ..methods import Method, parse
from ..store import EXAMPLES, read_table
from . import alpha_law, analysis, engines, replay as replay_lib, run, sampling_certificate, speed as speed_lib
from .command import AlphaLawOptions, CertifyOptions, CommandSpec, Log, Plan, SpeedOptions
from .summary import to_markdown
from .terminal import replay_table, show


def _markdown(plan: Plan, df: pd.DataFrame, log: Log) -> None:
    print(to_markdown(df))


def _oracle(s, plan: Plan, lock, log: Log, progress) -> pd.DataFrame:
    return replay_lib.oracle_table(s, plan.out, list(plan.methods), _ks(plan.cfg), resume=plan.resume, lock=lock)


def _ks(cfg: RunConfig) -> tuple[int, ...]:
    """The lattice's k = 1, 2, 4, ... up to --k."""
    return tuple(sorted({x for x in replay_lib.KS if x <= cfg.k} | {cfg.k}))


def _oracle_drafts(cfg: RunConfig) -> tuple[Method, ...]:
    """The heads' plain drafts, then the oracle at each k."""
    return (parse("bpd"), *[parse(f"oracle:k={k}") for k in _ks(cfg)])


def _analyze(s, plan: Plan, lock, log: Log, progress) -> dict:
    return analysis.analyze(s, plan.out, plan.methods[1])


def _show_analysis(plan: Plan, res: dict, log: Log) -> None:
    print(to_markdown(res["repetition"]))
    print(to_markdown(res["entropy"]))


def _replay(s, plan: Plan, lock, log: Log, progress) -> pd.DataFrame:
    return replay_lib.replay_methods(s, list(plan.methods), plan.out, resume=plan.resume,
                                     per_category=plan.per_category, lock=lock)


def _show_replay(plan: Plan, df: pd.DataFrame, log: Log) -> None:
    show(replay_table(df), f"replayed on greedy trajectories (outputs greedy's by construction, not timed); every "
         f"column in {plan.out / 'replay.csv'}")


def _needs_greedy(cfg: RunConfig, methods: list[Method], options: Any) -> None:
    if not cfg.sampling.greedy:
        raise ConfigError(f"replay walks each method along the greedy reference, but at --temperature "
                          f"{cfg.temperature:g} the trajectory depends on the draws, so there is none to replay; "
                          f"decode for real with `bpdbench run --temperature {cfg.temperature:g} --method M`")


def _tune(s, plan: Plan, lock, log: Log, progress) -> dict:
    return analysis.tune(s, plan.method)


def _has_alpha(cfg: RunConfig, methods: list[Method], options: Any) -> None:
    if methods and not methods[0].takes("alpha"):
        raise ConfigError(f"{methods[0].label} has no alpha to tune; methods with one: ngram2, ngram4, "
                          f"16best-ngram4, neural-s|m|l, medusa-neural-m, hf-lm")


def _show_tune(plan: Plan, res: dict, log: Log) -> None:
    log(f"{plan.cfg.task}/{plan.method.label}: alpha = {res['alpha']} on {res['n_examples']} tune-split examples "
        f"(stored in {res['file']})")


def _speed(s, plan: Plan, lock, log: Log, progress) -> Path:
    return speed_lib.run_speed(s, plan, lock, log)


def _show_speed(plan: Plan, out: Path, log: Log) -> None:
    print(to_markdown(read_table(out / "speed.csv")))
    if (out / "speed_by_category.csv").exists():
        print(to_markdown(read_table(out / "speed_by_category.csv")))
    log(f"results in {out}")


def _speed_check(cfg: RunConfig, methods: list[Method], options: Any) -> None:
    engines.check(methods)     # llama.cpp's prompt lookup needs llama.cpp's greedy, which certifies it


def _certify(s, plan: Plan, lock, log: Log, progress) -> dict:
    return sampling_certificate.sample_and_test(s, plan, log)


def _samples(cfg: RunConfig, methods: list[Method], options: Any) -> None:
    if cfg.sampling.greedy:
        raise ConfigError("certify tests sampling: pass --temperature > 0 (greedy runs are certified per example "
                          "by `bpdbench run`)")


def _alpha_law(s, plan: Plan, lock, log: Log, progress) -> Path:
    return alpha_law.measure(s, plan, log)


def _show_alpha_law(plan: Plan, out: Path, log: Log) -> None:
    print((out / "alpha_law.md").read_text())
    log(f"results in {out}")


def _alpha_law_method(block: dict) -> str:
    """A grid block's one sps chain, from its draft model and longest draft."""
    draft, gamma = block.get("draft"), block.get("gamma_max")
    if draft is not None and (not isinstance(draft, str) or not draft):
        raise ConfigError(f"draft must be a model name, got {draft!r}")
    if not isinstance(gamma, int) or isinstance(gamma, bool):
        raise ConfigError(f"gamma_max must be an integer >= 1, got {gamma!r}")
    return alpha_law.spelling(draft, gamma)


_FOLDER = frozenset({"folder", "out"})
# in the order a sweep runs them: a tune cell writes the alpha other cells read
COMMANDS: dict[str, CommandSpec] = {c.name: c for c in (
    CommandSpec("tune", _tune, methods="one", split="tune", check=_has_alpha, finish=_show_tune,
                kept=lambda r: {"alpha": r["alpha"], "n_examples": r["n_examples"]},
                grid_keys=frozenset({"methods", "out"}), defaults={"limit": 20}),
    CommandSpec("run", run.decode, summary="summary.csv", methods="one", named_by_methods=True, samples=True,
                result_file=EXAMPLES, counts_lost=True, precheck=run.precheck, finish=run.refuse_lost,
                kept=lambda r: {"n_examples": r.get("n_examples"), "n_lost": r.get("n_lost", 0)},
                grid_keys=frozenset({"methods", "out", "private_greedy"}), defaults={"limit": 10, "methods": ["bpd"]}),
    CommandSpec("replay", _replay, summary="replay.csv", folder="replay", result_file="replay.jsonl",
                recorded=("per_category",), check=_needs_greedy, finish=_show_replay,
                kept=lambda r: {"rows": len(r)}, grid_keys=frozenset({"methods", "per_category"}) | _FOLDER,
                defaults={"limit": 30, "methods": ["bpd", "16best-0gram", "oracle:k=16"]}),
    CommandSpec("oracle", _oracle, summary="oracle.csv", folder="oracle", methods="fixed", fixed=_oracle_drafts,
                result_file="replay.jsonl", finish=_markdown, kept=lambda r: {"rows": len(r)}, grid_keys=_FOLDER,
                defaults={"limit": 30}),
    CommandSpec("analyze", _analyze, summary="entropy.csv", folder="analysis", methods="fixed",
                fixed=lambda cfg: (parse("bpd"), parse("ngram2")),     # the heads' drafts, plain and 2-gram rescored
                config_last=True, match_methods=False, finish=_show_analysis, grid_keys=_FOLDER,
                defaults={"limit": 30}),
    CommandSpec("speed", _speed, summary="speed.csv", folder="speed", options=SpeedOptions, baseline="ar",
                external=True, timed=True, samples=True, result_file="speed.jsonl",
                recorded=("repeats", "per_category"), check=_speed_check, finish=_show_speed,
                grid_keys=frozenset({"methods", "repeats", "per_category"}) | _FOLDER,
                unused=frozenset(speed_lib.UNUSED),
                defaults={"limit": 20, "max_new_tokens": 128, "repeats": 3,
                          "methods": ["ar", "bpd", "pld", "hf-greedy", "hf-pld", "hf-assisted"]}),
    CommandSpec("alpha_law", _alpha_law, summary="alpha_law.csv", folder="alpha_law", methods="one",
                options=AlphaLawOptions, config_last=True, recorded=("gamma_max", "temperatures"),
                finish=_show_alpha_law, kept=lambda r: {"folder": str(r)}, cell_method=_alpha_law_method,
                grid_keys=frozenset({"draft", "gamma_max", "temperatures"}) | _FOLDER,
                defaults={"limit": 4, "max_new_tokens": 64, "gamma_max": 8, "temperatures": [0.0, 0.7, 1.0]}),
    CommandSpec("certify", _certify, summary="certify_summary.csv", options=CertifyOptions, named_by_methods=True,
                samples=True, config_file="certify.json", config_last=True,
                recorded=("rules", "samples", "positions", "level"), check=_samples,
                kept=lambda r: {"families": len(r["families"])},
                grid_keys=frozenset({"methods", "rules", "samples", "positions", "level", "out"}),
                defaults={"limit": 3, "rules": ["exact"], "samples": 300, "positions": 4, "level": 0.01}),
)}


def spec(command: str) -> CommandSpec:
    try:
        return COMMANDS[command]
    except KeyError:
        raise ValueError(f"unknown command {command!r}; valid: {', '.join(COMMANDS)}") from None


def result_files() -> dict[str, str]:
    """The file each command that resumes appends to: which command made a folder older than config.json's record
    of it (store.makers)."""
    return {c.name: c.result_file for c in COMMANDS.values() if c.result_file}
