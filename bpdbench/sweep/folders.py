"""Where a cell writes, relative to the results root, and the `out` template that names it.

A cell's folder is its identity (the sweep recognises a finished cell by it), so a grid that reproduces a committed
result must name the very folder the result lives in. Three ways, one per block: the command's own default
(`runs/<task>-<model>-<method>-<dtype>`, `replay/<task>`, ...); `folder = "speed-field"` (one name in place of the
command's, `speed-field/<task>`); or `out = "certificates/{task}-{method}"`, a path template under the results root
for the names that scripts and earlier commands chose (`drafters/replay/{task}-koala`, `sampling/{task}/
{method}-T{temperature}`, `leaderboard-{machine}/{task}`). The CLI writes where `--out` says; a cell whose folder
is not the command's default gets that `--out`, so its config.json is the equivalent command line's.
"""
from __future__ import annotations

import string
from pathlib import Path
from typing import Sequence

from .. import paths
from ..config import ConfigError, RunConfig
from ..experiments.command import CommandSpec
from ..methods import Method

PLACEHOLDERS = ("task", "method", "model", "dtype", "heads_profile", "temperature", "seed", "machine")


def place(command: CommandSpec, cfg: RunConfig, merged: dict, results: str,
          methods: Sequence[Method]) -> tuple[str, RunConfig]:
    """(the cell's folder relative to the results root, its config with `out` set where that folder is not where
    the command writes by default), from the cell's parsed methods (commands.parse_cell). Raises ConfigError
    naming the key."""
    folder, template = merged.get("folder"), merged.get("out")
    if folder is not None and template is not None:
        raise ConfigError("give folder or out, not both (out is a path template, e.g. out = \"certificates/"
                          "{task}-{method}\")")
    if not command.writes_folder:
        if template is not None:
            raise ConfigError("out: a tune cell writes the alpha table (alpha_file), not a folder")
        return "", cfg
    if folder is not None and (not isinstance(folder, str) or not folder or "/" in folder
                               or folder.startswith(".")):
        raise ConfigError(f"folder must be one folder name under the results root, got {folder!r}; for a path "
                          f"use out = \"a/b/{{task}}\"")
    default = _cli_default(command, cfg, methods)
    if template is not None:
        rel = expand(template, command, cfg)
    elif command.named_by_methods:       # run and certify: named by their methods and settings, as the command does
        rel = default
    else:
        rel = f"{folder or command.folder}/{cfg.task}"
        if not cfg.sampling.greedy:      # one folder per temperature and seed, named as run's are
            rel += "-" + cfg.sampling.label() + (f"-s{cfg.seed}" if cfg.seed else "")
    if rel != default:                   # as `--out <results>/<rel>` would
        cfg = cfg.replace(out=str(Path(results) / rel))
    return rel, cfg


def _cli_default(command: CommandSpec, cfg: RunConfig, methods: Sequence[Method]) -> str:
    """The folder the command writes to without --out, relative to the results root (experiments/plan.py names it;
    only run and certify folders are named after their methods)."""
    from ..experiments.plan import out_of
    return out_of(cfg.replace(out=None), command, list(methods)).relative_to(paths.results_root()).as_posix()


def machine_key(cfg: RunConfig) -> str:
    """The fingerprint of this machine as the cell runs on it (CPU, flags, software, threads, device): the key its
    results are grouped by (report/leaderboard.py) and its calibration is cached under."""
    from ..hardware.fingerprint import current
    return current(cfg.threads, cfg.device).key()


def names_machine(merged: dict) -> bool:
    """Whether the block's folder is named after the machine ({machine} in its out template)."""
    template = merged.get("out")
    return isinstance(template, str) and "{machine}" in template


def expand(template: object, command: CommandSpec, cfg: RunConfig) -> str:
    """The template with the cell's values: {task}, {model}, {dtype}, {heads_profile}, {temperature} (0 when
    greedy, `:g`), {seed} (0 when unset), {machine} (machine_key: the fingerprint the leaderboard groups by, so two
    machines' boards of one benchmark are two folders, not one overwriting the other), and for run cells {method},
    the spelling named by the folder rule (paths.folder_name) with `:`, `,` and `=` each replaced by `-`
    (`{method:_}`: by `_`, as the draft networks' certificate folders were first named)."""
    if not isinstance(template, str) or not template.strip():
        raise ConfigError(f"out must be a path template under the results root, e.g. \"certificates/{{task}}-"
                          f"{{method}}\", got {template!r}")
    if template.startswith(("/", "~")):
        raise ConfigError(f"out = {template!r}: give a path relative to the results root (set the root with "
                          f"[sweep] results or --results)")
    values = {"task": cfg.task, "model": cfg.model, "dtype": cfg.dtype, "heads_profile": cfg.heads_profile,
              "temperature": f"{cfg.temperature or 0:g}", "seed": str(cfg.seed or 0)}
    try:
        fields = list(string.Formatter().parse(template))
    except ValueError as e:
        raise ConfigError(f"out = {template!r}: {e} (write a literal brace as {{{{ or }}}})") from None
    parts = []
    for literal, name, spec, conversion in fields:
        parts.append(literal)
        if name is None:
            continue
        if name not in PLACEHOLDERS or conversion:
            shown = name + (f"!{conversion}" if conversion else "")
            raise ConfigError(f"out = {template!r}: unknown placeholder {{{shown}}}; valid: "
                              + ", ".join("{" + p + "}" for p in PLACEHOLDERS))
        if name == "method":
            if not (command.per_method and command.writes_folder):
                raise ConfigError(f"out = {template!r}: {{method}} names a run cell's one method; a {command.name} "
                                  f"cell has {'several' if command.methods == 'many' else 'none'}")
            if spec not in ("", "-", "_"):
                raise ConfigError(f"out = {template!r}: {{method:{spec}}}: the separator must be - or _")
            value = paths.folder_name(cfg.method, spec or "-", spec or "-")
        elif spec:
            raise ConfigError(f"out = {template!r}: {{{name}:{spec}}}: only {{method}} takes a format (- or _)")
        elif name == "machine":
            value = machine_key(cfg)
        else:
            value = values[name]
        parts.append(value.replace("/", "_"))       # a model naming a path stays one folder name
    rel = "".join(parts)
    bad = [p for p in rel.split("/") if p in ("", ".", "..")]
    if bad:
        raise ConfigError(f"out = {template!r} gives {rel!r}: every part must be a folder name under the results "
                          f"root (no '..', '.' or empty parts)")
    return rel
