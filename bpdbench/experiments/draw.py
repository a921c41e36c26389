"""`bpdbench draw`: the leaderboard's prompts, drawn once from the eval split and held out from development.

Why a committed file and not a rule: a board is evidence only if nothing was developed or chosen on its prompts.
A rule such as "the first N per category" hands the same prompts to every study, so the studies that choose the
board's rows end up tuned on its prompts. The draw is made once, with a seed it records, from the eval prompts no
committed result folder has evaluated, stratified by the task's subtasks (Spec-Bench's six: MT-Bench, translation,
summarization, QA, math reasoning, RAG) with the same count in each; within a subtask its categories are taken in
turns (MT-Bench's eight), so 8 MT-Bench questions span as many categories as the eval prompts left allow. The order interleaves the subtasks, so a
board stopped early still spans them. `tests/unit/test_board_heldout.py` fails when any other committed folder
evaluates a drawn prompt.
"""
from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import tasks as task_registry
from tasks.base import TURN_SUFFIX
from .. import paths
from ..config import ConfigError
from ..store import write_atomic

# Tasks whose question ids are one id space: Spec-Bench's first 80 records are MT-Bench's questions, same ids.
SHARED_IDS = {"spec_bench": ("spec_bench", "mt_bench"), "mt_bench": ("spec_bench", "mt_bench")}


@dataclass(frozen=True)
class Draw:
    task: str
    seed: int
    per_subtask: int
    ids: tuple[str, ...]
    subtasks: dict[str, str]          # id -> subtask
    excluded: int                     # eval prompts left out because a committed folder evaluated them
    excluded_sha256: str

    def to_json(self) -> dict:
        return {"task": self.task, "seed": self.seed, "per_subtask": self.per_subtask, "split": "eval",
                "ids": list(self.ids), "subtasks": self.subtasks,
                "excluded": {"n": self.excluded, "sha256": self.excluded_sha256},
                "recipe": f"bpdbench draw --task {self.task} --per-subtask {self.per_subtask} --seed {self.seed}"}


def subtask(task, example) -> str | None:
    """The subtask a prompt belongs to (Spec-Bench: its tune group), None for a task without them."""
    return task.tune_group(example) if task.tune_group else None


def by_folder(results: Path, task: str, skip: frozenset[Path] = frozenset()) -> Iterator[tuple[Path, set[str]]]:
    """(folder, the question ids it evaluated) for every committed folder under `results` of `task` or a task
    sharing its ids (SHARED_IDS), from its per-example files; folders in `skip` (a board's own) are left out."""
    from .audit import evaluated_ids
    family = SHARED_IDS.get(task, (task,))
    for cfg_path in committed(results):
        folder = cfg_path.parent
        if "tables" in folder.relative_to(results).parts or folder.resolve() in skip:
            continue
        try:
            meta = json.loads(cfg_path.read_text())
        except (OSError, ValueError):
            continue
        if (meta.get("config") or {}).get("task") in family:
            yield folder, {i.split(TURN_SUFFIX)[0] for i in evaluated_ids(folder)}


def evaluated(results: Path, task: str, skip: frozenset[Path] = frozenset()) -> set[str]:
    """Every prompt id any committed folder under `results` evaluated for `task` or a task sharing its ids."""
    return set().union(*(ids for _, ids in by_folder(results, task, skip)))


def made_from(results: Path, draw_file: Path) -> list[Path]:
    """The result folders whose prompts came from `draw_file` (config.json config.prompts names it)."""
    target = draw_file.resolve()
    out = []
    for cfg_path in sorted(results.rglob("config.json")):
        try:
            named = (json.loads(cfg_path.read_text()).get("config") or {}).get("prompts")
        except (OSError, ValueError):
            continue
        if named and _resolve(named).resolve() == target:
            out.append(cfg_path.parent.resolve())
    return out


def _resolve(path: str | Path) -> Path:
    p = Path(path)
    if not p.is_absolute() and not p.exists():      # a grid's or config's repo-relative path, from anywhere
        p = paths.REPO / p
    return p


