"""Per command (experiments/commands.py COMMANDS): the cells one grid block expands into, their plan (prepared once,
on the driver), the call a worker makes, and when a cell's results already exist ("finished": its summary file
exists and its config.json matches the cell).

The driver parses a cell's spellings once (`parse_cell`) and prepares its Plan once (`plan_cell`: validated config,
parsed methods, selected examples), as the CLI prepares the command's; the worker runs that Plan through the
CLI's own entry (experiments.execute.execute), always with `resume`, so a cell interrupted
mid-way keeps the examples it finished (and for run, replay and oracle a larger `limit` only adds the rest). Only
the artefact files are checked on the worker, since the sweep's own tasks build them after the driver planned.
Every difference between commands is a field of their CommandSpec; nothing here tests a command's name.
"""
from __future__ import annotations

import dataclasses
import json
import re
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

from ..config import ConfigError, RunConfig
from ..experiments.command import CommandSpec, Plan
from ..methods import Method
from ..refine import tuned_on_tune_split

Log = Callable[[str], None]


def one_line(e: Exception) -> str:
    """The CLI's messages name flags (--limit); a grid names keys (limit)."""
    return re.sub(r"--([a-z][a-z-]*)", lambda m: m.group(1).replace("-", "_"), str(e).splitlines()[0])


def _spellings(value: Any, where: str) -> list[str]:
    from ..methods import split_list
    items = value if isinstance(value, list) else [value]
    if not items or not all(isinstance(x, str) and x.strip() for x in items):
        raise ConfigError(f"{where}: methods must be a list of method spellings, e.g. [\"bpd\", \"ngram4\"]")
    return [s for x in items for s in split_list(x)]


def _count(v: Any, name: str, where: str) -> Any:
    if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
        raise ConfigError(f"{where}: {name} must be an integer >= 1, got {v!r}")
    return v


def options_for(command: CommandSpec, merged: dict, where: str) -> Iterator[tuple[dict, dict]]:
    """(RunConfig fields, command options) per cell of one (model, task): a command of one method makes one cell
    per method, unless its block names that method another way (alpha_law: its draft and longest chain)."""
    methods = merged.get("methods", merged.get("method"))
    private = merged.get("private_greedy", False)
    if not isinstance(private, bool):
        raise ConfigError(f"{where}: private_greedy must be true or false, got {private!r}")
    own = {"private_greedy": True} if private else {}
    if "per_category" in command.grid_keys and merged.get("per_category") is not None:
        own["per_category"] = _count(merged["per_category"], "per_category", where)
    if command.options is not None:
        own.update({f.name: merged.get(f.name) for f in dataclasses.fields(command.options)
                    if f.name in command.grid_keys})
        try:
            command.typed(own)                          # the CLI's own checks of these settings, now
        except (ConfigError, TypeError) as e:
            raise ConfigError(f"{where}: {one_line(e)}") from None
    first = {"offset": 0} if command.split == "tune" else {}    # tune reads the held-out slice from its start
    if command.per_method:
        for m in _spellings(methods, where):
            yield {**first, "method": m}, own
    elif command.cell_method is not None:
        try:
            yield {**first, "method": command.cell_method(merged)}, own
        except ConfigError as e:
            raise ConfigError(f"{where}: {one_line(e)}") from None
    elif command.methods == "many":
        yield first, {"methods": ",".join(_spellings(methods, where)), **own}
    else:
        yield first, own


def parse_cell(command: CommandSpec, cfg: RunConfig, options: dict) -> tuple[list[Method] | None, tuple[Method, ...]]:
    """The cell's spellings, parsed once by the registry (one grammar for every command): (the methods its Plan
    holds, as the CLI's command line would give them, oracle's and analyze's fixed drafts; the methods the cell
    builds, which its artefacts, tune waits and finished check read: speed adds its ar baseline)."""
    from ..experiments.plan import method_of, methods_of, with_baseline
    from ..methods import bind
    if command.methods == "fixed":            # parsed here once: the Plan holds them too
        fixed = tuple(bind(m, cfg) for m in command.fixed(cfg))
        return list(fixed), fixed
    chosen = [method_of(cfg)] if command.methods == "one" else methods_of(options["methods"])
    return chosen, tuple(bind(m, cfg) for m in with_baseline(command, chosen))


