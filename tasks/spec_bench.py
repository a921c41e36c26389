"""Spec-Bench: 480 prompts in 13 categories for speed measurement.

Its first 80 records are MT-Bench in the same order, so the default `index % 10 == 9` held-out rule holds out the
same MT-Bench questions in both tasks; do not give this task a different `heldout_key`.
"""
from ._chat import LAYOUT, parse_question
from .base import Task

TASK = Task(name="spec_bench", group="CHAT", chat=True, files=("spec_bench/question.jsonl",), layout=LAYOUT,
            parse=parse_question, max_new_tokens=128)