def committed(results: Path) -> list[Path]:
    """The config.json files git tracks under `results` (a demo's or a test's ignored folder is not a committed
    result); every one on disk where `results` is not in a git checkout."""
    import subprocess
    try:
        done = subprocess.run(["git", "-C", str(results), "ls-files", "-z", "--", "."], capture_output=True,
                              timeout=60, check=True)
        tracked = [results / f for f in done.stdout.decode().split("\0") if f.endswith("config.json")]
    except (OSError, subprocess.SubprocessError):
        tracked = []
    return sorted(tracked) if tracked else sorted(results.rglob("config.json"))


def make(task_name: str, per_subtask: int, seed: int, exclude: set[str], data_dir: Path | None = None) -> Draw:
    """The draw: per subtask, `per_subtask` eval prompts not in `exclude`, categories in turns, seeded shuffle."""
    if per_subtask < 1:
        raise ConfigError(f"--per-subtask must be >= 1, got {per_subtask}")
    task = task_registry.get_task(task_name)
    examples = task_registry.load_examples(task, data_dir or task_registry.default_data_dir())
    pool = [ex for ex in task_registry.splits(task, examples)["eval"] if ex.id not in exclude]
    rng = random.Random(seed)
    groups: dict[str, list] = {}
    for ex in pool:
        groups.setdefault(subtask(task, ex) or task_name, []).append(ex)
    picked: dict[str, list] = {}
    for name in sorted(groups):
        by_category: dict[str, list] = {}
        for ex in groups[name]:
            by_category.setdefault(ex.category or "", []).append(ex)
        for members in by_category.values():
            rng.shuffle(members)
        order = sorted(by_category)
        rng.shuffle(order)
        taken = [members[i] for i in range(max(map(len, by_category.values())))
                 for members in (by_category[c] for c in order) if i < len(members)]
        if len(taken) < per_subtask:
            raise ConfigError(f"{task_name}: subtask {name} has {len(taken)} eval prompts no committed folder "
                              f"evaluated, fewer than --per-subtask {per_subtask}")
        picked[name] = taken[:per_subtask]
    ids = tuple(picked[name][i].id for i in range(per_subtask) for name in sorted(picked))
    subtasks = {ex.id: name for name, group in picked.items() for ex in group}
    digest = hashlib.sha256("\n".join(sorted(exclude)).encode()).hexdigest()[:16]
    return Draw(task_name, seed, per_subtask, ids, subtasks, len(exclude & {ex.id for ex in examples}), digest)


def write(draw: Draw, out: Path) -> Path:
    write_atomic(out, json.dumps(draw.to_json(), indent=1) + "\n")
    return out


def read(path: str | Path, task: str) -> list[str]:
    """The ids of a draw file for `task`; one-line errors for a missing, broken or other task's file."""
    p = _resolve(path)
    if not p.is_file():
        raise ConfigError(f"--prompts {path}: no such draw file; make one with `bpdbench draw --task {task} ...`")
    try:
        data = json.loads(p.read_text())
        ids, drawn_for = [str(i) for i in data["ids"]], data["task"]
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"--prompts {path}: not a draw file ({type(e).__name__}: {e}); expected JSON with "
                          f"task and ids, as `bpdbench draw` writes") from None
    if drawn_for != task:
        raise ConfigError(f"--prompts {path} was drawn for task {drawn_for}, not {task}; pass --task {drawn_for}")
    if not ids or len(set(ids)) != len(ids):
        raise ConfigError(f"--prompts {path}: its ids must be non-empty and unique")
    return ids


def record(path: str | Path, task: str) -> dict:
    """What a result folder records of the draw it evaluated (config.json "draw"): the file as given, its seed, its
    ids and its content hash, so the board says which prompts it planned and a changed draw file is seen."""
    p = _resolve(path)
    data = json.loads(p.read_text())
    return {"file": str(path), "task": task, "seed": data.get("seed"), "per_subtask": data.get("per_subtask"),
            "ids": read(p, task), "sha256": hashlib.sha256(p.read_bytes()).hexdigest()[:16]}


def violations(results: Path, draw_file: Path) -> list[str]:
    """"folder: ids" for every committed folder not made from `draw_file` that evaluated one of its prompts: what
    makes a board's prompts no longer held out (tests/unit/test_board_heldout.py fails on any)."""
    task = json.loads(draw_file.read_text())["task"]
    drawn = set(read(draw_file, task))
    out = []
    for folder, ids in by_folder(results, task, frozenset(made_from(results, draw_file))):
        if hit := sorted(drawn & ids):
            out.append(f"{folder.relative_to(results)}: {', '.join(hit)}")
    return out
