"""Typer CLI: a thin layer that turns flags into a RunConfig and calls one library function.

Errors a user can fix are one line, exit code 2, printed before any model loads (the session validates first).
"""
from __future__ import annotations
import sys
from pathlib import Path
from typing import Optional

import typer

from .cli_common import (_A, _AF, _D, _DD, _DEV, _DF, _H, _HP, _HPATH, _K, _L, _M, _N, _NAT, _O, _OUT, _RES, _SEED,
                         _T, _TEMP, _TH, _TOPK, _TOPP, _cfg, _log, app, console, one_line_errors)
from .config import RunConfig
from . import cli_train  # noqa: F401  (registers the training commands on the app)

@app.command()
@one_line_errors
def run(task: str = _T, model: str = _M,
        method: str = typer.Option("bpd", help="method spelling, e.g. bpd, ngram4, medusa, pld, "
                                   "bpd:heads=4,threshold=0.4 (see `bpdbench methods`)"),
        rescorer: str = typer.Option("none", help="alias: --rescorer R is --method R"),
        heads: int = _H, heads_profile: str = _HP, heads_path: Optional[str] = _HPATH, alpha: Optional[float] = _A,
        k: int = _K, draft_threshold: float = typer.Option(0.0, help="verify draft tokens only while the head's "
                                                           "top-1 probability >= this (0: the full block)"),
        limit: Optional[int] = typer.Option(10, help="number of examples"), offset: int = _O,
        max_new_tokens: Optional[int] = _N, dtype: str = _D, device: str = _DEV, threads: Optional[int] = _TH,
        data_dir: Optional[str] = _DD, data_file: Optional[str] = _DF, out: Optional[str] = _OUT,
        resume: bool = typer.Option(False, help="continue an interrupted run in --out"),
        alpha_file: Optional[str] = _AF, no_auto_train: bool = _NAT, temperature: Optional[float] = _TEMP,
        top_p: Optional[float] = _TOPP, top_k: Optional[int] = _TOPK, seed: Optional[int] = _SEED):
    """Decode a task's examples with one method, certify losslessness against greedy, write examples.jsonl +
    summary."""
    from .experiments.plan import prepare
    from .experiments.progress import run_with_progress
    cfg = RunConfig(task=task, model=model, method=method, heads=heads, heads_profile=heads_profile,
                    heads_path=heads_path, rescorer=rescorer, alpha=alpha, k=k, draft_threshold=draft_threshold,
                    limit=limit, offset=offset, max_new_tokens=max_new_tokens, dtype=dtype, device=device,
                    threads=threads, data_dir=data_dir, data_file=data_file, out=out, resume=resume,
                    alpha_file=alpha_file, auto_train=not no_auto_train, temperature=temperature, top_p=top_p,
                    top_k=top_k, seed=seed)
    run_with_progress(prepare(cfg, "run", log=_log), console)


@app.command()
@one_line_errors
def methods(model: str = _M, heads_profile: str = _HP, heads_path: Optional[str] = _HPATH):
    """List every method with what it needs (heads, a rescorer artefact, a second model) and whether that is ready."""
    from .methods import REGISTRY
    cfg = RunConfig(model=model, heads_profile=heads_profile, heads_path=heads_path)
    for spec in REGISTRY.values():
        needs = spec.needs(model, cfg) if spec.needs else []
        state = ", ".join(f"{what} {'ready' if ok else 'MISSING'}" for what, ok in needs) or "nothing"
        params = ",".join(p.name + ("~" if p.auto else "") for p in spec.params)
        print(f"{spec.name:16s} {('[' + params + ']') if params else '':28s} {spec.description}")
        print(f"{'':16s} needs: {state}{'; timed with speed only' if spec.external else ''}")
    print("~: the parameter also takes `auto`, the shape fastest on this machine (docs/methods.md, draft shapes)")


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
    """List the refine stages (each is also a method: `bpdbench methods`)."""
    from .refine import RESCORERS
    for r in RESCORERS.values():
        print(f"{r.name:15s} {r.description}")


