"""Cornell NewsRoom: requires a signed data agreement, so there is neither a shipped file nor a Hub fallback."""
from ._summarization import not_redistributable, summarization_task

TASK = summarization_task(
    "newsroom", "L-SUM",
    "Write a short summary (one or two sentences) of the following news article.",
    hf=None, note=not_redistributable("newsroom"),
)
