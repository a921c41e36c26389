"""The lookup drafters' tables for a target model, loaded from the cache or built on first use, as heads are.

- static: the rescorers' corpus (C4 + WikiText, tokenized once and shared with the neural LMs) as a
  `FrequencyTable` over 2- and 3-gram keys; built in seconds, so always built when missing.
- bigram: each token's most frequent successor in that corpus (or in the model history), for MaG.
- history: the model's own greedy continuations (train/history.py), a named profile; `ci` takes seconds and is
  built when missing, `quick` takes minutes and is refused under --no-auto-train with the command that builds it.
Each loader returns (table, metadata); the metadata (file, source, size) goes into the run's resolved config.
Every table is sealed when built (store/seal.py): one that is missing, damaged or unreadable is built again,
said in one line; the history, which may take minutes, is refused under --no-auto-train in one line naming the file
and the command that rebuilds it.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np

from .. import paths
from . import history as history_lib
from .policy import Need, builder
from ..store import seal
from .formats import FrequencyTable, bigram_table, stream
from .keys import BuildEnv, Requirement

STATIC = {"sizes": (2, 3), "top": 4, "min_count": 2}
HISTORY = {"sizes": (1, 2, 3), "top": 4, "min_count": 1}
BIGRAM_SOURCES = ("corpus", "history")


def static_file(model: str) -> Path:
    return paths.lookup_dir(model) / "static.npz"


def bigram_file(model: str, source: str, profile: str = "quick") -> Path:
    return paths.lookup_dir(model) / (f"bigram-{source}.npy" if source == "corpus" else
                                      f"bigram-history-{profile}.npy")


def _corpus(env: BuildEnv) -> tuple[np.ndarray, list[str]]:
    """The corpus as one token stream; its tokenization is cached with the neural LMs' (same files, same key)."""
    from tasks import corpus_files
    from .corpus import corpus_cache, default_corpus_files, tokenized_corpus
    if env.cfg.data_dir:
        files, cache = corpus_files(Path(env.cfg.data_dir)), None
    else:
        files, cache = default_corpus_files(), corpus_cache(env.cfg.model)
    docs = tokenized_corpus(files, lambda s: env.tok(s, add_special_tokens=False)["input_ids"], cache, env.log)
    return stream(docs), [str(f) for f in files]


@lru_cache(maxsize=4)
def _load_table(path: str, mtime: int) -> FrequencyTable:
    return FrequencyTable.load(Path(path))


def _table(path: Path) -> FrequencyTable:
    return _load_table(str(path), path.stat().st_mtime_ns)


def static_table(env: BuildEnv) -> tuple[FrequencyTable, dict]:
    """The corpus n-gram table, rebuilt when missing, damaged or built from other corpus files than the current
    ones."""
    from tasks import corpus_files
    from .corpus import default_corpus_files
    path = static_file(env.cfg.model)
    files = [str(f) for f in (corpus_files(Path(env.cfg.data_dir)) if env.cfg.data_dir else default_corpus_files())]

    def build(tmp: Path) -> None:
        tokens, used = _corpus(env)
        FrequencyTable.build(tokens, **STATIC, meta={"source": "corpus", "files": used}).save(tmp)
    table = seal.load_or_build(path, _table, build, env.log, fresh=lambda t: t.meta.get("files") == files,
                               say=f"building the corpus n-gram table for {env.cfg.model} into {path} (seconds; once)")
    return table, _describe(path, table.meta)


def history_table(env: BuildEnv, profile: str) -> tuple[FrequencyTable, dict]:
    """The model-history table of a profile, built from the cached continuations (generated on first use; a damaged
    file is generated again, or refused in one line where --no-auto-train forbids it)."""
    path = history_lib.history_file(env.cfg.model, profile)
    need = Need(f"'{profile}' model history for {env.cfg.model}", f"bpdbench build-history --profile {profile}",
                history_lib.MINUTES[profile])
    loaded = seal.readable(path, _history_of, None)
    if loaded is not None:
        return loaded
    with seal.build_lock(path, env.log):          # another process may be generating it: wait, then read it
        loaded = seal.readable(path, _history_of, None)
        if loaded is not None:
            return loaded
        if path.exists():
            why = seal.problem(path) or f"{path} cannot be read"
            if not need.allowed(env.cfg.auto_train):
                raise seal.ArtefactDamaged(f"{why}; delete it and run `{need.command}` (about {need.minutes:g} min)")
            env.log(f"warning: {why}: building it again")
            seal.discard(path)
        need.build(env.cfg.auto_train, lambda: builder("history")(env.cfg.model, profile, env.model, env.tok,
                                                                 env.log), env.log, path)
    return _history_of(path)


def _history_of(path: Path) -> tuple[FrequencyTable, dict]:
    return _history(str(path), path.stat().st_mtime_ns)


@lru_cache(maxsize=4)
def _history(path: str, mtime: int) -> tuple[FrequencyTable, dict]:
    seqs, meta = history_lib.load(Path(path))
    table = FrequencyTable.build(stream(seqs), **HISTORY, meta={"source": meta["source"]})
    info = {k: meta[k] for k in ("model", "profile", "sequences", "tokens", "source")}
    return table, _describe(Path(path), {**info, "keys": table.meta["keys"]})


def bigram(env: BuildEnv, source: str = "corpus", profile: str = "quick") -> tuple[np.ndarray, dict]:
    """Each token's most frequent successor, from the corpus or from the model history."""
    path = bigram_file(env.cfg.model, source, profile)
    vocab = int(env.model.config.vocab_size)
    if source == "history":
        table, meta = history_table(env, profile)
        return bigram_table(table.tokens, vocab), {**meta, "kind": "bigram of the model history"}

    def build(tmp: Path) -> None:
        np.save(tmp, bigram_table(_corpus(env)[0], vocab))
    table = seal.load_or_build(path, np.load, build, env.log, fresh=lambda t: t.shape == (vocab,),
                               say=f"building the corpus bigram table for {env.cfg.model} into {path} (seconds; once)")
    return table, {"path": str(path), "kind": "bigram of the corpus", "known": int((table >= 0).sum())}


def _describe(path: Path, meta: dict) -> dict:
    return {"path": str(path), **{k: v for k, v in meta.items() if k != "files"}}


# Minutes a first use spends building each from nothing, the corpus's tokenization (shared, cached) included: measured
# on an AMD EPYC with AVX2 only, 2 cores, beside another job (tokenizing 1.39M corpus tokens 18 s, the n-gram table
# 10 s, the bigram table 6 s, the corpus suffix index 11 s), rounded up to half a minute each.
FIRST_USE_MINUTES = 0.5


def needs(model: str, parts: tuple[str, ...], profile: str = "quick") -> list[Requirement]:
    """What `bpdbench methods` shows: which tables exist (missing ones are built on first use)."""
    out = []
    if "static" in parts:
        out.append(_there("corpus n-gram table", "table", static_file(model), FIRST_USE_MINUTES))
    if "history" in parts:
        out.append(_there(f"model history ({profile})", "history", history_lib.history_file(model, profile),
                          history_lib.MINUTES.get(profile)))
    if "bigram" in parts:
        out.append(_there("corpus bigram table", "table", bigram_file(model, "corpus"), FIRST_USE_MINUTES))
    return out


def _there(what: str, kind: str, path: Path, minutes: float | None = None) -> Requirement:
    return Requirement(what, path.exists(), kind, path, minutes)