@app.command()
@one_line_errors
def oracle(task: str = _T, k: int = typer.Option(16, help="largest k (k = 1, 2, 4, ... up to it)"), model: str = _M,
           heads: int = _H, heads_profile: str = _HP, limit: Optional[int] = _L, offset: int = _O,
           max_new_tokens: Optional[int] = _N, dtype: str = _D, device: str = _DEV, threads: Optional[int] = _TH,
           data_dir: Optional[str] = _DD, data_file: Optional[str] = _DF, out: Optional[str] = _OUT,
           resume: bool = _RES, no_auto_train: bool = _NAT):
    """Oracle block efficiency of the top-k lattice (best achievable path) for k = 1, 2, 4, ..., K: CSV + PNG."""
    from .experiments import commands
    from .experiments.plan import prepare
    cfg = _cfg(task, model, heads, heads_profile, limit, offset, max_new_tokens, dtype, k, threads, data_dir,
               data_file, out, no_auto_train=no_auto_train, device=device)
    commands.oracle(prepare(cfg, "oracle", resume=resume, log=_log), k, _log)


@app.command()
@one_line_errors
def analyze(task: str = _T, model: str = _M, heads: int = _H, heads_profile: str = _HP, limit: Optional[int] = _L,
            offset: int = _O, max_new_tokens: Optional[int] = _N, dtype: str = _D, device: str = _DEV, k: int = _K,
            threads: Optional[int] = _TH, data_dir: Optional[str] = _DD, data_file: Optional[str] = _DF,
            out: Optional[str] = _OUT, no_auto_train: bool = _NAT):
    """Consecutive repetition in drafts (plain vs 2-gram rescored) and per-head entropy / h_max: CSV + PNG."""
    from .experiments import commands
    from .experiments.plan import prepare
    cfg = _cfg(task, model, heads, heads_profile, limit, offset, max_new_tokens, dtype, k, threads, data_dir,
               data_file, out, no_auto_train=no_auto_train, device=device)
    commands.analyze(prepare(cfg, "analyze", log=_log), _log)


@app.command()
@one_line_errors
def replay(task: str = _T, methods: str = typer.Option("bpd,16best-0gram,oracle:k=16", help="comma-separated "
                                                      "method spellings; the first is the baseline"),
           model: str = _M, heads: int = _H, heads_profile: str = _HP, limit: Optional[int] = _L, offset: int = _O,
           max_new_tokens: Optional[int] = _N, dtype: str = _D, device: str = _DEV, k: int = _K,
           threads: Optional[int] = _TH, data_dir: Optional[str] = _DD, data_file: Optional[str] = _DF,
           out: Optional[str] = _OUT, resume: bool = _RES, alpha_file: Optional[str] = _AF, no_auto_train: bool = _NAT,
           temperature: Optional[float] = _TEMP, top_p: Optional[float] = _TOPP, top_k: Optional[int] = _TOPK,
           seed: Optional[int] = _SEED, heads_path: Optional[str] = _HPATH,
           per_category: Optional[int] = typer.Option(None, help="first N examples of each category instead of "
                                                                 "--limit (Spec-Bench), as `speed` selects")):
    """Block efficiency of several methods replayed on the same greedy trajectories (the decode loop's own code).
    Greedy only: at T > 0 the trajectory depends on the draws (use `run --temperature`)."""
    from .experiments import commands
    from .experiments.plan import prepare
    cfg = _cfg(task, model, heads, heads_profile, limit, offset, max_new_tokens, dtype, k, threads, data_dir,
               data_file, out, alpha_file, no_auto_train, heads_path, device, temperature=temperature, top_p=top_p,
               top_k=top_k, seed=seed)
    commands.replay(prepare(cfg, "replay", methods, resume=resume, per_category=per_category, log=_log), _log)


