"""A command prepared once from its flags: the validated config, the parsed `Method`s, the selected examples and the
output folder.

Why: the CLI and the sweep hand every command one `Plan`; the session, the decoders and the result writers read
it and never validate the config, parse a spelling or select examples again. Everything a user can get wrong fails
in `prepare`, before any model loads; the `Method` objects made here are the ones the drafters are built from and
whose labels config.json records for the tables. The sweep prepares each cell's Plan on its driver and ships it to
a Ray worker, so a Plan pickles (its methods as references into the registry, see `_method_ref`).
"""
from __future__ import annotations

import copyreg
from pathlib import Path
from typing import Callable, Sequence

from .. import paths, refine
from ..config import ConfigError, RunConfig
from ..methods import REGISTRY, Method, MethodError, bind, contract, parse, parse_list
from ..methods.registry import canonical
from ..artefacts import checks
from ..methods import preflight as method_checks
from .command import AlphaLawOptions, CertifyOptions, CommandSpec, Plan, SpeedOptions  # noqa: F401 (re-exported)
from .commands import spec
from .examples import select_examples


def _method(name: str, params: dict, spelled: str) -> Method:
    return Method(REGISTRY[name], params, spelled)


def _method_ref(method: Method) -> tuple:
    """How a Method pickles: its registry name and typed parameters (nested methods the same way). Unpickling looks
    the spec up again, parsing nothing, and gives the registry's own spec object. Why: a spec holds its build and
    check functions, lambdas among them, which plain pickle refuses and cloudpickle would copy by value; a Plan must
    reach a sweep worker in another process as the same methods. A spec that is not the registry's (made on the fly)
    pickles as before."""
    if REGISTRY.get(method.spec.name) is not method.spec:
        return method.__reduce_ex__(2)
    return _method, (method.spec.name, method.params, method.spelled)


copyreg.pickle(Method, _method_ref)


def method_of(cfg: RunConfig) -> Method:
    """`--method` and its alias `--rescorer` (`--rescorer R` is `--method R`) as one method."""
    method, rescorer = cfg.method, cfg.rescorer
    try:
        if canonical(rescorer) not in ("bpd",):
            if canonical(method) not in ("bpd", canonical(rescorer)):
                raise ConfigError(f"--method {method} and --rescorer {rescorer} name two methods; pass one "
                                  f"(--rescorer R is short for --method R)")
            method = rescorer
        return parse(method)
    except MethodError as e:
        raise ConfigError(str(e)) from None


def methods_of(spellings: str | Sequence[str]) -> list[Method]:
    try:
        return parse_list(spellings)
    except MethodError as e:
        raise ConfigError(str(e)) from None


def run_folder(cfg: RunConfig, method: Method) -> Path:
    """`bpdbench run`'s default folder: task, model, the method's label (which names the run options it reads where
    they differ from their defaults: `bpd:threshold=0.4` under --draft-threshold 0.4) and dtype; a sampling run by
    its settings."""
    label = method.label
    if not cfg.sampling.greedy:
        label += "-" + cfg.sampling.label() + (f"-s{cfg.seed}" if cfg.seed else "")
    return paths.run_dir(cfg.task, cfg.model, label, cfg.dtype)


def out_of(cfg: RunConfig, command: CommandSpec, methods: Sequence[Method]) -> Path | None:
    """Where the command writes: --out, else its default folder (run and certify: named after their methods and
    settings; the others: <results>/<folder>/<task>); None for a command that writes no folder (tune)."""
    if not command.writes_folder:
        return None
    if cfg.out:
        return Path(cfg.out)
    if command.named_by_methods and command.methods == "one":
        return run_folder(cfg, methods[0])
    if command.named_by_methods:          # one folder per question asked: methods, sampling, dtype
        tag = paths.folder_name("+".join(m.label for m in methods))
        name = paths.shell_safe(f"{cfg.task}-{tag}-{cfg.sampling.label()}-{cfg.dtype}")
        return paths.experiment_dir(command.name, name)
    return paths.experiment_dir(command.folder, cfg.task)


