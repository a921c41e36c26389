"""The grid file: a small TOML document, validated whole before anything loads, expanded into cells and artefacts.

A cell is one command (experiments/commands.py COMMANDS: `run`, `replay`, `speed`, ...) with the RunConfig the CLI
would build from the same flags: the CLI's defaults of that command (CommandSpec.defaults), the grid's [defaults],
then the block's keys. So a
cell's config.json equals that of the equivalent command line, a folder the CLI wrote is recognised as finished or
resumed, and the reverse. Cell identity is its output folder relative to the results root (tune: its alpha-table
key): the command's default, a block's `folder` or its `out` template (folders.py), so a grid can name the folders
that committed results live in. Roots are configuration: `results` (every worker must reach it; the merged tree),
`cache` and `data` (default: each worker's own $BPDBENCH_CACHE / $BPDBENCH_DATA defaults); they reach workers
through the task's environment, the way every bpdbench command reads them, so that RunConfig stays what the CLI
records.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import paths
from ..config import ConfigError, RunConfig
from ..experiments.command import CommandSpec, Plan
from ..experiments.commands import COMMANDS
from ..methods import Method
from ..artefacts.graph import Artefact, artefacts_for, collect, with_trainings, without_unneeded_data
from .folders import machine_key, names_machine, place
from .trainings import heads_dtype, trainings, with_data

SWEEP_KEYS = {"name": str, "results": str, "cache": str, "data": str, "threads": int, "gpus": (int, float),
              "retries": int, "tables": bool}
# RunConfig fields the sweep sets itself (axes, roots, resume): not grid keys
MANAGED = {"task", "model", "method", "rescorer", "out", "resume", "threads", "data_dir", "alpha_file", "greedy_dir"}
AXES = {"tasks": "task", "models": "model", "methods": "method", "temperatures": "temperature", "seeds": "seed"}
SAMPLING = {"temperature", "temperatures", "seed", "seeds", "top_p", "top_k"}
FIELDS = {f.name: f for f in dataclasses.fields(RunConfig)}
SETTINGS = sorted(set(FIELDS) - MANAGED)
_TYPES = {"int": (int,), "float": (int, float), "str": (str,), "bool": (bool,)}


@dataclass(frozen=True)
class Cell:
    """One command of the grid, planned once on the driver: `plan` is what its worker runs (commands.plan_cell),
    and `config`, `options` and `rel` are what identify it and its finished folder."""
    command: str                        # a key of experiments/commands.COMMANDS
    config: RunConfig                   # as the equivalent command line records it (resume unset)
    options: dict                       # methods (a spelling list), k, repeats, per_category, rescorer
    rel: str                            # output folder relative to the results root; "" for tune
    plan: Plan = field(compare=False, repr=False)                   # validated, parsed, selected: shipped as is
    methods: tuple[Method, ...] = field(compare=False, repr=False)  # what it builds (commands.parse_cell)
    threads: int = 1                    # torch threads = Ray CPUs
    gpus: float = 0
    needs: tuple[str, ...] = ()         # ids of artefacts and tune cells that must finish first
    hooks: dict = field(default_factory=dict)   # tests only: {"exit_after_examples": n, "once_file": path}
    grid: str = ""                      # the grid file that made it, as config.json records it (not its identity)
    machine: str = ""                   # the fingerprint in `rel` where its out template names {machine}: the same
    #                                     cell on another machine writes the folder with that part replaced

    @property
    def spec(self) -> CommandSpec:
        return COMMANDS[self.command]

    @property
    def timed(self) -> bool:
        """Its command measures wall time (the artefact graph measures its cost curve before it)."""
        return self.spec.timed

    @property
    def id(self) -> str:
        c = self.config
        if not self.spec.writes_folder:            # tune: its alpha-table key
            return f"tune:{c.model}/{c.task}/{self.methods[0].name}"
        return self.rel

    def key(self) -> dict:
        """What the cell's result must have been made with (threads and resume never change a result)."""
        cfg = {k: v for k, v in self.config.to_dict().items() if k not in ("threads", "resume")}
        return {"command": self.command, "config": cfg, "options": self.options}