@app.command()
@one_line_errors
def tune(task: str = _T, rescorer: str = typer.Option(..., help="method whose alpha to tune, e.g. ngram4"),
         model: str = _M, heads: int = _H, heads_profile: str = _HP,
         limit: Optional[int] = typer.Option(20, help="held-out examples"), max_new_tokens: Optional[int] = _N,
         dtype: str = _D, device: str = _DEV, k: int = _K, threads: Optional[int] = _TH,
         data_dir: Optional[str] = _DD, data_file: Optional[str] = _DF, alpha_file: Optional[str] = _AF,
         no_auto_train: bool = _NAT):
    """Pick alpha on the task's held-out slice (never evaluated) and store it in the tuned-alpha table."""
    from .experiments import commands
    from .experiments.plan import prepare
    cfg = _cfg(task, model, heads, heads_profile, limit, 0, max_new_tokens, dtype, k, threads, data_dir, data_file,
               None, alpha_file, no_auto_train, device=device)
    commands.tune(prepare(cfg, "tune", rescorer, heldout=True, log=_log), _log)


@app.command()
@one_line_errors
def regress(baseline: str = typer.Option("results/baseline.json", help="baseline file"),
            update: bool = typer.Option(False, help="re-run the grid and overwrite the baseline")):
    """Re-run the fixed regression grid; exit 1 if block efficiency moved beyond tolerance or a run lost tokens."""
    from .experiments import commands
    if commands.regress(Path(baseline), update, _log):
        raise typer.Exit(1)


@app.command()
@one_line_errors
def tables(results: Optional[str] = typer.Option(None, help="results directory (default: the checkout's "
                                                           "results/)")):
    """Rebuild every table under <results>/tables/ from the result files alone."""
    from . import paths
    from .report.tables import build
    root = Path(results) if results else paths.results_root()
    if not root.is_dir():
        raise FileNotFoundError(f"no results directory at {root}; pass --results DIR")
    for path in build(root):
        print(path)


@app.command()
@one_line_errors
def speed(task: str = typer.Option("mt_bench", help="task (mt_bench, spec_bench, prompts, ...)"),
          methods: str = typer.Option("ar,bpd:heads=auto,pld:tokens=auto,hierarchy:candidates=auto,length=auto,"
                                      "hf-greedy,hf-pld,hf-assisted",
                                      help="comma-separated method spellings (`bpdbench methods`); ar, the "
                                           "baseline, always runs; shapes default to auto (sized to this "
                                           "machine; fixed shapes as parameters, e.g. bpd:heads=8)"),
          model: str = _M, heads: int = _H, heads_profile: str = _HP,
          limit: Optional[int] = typer.Option(20, help="prompts"), offset: int = _O,
          per_category: Optional[int] = typer.Option(None, help="first N prompts of each category instead of "
                                                                "--limit (Spec-Bench)"),
          repeats: int = typer.Option(3, help="timed repeats per prompt and method (median kept)"),
          max_new_tokens: int = typer.Option(128, help="max new tokens"), dtype: str = _D, device: str = _DEV,
          threads: Optional[int] = _TH, k: int = _K,
          assistant: Optional[str] = typer.Option(None, help="hf-assisted draft model (short for "
                                                             "hf-assisted:assistant=M)"),
          data_dir: Optional[str] = _DD, data_file: Optional[str] = _DF,
          out: Optional[str] = typer.Option(None, help="default: <results>/speed/<task>"),
          resume: bool = typer.Option(False, help="keep the prompts an interrupted run already measured"),
          alpha_file: Optional[str] = _AF, no_auto_train: bool = _NAT, temperature: Optional[float] = _TEMP,
          top_p: Optional[float] = _TOPP, top_k: Optional[int] = _TOPK, seed: Optional[int] = _SEED,
          heads_path: Optional[str] = _HPATH):
    """Wall-clock speedup over our greedy loop (ar) of every method on identical outputs: speed.jsonl, speed.csv,
    speed_by_category.csv, config.json."""
    from .experiments import commands
    from .experiments.plan import prepare
    cfg = _cfg(task, model, heads, heads_profile, limit, offset, max_new_tokens, dtype, k, threads, data_dir,
               data_file, out, alpha_file, no_auto_train, heads_path, device, temperature=temperature, top_p=top_p,
               top_k=top_k, seed=seed)
    if assistant:
        methods = ",".join(f"hf-assisted:assistant={assistant}" if m == "hf-assisted" else m
                           for m in methods.split(","))
    commands.speed(prepare(cfg, "speed", methods, resume=resume, per_category=per_category, log=_log), repeats,
                   _log)


