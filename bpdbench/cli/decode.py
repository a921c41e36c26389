"""The commands that decode: run, replay, oracle, analyze, tune, speed, certify, alpha-law.

Each turns its flags into one RunConfig, lets experiments.plan.prepare validate it (so a mistake is one line before
any model loads), and hands the plan to one library function. All of them load a model, so all take `--device` and
`--threads`; the flags they share are the types of `options.py`, and an option that reads differently here (what
`--limit` counts, certify's task) is spelled inline with its own help.
"""
from __future__ import annotations

from typing import Annotated, Optional

import typer

from .errors import console, log, one_line_errors
from .options import (DEFAULT_MODEL, Alpha, AlphaFile, DataDir, DataFile, Device, Dtype, Heads, HeadsPath,
                      HeadsProfile, K, Limit, MaxNewTokens, Model, NoAutoTrain, Offset, Out, Resume, Seed, Task,
                      Temperature, Threads, TopK, TopP, run_config)

PromptLimit = Annotated[Optional[int], typer.Option(help="prompts")]   # --limit where a command counts prompts


@one_line_errors
def run(task: Task = "xsum", model: Model = DEFAULT_MODEL,
        method: Annotated[str, typer.Option(help="method spelling, e.g. bpd, ngram4, medusa, pld, "
                                                 "bpd:heads=4,threshold=0.4 (see `bpdbench methods`)")] = "bpd",
        rescorer: Annotated[str, typer.Option(help="alias: --rescorer R is --method R")] = "none",
        heads: Heads = 8, heads_profile: HeadsProfile = "quick", heads_path: HeadsPath = None, alpha: Alpha = None,
        k: K = 16,
        draft_threshold: Annotated[float, typer.Option(help="verify draft tokens only while the head's top-1 "
                                                            "probability >= this (0: the full block)")] = 0.0,
        limit: Annotated[Optional[int], typer.Option(help="number of examples")] = 10, offset: Offset = 0,
        max_new_tokens: MaxNewTokens = None, dtype: Dtype = "auto", device: Device = "cpu", threads: Threads = None,
        data_dir: DataDir = None, data_file: DataFile = None, out: Out = None,
        resume: Annotated[bool, typer.Option(help="continue an interrupted run in --out")] = False,
        alpha_file: AlphaFile = None, no_auto_train: NoAutoTrain = False, temperature: Temperature = None,
        top_p: TopP = None, top_k: TopK = None, seed: Seed = None) -> None:
    """Decode a task's examples with one method, certify losslessness against greedy, write examples.jsonl +
    summary."""
    from ..experiments.plan import prepare
    from ..experiments.progress import run_with_progress
    cfg = run_config(task=task, model=model, method=method, heads=heads, heads_profile=heads_profile,
                     heads_path=heads_path, rescorer=rescorer, alpha=alpha, k=k, draft_threshold=draft_threshold,
                     limit=limit, offset=offset, max_new_tokens=max_new_tokens, dtype=dtype, device=device,
                     threads=threads, data_dir=data_dir, data_file=data_file, out=out, resume=resume,
                     alpha_file=alpha_file, no_auto_train=no_auto_train, temperature=temperature, top_p=top_p,
                     top_k=top_k, seed=seed)
    run_with_progress(prepare(cfg, "run", log=log), console)


@one_line_errors
def oracle(task: Task = "xsum",
           k: Annotated[int, typer.Option(help="largest k (k = 1, 2, 4, ... up to it)")] = 16,
           model: Model = DEFAULT_MODEL, heads: Heads = 8, heads_profile: HeadsProfile = "quick", limit: Limit = 30,
           offset: Offset = 0, max_new_tokens: MaxNewTokens = None, dtype: Dtype = "auto", device: Device = "cpu",
           threads: Threads = None, data_dir: DataDir = None, data_file: DataFile = None, out: Out = None,
           resume: Resume = False, no_auto_train: NoAutoTrain = False) -> None:
    """Oracle block efficiency of the top-k lattice (best achievable path) for k = 1, 2, 4, ..., K: CSV + PNG."""
    from ..experiments.execute import execute
    from ..experiments.plan import prepare
    cfg = run_config(task=task, model=model, heads=heads, heads_profile=heads_profile, limit=limit, offset=offset,
                     max_new_tokens=max_new_tokens, dtype=dtype, k=k, threads=threads, data_dir=data_dir,
                     data_file=data_file, out=out, no_auto_train=no_auto_train, device=device)
    execute(prepare(cfg, "oracle", resume=resume, log=log), log)


