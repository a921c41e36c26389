"""Which examples a command evaluates (or tunes on): one selection rule for every command, the auto shapes' held-out
slice and the sweep's checks, below the session so that what the session calls (autoshape) can select too."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import tasks as task_registry
from ..config import ConfigError, RunConfig


def prompt_sha256(example) -> str:
    """What each result record states of the prompt it was decoded from (store.PROMPT_HASH): the text of the turns
    up to the one the example asks, so a resume can tell an edited prompt from the one its record was made from."""
    text = json.dumps([*example.turns[:example.turn], example.prompt], ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def select_examples(cfg: RunConfig, split: str = "eval", per_category: int | None = None) -> list:
    """The task's `split` (eval for runs, tune for `tune` and `auto`: tasks.splits), then --offset/--limit, or the
    first N per category, taken in turns (the first of every category, then the second, ...): the leaderboard is
    accumulated over sittings, and its prompts so far must span the categories. Or the prompts of a draw file
    (--prompts, experiments/draw.py). With --turns N a multi-turn question is followed by its later turns."""
    task = task_registry.get_task(cfg.task)
    data_dir = Path(cfg.data_dir) if cfg.data_dir else task_registry.default_data_dir()
    examples = task_registry.load_examples(task, data_dir, Path(cfg.data_file) if cfg.data_file else None)
    if split not in task_registry.SPLITS:
        raise ConfigError(f"unknown split {split!r}; valid: {', '.join(task_registry.SPLITS)}")
    pool = task_registry.splits(task, examples)[split]
    chosen = _chosen(cfg, split, per_category, pool, len(examples))
    # A draw and later turns are the evaluation's: tuning and `auto` sizing read the tune split's first turns.
    return task_registry.with_turns(chosen, cfg.turns) if split == "eval" else chosen


def _chosen(cfg: RunConfig, split: str, per_category: int | None, pool: list, n_examples: int) -> list:
    if cfg.prompts is not None and split == "eval":
        return _drawn(cfg, split, per_category, pool)
    if per_category is not None:      # round robin over categories: a run stopped early still covers them all
        seen: dict = {}
        ranked = []
        for ex in pool:
            seen[ex.category] = seen.get(ex.category, 0) + 1
            if seen[ex.category] <= per_category:
                ranked.append((seen[ex.category], ex))
        return [ex for _, ex in sorted(ranked, key=lambda r: r[0])]       # stable: the pool's order within a rank
    if split != "eval" and not pool:
        raise ConfigError(f"{cfg.task} has no {split} split ({n_examples} examples, all evaluated); tune on "
                          f"a task with one, or pass --alpha / alpha= instead of tuning")
    chosen = task_registry.select(pool, cfg.offset, cfg.limit)
    if not chosen:
        raise ConfigError(f"{cfg.task}: no examples selected ({len(pool)} {split} examples, --offset "
                          f"{cfg.offset}); lower --offset or add data")
    return chosen


def _drawn(cfg: RunConfig, split: str, per_category: int | None, pool: list) -> list:
    """The prompts of a draw file (experiments/draw.py), in its order, then --offset/--limit; each must be in the
    split, so a board never evaluates a prompt that trained or tuned anything."""
    from .draw import read
    if per_category is not None:
        raise ConfigError("give --prompts (a draw file) or --per-category, not both")
    ids = read(cfg.prompts, cfg.task)
    by_id = {ex.id: ex for ex in pool}
    missing = [i for i in ids if i not in by_id]
    if missing:
        raise ConfigError(f"--prompts {cfg.prompts}: {len(missing)} of its ids are not in {cfg.task}'s {split} "
                          f"split (first: {missing[0]}); draw again with `bpdbench draw`")
    return task_registry.select([by_id[i] for i in ids], cfg.offset, cfg.limit)