@dataclass
class SweepPlan:
    grid: Path
    name: str
    results: Path                       # the merged results tree
    cache: str | None                   # None: each worker's default
    data: str | None
    retries: int
    tables: bool
    cells: list[Cell]
    artefacts: list[Artefact]

    def env(self) -> dict[str, str]:
        """The environment every task runs in: the roots, as every bpdbench command reads them."""
        env = {"BPDBENCH_RESULTS": str(self.results)}
        if self.cache:
            env["BPDBENCH_CACHE"] = self.cache
        if self.data:
            env["BPDBENCH_DATA"] = self.data
        return env


class GridError(ConfigError):
    """A grid file problem: one line naming the file, the block and the key."""


def _toml(path: Path) -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:           # Python 3.10
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            raise GridError("reading a grid needs Python >= 3.11 or `pip install tomli`") from None
    if not path.is_file():
        raise GridError(f"grid file not found: {path}; pass a TOML file like grids/reference.toml")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise GridError(f"{path}: not valid TOML ({str(e).splitlines()[0]})") from None


def _root(value: str | None, base: Path) -> str | None:
    """Relative paths are relative to `base` (the grid's folder, or the current one for a CLI option)."""
    if value is None:
        return None
    p = Path(value).expanduser()
    return str(p if p.is_absolute() else (base / p).resolve())


def load(grid: Path, results: str | None = None, cache: str | None = None, data: str | None = None,
         threads: int | None = None, limit: int | None = None) -> SweepPlan:
    """Read, validate and expand a grid; CLI options override the grid's [sweep] table."""
    grid = Path(grid)
    doc = _toml(grid)
    unknown = sorted(set(doc) - {"sweep", "defaults", "train", *COMMANDS})
    if unknown:
        raise GridError(f"{grid}: unknown table [{unknown[0]}]; valid: [sweep], [defaults], [[train]], "
                        + ", ".join(f"[[{k}]]" for k in COMMANDS))
    sweep = _table(doc, "sweep", grid)
    if not re.fullmatch(r"[\w.-]+", str(sweep.get("name", "x"))):
        raise GridError(f"{grid}: [sweep]: name must be one folder name (letters, digits, . _ -)")
    for key, value in sweep.items():
        if key not in SWEEP_KEYS:
            raise GridError(f"{grid}: [sweep]: unknown key '{key}'; valid: {', '.join(SWEEP_KEYS)}")
        if not isinstance(value, SWEEP_KEYS[key]) or (isinstance(value, bool) and SWEEP_KEYS[key] is not bool):
            raise GridError(f"{grid}: [sweep]: {key} = {value!r} has the wrong type")
    if threads is not None and threads < 1:
        raise GridError(f"--threads must be >= 1, got {threads}")
    if limit is not None and limit < 1:
        raise GridError(f"--limit must be >= 1, got {limit}")
    here = Path.cwd()
    res = _root(results, here) or _root(sweep.get("results"), grid.parent) or str(paths.results_root().resolve())
    if limit is not None and results is None:   # a reduced pass would overwrite the full grid's cells and alpha table
        raise GridError(f"--limit makes a reduced pass of the grid: give --results DIR too, so it does not overwrite "
                        f"the grid's full results in {res}")
    retries = sweep.get("retries", 2)
    if retries < 0 or sweep.get("gpus", 0) < 0 or sweep.get("threads", 1) < 1:
        raise GridError(f"{grid}: [sweep]: retries and gpus must be >= 0 and threads >= 1")
    data_root = _root(data, here) or _root(sweep.get("data"), grid.parent)
    ctx = {"grid": grid, "shown": shown(grid), "threads": sweep.get("threads", 1), "threads_cli": threads,
           "gpus": sweep.get("gpus", 0), "limit": limit, "data": data_root, "results": res, "selected": {}}
    defaults = _table(doc, "defaults", grid)
    _check_keys(defaults, set(SETTINGS) | {"models", "model", "temperatures", "temperature", "seeds", "seed",
                                           "threads", "gpus"}, f"{grid}: [defaults]")
    cells: list[Cell] = []
    for name, command in COMMANDS.items():
        blocks = doc.get(name, [])
        if not isinstance(blocks, list) or not all(isinstance(b, dict) for b in blocks):
            raise GridError(f"{grid}: write [[{name}]] blocks (an array of tables), not [{name}]")
        for i, block in enumerate(blocks, 1):
            cells += _expand(command, block, defaults, f"{grid}: [[{name}]] {i}", ctx)
    blocks = doc.get("train", [])
    if not isinstance(blocks, list):
        raise GridError(f"{grid}: write [[train]] blocks (an array of tables), not [train]")
    networks = trainings(blocks, str(defaults.get("model", RunConfig().model)), str(grid), res)
    if not cells and not networks:
        raise GridError(f"{grid}: no cells; add a block such as [[run]] with tasks = [...] and methods = [...]")
    cells = _unique(cells, grid)
    cells, artefacts = _link(cells)
    cells, artefacts = without_unneeded_data(*with_trainings(cells, artefacts, with_data(networks)))
    return SweepPlan(grid, sweep.get("name", grid.stem), Path(res), _root(cache, here) or _root(sweep.get("cache"),
                grid.parent), data_root, retries, sweep.get("tables", False), cells, artefacts)