@one_line_errors
def analyze(task: Task = "xsum", model: Model = DEFAULT_MODEL, heads: Heads = 8, heads_profile: HeadsProfile = "quick",
            limit: Limit = 30, offset: Offset = 0, max_new_tokens: MaxNewTokens = None, dtype: Dtype = "auto",
            device: Device = "cpu", k: K = 16, threads: Threads = None, data_dir: DataDir = None,
            data_file: DataFile = None, out: Out = None, no_auto_train: NoAutoTrain = False) -> None:
    """Consecutive repetition in drafts (plain vs 2-gram rescored) and per-head entropy / h_max: CSV + PNG."""
    from ..experiments.execute import execute
    from ..experiments.plan import prepare
    cfg = run_config(task=task, model=model, heads=heads, heads_profile=heads_profile, limit=limit, offset=offset,
                     max_new_tokens=max_new_tokens, dtype=dtype, k=k, threads=threads, data_dir=data_dir,
                     data_file=data_file, out=out, no_auto_train=no_auto_train, device=device)
    execute(prepare(cfg, "analyze", log=log), log)


@one_line_errors
def replay(task: Task = "xsum",
           methods: Annotated[str, typer.Option(help="comma-separated method spellings; the first is the "
                                                     "baseline")] = "bpd,16best-0gram,oracle:k=16",
           model: Model = DEFAULT_MODEL, heads: Heads = 8, heads_profile: HeadsProfile = "quick", limit: Limit = 30,
           offset: Offset = 0, max_new_tokens: MaxNewTokens = None, dtype: Dtype = "auto", device: Device = "cpu",
           k: K = 16, threads: Threads = None, data_dir: DataDir = None, data_file: DataFile = None, out: Out = None,
           resume: Resume = False, alpha_file: AlphaFile = None, no_auto_train: NoAutoTrain = False,
           temperature: Temperature = None, top_p: TopP = None, top_k: TopK = None, seed: Seed = None,
           heads_path: HeadsPath = None,
           per_category: Annotated[Optional[int], typer.Option(help="first N examples of each category instead of "
                                                                    "--limit (Spec-Bench), as `speed` "
                                                                    "selects")] = None) -> None:
    """Block efficiency of several methods replayed on the same greedy trajectories (the decode loop's own code).
    Greedy only: at T > 0 the trajectory depends on the draws (use `run --temperature`)."""
    from ..experiments.execute import execute
    from ..experiments.plan import prepare
    cfg = run_config(task=task, model=model, heads=heads, heads_profile=heads_profile, limit=limit, offset=offset,
                     max_new_tokens=max_new_tokens, dtype=dtype, k=k, threads=threads, data_dir=data_dir,
                     data_file=data_file, out=out, alpha_file=alpha_file, no_auto_train=no_auto_train,
                     heads_path=heads_path, device=device, temperature=temperature, top_p=top_p, top_k=top_k,
                     seed=seed)
    execute(prepare(cfg, "replay", methods, resume=resume, per_category=per_category, log=log), log)


@one_line_errors
def tune(task: Task = "xsum",
         rescorer: Annotated[str, typer.Option(help="method whose alpha to tune, e.g. ngram4")] = ...,
         model: Model = DEFAULT_MODEL, heads: Heads = 8, heads_profile: HeadsProfile = "quick",
         limit: Annotated[Optional[int], typer.Option(help="held-out examples")] = 20,
         max_new_tokens: MaxNewTokens = None, dtype: Dtype = "auto", device: Device = "cpu", k: K = 16,
         threads: Threads = None, data_dir: DataDir = None, data_file: DataFile = None, alpha_file: AlphaFile = None,
         no_auto_train: NoAutoTrain = False) -> None:
    """Pick alpha on the task's held-out slice (never evaluated) and store it in the tuned-alpha table."""
    from ..experiments.execute import execute
    from ..experiments.plan import prepare
    cfg = run_config(task=task, model=model, heads=heads, heads_profile=heads_profile, limit=limit, offset=0,
                     max_new_tokens=max_new_tokens, dtype=dtype, k=k, threads=threads, data_dir=data_dir,
                     data_file=data_file, out=None, alpha_file=alpha_file, no_auto_train=no_auto_train,
                     device=device)
    execute(prepare(cfg, "tune", rescorer, split="tune", log=log), log)


