"""Typer CLI: a thin layer that fills a RunConfig and calls the library. Errors are one line, exit code 2."""
from __future__ import annotations

import os
import sys
from functools import wraps
from pathlib import Path
from typing import Optional

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # every default works offline; unset it to use the Hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", os.environ["HF_HUB_OFFLINE"])
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .config import RunConfig

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Benchmark blockwise parallel decoding.")
console = Console(stderr=True)


def one_line_errors(fn):
    """Known user errors become one line naming what is wrong and how to fix it."""
    @wraps(fn)
    def wrapper(*args, **kwargs):
        from tasks import DataError
        from .config import ConfigError
        from .models import ModelError
        try:
            return fn(*args, **kwargs)
        except (ConfigError, DataError, ModelError, FileExistsError, FileNotFoundError, ValueError) as e:
            console.print(f"[red]error:[/red] {str(e).splitlines()[0]}", highlight=False, soft_wrap=True)
            raise typer.Exit(2)
        except KeyboardInterrupt:
            console.print("interrupted: finished examples are saved; rerun with --resume to continue")
            raise typer.Exit(130)
    return wrapper


@app.command()
@one_line_errors
def run(task: str = typer.Option("xsum", help="task name (see `bpdbench tasks`)"),
        model: str = typer.Option("qwen2.5-coder-0.5b", help="registered name, local HF dir or Hub id"),
        method: str = typer.Option("bpd", help="bpd | ar"),
        heads: int = typer.Option(8, help="use the first N heads"),
        heads_profile: str = typer.Option("quick", help="quick | full | ci | init (untrained)"),
        heads_path: Optional[str] = typer.Option(None, help="heads directory (ours or Medusa-1)"),
        rescorer: str = typer.Option("none", help="draft rescorer (see `bpdbench rescorers`)"),
        alpha: Optional[float] = typer.Option(None, help="rescorer weight; default: tuned (results/alpha.json)"),
        k: int = typer.Option(16, help="lattice width (top-k per head) for rescorers"),
        draft_threshold: float = typer.Option(0.0, help="verify draft tokens only while the head's top-1 "
                                              "probability >= this (0: the full block, as in the paper)"),
        limit: Optional[int] = typer.Option(10, help="number of examples"),
        offset: int = typer.Option(0, help="first example (deterministic order)"),
        max_new_tokens: Optional[int] = typer.Option(None, help="default: the task's"),
        dtype: str = typer.Option("bfloat16", help="bfloat16 (fast on CPU) | float32 (exact)"),
        device: str = typer.Option("cpu", help="cpu | cuda | auto"),
        threads: Optional[int] = typer.Option(None, help="torch threads"),
        data_dir: Optional[str] = typer.Option(None, help="default: $BPDBENCH_DATA or ../shared/data"),
        data_file: Optional[str] = typer.Option(None, help="JSONL file (task `prompts`)"),
        out: Optional[str] = typer.Option(None, help="result directory"),
        resume: bool = typer.Option(False, help="continue an interrupted run in --out")):
    """Decode a task's examples, certify losslessness against greedy, write examples.jsonl + summary."""
    from . import runner
    from .results import to_markdown
    import pandas as pd

    cfg = RunConfig(task=task, model=model, method=method, heads=heads, heads_profile=heads_profile,
                    heads_path=heads_path, rescorer=rescorer, alpha=alpha, k=k, draft_threshold=draft_threshold,
                    limit=limit, offset=offset, max_new_tokens=max_new_tokens, dtype=dtype, device=device, threads=threads, data_dir=data_dir,
                    data_file=data_file, out=out, resume=resume)
    from rescorers import get_rescorer
    get_rescorer(rescorer)  # fail fast on an unknown name
    cfg.validate()
    totals = {"tokens": 0, "calls": 0, "seconds": 0.0}
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[stats]}"), console=console, transient=False) as bar:
        job = bar.add_task(f"{task} {method}", total=limit, stats="")

        def progress(rec: dict) -> None:
            totals["tokens"] += rec["new_tokens"]
            totals["calls"] += rec["serial_calls"]
            totals["seconds"] += rec["seconds"]
            bar.update(job, advance=1, stats=f"{totals['tokens'] / totals['seconds']:.1f} tok/s  block eff "
                       f"{totals['tokens'] / totals['calls']:.2f}")

        row = runner.run(cfg, log=lambda m: bar.console.print(m, highlight=False), progress=progress)
    print(to_markdown(pd.DataFrame([row]).drop(columns=["accepted_per_head"])))
    console.print(f"results in {cfg.out_dir()}")


