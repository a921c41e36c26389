"""SAMSum: messenger dialogues with short third-person summaries (short-summary group)."""
from ._summarization import summarization_task

TASK = summarization_task(
    "samsum", "S-SUM",
    "Write a short summary (one or two sentences) of the following dialogue.",
    hf=("samsum", None, "test"),
)