@one_line_errors
def speed(task: Annotated[str, typer.Option(help="task (mt_bench, spec_bench, prompts, ...)")] = "mt_bench",
          methods: Annotated[str, typer.Option(help="comma-separated method spellings (`bpdbench methods`); ar, the "
                                                    "baseline, always runs; shapes default to auto (sized to this "
                                                    "machine; fixed shapes as parameters, e.g. bpd:heads=8)")]
          = "ar,bpd:heads=auto,pld:tokens=auto,hierarchy:candidates=auto,length=auto,hf-greedy,hf-pld,hf-assisted",
          model: Model = DEFAULT_MODEL, heads: Heads = 8, heads_profile: HeadsProfile = "quick",
          limit: PromptLimit = 20, offset: Offset = 0,
          per_category: Annotated[Optional[int], typer.Option(help="first N prompts of each category instead of "
                                                                   "--limit (Spec-Bench)")] = None,
          prompts: Annotated[Optional[str], typer.Option(help="a draw file (`bpdbench draw`): exactly its eval "
                                                              "prompts, in its order")] = None,
          turns: Annotated[Optional[int], typer.Option(help="decode the first N turns of multi-turn questions, "
                                                            "each after the model's own greedy answers (MT-Bench: "
                                                            "2, as Spec-Bench)")] = None,
          repeats: Annotated[int, typer.Option(help="timed repeats per prompt and method (median kept)")] = 3,
          max_new_tokens: Annotated[int, typer.Option(help="max new tokens")] = 128, dtype: Dtype = "auto",
          device: Device = "cpu", threads: Threads = None, k: K = 16,
          assistant: Annotated[Optional[str], typer.Option(help="hf-assisted draft model (short for "
                                                                "hf-assisted:assistant=M)")] = None,
          data_dir: DataDir = None, data_file: DataFile = None,
          out: Annotated[Optional[str], typer.Option(help="default: <results>/speed/<task>")] = None,
          resume: Annotated[bool, typer.Option(help="keep the prompts an interrupted run already measured")] = False,
          alpha_file: AlphaFile = None, no_auto_train: NoAutoTrain = False, temperature: Temperature = None,
          top_p: TopP = None, top_k: TopK = None, seed: Seed = None, heads_path: HeadsPath = None) -> None:
    """Wall-clock speedup over our greedy loop (ar) of every method on identical outputs: speed.jsonl, speed.csv,
    speed_by_category.csv, speed_by_subtask.csv, config.json."""
    from ..experiments.execute import execute
    from ..experiments.plan import prepare
    cfg = run_config(task=task, model=model, heads=heads, heads_profile=heads_profile, limit=limit, offset=offset,
                     max_new_tokens=max_new_tokens, dtype=dtype, k=k, threads=threads, data_dir=data_dir,
                     data_file=data_file, out=out, alpha_file=alpha_file, no_auto_train=no_auto_train,
                     heads_path=heads_path, device=device, temperature=temperature, top_p=top_p, top_k=top_k,
                     seed=seed, prompts=prompts, turns=turns)
    if assistant:
        if "hf-assisted" not in methods.split(","):
            raise ValueError(f"--assistant {assistant} names hf-assisted's draft model, but --methods has no plain "
                             f"hf-assisted; add it, or spell hf-assisted:assistant={assistant} in --methods")
        methods = ",".join(f"hf-assisted:assistant={assistant}" if m == "hf-assisted" else m
                           for m in methods.split(","))
    from ..experiments.plan import SpeedOptions
    execute(prepare(cfg, "speed", methods, resume=resume, per_category=per_category, log=log,
                    options=SpeedOptions(repeats)), log)


