"""The commands around result folders rather than one decode: tables, regress, sweep, calibrate.

`tables` reads result files only; `regress` and `sweep` run many decoding cells (the fixed regression grid, a grid
file on Ray) whose settings come from their grid, not from decoding flags; `calibrate` measures this machine's
forward costs, which `speed`'s predictions and the auto shapes read.
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ..config import RunConfig
from .errors import log, one_line_errors
from .options import DEFAULT_MODEL, Device, Dtype, Model, Threads, set_threads


@one_line_errors
def regress(baseline: Annotated[str, typer.Option(help="baseline file")] = "results/baseline.json",
            update: Annotated[bool, typer.Option(help="re-run the grid and overwrite the baseline")] = False) -> None:
    """Re-run the fixed regression grid; exit 1 if block efficiency moved beyond tolerance or a run lost tokens."""
    from ..experiments import regress as lib
    if lib.check(Path(baseline), update, log):
        raise typer.Exit(1)


@one_line_errors
def tables(results: Annotated[Optional[str], typer.Option(help="results directory (default: the checkout's "
                                                               "results/)")] = None) -> None:
    """Rebuild every table under <results>/tables/ from the result files alone."""
    from .. import paths
    from ..report.tables import build
    root = Path(results) if results else paths.results_root()
    if not root.is_dir():
        raise FileNotFoundError(f"no results directory at {root}; pass --results DIR")
    for path in build(root):
        print(path)


@one_line_errors
def sweep(grid: Annotated[str, typer.Argument(help="grid file (TOML), e.g. grids/reference.toml")],
          address: Annotated[str, typer.Option(help="local (start Ray here), auto (the cluster this machine joined "
                                                    "with `ray start`) or ray://<head>:10001")] = "local",
          cpus: Annotated[Optional[int], typer.Option(help="CPUs of a local Ray instance (default: all); cells run "
                                                           "cpus // threads at a time")] = None,
          threads: Annotated[Optional[int], typer.Option(help="torch threads (= Ray CPUs) per cell; overrides the "
                                                              "grid")] = None,
          limit: Annotated[Optional[int], typer.Option(help="cap every cell's examples (a reduced run of the "
                                                            "grid)")] = None,
          results: Annotated[Optional[str], typer.Option(help="results root (default: the grid's, else the "
                                                              "checkout's results/)")] = None,
          cache: Annotated[Optional[str], typer.Option(help="cache root for every worker (default: the grid's, else "
                                                            "each worker's $BPDBENCH_CACHE or "
                                                            "~/.cache/bpdbench)")] = None,
          data: Annotated[Optional[str], typer.Option(help="data root for every worker (default: the grid's, else "
                                                           "each worker's $BPDBENCH_DATA or ../shared/data)")] = None,
          dry_run: Annotated[bool, typer.Option("--dry-run", help="list the cells, what is finished and what each "
                                                                  "waits for; run nothing")] = False,
          only: Annotated[Optional[list[str]], typer.Option(help="run only the cells whose id matches (shell "
                                                                 "wildcards, repeatable: --only 'tune:*'), with what "
                                                                 "they wait for")] = None) -> None:
    """Run a grid of run/replay/oracle/analyze/tune/speed/alpha_law/certify cells as Ray tasks; finished cells and examples are kept,
    failed cells are retried and reported (exit 1), results land in one tree that `bpdbench tables` reads."""
    from ..sweep import driver, grid as grid_lib
    if cpus is not None and cpus < 1:
        raise ValueError(f"--cpus must be >= 1, got {cpus}")
    driver.check_address(address)
    plan = grid_lib.only(grid_lib.load(Path(grid), results, cache, data, threads, limit), only or [])
    if dry_run:
        driver.show(plan)
        return
    try:
        report = driver.run(plan, address, cpus, log)
    except KeyboardInterrupt:          # the driver said what is kept and how to continue
        raise typer.Exit(130)
    if driver.exit_code(report):
        raise typer.Exit(1)


@one_line_errors
def calibrate(model: Model = DEFAULT_MODEL, dtype: Dtype = "auto", device: Device = "cpu", threads: Threads = None,
              show: Annotated[bool, typer.Option("--show", help="print the curve and write its PNG (+ a JSON "
                                                                "copy)")] = False,
              force: Annotated[bool, typer.Option("--force", help="measure again although this machine has a "
                                                                  "curve")] = False,
              out: Annotated[Optional[str], typer.Option(help="folder for the PNG and the JSON copy (default: "
                                                              "<results>/calibration/<fingerprint key>/)")] = None
              ) -> None:
    """What one forward over n tokens costs on this machine, in decode steps (chain and tree, per context),
    measured once per machine fingerprint, model and dtype (a few minutes) and cached; --show prints and plots it."""
    from ..artefacts.checks import check_model_files
    from ..hardware import calibration as lib
    from ..models import resolve_device
    cfg = RunConfig(model=model, dtype=dtype, device=device, threads=threads).validate()
    check_model_files(cfg.model, cfg.dtype)
    set_threads(threads)
    from ..models import load
    cal = lib.ensure(cfg.model, cfg.dtype, resolve_device(cfg.device), threads, log=log, force=force,
                     loader=lambda dt, dev: load(cfg.model, dt, dev)[0])
    path = lib.cache_path(cal.model, cal.dtype, cal.device, cal.threads)
    if not (show or out):
        print(f"{cal.model} {cal.dtype}: one step {cal.step_ms:.1f} ms, 16 tokens {cal.cost(16):.2f} steps, "
              f"64 tokens {cal.cost(64):.2f} steps; {path}")
        return
    from ..report.calibration_plot import plot_calibration, show_table
    folder = Path(out) if out else lib.results_dir(cal)
    folder.mkdir(parents=True, exist_ok=True)
    lib.save(cal, folder / path.name)
    png = plot_calibration(cal, folder / path.with_suffix(".png").name)
    if show:
        show_table(cal)
        _show_llamacpp(cfg.model, cal)
    log(f"cached: {path}\nwritten: {png}, {folder / path.name}")


def _show_llamacpp(model: str, cal) -> None:
    """llama.cpp's verify curve on this machine beside ours, where a speed run with llama.cpp rows cached one."""
    from ..hardware import engine_curve
    from ..models import MODELS
    from ..nets.llamacpp import available, version
    if model not in MODELS or not available():
        return
    curve = engine_curve.cached(model, MODELS[model].sha256, version(), cal.threads)
    if curve is None:
        log("llama.cpp's verify curve: not measured on this machine yet (a speed run with llamacpp rows measures "
            "it)")
        return
    from ..report.engines import show
    show(curve, cal)