@app.command()
@one_line_errors
def models():
    """List registered models and their cache state."""
    from .models import MODELS, cache_state
    for spec in MODELS.values():
        print(f"{spec.name:22s} {cache_state(spec.name):22s} {spec.note}")


@app.command()
@one_line_errors
def tasks():
    """List tasks."""
    from tasks import TASKS
    for t in TASKS.values():
        print(f"{t.name:15s} {t.group:6s} {', '.join(t.metrics) or '-'}")


@app.command()
@one_line_errors
def rescorers():
    """List draft rescorers."""
    from rescorers import RESCORERS
    for r in RESCORERS.values():
        print(f"{r.name:15s} {r.description}")


@app.command("train-heads")
@one_line_errors
def train_heads_cmd(model: str = typer.Option("qwen2.5-coder-0.5b"),
                    profile: str = typer.Option("quick", help="quick (<=10 min) | full (<=60 min) | ci"),
                    out: Optional[str] = typer.Option(None, help="default: the heads cache"),
                    threads: Optional[int] = typer.Option(None)):
    """Train blockwise heads on the frozen base (self-distillation on held-out prompts)."""
    import torch
    from . import train_heads
    if profile not in train_heads.PROFILES:
        raise ValueError(f"unknown profile '{profile}'; valid: {', '.join(train_heads.PROFILES)}")
    if threads:
        torch.set_num_threads(threads)
    train_heads.train(model, profile, out=Path(out) if out else None, log=lambda m: console.print(m))


@app.command("train-rescorer")
@one_line_errors
def train_rescorer_cmd(kind: str = typer.Argument(..., help="ngram | neural"),
                       model: str = typer.Option("qwen2.5-coder-0.5b", help="target model (its tokenizer)"),
                       order: int = typer.Option(4, help="n-gram order"),
                       size: str = typer.Option("m", help="neural size: s | m | l"),
                       minutes: float = typer.Option(15.0, help="neural training budget"),
                       corpus: Optional[list[str]] = typer.Option(None, help="corpus files (default: shared C4 + "
                                                                  "WikiText; never task data)"),
                       memory: str = typer.Option("500M", help="lmplz -S memory cap"),
                       discount_fallback: bool = typer.Option(False, help="for tiny corpora")):
    """Train a draft rescorer for a target model: KenLM n-gram over its token ids, or a small neural LM."""
    import rescorers
    from . import models
    from tasks import corpus_files
    files = [Path(c) for c in corpus] if corpus else corpus_files()
    if kind == "ngram":
        from rescorers.ngram import train_ngram
        tok = models.load_tokenizer(model)
        out = rescorers.artefact_dir(rescorers.RescorerSpec(f"ngram{order}", "", "ngram", order=order), model)
        path = train_ngram(order, lambda s: tok(s, add_special_tokens=False)["input_ids"], files, out,
                           memory=memory, discount_fallback=discount_fallback)
        console.print(f"{order}-gram for {model} written to {path}")
    elif kind == "neural":
        from .train_rescorer import train_neural
        path = train_neural(size, model, minutes=minutes, log=lambda m: console.print(m, highlight=False))
        console.print(f"neural-{size} for {model} written to {path}")
    else:
        raise ValueError(f"unknown rescorer kind '{kind}'; valid: ngram, neural")


def _analysis_cfg(task, model, heads, heads_profile, limit, offset, max_new_tokens, dtype, k, threads,
                  data_dir=None, data_file=None) -> RunConfig:
    return RunConfig(task=task, model=model, heads=heads, heads_profile=heads_profile, limit=limit, offset=offset,
                     max_new_tokens=max_new_tokens, dtype=dtype, k=k, threads=threads, data_dir=data_dir,
                     data_file=data_file).validate()


_T = typer.Option("xsum", help="task")
_M = typer.Option("qwen2.5-coder-0.5b", help="model")
_H = typer.Option(8, help="heads")
_HP = typer.Option("quick", help="heads profile")
_L = typer.Option(30, help="examples")
_O = typer.Option(0, help="offset")
_N = typer.Option(None, help="max new tokens (default: task's)")
_D = typer.Option("bfloat16", help="dtype")
_TH = typer.Option(None, help="threads")
_RES = typer.Option(False, help="keep the examples an earlier run with the same settings wrote to --out; replay "
                               "only the rest (also to extend a run to a larger --limit)")
