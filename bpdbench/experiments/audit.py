"""What a result evaluated against what its artefacts saw: the overlap a reader needs to trust a number.

Every task example is in exactly one split (tasks.splits): trained artefacts (heads, drafters, model history,
distillation data) are built from the train split, `tune` and `auto` read the tune split, runs evaluate the eval
split. A result folder's evaluated ids are read from its per-example files and classified by that rule; where an
artefact recorded the ids it saw (`seen`, train/greedy.seen), the overlap with those ids is counted too. A folder
is clean when nothing it evaluated is in train or tune and no recorded artefact saw any of it; the leaderboard
accepts only clean folders.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import tasks as task_registry
from tasks.base import TURN_SUFFIX

from .. import paths

PER_EXAMPLE = ("examples.jsonl", "speed.jsonl", "replay.jsonl", "samples.jsonl")
RULE = "tasks.splits/1"          # train: index % 10 == 9 (SQuAD by article); tune: the tail, 8% per tune group


def _split_of(task: str, data_dir: str | None, data_file: str | None) -> dict[str, str]:
    """Cached per data folder as resolved now: the default folder follows BPDBENCH_DATA, which may change within a
    process (a cache keyed by `None` had kept another folder's splits)."""
    root = Path(data_dir) if data_dir else task_registry.default_data_dir()
    return _split_at(task, str(root) if root else None, data_file)


@lru_cache(maxsize=None)
def _split_at(task: str, root: str | None, data_file: str | None) -> dict[str, str]:
    task_obj = task_registry.get_task(task)
    examples = task_registry.load_examples(task_obj, Path(root) if root else None,
                                           Path(data_file) if data_file else None)
    return task_registry.split_of(task_obj, examples)


def overlap(task: str, ids: list[str] | set[str], artefacts: dict[str, dict] | None = None,
            data_dir: str | None = None, data_file: str | None = None) -> dict:
    """Counts of evaluated ids per split (train, tune, eval, and ids the task's data does not hold) and, per
    artefact that recorded what it saw, how many evaluated ids it saw."""
    where = _split_of(task, data_dir, data_file)
    ids = {_question(str(i), where) for i in ids}
    counts = {name: 0 for name in (*task_registry.SPLITS, "unknown")}
    for i in ids:
        counts[where.get(i, "unknown")] += 1
    out = {"rule": RULE, "evaluated": len(ids), "in_train": counts["train"], "in_tune": counts["tune"],
           "not_in_data": counts["unknown"], "artefacts": {}}
    for name, seen in (artefacts or {}).items():
        if seen.get("unrecorded"):
            out["artefacts"][name] = {"sha256": None, "overlap": None, "why": seen["unrecorded"]}
            continue
        saw = set((seen.get("ids") or {}).get(task, []))
        out["artefacts"][name] = {"sha256": seen.get("sha256"), "overlap": len(ids & saw)}
    out["clean"] = not (out["in_train"] or out["in_tune"] or
                        any(a["overlap"] is None or a["overlap"] for a in out["artefacts"].values()))
    return out


def _question(example_id: str, where: dict[str, str]) -> str:
    """A later turn's id ("<question>-t2", tasks.with_turns) stands for its question, which the data holds."""
    base = example_id.rsplit(TURN_SUFFIX, 1)[0]
    return base if example_id not in where and base in where else example_id


def record(cfg, examples, resolved: dict) -> dict | None:
    """What a new result's config.json states (resolved.overlap): the overlap of the examples it evaluates with each
    split and with every artefact that recorded what it saw. None for a task whose data cannot be read again."""
    try:
        return overlap(cfg.task, [ex.id for ex in examples], artefacts_seen(resolved), cfg.data_dir, cfg.data_file)
    except (task_registry.DataError, ValueError, OSError):
        return None


def artefacts_seen(resolved: dict) -> dict[str, dict]:
    """`seen` records of the artefacts a result's config.json names (heads, drafters, histories, tuned alphas), by
    name; a tuned alpha that recorded nothing is `unrecorded` (its overlap is unknown, so the folder is not clean)."""
    found: dict[str, dict] = {}

    def walk(node, path: str) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("seen"), dict) and "ids" in node["seen"]:
                found[path or "artefact"] = node["seen"]
            elif path.endswith("alpha_table") and node.get("split") != "tune":
                found[path] = {"unrecorded": "an alpha tuned before the splits"}
            elif str(node.get("alpha_source", "")).endswith(".json") and "alpha_table" not in node:
                found[f"{path}.alpha_table"] = {"unrecorded": "an alpha read from a table that recorded nothing"}
            for k, v in node.items():
                if k != "seen":
                    walk(v, f"{path}.{k}" if path else str(k))
    walk(resolved, "")
    return found


def evaluated_ids(folder: Path) -> list[str]:
    """Ids of the examples a result folder holds, from its per-example files."""
    ids: list[str] = []
    for name in PER_EXAMPLE:
        path = folder / name
        if path.is_file():
            for line in path.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:          # a torn last line (crash): that example is not counted
                    continue
                if isinstance(rec, dict) and "id" in rec:
                    ids.append(str(rec["id"]))
    return sorted(set(ids))


def folder(path: Path) -> dict | None:
    """The audit of one result folder (None where it records no task or no per-example ids)."""
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        return None
    try:
        meta = json.loads(cfg_path.read_text())
    except ValueError as e:
        raise ValueError(f"{cfg_path} is not valid JSON ({e}); restore it (git checkout) or move the folder out of "
                         f"the results") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("config", {}), dict):
        raise ValueError(f"{cfg_path} holds no JSON object with a `config` object; restore it (git checkout) or "
                         f"move the folder out of the results")
    cfg = meta.get("config", {})
    ids = evaluated_ids(path)
    if not cfg.get("task") or not ids:
        return None
    recorded = meta.get("resolved", {}).get("overlap")
    try:
        data = _local(cfg.get("data_dir")), _local(cfg.get("data_file"))
    except OutsideData as e:          # not here to read again: the audit the run made of its selection, if any
        if isinstance(recorded, dict) and recorded.get("rule") == RULE:
            return {"task": cfg["task"], **recorded, "recorded": recorded, "source": f"recorded by the run: {e}"}
        return {"task": cfg["task"], "error": str(e), "clean": False}
    try:
        result = overlap(cfg["task"], ids, artefacts_seen(meta.get("resolved", {})), *data)
    except (task_registry.DataError, ValueError) as e:
        return {"task": cfg["task"], "error": str(e), "clean": False}
    return {"task": cfg["task"], **result, "recorded": recorded}


class OutsideData(ValueError):
    """A folder's --data-dir/--data-file lay outside the checkout and the cache (recorded as `<outside>/<name>`)."""


def _local(recorded: str | None) -> str | None:
    """A data path as config.json recorded it (absolute in older folders, portable since: paths.portable), here."""
    if recorded is None:
        return None
    where = paths.resolve(recorded)
    if where is None:
        raise OutsideData(f"its data ({recorded}) lay outside the checkout and the cache of the machine that made it")
    return str(where)


def tree(root: Path) -> dict[str, dict]:
    """Every result folder under `root` (rendered tables left out), relative path -> its audit."""
    out = {}
    for cfg in sorted(root.rglob("config.json")):
        rel = cfg.parent.relative_to(root)
        if "tables" in rel.parts:
            continue
        audit = folder(cfg.parent)
        if audit is not None:
            out[rel.as_posix()] = audit
    return out