def check_model(cfg: RunConfig) -> None:
    """What the sweep refuses beyond what `prepare` checks: a local model folder that is not there."""
    from .. import models
    from ..artefacts.checks import check_model_files
    if cfg.model not in models.MODELS:
        check_model_files(cfg.model, cfg.dtype)


def plan_cell(command: CommandSpec, cfg: RunConfig, methods: list[Method] | None, options: dict, ctx: dict) -> Plan:
    """The cell's Plan, prepared once, here on the driver, as the CLI prepares the command's: the config validated,
    the parsed methods, the examples selected (from the grid's data root, which the workers read too; cells of one
    task share a selection). It is what the worker runs, with `resume` (tune: without, it writes the alpha table).
    Validated as a CPU config, since the GPU is on the workers; the artefact files are the worker's to check."""
    from ..experiments.plan import prepare
    view = cfg.replace(device="cpu") if cfg.device.startswith("cuda") else cfg
    if ctx["data"]:
        view = view.replace(data_dir=ctx["data"])
    resume = command.writes_folder
    plan = prepare(view.replace(resume=resume), command.name, methods, resume=resume,
                   per_category=options.get("per_category"), files=False, select=_selector(ctx["selected"]),
                   options=command.typed(options))
    return dataclasses.replace(plan, cfg=plan.cfg.replace(device=cfg.device, data_dir=cfg.data_dir))


def placed(plan: Plan, cfg: RunConfig, rel: str, results: str) -> Plan:
    """The Plan writing where the cell's folder is (folders.place): `cfg.out` as the cell's config records it, and
    the folder under the grid's results root, where the workers' commands would have put it."""
    out = None if plan.out is None else Path(results) / rel
    return dataclasses.replace(plan, cfg=plan.cfg.replace(out=cfg.out), out=out)


def _selector(cache: dict) -> Callable[..., list]:
    """select_examples, remembered per selection: many cells of a grid select the same examples of one task."""
    def select(cfg: RunConfig, split: str, per_category: int | None) -> list:
        from ..experiments.examples import select_examples
        key = (cfg.task, cfg.data_dir, cfg.data_file, cfg.offset, cfg.limit, split, per_category)
        if key not in cache:
            cache[key] = select_examples(cfg, split, per_category)
        return cache[key]
    return select


def tuned_keys(cell) -> list[str]:
    """Ids of the tune cells whose alpha this cell reads (methods that interpolate and are given no alpha)."""
    if not cell.spec.writes_folder or cell.spec.methods == "fixed" or cell.config.alpha is not None:
        return []                          # tune writes the alpha; oracle and analyze choose their own drafts
    from .. import refine
    out = []
    for m in cell.methods:
        spec = refine.RESCORERS.get(m.name)
        if spec is not None and spec.interpolates and m.get("alpha") is None:
            out.append(f"tune:{cell.config.model}/{cell.config.task}/{m.name}")
    return out


def execute(cell, log: Log) -> dict:
    """Run one cell through the CLI's own function, its config.json naming the grid and cell (session.made_by);
    returns what the report keeps about it."""
    from ..experiments.session import made_by
    with made_by(cell.grid, cell.id):
        return _execute(cell, cell.plan, log)


