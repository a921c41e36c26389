"""The shared text corpus (C4 + WikiText from the shared data folder): its documents, and their tokenization per
model, cached once and read by the neural rescorers' training, the n-gram and suffix tables and REST's datastore.
An artefact input, not training code: the lookup drafters read it at decode time."""
from __future__ import annotations

import hashlib
import json
import re
import time
from pathlib import Path
from typing import Callable

import torch

from .. import paths
from ..store import seal

CORPUS_FILES = ("c4_en_validation_2k.jsonl", "wikitext2_valid.tokens.txt", "wikitext2_test.tokens.txt")
_WIKI_TITLE = re.compile(r"^ = [^=].* = $")
_WIKI_HEADING = re.compile(r"^[\s=]+|[\s=]+$")
_WIKI_DETOK = [(" <unk>", ""), (" @-@ ", "-"), (" @,@ ", ","), (" @.@ ", "."), (" , ", ", "), (" . ", ". "),
               (" ; ", "; "), (" : ", ": "), (" 's", "'s"), (" n't", "n't"), ("( ", "("), (" )", ")"), (" ' ", "' ")]


def _detok(line: str) -> str:
    """Undo WikiText's tokenisation (" @-@ ", " , "), so the LM sees text spaced like what the target writes; drop
    its <unk> placeholders rather than teach the LM a token pattern the target never writes."""
    for a, b in _WIKI_DETOK:
        line = line.replace(a, b)
    return line.strip()


def corpus_documents(path: Path) -> list[str]:
    """C4: one document per JSONL record. WikiText: one document per article (split at top-level titles)."""
    text = Path(path).read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        texts = (json.loads(line).get("text", "") for line in text.splitlines() if line.strip())
        return [t for t in texts if t.strip()]
    docs: list[list[str]] = []
    for line in text.splitlines():
        if _WIKI_TITLE.match(line) or not docs:
            docs.append([])
        if line.strip():
            docs[-1].append(_WIKI_HEADING.sub("", line) if line.lstrip().startswith("=") else _detok(line))
    return ["\n".join(d) for d in docs if d]


def tokenized_corpus(files: list[Path], tokenize, cache: Path | None, log) -> list[list[int]]:
    """Token ids per document; cached across sizes (keyed by the files' sizes and mtimes) when `cache` is given."""
    stamp = [[str(f), f.stat().st_size, f.stat().st_mtime] for f in files]
    key = hashlib.sha256(json.dumps(stamp).encode()).hexdigest()

    def tokenized() -> list[list[int]]:
        t0 = time.time()
        docs = [ids for f in files for ids in (tokenize(d) for d in corpus_documents(f)) if ids]
        log(f"  tokenized {len(docs)} documents, {sum(map(len, docs))} tokens in {time.time() - t0:.0f}s")
        return docs
    if cache is None:
        return tokenized()

    def cached(say: Callable[[str], None] | None) -> list[list[int]] | None:
        saved = seal.readable(cache, lambda p: torch.load(p, weights_only=True), say)
        return saved["docs"] if isinstance(saved, dict) and saved.get("key") == key else None
    docs = cached(log)                  # a damaged or unreadable cache is said and made again: it is only a cache
    if docs is not None:
        return docs
    with seal.build_lock(cache, log):   # another process tokenizing it now: wait, then read what it saved
        docs = cached(None)
        if docs is None:
            docs = tokenized()
            with seal.building(cache, log) as tmp:
                torch.save({"key": key, "docs": docs}, tmp)
    return docs


def corpus_cache(model_name: str) -> Path:
    """Where the corpus tokenized for `model_name` is cached (shared by the neural LMs and the lookup tables)."""
    return paths.corpus_file(model_name)


def default_corpus_files() -> list[Path]:
    """The shared C4 + WikiText files, in the order the tokenized-corpus cache is keyed by."""
    import tasks

    data = tasks.default_data_dir()
    if data is None:
        raise FileNotFoundError("no shared data dir for the rescorer corpus: set BPDBENCH_DATA")
    files = [data / "corpus" / f for f in CORPUS_FILES if (data / "corpus" / f).exists()]
    if not files:
        raise FileNotFoundError(f"no corpus files ({', '.join(CORPUS_FILES)}) under {data / 'corpus'}")
    return files
