"""What a speed folder's rows really measured, beyond their labels: the leaderboard places a folder only when its
prompts are clean (`bpdbench audit`), and renames a row whose label meant another configuration when it ran (a
default since changed to the published one) or whose repeats were timed before drafter state was restored per
repeat, or why it cannot be placed at all (no recorded machine)."""
from __future__ import annotations

from . import load

REQUIRED = (("environment", "fingerprint"), ("environment", "cpu_flags"), ("environment", "processor"),
            ("environment", "git_commit"), ("environment", "versions", "torch"), ("config", "model"))

# Defaults that changed to a paper's published configuration: a folder that ran a bare label before the change
# ran another configuration under the same name, so its row is renamed to say which (docs/methods.md).
PUBLISHED_SINCE = {"sam": {"tokens": 39, "threshold": 5, "bias": 5}, "tree=dynamic": {"nodes": 59, "topk": 10}}


def older_default(label: str, resolved: dict) -> str:
    """`label` as measured: with `[older default: k=v, ...]` where the folder resolved it to a default since changed
    (a value the label does not spell)."""
    name, _, given = label.partition(":")
    spelled = dict(kv.split("=", 1) for kv in given.split(",") if "=" in kv)
    want = {**PUBLISHED_SINCE.get(name, {}), **(PUBLISHED_SINCE["tree=dynamic"] if spelled.get("tree") == "dynamic"
                                                else {})}
    old = {k: resolved[k] for k, v in want.items() if k not in spelled and k in resolved and resolved[k] != v}
    if name == "sam" and "fallback" not in spelled and "fallback" not in resolved:
        old["fallback"] = "none"
    return label + (f" [older default: {', '.join(f'{k}={v}' for k, v in old.items())}]" if old else "")


LEAKED = " [before the per-repeat state restore: later repeats saw their own output]"


def keeps_state(label: str, resolved: dict) -> bool:
    """Whether `label` kept drafter state across timed repeats when speed did not restore it: Token Recycling's
    matrix (persist=1, the default), also as sam's fallback."""
    name = label.partition(":")[0]
    if name == "recycling":
        return int(resolved.get("persist", 1)) == 1
    return name == "sam" and str(resolved.get("fallback", "")).startswith("recycling")


def overlap(f: load.ResultFolder) -> str:
    """Why a folder's prompts cannot be trusted ("" when `bpdbench audit` finds them clean): the leaderboard takes
    only folders that evaluated nothing of the train or tune split and nothing an artefact saw."""
    from ..experiments import audit
    try:
        a = audit.folder(f.path)
    except Exception as e:               # data not here to classify the ids: not proven clean
        return f"not audited ({type(e).__name__}: {e})"
    if a is None or a.get("error"):
        return f"not audited ({(a or {}).get('error', 'no per-example ids')})"
    if not a["clean"]:
        unknown = [x["why"] for x in a["artefacts"].values() if x["overlap"] is None]
        seen = "unknown" if unknown else sum(x["overlap"] for x in a["artefacts"].values())
        return f"overlap: {a['in_train']} train, {a['in_tune']} tune, {seen} seen by artefacts (bpdbench audit)" \
               + (f": {unknown[0]}" if unknown else "")
    return ""


def _dig(d, keys: tuple[str, ...]):
    for k in keys:
        d = d.get(k) if isinstance(d, dict) else None
    return d


def missing(f: load.ResultFolder) -> str:
    """Why a speed folder cannot be placed on a machine's page ("" when it can)."""
    if not f.has_config:
        return "no config.json"
    lacks = [".".join(k) for k in REQUIRED if _dig(f.config, k) is None]
    if not (f.path / "speed.jsonl").exists():
        lacks.append("speed.jsonl")
    return f"older recipe: lacks {', '.join(lacks)}" if lacks else ""