def _execute(cell, plan: Plan, log: Log) -> dict:
    """The cell's Plan, prepared on the driver (`plan_cell`), run by the CLI's own `execute`; nothing is validated,
    parsed or selected again. Only the artefact files are checked here: the sweep's tasks built them since."""
    from ..experiments.execute import execute
    from ..experiments.plan import check_files
    if cell.hooks.get("fail"):           # tests only: a cell that fails on every attempt
        raise RuntimeError("test hook: failing on purpose")
    check_files(plan.cfg, list(plan.methods), log)
    if cell.options.get("private_greedy"):
        # the greedy reference decoded in this process, so a T = 0 cell times its own AR (a cached one has no
        # time); where the reference lives never changes a result (PLACE): the folder stays finished
        with tempfile.TemporaryDirectory(prefix="bpdbench-greedy-") as private:
            return _kept(cell, execute(dataclasses.replace(plan, cfg=plan.cfg.replace(greedy_dir=private)), log,
                                       _hook(cell)))
    return _kept(cell, execute(plan, log, _hook(cell)))


def _kept(cell, result) -> dict:
    """What the sweep's report keeps of a command's result."""
    return cell.spec.kept(result)


def _hook(cell):
    """Tests only: end the worker process abruptly after n examples, once, as a killed machine would."""
    exit_after, once = cell.hooks.get("exit_after_examples"), cell.hooks.get("once_file")
    if not exit_after or not once:
        return None
    seen = [0]

    def progress(record: dict) -> None:
        import os
        seen[0] += 1
        if seen[0] >= exit_after and not Path(once).exists():
            Path(once).write_text(f"exited after {seen[0]} examples\n")
            os._exit(3)
    return progress


# --- finished cells -------------------------------------------------------------------------------------------------

def finished(cell, root: Path) -> bool:
    """The cell's summary exists, was written after its config.json (a crash after a new config.json leaves an older
    summary behind; a folder exactly as committed is exempt, _as_committed), and config.json records the cell's
    settings and methods. Folders the CLI wrote count too."""
    command = cell.spec
    if not command.writes_folder:
        return _tuned(cell, root)
    out = root / cell.rel
    summary, conf = out / command.summary, out / command.config_file
    try:
        if command.config_last:
            if not summary.exists():
                return False
        elif summary.stat().st_mtime_ns < conf.stat().st_mtime_ns and not _as_committed(out):
            return False
        meta = json.loads(conf.read_text())
        if not _all_prompts(out, meta, command.result_file):
            return False
    except (OSError, ValueError):
        return False
    return _matches(cell, meta)


