"""Free-form prompts from a user file (--data-file): for quick speed checks, nothing is held out or scored."""
from __future__ import annotations

from .base import Example, Task


def parse(record: dict) -> Example:
    return Example(id=str(record["id"]), prompt=str(record["prompt"]))


TASK = Task(name="prompts", group="CHAT", chat=True, files=(), layout="JSONL with fields id, prompt",
            parse=parse, heldout_key=lambda index, ex: False, max_new_tokens=128, tune_fraction=0.0)
