"""LAMBADA (OpenAI detokenized): predict the last word of a passage; a plain completion task, no chat template."""
from __future__ import annotations

from .base import Example, Task

_PUNCT = ".,;:!?\"'"


def parse(record: dict) -> Example:
    text = str(record["text"]).rstrip()
    context, word = text.rsplit(None, 1)  # ValueError on a one-word text -> reported as a bad record
    return Example(id=str(record["id"]), prompt=context, reference=word, target=" " + word)


def first_word(output: str) -> str:
    """Models often continue past the target word or add punctuation; only the first word counts."""
    words = output.strip().split()
    return words[0].strip(_PUNCT) if words else ""


def score(example: Example, output: str) -> dict[str, float]:
    return {"accuracy": float(first_word(output) == example.reference)}


TASK = Task(
    name="lambada", group="LM", chat=False,
    files=("lambada/test.jsonl",), layout="JSONL with fields id, text",
    parse=parse, score=score, metrics=("accuracy",),
    hf=("EleutherAI/lambada_openai", "default", "test"), max_new_tokens=8,
)