@app.command()
@one_line_errors
def sweep(grid: str = typer.Argument(..., help="grid file (TOML), e.g. grids/reference.toml"),
          address: str = typer.Option("local", help="local (start Ray here), auto (the cluster this machine joined "
                                                    "with `ray start`) or ray://<head>:10001"),
          cpus: Optional[int] = typer.Option(None, help="CPUs of a local Ray instance (default: all); cells run "
                                                        "cpus // threads at a time"),
          threads: Optional[int] = typer.Option(None, help="torch threads (= Ray CPUs) per cell; overrides the grid"),
          limit: Optional[int] = typer.Option(None, help="cap every cell's examples (a reduced run of the grid)"),
          results: Optional[str] = typer.Option(None, help="results root (default: the grid's, else the checkout's "
                                                           "results/)"),
          cache: Optional[str] = typer.Option(None, help="cache root for every worker (default: the grid's, else "
                                                         "each worker's $BPDBENCH_CACHE or ~/.cache/bpdbench)"),
          data: Optional[str] = typer.Option(None, help="data root for every worker (default: the grid's, else "
                                                        "each worker's $BPDBENCH_DATA or ../shared/data)"),
          dry_run: bool = typer.Option(False, "--dry-run", help="list the cells, what is finished and what each "
                                                                  "waits for; run nothing")):
    """Run a grid of run/replay/oracle/analyze/tune/speed cells as Ray tasks; finished cells and examples are kept,
    failed cells are retried and reported (exit 1), results land in one tree that `bpdbench tables` reads."""
    from .sweep import driver, grid as grid_lib
    if cpus is not None and cpus < 1:
        raise ValueError(f"--cpus must be >= 1, got {cpus}")
    driver.check_address(address)
    plan = grid_lib.load(Path(grid), results, cache, data, threads, limit)
    if dry_run:
        driver.show(plan)
        return
    try:
        report = driver.run(plan, address, cpus, _log)
    except KeyboardInterrupt:          # the driver said what is kept and how to continue
        raise typer.Exit(130)
    if driver.exit_code(report):
        raise typer.Exit(1)


@app.command()
@one_line_errors
def certify(method: str = typer.Option(..., help="method spelling(s), comma-separated (`bpdbench methods`)"),
            temperature: float = typer.Option(..., "--temperature", help="sampling temperature (> 0)"),
            top_p: Optional[float] = _TOPP, top_k: Optional[int] = _TOPK, seed: Optional[int] = _SEED,
            rules: str = typer.Option("exact", help="acceptance rules to test, comma-separated: exact, and the lossy "
                                      "controls always-accept, no-residual (they should fail)"),
            samples: int = typer.Option(300, help="samples per side (AR and method) per prompt"),
            positions: int = typer.Option(4, help="generated positions tested per prompt"),
            level: float = typer.Option(0.01, help="family-wise false-alarm rate per method and rule (Holm)"),
            task: str = typer.Option("mt_bench", help="task whose prompts are used"), model: str = _M,
            heads: int = _H, heads_profile: str = _HP, limit: Optional[int] = typer.Option(3, help="prompts"),
            offset: int = _O, max_new_tokens: Optional[int] = typer.Option(None, help="tokens decoded per sample "
                                                                            "(default: --positions)"),
            dtype: str = _D, device: str = _DEV, k: int = _K, threads: Optional[int] = _TH,
            data_dir: Optional[str] = _DD, data_file: Optional[str] = _DF, out: Optional[str] = _OUT,
            alpha_file: Optional[str] = _AF, no_auto_train: bool = _NAT):
    """Two-sample chi-square test per prompt and position between AR sampling and a method's sampling (distinct
    seeds): certify.json / certify.csv / certify_summary.csv / samples.jsonl. Exit 1 when an exact rule fails."""
    from .experiments.plan import prepare
    from .experiments.sampling_certificate import certify as run_certify
    cfg = _cfg(task, model, heads, heads_profile, limit, offset, max_new_tokens, dtype, k, threads, data_dir,
               data_file, out, alpha_file, no_auto_train, device=device, temperature=temperature, top_p=top_p,
               top_k=top_k, seed=seed)
    res = run_certify(prepare(cfg, "certify", method, log=_log), rules, samples, positions, level, _log)
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


