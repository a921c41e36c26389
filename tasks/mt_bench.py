"""MT-Bench: 80 two-turn chat questions in 8 categories; only the first turn is decoded by default."""
from ._chat import LAYOUT, parse_question
from .base import Task

TASK = Task(name="mt_bench", group="CHAT", chat=True, files=("mt_bench/question.jsonl",), layout=LAYOUT,
            parse=parse_question, max_new_tokens=128)
