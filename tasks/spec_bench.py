"""Spec-Bench: 480 prompts in 13 categories for speed measurement.

Its first 80 records are MT-Bench in the same order, so the default `index % 10 == 9` held-out rule holds out the
same MT-Bench questions in both tasks; do not give this task a different `heldout_key`. Its tune split takes the
tail of that MT-Bench block as mt_bench's does (the same questions) and the tail of each other category.
"""
from ._chat import LAYOUT, parse_question
from .base import Task

OWN_CATEGORIES = ("translation", "summarization", "qa", "math_reasoning", "rag")   # the rest is MT-Bench

TASK = Task(name="spec_bench", group="CHAT", chat=True, files=("spec_bench/question.jsonl",), layout=LAYOUT,
            parse=parse_question, max_new_tokens=128,
            tune_group=lambda ex: ex.category if ex.category in OWN_CATEGORIES else "mt_bench")
