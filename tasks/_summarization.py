"""Shared pieces of the five summarization tasks, so each task module only states its instruction and files."""
from __future__ import annotations

import re
from typing import Callable

from .base import Example, Task

MAX_DOC_WORDS = 400  # keeps prompts well inside small models' context windows; applied identically to every method
LAYOUT = "JSONL with fields id, document, summary"
_scorer = None


def truncate_words(text: str, max_words: int = MAX_DOC_WORDS) -> str:
    """Cut after the n-th whitespace word but keep the original line breaks (dialogue turns, paragraphs)."""
    for i, match in enumerate(re.finditer(r"\S+", text), 1):
        if i == max_words:
            return text[: match.end()]
    return text.strip()


def _first(record: dict, *names: str) -> str:
    """Local files use id/document/summary; Hub copies call them article/dialogue/highlights."""
    for name in names:
        if name in record:
            return str(record[name])
    raise KeyError(names[0])


def make_parse(instruction: str, prepare: Callable[[str], str] = lambda doc: doc) -> Callable[[dict], Example]:
    def parse(record: dict) -> Example:
        document = prepare(_first(record, "document", "article", "dialogue"))
        summary = _first(record, "summary", "highlights")
        prompt = f"{instruction}\n\n{truncate_words(document.strip())}"
        return Example(id=str(record["id"]), prompt=prompt, reference=summary)
    return parse


def rouge_l(reference: str, output: str) -> float:
    """ROUGE-L F-measure with stemming; the scorer is built lazily because importing rouge_score loads nltk."""
    global _scorer
    if _scorer is None:
        from rouge_score import rouge_scorer
        _scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    return _scorer.score(reference, output)["rougeL"].fmeasure


def score(example: Example, output: str) -> dict[str, float]:
    return {"rougeL": rouge_l(str(example.reference or ""), output)}


def summarization_task(name: str, group: str, instruction: str, hf: tuple[str, str | None, str] | None,
                       prepare: Callable[[str], str] = lambda doc: doc, note: str = "") -> Task:
    return Task(name=name, group=group, chat=True, files=(f"{name}/test.jsonl",), layout=LAYOUT,
                parse=make_parse(instruction, prepare), score=score, metrics=("rougeL",), hf=hf,
                max_new_tokens=128, note=note)


def not_redistributable(name: str) -> str:
    """Hint for datasets we may not ship: the user has to obtain and convert them."""
    return (f"this dataset cannot be redistributed, obtain it yourself and convert it to "
            f"{name}/test.jsonl with fields id, document, summary (see {name}/README.md)")
