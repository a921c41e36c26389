"""Training commands: heads, the model-history database, distillation data, drafters and rescorers.

Registered on the shared app when cli.py imports this module; each command only validates its flags and calls one
function of bpdbench.train.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .cli_common import _M, _TH, _log, _threads, app, console, one_line_errors



@app.command("train-heads")
@one_line_errors
def train_heads_cmd(model: str = _M, profile: str = typer.Option("quick", help="quick (<=10 min) | full (<=60 min) | ci"),
                    out: Optional[str] = typer.Option(None, help="default: the heads cache"),
                    threads: Optional[int] = _TH):
    """Train blockwise heads on the frozen base (self-distillation on held-out prompts)."""
    import torch
    from .train import heads as train_heads
    if profile not in train_heads.PROFILES:
        raise ValueError(f"unknown profile '{profile}'; valid: {', '.join(train_heads.PROFILES)}")
    if threads is not None and threads < 1:
        raise ValueError(f"--threads must be >= 1, got {threads}")
    if threads:
        torch.set_num_threads(threads)
    train_heads.train(model, profile, out=Path(out) if out else None, log=_log)


@app.command("build-history")
@one_line_errors
def build_history_cmd(model: str = _M, profile: str = typer.Option("quick", help="quick (about 4 min) | full (about 1 h) | ci"),
                      threads: Optional[int] = _TH):
    """The model's greedy continuations on held-out prompts, for `hierarchy`'s model-history database."""
    import torch
    from .train import history
    if profile not in history.PROFILES:
        raise ValueError(f"unknown profile '{profile}'; valid: {', '.join(history.PROFILES)}")
    if threads is not None and threads < 1:
        raise ValueError(f"--threads must be >= 1, got {threads}")
    if threads:
        torch.set_num_threads(threads)
    history.build(model, profile, log=_log)


@app.command("distill-data")
@one_line_errors
def distill_data_cmd(model: str = _M, profile: str = typer.Option("quick", help="data budget: quick | full | ci"),
                     threads: Optional[int] = _TH):
    """Build (once) the cached distillation dataset every drafter trainer reads: greedy continuations of held-out
    prompts with the base's hidden states and top-8 log-probs."""
    from .train import distill
    if profile not in distill.BUDGETS:
        raise ValueError(f"unknown profile '{profile}'; valid: {', '.join(distill.BUDGETS)}")
    _threads(threads)
    path = distill.path_for(model, profile)
    if (path / distill.FILE).exists():
        _log(f"distillation data '{profile}' for {model} is cached at {path}; delete it to rebuild")
        return
    distill.build(model, profile, log=_log)


@app.command("train-drafter")
@one_line_errors
def train_drafter_cmd(name: str = typer.Argument(..., help="medusa | koala | koala-hydra | hydra | hydra++ | "
                                                       "amphista | eagle"),
                      model: str = _M, profile: str = typer.Option("quick", help="quick (<=10 min) | full (<=60 "
                                                                   "min) | ci"),
                      adversarial: float = typer.Option(0.0, help="KOALA's adversarial weight (koala, koala-hydra; "
                                                                  "saved as NAME-adv)"),
                      out: Optional[str] = typer.Option(None, help="default: the drafter cache"),
                      threads: Optional[int] = _TH):
    """Train a draft model on the cached distillation data (built first when missing) and write its held-out
    per-depth agreement next to the weights."""
    from .train import drafter
    drafter.check(name, profile, adversarial)
    _threads(threads)
    drafter.train(name, profile, model, log=_log, out=Path(out) if out else None, adversarial=adversarial)


@app.command("train-rescorer")
@one_line_errors
def train_rescorer_cmd(kind: str = typer.Argument(..., help="ngram | neural"), model: str = _M,
                       order: int = typer.Option(4, help="n-gram order"),
                       size: str = typer.Option("m", help="neural size: s | m | l"),
                       minutes: float = typer.Option(15.0, help="neural training budget"),
                       corpus: Optional[list[str]] = typer.Option(None, help="corpus files (default: shared C4 + "
                                                                  "WikiText; never task data)"),
                       memory: str = typer.Option("500M", help="lmplz -S memory cap"),
                       discount_fallback: bool = typer.Option(False, help="for tiny corpora")):
    """Train a draft rescorer for a target model: KenLM n-gram over its token ids, or a small neural LM."""
    from .train.rescorer import train_cli
    path = train_cli(kind, model, order, size, minutes, corpus, memory, discount_fallback, _log)
    console.print(f"{kind} rescorer for {model} written to {path}")