def check_inputs(cfg: RunConfig, split: str = "eval", per_category: int | None = None,
                 methods: list[Method] | None = None, select: Callable[..., list] | None = None) -> list:
    """What the user chose: methods that exist for these sampling settings, and the examples (`select`: a selector
    with select_examples' signature, e.g. one that remembers selections shared by many sweep cells)."""
    if not cfg.sampling.greedy:
        greedy_only = [m.label for m in methods or [] if contract.Input.REFERENCE in contract.inputs(m)]
        if greedy_only:
            raise ConfigError(f"{', '.join(greedy_only)} drafts from the greedy reference, so it exists for greedy "
                              f"decoding only; drop --temperature or the method")
    refine.alpha_table(Path(cfg.alpha_file) if cfg.alpha_file else paths.alpha_file())    # corrupt: one line now
    return (select or select_examples)(cfg, split, per_category)


def check_files(cfg: RunConfig, methods: list[Method] | None = None, log=print) -> None:
    """The artefact files the command reads: model folder or cache, heads against their config, draft networks.
    A sweep checks them on the worker, just before the cell runs: its own tasks build them after the driver plans."""
    checks.check_model_files(cfg.model, cfg.dtype)
    method_checks.check_heads(cfg, methods, log)
    method_checks.check_methods(cfg, methods)


def check_engines(command: CommandSpec, methods: Sequence[Method]) -> None:
    """Methods that run another engine's loop can only be timed: every other command walks ours."""
    external = [m.label for m in methods if m.spec.external]
    if external and not command.external:
        raise ConfigError(f"{', '.join(external)} run their own engine's loop (transformers, llama.cpp) and cannot be "
                          f"replayed, certified or analysed by `bpdbench {command.name.replace('_', '-')}`; time "
                          f"them with `bpdbench speed` (in a grid: a [[speed]] block)")


def with_baseline(command: CommandSpec, methods: list[Method]) -> list[Method]:
    """The methods with the command's baseline first (speed: ar, the divisor of every speedup), added if absent."""
    if command.baseline is None:
        return methods
    first = [m for m in methods if m.label == command.baseline] or [parse(command.baseline)]
    return first[:1] + [m for m in methods if m.label != command.baseline]


def prepare(cfg: RunConfig, command: str, methods: str | Sequence[str] | Sequence[Method] | None = None, *,
            resume: bool | None = None, per_category: int | None = None, split: str | None = None,
            log=print, files: bool = True, select: Callable[..., list] | None = None, options: object = None) -> Plan:
    """Validate, parse and select once; raise ConfigError (one line) on anything a user can fix. `files=False`
    leaves the artefact files to `check_files` (a sweep's driver: its tasks build them later, on the workers);
    `select`: see check_inputs; `split`: the command's own (tune: the tune split) unless given."""
    c = spec(command)
    if options is None and c.options is not None:
        options = c.options()
    if (c.options is None) != (options is None) or (c.options is not None and not isinstance(options, c.options)):
        raise ValueError(f"{command} takes {c.options.__name__ if c.options else 'no options'}, "
                         f"got {type(options).__name__}")
    cfg = cfg.validate()
    if methods is None:             # one: the config's --method; fixed: the drafts the command chooses itself
        parsed = [method_of(cfg)] if c.methods == "one" else list(c.fixed(cfg)) if c.methods == "fixed" else []
    elif isinstance(methods, str) or any(isinstance(m, str) for m in methods):
        parsed = methods_of(methods)
    else:
        parsed = list(methods)
    parsed = [bind(m, cfg) for m in with_baseline(c, parsed)]   # --heads, --k, ... as the methods' own values
    check_engines(c, parsed)
    c.check(cfg, parsed, options)
    examples = check_inputs(cfg, split or c.split, per_category, parsed, select)
    if files:
        check_files(cfg, parsed, log)
    return Plan(cfg, command, tuple(parsed), tuple(examples), out_of(cfg, c, parsed),
                cfg.resume if resume is None else resume, per_category, options)
