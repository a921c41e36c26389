"""Task registry: one module per task, each exposing `TASK`; `get_task` is the only lookup the CLI needs."""
from __future__ import annotations

from . import (cnn_dailymail, lambada, mt_bench, multi_news, newsroom, prompts, samsum, spec_bench, squad,
               xsum)
from .base import (DataError, Example, Task, corpus_files, default_data_dir, encode_prompt, encode_prompt_checked,
                   load_examples, question_of, seen, select, split, split_of, splits, SPLITS,
                   with_turns)

_MODULES = (lambada, squad, cnn_dailymail, samsum, xsum, multi_news, newsroom, mt_bench, spec_bench, prompts)
TASKS: dict[str, Task] = {module.TASK.name: module.TASK for module in _MODULES}


def get_task(name: str) -> Task:
    """Look up a task; the error lists valid names so a typo on the command line is self-explaining."""
    try:
        return TASKS[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; valid: {', '.join(TASKS)}") from None


__all__ = ["TASKS", "corpus_files", "encode_prompt", "encode_prompt_checked", "DataError", "Example", "Task", "default_data_dir", "get_task", "load_examples", "question_of", "seen", "select", "split", "split_of", "splits", "SPLITS", "with_turns"]
