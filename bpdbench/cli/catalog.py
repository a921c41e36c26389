"""The commands that list what there is: methods, models, tasks, rescorers.

They read the registries and what the caches hold; `methods` also says for each method whether what it needs
(heads, a rescorer artefact, a second model, a table or network its first use builds) is there, and if not, how long
building it takes and the command that builds it alone: the artefact graph's own answer (artefacts/graph.py), so a
user sees what a run or a sweep would build before starting one.
"""
from __future__ import annotations

from ..config import RunConfig
from .errors import one_line_errors
from .options import DEFAULT_MODEL, HeadsPath, HeadsProfile, Model


@one_line_errors
def methods(model: Model = DEFAULT_MODEL, heads_profile: HeadsProfile = "quick", heads_path: HeadsPath = None) -> None:
    """List every method with the artefacts it needs, from the artefact graph a sweep builds them by (present, or
    the minutes and command that build it), and what its drafter takes from the decode loop (its contract, for the
    default spelling)."""
    from ..artefacts import graph
    from ..methods import REGISTRY, Method, contract
    from ..sweep.trainings import heads_dtype
    cfg = RunConfig(model=model, heads_profile=heads_profile, heads_path=heads_path).validate()
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