@one_line_errors
def certify(method: Annotated[str, typer.Option(help="method spelling(s), comma-separated (`bpdbench "
                                                     "methods`)")] = ...,
            temperature: Annotated[float, typer.Option("--temperature", help="sampling temperature (> 0)")] = ...,
            top_p: TopP = None, top_k: TopK = None, seed: Seed = None,
            rules: Annotated[str, typer.Option(help="acceptance rules to test, comma-separated: exact, and the lossy "
                                                    "controls always-accept, no-residual (they should "
                                                    "fail)")] = "exact",
            samples: Annotated[int, typer.Option(help="samples per side (AR and method) per prompt")] = 300,
            positions: Annotated[int, typer.Option(help="generated positions tested per prompt")] = 4,
            level: Annotated[float, typer.Option(help="family-wise false-alarm rate per method and rule "
                                                      "(Holm)")] = 0.01,
            task: Annotated[str, typer.Option(help="task whose prompts are used")] = "mt_bench",
            model: Model = DEFAULT_MODEL, heads: Heads = 8, heads_profile: HeadsProfile = "quick",
            limit: PromptLimit = 3, offset: Offset = 0,
            max_new_tokens: Annotated[Optional[int], typer.Option(help="tokens decoded per sample (default: "
                                                                       "--positions)")] = None,
            dtype: Dtype = "auto", device: Device = "cpu", k: K = 16, threads: Threads = None,
            data_dir: DataDir = None, data_file: DataFile = None, out: Out = None, alpha_file: AlphaFile = None,
            no_auto_train: NoAutoTrain = False) -> None:
    """Two-sample chi-square test per prompt and position between AR sampling and a method's sampling (distinct
    seeds): certify.json / certify.csv / certify_summary.csv / samples.jsonl. Exit 1 when an exact rule fails."""
    from ..experiments.execute import execute
    from ..experiments.plan import CertifyOptions, prepare
    cfg = run_config(task=task, model=model, heads=heads, heads_profile=heads_profile, limit=limit, offset=offset,
                     max_new_tokens=max_new_tokens, dtype=dtype, k=k, threads=threads, data_dir=data_dir,
                     data_file=data_file, out=out, alpha_file=alpha_file, no_auto_train=no_auto_train,
                     device=device, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
    res = execute(prepare(cfg, "certify", method, log=log,
                          options=CertifyOptions(tuple(r.strip() for r in rules.split(",") if r.strip()), samples,
                                                 positions, level)), log)
    failed = False
    for f in res["families"]:
        verdict = "PASS" if f["passed"] else "FAIL"
        if f["lossy"]:
            verdict = "not detected (no power here)" if f["passed"] else "detected as lossy"
        print(f"{f['method']} rule={f['rule']}{' (lossy control)' if f['lossy'] else ''}: {verdict} "
              f"({f['rejections']}/{f['n_tests']} tests rejected at family-wise {res['level']:g}, "
              f"min p = {f['min_p']:.3g})")
        failed |= not f["passed"] and not f["lossy"]
    if failed:
        raise typer.Exit(1)


@one_line_errors
def alpha_law(task: Annotated[str, typer.Option(help="task")] = "mt_bench", model: Model = DEFAULT_MODEL,
              draft: Annotated[Optional[str], typer.Option(help="sps draft model (default: sps's default for "
                                                                "--model)")] = None,
              gamma_max: Annotated[int, typer.Option(help="draft length decoded; gamma = 1..this are "
                                                          "measured")] = 8,
              temperatures: Annotated[str, typer.Option(help="comma-separated temperatures (0: "
                                                             "greedy)")] = "0,0.7,1.0",
              limit: PromptLimit = 4, offset: Offset = 0,
              max_new_tokens: Annotated[Optional[int], typer.Option(help="tokens per prompt")] = 64,
              dtype: Dtype = "auto", device: Device = "cpu", threads: Threads = None, seed: Seed = None,
              data_dir: DataDir = None, data_file: DataFile = None, out: Out = None,
              no_auto_train: NoAutoTrain = False) -> None:
    """Measured tokens per target call of a draft-model chain (sps) vs (1 - a^(g+1)) / (1 - a) for g = 1..gamma-max
    at each temperature: alpha_law.csv / .md / .png."""
    from ..experiments import alpha_law as lib
    try:
        temps = tuple(float(t) for t in temperatures.split(",") if t.strip())
    except ValueError:
        raise ValueError(f"--temperatures must be comma-separated numbers, got {temperatures!r}") from None
    from ..experiments.execute import execute
    from ..experiments.plan import AlphaLawOptions, prepare
    spelling = lib.spelling(draft, gamma_max)
    cfg = run_config(task=task, model=model, method=spelling, limit=limit, offset=offset,
                     max_new_tokens=max_new_tokens, dtype=dtype, device=device, threads=threads, seed=seed,
                     data_dir=data_dir, data_file=data_file, out=out, no_auto_train=no_auto_train)
    execute(prepare(cfg, "alpha_law", [spelling], log=log, options=AlphaLawOptions(gamma_max, temps)), log)
