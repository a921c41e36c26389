"""XSum: BBC articles with a single-sentence, highly abstractive summary."""
from ._summarization import summarization_task

TASK = summarization_task(
    "xsum", "L-SUM",
    "Summarize the following news article in one sentence.",
    hf=("EdinburghNLP/xsum", None, "test"),
)