def only(plan: SweepPlan, patterns: list[str]) -> SweepPlan:
    """The cells whose id matches one of `patterns` (shell wildcards, as `--dry-run` prints ids: 'tune:*'), with
    the artefacts and cells they wait for. Why: one recipe re-made alone (the tuned alphas) without re-running the
    rest of its grid. The tables are not rendered for a part of a grid."""
    from fnmatch import fnmatchcase
    if not patterns:
        return plan
    deps = {c.id: c.needs for c in plan.cells} | {a.id: a.needs for a in plan.artefacts}
    keep = {c.id for c in plan.cells if any(fnmatchcase(c.id, p) for p in patterns)}
    if not keep:
        raise GridError(f"--only {' '.join(patterns)}: no cell of {plan.grid} has a matching id; "
                        f"`bpdbench sweep {plan.grid} --dry-run` lists them (e.g. {plan.cells[0].id})")
    todo = list(keep)
    while todo:
        for d in deps.get(todo.pop(), ()):
            if d not in keep:
                keep.add(d)
                todo.append(d)
    return dataclasses.replace(plan, cells=[c for c in plan.cells if c.id in keep], tables=False,
                               artefacts=[a for a in plan.artefacts if a.id in keep])


def shown(grid: Path) -> str:
    """The grid as a result records it: relative to the checkout when inside it (grids/field.toml), so the name
    means the same file in every clone; otherwise its absolute path."""
    path = grid.resolve()
    try:
        return path.relative_to(paths.REPO).as_posix()
    except ValueError:
        return str(path)


def _table(doc: dict, name: str, grid: Path) -> dict:
    value = doc.get(name, {})
    if not isinstance(value, dict):
        raise GridError(f"{grid}: [{name}] must be a table")
    return value


def _check_keys(table: dict, valid: set[str], where: str) -> None:
    for key in table:
        if key not in valid:
            raise GridError(f"{where}: unknown key '{key}'; valid: {', '.join(sorted(valid))}")


def _merge(cli: dict, defaults: dict, block: dict, where: str) -> dict:
    """Later tables win; `method = "x"` in a block replaces `methods = [...]` of an earlier one."""
    out: dict = {}
    for table in (cli, defaults, block):
        for plural, singular in AXES.items():
            if plural in table and singular in table:
                raise GridError(f"{where}: give {plural} or {singular}, not both")
            if plural in table or singular in table:
                out.pop(plural, None)
                out.pop(singular, None)
        out.update(table)
    return out


def _axis(merged: dict, plural: str, where: str, default: list) -> list:
    singular = AXES[plural]
    value = merged.get(plural, merged.get(singular, default))
    values = value if isinstance(value, list) else [value]
    if not values:
        raise GridError(f"{where}: {plural} is empty")
    return values