def _as_committed(out: Path) -> bool:
    """Whether `out` is a committed folder exactly as committed. A pull rewrites only the files that changed (a
    config.json whose paths were made portable), so there the order of mtimes says nothing about the order a run
    wrote its files in; a run that restarted in the folder since has changed its config.json or left new files."""
    import subprocess
    try:
        tracked = subprocess.run(["git", "-C", str(out), "ls-files", "--", "."], capture_output=True, text=True,
                                 timeout=60)
        status = subprocess.run(["git", "-C", str(out), "status", "--porcelain", "--", "."], capture_output=True,
                                text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return False
    return not (tracked.returncode or status.returncode) and bool(tracked.stdout.strip()) and not status.stdout.strip()


def _all_prompts(out: Path, meta: dict, result_file: str | None) -> bool:
    """A speed run rewrites speed.csv after every prompt (a run stopped in its 10th hour still reports), so a newer
    summary does not mean a whole one: every prompt its config.json selected must have its records. A folder from
    before config.json listed them is judged by the summary alone."""
    if "prompts" not in meta or result_file is None:
        return True
    ids = {str(i) for i in meta["prompts"]}
    with open(out / result_file) as f:
        seen = {str(json.loads(line).get("id")) for line in f if line.strip()}
    return ids <= seen


def lost(cell, root: Path) -> int:
    """Examples of a finished run cell that diverged from greedy beyond numerical noise."""
    if not cell.spec.counts_lost:
        return 0
    try:
        import pandas as pd
        return int(pd.read_csv(root / cell.rel / "summary.csv").get("n_lost", pd.Series([0])).fillna(0).iloc[0])
    except (OSError, ValueError, IndexError):
        return 0


def _norm(d: dict) -> dict:
    """`d` as JSON holds it, paths in the portable form (a folder recorded with absolute paths still matches)."""
    from ..paths import comparable
    return comparable(json.loads(json.dumps(d, default=str)))


# Where a cell ran and on how many threads, not what it computed: a results tree copied to another checkout (or a
# data folder mounted elsewhere) still holds finished cells.
PLACE = ("threads", "resume", "out", "data_dir", "greedy_dir")


def _matches(cell, meta: dict) -> bool:
    command = cell.spec
    want = _aliased(_norm(cell.config.to_dict()))
    want = {k: v for k, v in want.items() if k not in command.unused}
    # a field an older config.json lacks was added since with its default, which is what that run did
    have = _aliased({**{k: v for k, v in _norm(RunConfig().to_dict()).items() if k in want},
                     **_norm(meta.get("config", {}))})
    if any(have.get(k) != want.get(k) for k in set(want) | set(have) if k not in PLACE):
        return False
    if not _same_heads_recipe(cell, meta):
        return False
    if any(not _same(meta.get(k), cell.options.get(k)) for k in command.recorded):
        return False
    if not command.match_methods:       # analyze: always plain and 2-gram drafts, its config is all there is
        return True
    labels = [m.label for m in cell.methods]
    recorded = [bound_label(m, have) for m in meta.get("methods", [])]
    if command.methods == "one" and not recorded and have.get("method"):   # older run folders: in config only
        recorded = [bound_label(have["method"], have)]
    recorded += list(meta.get("resolved", {}).get("skipped", {}))       # speed: methods it could not time here
    return sorted(recorded) == sorted(labels)


def bound_label(spelling: str, config: dict) -> str:
    """A recorded method's label under the run options its folder recorded (methods.bind): a folder written before
    labels named them (`bpd` under --heads 5) reads as the `bpd:heads=5` it is. A spelling that is no method (an
    external engine's row, an old name) stays as it is."""
    from types import SimpleNamespace
    from ..methods import MethodError, bind, canonical, parse
    try:
        return bind(parse(spelling), SimpleNamespace(**config)).label
    except (MethodError, TypeError):
        return canonical(spelling)


def _same(recorded: Any, wanted: Any) -> bool:
    """An option as config.json holds it against the cell's: a list is a list, 0 is 0.0."""
    if isinstance(recorded, (list, tuple)) and isinstance(wanted, (list, tuple)):
        return list(recorded) == list(wanted)
    return recorded == wanted


def _same_heads_recipe(cell, meta: dict) -> bool:
    """A folder decoded with cached heads of another recipe than today's `train-heads` is not this cell's result:
    re-running the grid would train other heads and get other numbers. Heads the cell names by path are what
    they are, and untrained heads have no recipe."""
    from ..train.heads import FIRST_RECIPE, RECIPE
    heads = (meta.get("resolved") or {}).get("heads") or {}
    if not heads or cell.config.heads_path or heads.get("profile") in (None, "init"):
        return True
    return heads.get("recipe", FIRST_RECIPE) == RECIPE


def _aliased(config: dict) -> dict:
    """`--rescorer R` is `--method R`: a run recorded as method bpd + rescorer R is the cell spelling method R."""
    rescorer = config.get("rescorer")
    if "method" in config and rescorer not in (None, "none"):
        return {**config, "method": rescorer, "rescorer": "none"}
    return config


def _tuned(cell, root: Path) -> bool:
    c = cell.config
    table = Path(c.alpha_file) if c.alpha_file else root / "alpha.json"
    try:
        return tuned_on_tune_split(json.loads(table.read_text()), f"{c.model}/{c.task}/{cell.methods[0].name}")
    except (OSError, ValueError):
        return False
