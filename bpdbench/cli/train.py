"""The commands that build artefacts: heads, the model-history database, distillation data, drafters, rescorers.

Each checks its flags (an unknown profile, name or device is one line before the base model loads) and calls one
function of bpdbench.train. Every artefact is also built on first use by the command that needs it; these build one
on purpose. `--device` is where the base model makes the data (greedy continuations or teacher-forced passes) and
where the fits run: on the CPU a fit's budget is core-seconds, on a GPU its profile's wall seconds (device_seconds),
and the weights land in the same cache folder either way (`make gpu-train`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from .errors import console, log, one_line_errors
from ..config import check_device
from .options import DEFAULT_MODEL, Device, Model, Threads, set_threads


@one_line_errors
def train_heads(model: Model = DEFAULT_MODEL,
                profile: Annotated[str, typer.Option(help="quick (<=10 min) | full (<=60 min) | bench (140 "
                                                                "core-min on the networks' prefill-bench data) | ci")] = "quick",
                out: Annotated[Optional[str], typer.Option(help="default: the heads cache")] = None,
                device: Device = "cpu", threads: Threads = None) -> None:
    """Train blockwise heads on the frozen base (self-distillation on held-out prompts)."""
    from ..train import heads as train_heads
    if profile not in train_heads.PROFILES:
        raise ValueError(f"unknown profile '{profile}'; valid: {', '.join(train_heads.PROFILES)}")
    check_device(device)
    set_threads(threads)
    train_heads.train(model, profile, out=Path(out) if out else None, log=log, device=device)


@one_line_errors
def build_history(model: Model = DEFAULT_MODEL,
                  profile: Annotated[str, typer.Option(help="quick (about 4 min) | full (about 1 h) | ci")] = "quick",
                  device: Device = "cpu", threads: Threads = None) -> None:
    """The model's greedy continuations on held-out prompts, for `hierarchy`'s model-history database."""
    from ..train import history
    if profile not in history.PROFILES:
        raise ValueError(f"unknown profile '{profile}'; valid: {', '.join(history.PROFILES)}")
    check_device(device)
    set_threads(threads)
    history.build(model, profile, log=log, device=device)


@one_line_errors
def distill_data(model: Model = DEFAULT_MODEL,
                 profile: Annotated[str, typer.Option(help="data budget: quick | full | ci (greedy, decode "
                                                          "speed) | prefill-bench | prefill-quick | prefill-ci "
                                                          "(teacher-forced text)")] = "quick",
                 device: Device = "cpu", threads: Threads = None) -> None:
    """Build (once) the cached distillation dataset every draft-network trainer reads: greedy continuations of held-out
    prompts, or teacher-forced passes over train-split and corpus text (prefill-*: resumable), with the base's hidden
    states and top-8 log-probs."""
    from ..train import distill, prefill
    if profile not in distill.BUDGETS and profile not in prefill.BUDGETS:
        raise ValueError(f"unknown profile '{profile}'; valid: {', '.join([*distill.BUDGETS, *prefill.BUDGETS])}")
    check_device(device)
    set_threads(threads)
    path = distill.path_for(model, profile)
    if (path / distill.FILE).exists() or (path / "meta.json").exists():
        log(f"distillation data '{profile}' for {model} is cached at {path}; delete it to rebuild")
        return
    if profile in prefill.BUDGETS:
        prefill.build(model, profile, log=log, device=device)
        return
    distill.build(model, profile, log=log, device=device)


@one_line_errors
def train_network(name: Annotated[str, typer.Argument(help="medusa | koala | koala-hydra | hydra | hydra++ | "
                                                           "amphista | eagle | eagle3")],
                  model: Model = DEFAULT_MODEL,
                  profile: Annotated[str, typer.Option(help="quick (<=10 min) | full (<=60 min) | bench (about 2 h: "
                                                            "teacher-forced prefill data) | ci; eagle3: quick, bench or ci, on prefill data "
                                                            "that keeps its layers")] = "quick",
                  adversarial: Annotated[float, typer.Option(help="KOALA's adversarial weight (koala, koala-hydra; "
                                                                  "saved as NAME-adv)")] = 0.0,
                  out: Annotated[Optional[str], typer.Option(help="default: the draft-network cache")] = None,
                  device: Device = "cpu", threads: Threads = None) -> None:
    """Train a draft network on the cached distillation data (built first when missing) and write its held-out
    per-depth agreement next to the weights."""
    from ..train import network
    network.check(name, profile, adversarial)
    check_device(device)
    set_threads(threads)
    network.train(name, profile, model, log=log, out=Path(out) if out else None, adversarial=adversarial,
                  device=device)


@one_line_errors
def train_rescorer(kind: Annotated[str, typer.Argument(help="ngram | neural")], model: Model = DEFAULT_MODEL,
                   order: Annotated[int, typer.Option(help="n-gram order")] = 4,
                   size: Annotated[str, typer.Option(help="neural size: s | m | l")] = "m",
                   minutes: Annotated[float, typer.Option(help="neural training budget")] = 15.0,
                   corpus: Annotated[Optional[list[str]], typer.Option(help="corpus files (default: shared C4 + "
                                                                            "WikiText; never task data)")] = None,
                   memory: Annotated[str, typer.Option(help="lmplz -S memory cap")] = "500M",
                   discount_fallback: Annotated[bool, typer.Option(help="for tiny corpora")] = False,
                   threads: Threads = None) -> None:
    """Train a draft rescorer for a target model: KenLM n-gram over its token ids, or a small neural LM."""
    from ..train.rescorer import train_cli
    set_threads(threads)
    path = train_cli(kind, model, order, size, minutes, corpus, memory, discount_fallback, log)
    console.print(f"{kind} rescorer for {model} written to {path}")
