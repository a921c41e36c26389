"""The commands that list what there is: methods, models, tasks, rescorers, and what the cache holds.

They read the registries and what the caches hold; `methods` also says for each method whether what it needs
(heads, a rescorer artefact, a second model, a table or network its first use builds) is there, and if not, how long
building it takes and the command that builds it alone: the artefact graph's own answer (artefacts/graph.py), so a
user sees what a run or a sweep would build before starting one.
"""
from __future__ import annotations

from typing import Annotated, Callable, Optional

import typer

from ..config import ConfigError, RunConfig
from .errors import one_line_errors
from .options import DEFAULT_MODEL, HeadsPath, HeadsProfile, Model


PlanOf = Annotated[Optional[str], typer.Option("--plan", help="comma-separated method spellings: print only what a run "
                                                              "of them would build, where, and in how many minutes")]


@one_line_errors
def methods(model: Model = DEFAULT_MODEL, heads_profile: HeadsProfile = "quick", heads_path: HeadsPath = None,
            plan: PlanOf = None) -> None:
    """List every method with the artefacts it needs, from the artefact graph a sweep builds them by (present, or
    the minutes and command that build it), and what its drafter takes from the decode loop (its contract, for the
    default spelling). With --plan, the graph's answer for those spellings alone: every node in build order."""
    from ..artefacts import graph
    from ..methods import REGISTRY, Method, contract
    from ..sweep.trainings import heads_dtype
    cfg = RunConfig(model=model, heads_profile=heads_profile, heads_path=heads_path).validate()
    if plan is not None:
        return _plan(cfg, plan, heads_dtype)
    base = graph.nodes(cfg, [], heads_dtype)           # the run's own model: every method needs it, said once
    print("every method needs " + ("; ".join(f"{a.label} {graph.describe(a)}" for a in base) or model))
    for spec in REGISTRY.values():
        method = Method(spec, {})
        _, needs = graph.without_unneeded_data([], [a for a in graph.nodes(cfg, [method], heads_dtype)
                                                    if a not in base])   # data only where something reads it
        state = "; ".join(f"{a.label} {graph.describe(a)}" for a in needs) or "nothing"
        params = ",".join(p.name + ("~" if p.auto else "") for p in spec.params)
        takes = sorted(contract.inputs(method) - contract.ALWAYS)
        print(f"{spec.name:16s} {('[' + params + ']') if params else '':28s} {spec.description}")
        print(f"{'':16s} needs: {state}{'; takes the ' + ' and the '.join(takes) if takes else ''}"
              f"{'; timed with speed only' if spec.external else ''}")
    print("~: the parameter also takes `auto`, the shape fastest on this machine (docs/methods.md, draft shapes)")


def _plan(cfg: RunConfig, spellings: str, heads_dtype: Callable[[str], str]) -> None:
    """What a run of these spellings would build, from the artefact graph alone (the nodes a sweep cell of them
    waits for, timed runs' cost curve aside): each node present, or its minutes, its command and its path."""
    from ..artefacts import graph
    from ..methods import MethodError, parse_list
    try:
        chosen = parse_list(spellings)
    except MethodError as e:
        raise ConfigError(f"--plan: {e}") from None
    _, nodes = graph.without_unneeded_data([], graph.nodes(cfg, chosen, heads_dtype))
    minutes, unknown, missing = 0.0, 0, 0
    for a in nodes:
        spec = graph.KINDS[a.kind]
        there = spec.present(a)         # once per node: a sealed folder's check hashes its files
        where = spec.path(a)
        print(f"{a.label:40s} {graph.describe(a, there)}" + (f" ({where})" if there and where is not None else ""))
        if not there:
            missing += 1
            m = spec.minutes(a)
            minutes, unknown = (minutes + m, unknown) if m is not None else (minutes, unknown + 1)
    print(f"{', '.join(m.label for m in chosen)} on {cfg.model}: " + (
        "nothing to build" if not missing else f"{missing} to build, about {minutes:g} min on 2 CPU cores"
        + (f" and {unknown} whose first use says how long" if unknown else "")))


@one_line_errors
def models() -> None:
    """List registered models and their cache state."""
    from ..models import MODELS, cache_state
    for spec in MODELS.values():
        print(f"{spec.name:22s} {cache_state(spec.name):22s} {spec.note}")


@one_line_errors
def tasks() -> None:
    """List tasks."""
    from tasks import TASKS
    for t in TASKS.values():
        print(f"{t.name:15s} {t.group:6s} {', '.join(t.metrics) or '-'}")


@one_line_errors
def rescorers() -> None:
    """List the refine stages (each is also a method: `bpdbench methods`)."""
    from ..refine import RESCORERS
    for r in RESCORERS.values():
        print(f"{r.name:15s} {r.description}")


Files = Annotated[bool, typer.Option("--files", help="list every file with its kind, not one line per kind")]


@one_line_errors
def cache(files: Files = False) -> None:
    """What the cache holds, by kind of artefact (artefacts/cache.py): files, size, and the command that builds one
    alone; files no registered kind makes are listed last, as left by an older version or another tool."""
    from .. import paths
    from ..artefacts.cache import SPECS, listing
    root = paths.cache_root()
    entries = listing(root)
    print(f"{paths.cache_name(root)}: {len(entries)} files, {sum(e.size for e in entries) / 2**20:,.0f} MiB")
    if files:
        for e in entries:
            print(f"{e.kind or '(none)':14s} {e.size / 2**20:10,.1f} MiB  {e.path}")
        return
    for spec in SPECS:
        mine = [e for e in entries if e.kind == spec.kind]
        size = f"{len(mine):5d} files {sum(e.size for e in mine) / 2**20:10,.1f} MiB" if mine else f"{'-':>27s}"
        print(f"{spec.kind:14s} {size}  {spec.holds}; built by: {spec.command}")
    stray = [e.path for e in entries if e.kind is None]
    if stray:
        print(f"{len(stray)} files no registered kind makes (nothing reads them; safe to delete):")
        for path in stray:
            print(f"  {path}")