def _setting(name: str, value: Any, where: str) -> Any:
    """A RunConfig field's value, type-checked against its annotation (`limit = "all"` means every example)."""
    if value is None or (name == "limit" and value == "all"):
        return None
    allowed = [t for t in str(FIELDS[name].type).replace(" ", "").split("|") if t in _TYPES]
    if isinstance(value, bool) and "bool" not in allowed or not any(isinstance(value, _TYPES[t]) for t in allowed):
        extra = ' or "all"' if name == "limit" else ""
        raise GridError(f"{where}: {name} must be {' or '.join(allowed)}{extra}, got {value!r}")
    return float(value) if allowed == ["float"] else value


def _expand(command: CommandSpec, block: dict, defaults: dict, where: str, ctx: dict) -> list[Cell]:
    name = command.name
    valid = set(SETTINGS) | {"tasks", "task", "models", "model", "temperatures", "temperature", "seeds", "seed",
                             "threads", "gpus"} | command.grid_keys | ({"method"} if command.per_method else set())
    _check_keys(block, valid, where)
    sampled = [k for k in block if k in SAMPLING and k not in command.grid_keys]
    if sampled and not command.samples:
        raise GridError(f"{where}: {sampled[0]}: {name} decodes greedily; sampling options go in [[run]] and "
                        f"[[speed]] blocks")
    merged = _merge(command.defaults, defaults, block, where)
    # a setting of the command's own that shares an axis's name (alpha_law's temperatures: measured in one
    # folder) is the command's, not an axis
    own = {k: merged.pop(k) for k in list(merged) if k in SAMPLING and k in command.grid_keys}
    if not command.samples:                  # [defaults]' sampling options are for the cells that sample
        merged = {k: v for k, v in merged.items() if k not in SAMPLING}
    if "tasks" not in block and "task" not in block:
        raise GridError(f"{where}: name its tasks, e.g. tasks = [\"xsum\"]")
    if command.per_method and "methods" not in command.defaults and "methods" not in block and "method" not in block:
        raise GridError(f"{where}: name the methods whose alpha to tune, e.g. methods = [\"ngram4\"]")
    tasks = _axis(merged, "tasks", where, [])
    models = _axis(merged, "models", where, [RunConfig.model])
    temps = _axis(merged, "temperatures", where, [None])
    seeds = _axis(merged, "seeds", where, [None])
    settings = {k: _setting(k, v, where) for k, v in merged.items()
                if k in FIELDS and k not in MANAGED and k not in AXES.values()}
    threads = ctx["threads_cli"] or block.get("threads", defaults.get("threads", ctx["threads"]))
    gpus = block.get("gpus", defaults.get("gpus", ctx["gpus"]))
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise GridError(f"{where}: threads must be an integer >= 1, got {threads!r}")
    if not isinstance(gpus, (int, float)) or isinstance(gpus, bool) or gpus < 0:
        raise GridError(f"{where}: gpus must be a number >= 0, got {gpus!r}")
    from .commands import options_for
    cells = []
    for model in models:
        for task in tasks:
            for t in temps:
                greedy = t is None or (isinstance(t, (int, float)) and not isinstance(t, bool) and t == 0)
                for s in [None] if greedy else seeds:
                    # greedy cells record what a command line without sampling options records
                    extra = dict.fromkeys(("temperature", "top_p", "top_k", "seed")) if greedy else \
                        {"temperature": _setting("temperature", t, where), "seed": _setting("seed", s, where)}
                    for cfg, options in options_for(command, {**merged, **own}, where):
                        cfg = RunConfig(task=_str(task, "task", where), model=_str(model, "model", where),
                                        threads=threads, **{**settings, **extra, **cfg})
                        cfg = _cap(cfg, ctx["limit"])
                        options = _cap_options(options, ctx["limit"])
                        cells.append(_cell(command, cfg, options, merged, where, ctx, threads, gpus))
    return cells


