"""CNN/DailyMail: multi-sentence news highlights (short-summary group)."""
from ._summarization import summarization_task

TASK = summarization_task(
    "cnn_dailymail", "S-SUM",
    "Summarize the following news article in 3-4 short highlight sentences, one per line.",
    hf=("cnn_dailymail", "3.0.0", "test"),
)