_DD = typer.Option(None, help="data dir")
_DF = typer.Option(None, help="data file (task prompts)")


@app.command()
@one_line_errors
def oracle(task: str = _T, k: int = typer.Option(16, help="largest k (k = 1, 2, 4, ... up to it)"), model: str = _M,
           heads: int = _H, heads_profile: str = _HP, limit: Optional[int] = _L, offset: int = _O,
           max_new_tokens: Optional[int] = _N, dtype: str = _D, threads: Optional[int] = _TH,
           data_dir: Optional[str] = _DD, data_file: Optional[str] = _DF, out: Optional[str] = typer.Option(None),
           resume: bool = _RES):
    """Oracle block efficiency of the top-k lattice (best achievable path) for k = 1, 2, 4, ..., K: CSV + PNG."""
    from . import analysis
    from .results import to_markdown
    cfg = _analysis_cfg(task, model, heads, heads_profile, limit, offset, max_new_tokens, dtype, k, threads,
                        data_dir, data_file)
    ctx, examples = analysis.prepare(cfg, log=console.print)
    ks = [x for x in analysis.KS if x <= k] + ([k] if k not in analysis.KS else [])
    df = analysis.oracle_table(ctx, examples, Path(out or f"results/oracle/{task}"), ks=tuple(sorted(set(ks))),
                               resume=resume, log=console.print)
    print(to_markdown(df))


@app.command()
@one_line_errors
def analyze(task: str = _T, model: str = _M, heads: int = _H, heads_profile: str = _HP, limit: Optional[int] = _L,
            offset: int = _O, max_new_tokens: Optional[int] = _N, dtype: str = _D, k: int = 16,
            threads: Optional[int] = _TH,
           data_dir: Optional[str] = _DD, data_file: Optional[str] = _DF, out: Optional[str] = typer.Option(None)):
    """Consecutive repetition in drafts (plain vs 2-gram rescored) and per-head entropy / h_max: CSV + PNG."""
    from . import analysis
    from .results import to_markdown
    cfg = _analysis_cfg(task, model, heads, heads_profile, limit, offset, max_new_tokens, dtype, k, threads,
                        data_dir, data_file)
    ctx, examples = analysis.prepare(cfg, log=console.print)
    res = analysis.analyze(ctx, examples, Path(out or f"results/analysis/{task}"), log=console.print)
    print(to_markdown(res["repetition"]))
    print(to_markdown(res["entropy"]))


@app.command()
@one_line_errors
def replay(task: str = _T, methods: str = typer.Option("bpd,16best-0gram,oracle-k16", help="comma-separated"),
           model: str = _M, heads: int = _H, heads_profile: str = _HP, limit: Optional[int] = _L, offset: int = _O,
           max_new_tokens: Optional[int] = _N, dtype: str = _D, k: int = 16, threads: Optional[int] = _TH,
           data_dir: Optional[str] = _DD, data_file: Optional[str] = _DF, out: Optional[str] = typer.Option(None),
           resume: bool = _RES):
    """Block efficiency of several draft methods replayed on the same greedy trajectories (first = baseline)."""
    from . import analysis
    from .results import to_markdown
    cfg = _analysis_cfg(task, model, heads, heads_profile, limit, offset, max_new_tokens, dtype, k, threads,
                        data_dir, data_file)
    ctx, examples = analysis.prepare(cfg, log=console.print)
    df = analysis.replay_methods(ctx, examples, methods.split(","), Path(out or f"results/replay/{task}"),
                                 log=console.print, resume=resume)
    print(to_markdown(df))


@app.command()
@one_line_errors
def tune(task: str = _T, rescorer: str = typer.Option(..., help="rescorer to tune"), model: str = _M,
         heads: int = _H, heads_profile: str = _HP, limit: Optional[int] = typer.Option(20, help="held-out examples"),
         max_new_tokens: Optional[int] = _N, dtype: str = _D, k: int = 16, threads: Optional[int] = _TH,
         data_dir: Optional[str] = _DD, data_file: Optional[str] = _DF):
    """Pick alpha on the task's held-out slice (never evaluated) and store it in results/alpha.json."""
    from . import analysis
    cfg = _analysis_cfg(task, model, heads, heads_profile, limit, 0, max_new_tokens, dtype, k, threads,
                        data_dir, data_file)
    ctx, examples = analysis.prepare(cfg, log=console.print, heldout=True)
    res = analysis.tune(ctx, examples, rescorer, log=console.print)
    console.print(f"{task}/{rescorer}: alpha = {res['alpha']} on {res['n_examples']} held-out examples "
                  f"(stored in results/alpha.json)")


