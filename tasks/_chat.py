"""Shared parser for FastChat-style question files (MT-Bench, Spec-Bench): no references, speed/judge only."""
from __future__ import annotations

from .base import Example

LAYOUT = "JSONL with fields question_id, category, turns"


def parse_question(record: dict) -> Example:
    turns = record["turns"]
    if isinstance(turns, str) or not turns:
        raise ValueError("'turns' must be a non-empty list of strings")
    turns = tuple(str(t) for t in turns)
    return Example(id=str(record["question_id"]), prompt=turns[0], category=str(record["category"]), turns=turns)
