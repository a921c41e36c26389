"""The options several commands share, each a named type: one flag, one help text, written once.

A command writes `task: Task = "xsum"`; the type carries the flag's help and the signature its default, so a command
that needs another default (certify's task is mt_bench) says so where it is read, with the same help text. An
option whose help differs from command to command (what `--limit` counts) is spelled inline in that command.

`run_config` builds the RunConfig from these flags for the commands that decode; `set_threads` is what `--threads`
means for the commands that do not go through a RunConfig (calibration, training).
"""
from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

from ..config import RunConfig

DEFAULT_MODEL = "qwen2.5-coder-0.5b"

Task = Annotated[str, typer.Option(help="task (see `bpdbench tasks`)")]
Model = Annotated[str, typer.Option(help="registered name, local HF dir or Hub id")]
Heads = Annotated[int, typer.Option(help="use the first N heads (a method's heads= overrides it)")]
HeadsProfile = Annotated[str, typer.Option(help="heads profile: quick | full | ci | init (untrained)")]
HeadsPath = Annotated[Optional[str], typer.Option(help="heads directory (ours or a Medusa-1 checkpoint)")]
Limit = Annotated[Optional[int], typer.Option(help="examples")]
Offset = Annotated[int, typer.Option(help="first example (deterministic order)")]
MaxNewTokens = Annotated[Optional[int], typer.Option(help="max new tokens (default: the task's)")]
Dtype = Annotated[str, typer.Option(help="auto (bfloat16 where this machine runs it natively, else float32; said "
                                         "with its reason) | bfloat16 | float32 (exact)")]
Device = Annotated[str, typer.Option(help="cpu | cuda | auto")]
Threads = Annotated[Optional[int], typer.Option(help="torch threads")]
K = Annotated[int, typer.Option(help="lattice width (top-k per head) for refined methods (a method's k= overrides "
                                     "it)")]
Alpha = Annotated[Optional[float], typer.Option(help="rescorer weight (a method's alpha= overrides it); default: the "
                                                     "tuned table")]
AlphaFile = Annotated[Optional[str], typer.Option(help="tuned-alpha table (default: <results>/alpha.json)")]
Resume = Annotated[bool, typer.Option(help="keep what an earlier run with the same settings wrote to --out; do only "
                                           "the rest (also extends a run to a larger --limit)")]
DataDir = Annotated[Optional[str], typer.Option(help="data dir (default: $BPDBENCH_DATA or ../shared/data)")]
DataFile = Annotated[Optional[str], typer.Option(help="data file (task `prompts`: JSONL with id, prompt)")]
Out = Annotated[Optional[str], typer.Option(help="result directory (default: under the checkout's results/)")]
NoAutoTrain = Annotated[bool, typer.Option("--no-auto-train", help="refuse to train missing heads or neural "
                                                                   "rescorers (> 1 min)")]
Temperature = Annotated[Optional[float], typer.Option("--temperature", help="sample at this temperature "
                                                      "(transformers' warpers define p; speculative sampling keeps "
                                                      "it exact); unset or 0: greedy")]
TopP = Annotated[Optional[float], typer.Option("--top-p", help="nucleus sampling (needs --temperature > 0); unset: "
                                                               "off")]
TopK = Annotated[Optional[int], typer.Option("--top-k", help="top-k sampling (needs --temperature > 0); unset or 0: "
                                                             "off")]
Seed = Annotated[Optional[int], typer.Option("--seed", help="example i samples from a generator seeded seed + "
                                                            "offset + i (default 0)")]


def run_config(*, no_auto_train: bool = False, **flags: Any) -> RunConfig:
    """The decoding flags as one RunConfig (validated once, later, by experiments.plan.prepare). `--no-auto-train`
    is the config's `auto_train` turned round; every other flag keeps its name. Keyword-only on purpose: a command
    hands over a dozen ints and strings, and a positional slip would swap two of them without an error."""
    return RunConfig(auto_train=not no_auto_train, **flags)


def set_threads(threads: Optional[int]) -> None:
    """`--threads` for the commands without a RunConfig (whose validation says the same for the others): at least
    one, and unset leaves torch's own choice."""
    if threads is not None and threads < 1:
        raise ValueError(f"--threads must be >= 1, got {threads}")
    if threads:
        import torch
        torch.set_num_threads(threads)
