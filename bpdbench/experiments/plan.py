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
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from .. import paths, refine
from ..config import ConfigError, RunConfig
from ..methods import REGISTRY, Method, MethodError, contract, parse, parse_list
from ..methods.registry import canonical
from ..artefacts import checks
from ..methods import preflight as method_checks
from . import engines
from .examples import select_examples

# the result folder of each command under <results>/ (run folders are named after the method, see `run_folder`)
FOLDERS = {"run": "runs", "replay": "replay", "oracle": "oracle", "analyze": "analysis", "speed": "speed",
           "certify": "certify", "alpha_law": "alpha_law", "tune": ""}


@dataclass(frozen=True)
class SpeedOptions:
    repeats: int = 3


@dataclass(frozen=True)
class CertifyOptions:
    rules: tuple[str, ...] = ("exact",)
    samples: int = 300
    positions: int = 4
    level: float = 0.01


@dataclass(frozen=True)
class AlphaLawOptions:
    gamma_max: int = 8
    temperatures: tuple[float, ...] = (0.0, 0.7, 1.0)


# a command's own settings beyond the RunConfig, typed, on the Plan: the CLI and a grid cell fill the same object, and
# `execute` (experiments/execute.py) reads it; the commands without any have none
OPTIONS = {"speed": SpeedOptions, "certify": CertifyOptions, "alpha_law": AlphaLawOptions}


@dataclass(frozen=True)
class Plan:
    cfg: RunConfig                      # validated
    kind: str                           # a key of FOLDERS
    methods: tuple[Method, ...]
    examples: tuple                     # the selection the session decodes (held-out for tune)
    out: Path | None                    # None: the command writes no folder (tune writes the alpha table)
    resume: bool = False
    per_category: int | None = None
    options: object = None              # OPTIONS[kind], or None for a command without settings of its own

    @property
    def method(self) -> Method:
        """The one method of `run` (and `tune`)."""
        return self.methods[0]


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
    """`bpdbench run`'s default folder: task, model, method and dtype; a draft threshold is named only where the
    method reads one, a sampling run by its settings."""
    label = method.label
    if cfg.draft_threshold > 0 and takes_threshold(method) and "threshold=" not in label:
        label += f"-t{cfg.draft_threshold:g}"
    if not cfg.sampling.greedy:
        label += "-" + cfg.sampling.label() + (f"-s{cfg.seed}" if cfg.seed else "")
    return paths.run_dir(cfg.task, cfg.model, label, cfg.dtype)


def takes_threshold(method: Method) -> bool:
    """Whether `--draft-threshold` changes what the method drafts (its own `threshold=` parameter's default)."""
    return method.label != "ar" and any(p.name == "threshold" for p in method.spec.params)


def out_of(cfg: RunConfig, kind: str, methods: Sequence[Method]) -> Path | None:
    if kind == "tune":
        return None
    if cfg.out:
        return Path(cfg.out)
    if kind == "run":
        return run_folder(cfg, methods[0])
    if kind == "certify":                   # one folder per question asked: methods, sampling, dtype
        tag = paths.folder_name("+".join(m.label for m in methods))
        name = paths.shell_safe(f"{cfg.task}-{tag}-{cfg.sampling.label()}-{cfg.dtype}")
        return paths.experiment_dir("certify", name)
    return paths.experiment_dir(FOLDERS[kind], cfg.task)


def preflight(cfg: RunConfig, split: str = "eval", per_category: int | None = None,
              methods: list[Method] | None = None, log=print) -> list:
    """Everything that can be checked without loading the model: options, data, model folder, heads files against
    their config, --k against the drafting shortlist. Returns the selected examples. Called before the progress bar
    and before any model loads, so a bad input costs a second, not a model load."""
    examples = check_inputs(cfg, split, per_category, methods)
    check_files(cfg, methods, log)
    return examples


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


def check_replay(cfg: RunConfig, methods: list[Method]) -> None:
    """Before anything loads: replay needs a greedy trajectory and our own decode loop."""
    if not cfg.sampling.greedy:
        raise ConfigError(f"replay walks each method along the greedy reference, but at --temperature "
                          f"{cfg.temperature:g} the trajectory depends on the draws, so there is none to replay; "
                          f"decode for real with `bpdbench run --temperature {cfg.temperature:g} --method M`")
    external = [m.label for m in methods if m.spec.external]
    if external:
        raise ValueError(f"{', '.join(external)} run their own engine's loop (transformers, llama.cpp) and cannot be "
                         f"replayed; "
                         f"time them with `bpdbench speed`")


def prepare(cfg: RunConfig, kind: str, methods: str | Sequence[str] | Sequence[Method] | None = None, *,
            resume: bool | None = None, per_category: int | None = None, split: str = "eval",
            log=print, files: bool = True, select: Callable[..., list] | None = None, options: object = None) -> Plan:
    """Validate, parse and select once; raise ConfigError (one line) on anything a user can fix. `files=False`
    leaves the artefact files to `check_files` (a sweep's driver: its tasks build them later, on the workers);
    `select`: see check_inputs."""
    if kind not in FOLDERS:
        raise ValueError(f"unknown command kind {kind!r}")
    want = OPTIONS.get(kind)
    if options is None and want is not None:
        options = want()
    if (want is None) != (options is None) or (want is not None and not isinstance(options, want)):
        raise ValueError(f"{kind} takes {want.__name__ if want else 'no options'}, got {type(options).__name__}")
    cfg = cfg.validate()
    if methods is None:
        parsed = [method_of(cfg)] if kind in ("run", "tune") else []
    elif isinstance(methods, str) or any(isinstance(m, str) for m in methods):
        parsed = methods_of(methods)
    else:
        parsed = list(methods)
    if kind == "speed":          # ar, the baseline every speedup divides by, always runs, first
        ar = [m for m in parsed if m.label == "ar"] or [parse("ar")]
        parsed = ar[:1] + [m for m in parsed if m.label != "ar"]
        engines.check(parsed)     # llama.cpp's prompt lookup needs llama.cpp's greedy, which certifies it
    if kind == "replay":
        check_replay(cfg, parsed)
    examples = check_inputs(cfg, split, per_category, parsed, select)
    if files:
        check_files(cfg, parsed, log)
    return Plan(cfg, kind, tuple(parsed), tuple(examples), out_of(cfg, kind, parsed),
                cfg.resume if resume is None else resume, per_category, options)
