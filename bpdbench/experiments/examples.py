"""Which examples a command evaluates (or tunes on): one selection rule for every command, the auto shapes' held-out
slice and the sweep's checks, below the session so that what the session calls (autoshape) can select too."""
from __future__ import annotations

from pathlib import Path

import tasks as task_registry
from ..config import ConfigError, RunConfig


def select_examples(cfg: RunConfig, split: str = "eval", per_category: int | None = None) -> list:
    """The task's `split` (eval for runs, tune for `tune` and `auto`: tasks.splits), then --offset/--limit, or the
    first N per category."""
    task = task_registry.get_task(cfg.task)
    data_dir = Path(cfg.data_dir) if cfg.data_dir else task_registry.default_data_dir()
    examples = task_registry.load_examples(task, data_dir, Path(cfg.data_file) if cfg.data_file else None)
    if split not in task_registry.SPLITS:
        raise ConfigError(f"unknown split {split!r}; valid: {', '.join(task_registry.SPLITS)}")
    pool = task_registry.splits(task, examples)[split]
    if per_category is not None:
        seen: dict = {}
        chosen = []
        for ex in pool:
            seen[ex.category] = seen.get(ex.category, 0) + 1
            if seen[ex.category] <= per_category:
                chosen.append(ex)
        return chosen
    if split != "eval" and not pool:
        raise ConfigError(f"{cfg.task} has no {split} split ({len(examples)} examples, all evaluated); tune on "
                          f"a task with one, or pass --alpha / alpha= instead of tuning")
    chosen = task_registry.select(pool, cfg.offset, cfg.limit)
    if not chosen:
        raise ConfigError(f"{cfg.task}: no examples selected ({len(pool)} {split} examples, --offset "
                          f"{cfg.offset}); lower --offset or add data")
    return chosen
