"""Multi-News: several source articles per summary; not shipped (LILY Lab agreement forbids redistribution)."""
from ._summarization import not_redistributable, summarization_task

SEPARATOR = "|||||"


def _join_articles(document: str) -> str:
    """The raw separator is noise to a model; blank lines read as article boundaries."""
    return "\n\n".join(part.strip() for part in document.split(SEPARATOR) if part.strip())


TASK = summarization_task(
    "multi_news", "L-SUM",
    "Summarize the following news articles, which cover the same story, in one paragraph.",
    hf=("multi_news", None, "test"), prepare=_join_articles, note=not_redistributable("multi_news"),
)