@one_line_errors
def audit(results: Annotated[Optional[str], typer.Option(help="results directory (default: the checkout's "
                                                              "results/)")] = None,
          strict: Annotated[bool, typer.Option("--strict", help="exit 1 when any folder overlaps train or "
                                                                "tune")] = False) -> None:
    """Per result folder: how many evaluated examples lie in the train or tune split, or were seen by an artefact."""
    from .. import paths
    from ..experiments import audit as audits
    root = Path(results) if results else paths.results_root()
    if not root.is_dir():
        raise FileNotFoundError(f"no results directory at {root}; pass --results DIR")
    found = audits.tree(root)
    print(f"{'folder':58} {'task':14} {'n':>5} {'train':>6} {'tune':>5} {'artefacts':>9}  verdict")
    for rel, a in found.items():
        if "error" in a:
            print(f"{rel:58} {a['task']:14} {'-':>5} {'-':>6} {'-':>5} {'-':>9}  unknown ({a['error']})")
            continue
        unknown = [x["why"] for x in a["artefacts"].values() if x["overlap"] is None]
        seen = "?" if unknown else str(sum(x["overlap"] for x in a["artefacts"].values()))
        print(f"{rel:58} {a['task']:14} {a['evaluated']:5d} {a['in_train']:6d} {a['in_tune']:5d} {seen:>9}  "
              f"{'clean' if a['clean'] else 'OVERLAP'}{f' (unknown: {unknown[0]})' if unknown else ''}")
    dirty = [r for r, a in found.items() if not a["clean"]]
    print(f"{len(found)} folders, {len(found) - len(dirty)} clean, {len(dirty)} with overlap ({audits.RULE})")
    if strict and dirty:
        raise typer.Exit(1)


@one_line_errors
def draw(task: Annotated[str, typer.Option(help="task whose eval prompts to draw")] = "spec_bench",
         per_subtask: Annotated[int, typer.Option(help="prompts per subtask (Spec-Bench: each of its 6 tasks)")] = 8,
         seed: Annotated[int, typer.Option(help="the draw's seed (recorded in the file)")] = 0,
         exclude: Annotated[Optional[list[str]], typer.Option(help="another draw file whose prompts to leave out "
                                                                   "(repeatable): a replication draw")] = None,
         out: Annotated[str, typer.Option(help="the draw file to write, e.g. grids/draws/spec_bench-board.json")]
         = ...,
         results: Annotated[Optional[str], typer.Option(help="results directory whose evaluated prompts are left "
                                                             "out (default: the checkout's results/)")] = None) -> None:
    """Draw a board's prompts once: eval prompts no committed folder evaluated, the same number per subtask."""
    from .. import paths
    from ..experiments import draw as draws
    root = Path(results) if results else paths.results_root()
    if not root.is_dir():
        raise FileNotFoundError(f"no results directory at {root}; pass --results DIR")
    target = Path(out)
    skip = frozenset()
    if target.exists():          # drawing again: the folders made from this very draw are not "others"
        skip = frozenset(draws.made_from(root, target))
    left_out = draws.evaluated(root, task, skip)
    for other in exclude or []:
        left_out |= set(draws.read(other, task))
    made = draws.make(task, per_subtask, seed, left_out)
    draws.write(made, target)
    counts = {s: list(made.subtasks.values()).count(s) for s in sorted(set(made.subtasks.values()))}
    print(f"{target}: {len(made.ids)} prompts ({', '.join(f'{k} {v}' for k, v in counts.items())}), seed {seed}; "
          f"{made.excluded} eval prompts left out as already evaluated or excluded")