@app.command()
@one_line_errors
def calibrate(model: str = _M, dtype: str = _D, device: str = _DEV, threads: Optional[int] = _TH,
              show: bool = typer.Option(False, "--show", help="print the curve and write its PNG (+ a JSON copy)"),
              force: bool = typer.Option(False, "--force", help="measure again although this machine has a curve"),
              out: Optional[str] = typer.Option(None, help="folder for the PNG and the JSON copy (default: "
                                                           "<results>/calibration/<fingerprint key>/)")):
    """What one forward over n tokens costs on this machine, in decode steps (chain and tree, per context),
    measured once per machine fingerprint, model and dtype (about a minute) and cached; --show prints and plots it."""
    from .cli_common import _threads
    from .experiments.artefacts import check_model_files
    from .hardware import calibration as lib
    from .models import resolve_device
    cfg = RunConfig(model=model, dtype=dtype, device=device, threads=threads).validate()
    check_model_files(cfg.model, cfg.dtype)
    _threads(threads)
    from .models import load
    cal = lib.ensure(cfg.model, cfg.dtype, resolve_device(cfg.device), threads, log=_log, force=force,
                     loader=lambda dt, dev: load(cfg.model, dt, dev)[0])
    path = lib.cache_path(cal.model, cal.dtype, cal.device, cal.threads)
    if not (show or out):
        print(f"{cal.model} {cal.dtype}: one step {cal.step_ms:.1f} ms, 16 tokens {cal.cost(16):.2f} steps, "
              f"64 tokens {cal.cost(64):.2f} steps; {path}")
        return
    from .report.calibration_plot import plot_calibration, show_table
    folder = Path(out) if out else lib.results_dir(cal)
    folder.mkdir(parents=True, exist_ok=True)
    lib.save(cal, folder / path.name)
    png = plot_calibration(cal, folder / path.with_suffix(".png").name)
    if show:
        show_table(cal)
    _log(f"cached: {path}\nwritten: {png}, {folder / path.name}")


@app.command("alpha-law")
@one_line_errors
def alpha_law(task: str = typer.Option("mt_bench", help="task"), model: str = _M,
              draft: Optional[str] = typer.Option(None, help="sps draft model (default: sps's default for --model)"),
              gamma_max: int = typer.Option(8, help="draft length decoded; gamma = 1..this are measured"),
              temperatures: str = typer.Option("0,0.7,1.0", help="comma-separated temperatures (0: greedy)"),
              limit: Optional[int] = typer.Option(4, help="prompts"), offset: int = _O,
              max_new_tokens: Optional[int] = typer.Option(64, help="tokens per prompt"), dtype: str = _D,
              device: str = _DEV, threads: Optional[int] = _TH, seed: Optional[int] = _SEED,
              data_dir: Optional[str] = _DD,
              data_file: Optional[str] = _DF, out: Optional[str] = _OUT, no_auto_train: bool = _NAT):
    """Measured tokens per target call of a draft-model chain (sps) vs (1 - a^(g+1)) / (1 - a) for g = 1..gamma-max
    at each temperature: alpha_law.csv / .md / .png."""
    from .experiments import alpha_law as lib
    try:
        temps = tuple(float(t) for t in temperatures.split(",") if t.strip())
    except ValueError:
        raise ValueError(f"--temperatures must be comma-separated numbers, got {temperatures!r}") from None
    from .experiments.plan import prepare
    spelling = lib.spelling(draft, gamma_max)
    cfg = RunConfig(task=task, model=model, method=spelling, limit=limit, offset=offset,
                    max_new_tokens=max_new_tokens, dtype=dtype, device=device, threads=threads, seed=seed,
                    data_dir=data_dir, data_file=data_file, out=out, auto_train=not no_auto_train)
    path = lib.run(prepare(cfg, "alpha_law", [spelling], log=_log), gamma_max, temps, _log)
    print((path / "alpha_law.md").read_text())
    _log(f"results in {path}")


def main() -> None:
    app()


if __name__ == "__main__":
    sys.exit(main())
