"""SQuAD v1.1 dev: extractive QA scored with the official EM/F1 normalization (reimplemented, no dependency)."""
from __future__ import annotations

import re
import string
from collections import Counter

from .base import Example, Task

_PUNCT = frozenset(string.punctuation)

PROMPT = ("Answer the question with a short phrase copied from the passage. Reply with the phrase only.\n\n"
          "Passage: {context}\n\nQuestion: {question}\nAnswer:")


def parse(record: dict) -> Example:
    answers = record["answers"]
    if isinstance(answers, dict):  # Hub layout: {"text": [...], "answer_start": [...]}
        answers = answers["text"]
    if isinstance(answers, str) or not answers:
        raise ValueError("'answers' must be a non-empty list of strings")
    return Example(id=str(record["id"]), prompt=PROMPT.format(context=record["context"], question=record["question"]),
                   reference=tuple(str(a) for a in answers), unit=str(record["title"]))


def normalize_answer(text: str) -> str:
    """Official v1.1 normalization: lowercase, drop punctuation and articles, collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def exact_match(prediction: str, truth: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(truth))


def f1(prediction: str, truth: str) -> float:
    pred, gold = normalize_answer(prediction).split(), normalize_answer(truth).split()
    common = sum((Counter(pred) & Counter(gold)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(gold)
    return 2 * precision * recall / (precision + recall)


def score(example: Example, output: str) -> dict[str, float]:
    """Chat models tend to answer on the first line and then explain; score only that line, max over answers."""
    lines = output.strip().splitlines()
    prediction = lines[0] if lines else ""
    answers = example.reference or ("",)
    return {"exact_match": max(exact_match(prediction, a) for a in answers),
            "f1": max(f1(prediction, a) for a in answers)}


def by_article(article_index: int, example: Example) -> bool:
    """Hold out whole articles: questions on one passage are near-duplicates and would leak into tuning."""
    return article_index % 10 == 9


TASK = Task(
    name="squad", group="QA", chat=True,
    files=("squad/validation.jsonl",), layout="JSONL with fields id, title, context, question, answers",
    parse=parse, score=score, metrics=("exact_match", "f1"),
    hf=("rajpurkar/squad", None, "validation"), heldout_key=by_article, max_new_tokens=32,
)