@app.command()
@one_line_errors
def regress(baseline: str = typer.Option("results/baseline.json", help="baseline file"),
            update: bool = typer.Option(False, help="re-run the grid and overwrite the baseline")):
    """Re-run the fixed regression grid; exit 1 if block efficiency moved beyond tolerance or a run lost tokens."""
    from .regress import regress as run_regress
    path = Path(baseline)
    if not update and not path.exists():
        raise FileNotFoundError(f"no baseline at {path}; create it with `bpdbench regress --update`")
    failures = run_regress(path, update, log=lambda m: console.print(m, highlight=False))
    if update:
        console.print(f"baseline written to {path}")
    for f in failures:
        console.print(f"[red]REGRESSION[/red] {f}", highlight=False, soft_wrap=True)
    if failures:
        raise typer.Exit(1)
    if not update:
        console.print("regression check passed")


@app.command()
@one_line_errors
def tables(results: str = typer.Option("results", help="results directory")):
    """Rebuild every table under results/tables/ from the result files alone."""
    from .tables import build
    for path in build(Path(results)):
        print(path)


@app.command()
@one_line_errors
def speed(task: str = typer.Option("mt_bench", help="task (mt_bench, spec_bench, prompts, ...)"),
          methods: str = typer.Option("ar,bpd,hf-greedy,hf-pld,hf-assisted",
                                      help="comma-separated: ar, bpd, bpd-t<threshold> (BPD with a draft "
                                           "threshold, e.g. bpd-t0.3), a rescorer name, hf-greedy, hf-pld, "
                                           "hf-assisted (ar, the baseline, always runs)"),
          model: str = _M, heads: int = _H, heads_profile: str = _HP,
          limit: Optional[int] = typer.Option(20, help="prompts"), offset: int = _O,
          per_category: Optional[int] = typer.Option(None, help="first N prompts of each category instead of "
                                                                "--limit (Spec-Bench)"),
          repeats: int = typer.Option(3, help="timed repeats per prompt and method (median kept)"),
          max_new_tokens: int = typer.Option(128, help="max new tokens"), dtype: str = _D,
          device: str = typer.Option("cpu", help="cpu | cuda | auto"), threads: Optional[int] = _TH,
          k: int = typer.Option(16, help="lattice width for rescorers"),
          assistant: Optional[str] = typer.Option(None, help="hf-assisted draft model (default "
                                                             "qwen2.5-coder-0.5b; smollm2-135m, with universal "
                                                             "assisted decoding, when that is the target)"),
          data_dir: Optional[str] = _DD, data_file: Optional[str] = _DF,
          out: Optional[str] = typer.Option(None, help="default: results/speed/<task>"),
          resume: bool = typer.Option(False, help="keep the prompts an interrupted run already measured")):
    """Wall-clock speedup over our greedy loop (ar) of BPD, rescorers and transformers' generate (greedy, PLD,
    assisted) on identical outputs: speed.jsonl, speed.csv, speed_by_category.csv, config.json."""
    import pandas as pd
    from . import speed as speed_lib
    from .results import to_markdown
    cfg = RunConfig(task=task, model=model, heads=heads, heads_profile=heads_profile, limit=limit, offset=offset,
                    max_new_tokens=max_new_tokens, dtype=dtype, device=device, threads=threads, k=k,
                    data_dir=data_dir, data_file=data_file, out=out)
    out_dir = speed_lib.run(cfg, [m.strip() for m in methods.split(",") if m.strip()], repeats, assistant,
                            per_category, log=lambda m: console.print(m, highlight=False, soft_wrap=True),
                            resume=resume)
    print(to_markdown(pd.read_csv(out_dir / "speed.csv")))
    if (out_dir / "speed_by_category.csv").exists():
        print(to_markdown(pd.read_csv(out_dir / "speed_by_category.csv")))
    console.print(f"results in {out_dir}")


def main() -> None:
    app()


if __name__ == "__main__":
    sys.exit(main())
