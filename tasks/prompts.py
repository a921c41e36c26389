"""Free-form prompts from a user file (--data-file): for quick speed checks, nothing is held out or scored."""
from __future__ import annotations

from .base import Example, Task


def parse(record: dict) -> Example:
    """A prompt must be text: str(None) would decode the word "None" and exit 0 (ValueError: a one-line DataError)."""
    prompt = record["prompt"]
    if not isinstance(prompt, str):
        raise ValueError(f"'prompt' must be a string, got {type(prompt).__name__}")
    return Example(id=str(record["id"]), prompt=prompt)


TASK = Task(name="prompts", group="CHAT", chat=True, files=(), layout="JSONL with fields id, prompt",
            parse=parse, heldout_key=lambda index, ex: False, max_new_tokens=128, tune_fraction=0.0)
