"""What a command is, as data: `CommandSpec`, its typed options, and the `Plan` one invocation of it carries.

Why: a command used to be a string that 8 files tested (`kind == "speed"`), each keeping its own piece of what the
command is (its folder, its summary file, whether it resumes, which settings its grid block takes). As with methods
(methods/contract.py), one record per command now says all of it, and the CLI, `execute` and the sweep read the
record. The registry of records, with their run functions, is experiments/commands.py; this module holds only the
types, so that the functions the registry names may import them without importing the registry back.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..config import ConfigError, RunConfig
from ..methods import Method


def _whole(value: Any, flag: str, at_least: int = 1, none: bool = False) -> None:
    if value is None and none:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < at_least:
        raise ConfigError(f"--{flag} must be an integer >= {at_least}, got {value!r}")


@dataclass(frozen=True)
class SpeedOptions:
    repeats: int = 3
    recalibrate: bool = False           # measure this machine's forward costs again instead of reading the cache

    def __post_init__(self) -> None:
        _whole(self.repeats, "repeats")


@dataclass(frozen=True)
class CertifyOptions:
    rules: tuple[str, ...] = ("exact",)
    samples: int = 300
    positions: int = 4
    level: float = 0.01

    def __post_init__(self) -> None:
        from ..engine.sampling import RULES
        rules = self.rules
        if isinstance(rules, str) or not isinstance(rules, (list, tuple)) or not rules \
                or not all(isinstance(r, str) and r for r in rules):
            raise ConfigError(f"--rules must name acceptance rules, e.g. exact,no-residual; got {rules!r}")
        object.__setattr__(self, "rules", tuple(rules))
        bad = [r for r in self.rules if r not in RULES]
        if bad:
            raise ConfigError(f"unknown rule {bad[0]!r}; valid: {', '.join(RULES)}")
        _whole(self.samples, "samples", 20)
        _whole(self.positions, "positions")
        if isinstance(self.level, bool) or not isinstance(self.level, (int, float)) or not 0 < self.level < 1:
            raise ConfigError(f"--level must be in (0, 1), got {self.level!r}")


@dataclass(frozen=True)
class AlphaLawOptions:
    gamma_max: int = 8
    temperatures: tuple[float, ...] = (0.0, 0.7, 1.0)

    def __post_init__(self) -> None:
        _whole(self.gamma_max, "gamma-max")
        temps = self.temperatures
        if not isinstance(temps, (list, tuple)) or not temps or not all(
                isinstance(t, (int, float)) and not isinstance(t, bool) and t >= 0 for t in temps):
            raise ConfigError(f"--temperatures must be numbers >= 0 (0: greedy), got {temps!r}")
        object.__setattr__(self, "temperatures", tuple(float(t) for t in temps))


@dataclass(frozen=True)
class Plan:
    """A command prepared once from its flags (experiments/plan.py `prepare`): the validated config, the parsed
    methods, the selected examples and the output folder. Sessions, decoders and writers read it and never validate,
    parse or select again."""
    cfg: RunConfig                      # validated
    command: str                        # a key of experiments/commands.COMMANDS
    methods: tuple[Method, ...]
    examples: tuple                     # the selection the session decodes (held-out for tune)
    out: Path | None                    # None: the command writes no folder (tune writes the alpha table)
    resume: bool = False
    per_category: int | None = None
    options: object = None              # the command's options type, or None for a command without settings

    @property
    def method(self) -> Method:
        """The one method of a command that takes one (run, tune, alpha_law)."""
        return self.methods[0]


Log = Callable[[str], None]
# body(session, plan, lock, log, progress): the command's work, inside its folder's lock and an open session
Body = Callable[..., Any]


def _nothing(*_: Any) -> None:
    return None


@dataclass(frozen=True)
class CommandSpec:
    """One command, declared once. `execute` (experiments/execute.py) runs every command the same way: check,
    lock the folder, open the session, `body`, `finish`; the sweep reads the same record for its blocks and for
    whether a cell's folder is finished."""
    name: str                           # `bpdbench <name>` (with - for _) and the grid's [[name]] blocks
    body: Body
    summary: str = ""                   # the file a finished folder has, written last ("" : writes no folder)
    folder: str = ""                    # <results>/<folder>/<task> without --out ("": named by `out_of`)
    methods: str = "many"               # "one": the Plan holds one method (the config's --method); "many": a list
    #                                     of spellings; "fixed": the command chooses them (`fixed`)
    fixed: Callable[[RunConfig], tuple[Method, ...]] | None = None
    options: type | None = None         # its settings beyond RunConfig, typed (the CLI's flags and a grid fill it)
    named_by_methods: bool = False      # its default folder names its methods and settings (run, certify)
    baseline: str | None = None         # a method that always runs, first (speed: ar, every speedup's divisor)
    external: bool = False              # may time methods that run another engine's loop (transformers, llama.cpp)
    timed: bool = False                 # measures wall time: its cost curve is measured before it, not on its clock
    samples: bool = False               # takes sampling settings (temperature, top-p/k, seed)
    split: str = "eval"                 # the examples it reads ("tune": the tune split)
    result_file: str | None = None      # the per-example file a resume appends to (its prompts are checked)
    config_file: str = "config.json"    # where it records its settings
    config_last: bool = False           # writes its config after its summary (a folder without a summary is not done)
    recorded: tuple[str, ...] = ()      # options a finished folder's config must match, besides config and methods
    match_methods: bool = True          # a finished folder must record the cell's methods
    counts_lost: bool = False           # its summary counts examples lost against greedy (n_lost)
    check: Callable[[RunConfig, list[Method], Any], None] = _nothing     # in `prepare`, before anything loads
    precheck: Callable[["Plan"], None] = _nothing     # inside the folder's lock, before the model loads
    finish: Callable[["Plan", Any, Log], None] = _nothing     # after the lock: what it prints, or the error its
    #                                                            result means (run: examples lost against greedy)
    kept: Callable[[Any], dict] = lambda result: {}       # what a sweep's report keeps of its result
    grid_keys: frozenset[str] = frozenset()   # its own keys in a grid block, beside the RunConfig settings
    defaults: dict = field(default_factory=dict)    # what its CLI uses where the grid is silent
    cell_method: Callable[[dict], str] | None = None    # a grid cell's one method from its block (alpha_law)
    unused: frozenset[str] = frozenset()      # RunConfig fields it ignores (not compared for "finished")

    @property
    def writes_folder(self) -> bool:
        return bool(self.summary)

    @property
    def per_method(self) -> bool:
        """A grid block of it makes one cell per method (run, tune)."""
        return self.methods == "one" and self.cell_method is None

    def typed(self, values: dict) -> object:
        """Its options object from a grid cell's keys (None for a command without options)."""
        if self.options is None:
            return None
        names = {f.name for f in dataclasses.fields(self.options)}
        return self.options(**{k: v for k, v in values.items() if k in names})