def _str(value: Any, name: str, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise GridError(f"{where}: {name} must be a non-empty string, got {value!r}")
    return value


def _cap(cfg: RunConfig, limit: int | None) -> RunConfig:
    if limit is None or (cfg.limit is not None and cfg.limit <= limit):
        return cfg
    return cfg.replace(limit=limit)


def _cap_options(options: dict, limit: int | None) -> dict:
    if limit is not None and options.get("per_category") and options["per_category"] > limit:
        return {**options, "per_category": limit}
    return options


def _cell(command: CommandSpec, cfg: RunConfig, options: dict, merged: dict, where: str, ctx: dict, threads: int,
          gpus: float) -> Cell:
    """The cell, planned once: its spellings parsed, its config validated and its examples selected here, on the
    driver (commands.plan_cell), before anything loads; the worker runs that plan."""
    from .commands import check_model, one_line, parse_cell, placed, plan_cell
    for name in ("data_file", "heads_path"):    # `~` and paths relative to the grid, as a shell and cwd would
        if getattr(cfg, name):
            cfg = cfg.replace(**{name: _root(getattr(cfg, name), ctx["grid"].parent)})
    if gpus and cfg.device == "cpu":
        raise GridError(f"{where}: gpus = {gpus:g} but device = \"cpu\"; set device = \"cuda\" (or gpus = 0)")
    if not gpus and cfg.device.startswith("cuda"):     # Ray hides every GPU from a task that asks for none
        raise GridError(f"{where}: device = \"{cfg.device}\" needs gpus = 1 (Ray shows a task only the GPUs it asks "
                        f"for)")
    if cfg.dtype == "auto":     # resolved on the driver, so a cell's folder and key name the dtype it runs in
        from ..hardware.dtype import resolve
        cfg = cfg.replace(dtype=resolve("auto", "cpu" if cfg.device == "cpu" else cfg.device, cfg.threads))
    try:
        chosen, methods = parse_cell(command, cfg, options)
        check_model(cfg)
        plan = plan_cell(command, cfg, chosen, options, ctx)
    except (ConfigError, ValueError, FileNotFoundError, RuntimeError) as e:
        raise GridError(f"{where}: {cfg.task}: {one_line(e)}") from None
    try:
        rel, cfg = place(command, cfg, merged, ctx["results"], methods)
    except ConfigError as e:
        raise GridError(f"{where}: {e}") from None
    cell = Cell(command.name, cfg, options, rel, placed(plan, cfg, rel, ctx["results"]), methods, threads, gpus,
                grid=ctx["shown"], machine=machine_key(cfg) if names_machine(merged) else "")
    return dataclasses.replace(cell, needs=tuple(a.id for a in artefacts_for(cell, list(methods), heads_dtype)))


def _unique(cells: list[Cell], grid: Path) -> list[Cell]:
    """One cell per output folder: the same cell twice is kept once, two settings for one folder are an error."""
    seen: dict[str, Cell] = {}
    for c in cells:
        old = seen.get(c.id)
        if old is None:
            seen[c.id] = c
        elif old.key() != c.key():
            diff = sorted(k for k in set(old.key()["config"]) | set(c.key()["config"])
                          if old.key()["config"].get(k) != c.key()["config"].get(k))
            what = ", ".join(diff) or "options"
            raise GridError(f"{grid}: two cells write {c.id} with different {what}; give one of them another "
                            f"folder (folder = ..., or an out template with the placeholder that tells them apart) "
                            f"or a separate grid with its own results")
    return list(seen.values())


def _link(cells: list[Cell]) -> tuple[list[Cell], list[Artefact]]:
    """Artefacts once per (model, artefact); a cell reading a tuned alpha waits for the tune cell that writes it."""
    from .commands import tuned_keys
    artefacts = collect(cells, heads_dtype)
    tunes = {c.id for c in cells if not c.spec.writes_folder}
    linked = []
    for c in cells:
        waits = tuple(t for t in tuned_keys(c) if t in tunes)
        linked.append(dataclasses.replace(c, needs=c.needs + waits))
    return linked, artefacts
