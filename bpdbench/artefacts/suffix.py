"""Suffix structures for the retrieval drafters (`sam`, `rest`), and their on-disk cache.

- `SuffixAutomaton`: SAM-Decoding's dynamic automaton over prompt + decided tokens. Each token is added online in
  amortised O(1) (Blumer et al.'s construction, states as dicts), and the longest suffix of the text that occurred
  *earlier* is tracked as it grows (matching state + length, moved along suffix links), so a step costs a few dict
  lookups whatever the context length. Each state keeps the end of its earliest occurrence (the authors' min_endpos):
  the draft is what followed it.
- `SuffixIndex`: a static token stream (corpus, model history) as a suffix array sorted on the first `depth` tokens
  of every suffix. Why not a second automaton: in Python a 5M-token automaton takes minutes and GBs of dicts, while
  prefix doubling with numpy's lexsort sorts 5M suffixes to depth 32 in a few seconds into two int32 arrays (saved
  as one .npz). Queries are binary searches: the interval of suffixes starting with a pattern, the longest suffix of
  a context that occurs (SAM's static match length: occurrence is monotone in the suffix length, so a bisection on
  the length), and the continuations after a match (REST's retrieval).
- `corpus_index` / `datastore_index`: the static indexes for a target model, built on first use and cached under
  `$BPDBENCH_CACHE/lookup/<model>/` next to the lookup tables (tables.py), from the same sources, sealed
  (store/seal.py): a damaged or unreadable index is said in one line and built again.
"""
from __future__ import annotations

import bisect
import json
from functools import lru_cache
from pathlib import Path
from typing import Sequence

import numpy as np

from ..store import seal
from .formats import SEP, save_npz
from .keys import Requirement

DEPTH = 32          # suffixes are sorted on their first DEPTH tokens: the longest pattern a query may use


class SuffixAutomaton:
    """Suffix automaton of `tokens`, extended one token at a time, with the longest earlier match of its suffix."""

    def __init__(self, tokens: Sequence[int] = ()):
        self.reset(tokens)

    def reset(self, tokens: Sequence[int] = ()) -> None:
        self.nxt: list[dict[int, int]] = [{}]
        self.link, self.length, self.first = [-1], [0], [-1]
        self.last = 0
        self.tokens: list[int] = []
        self.state = self.matched = 0          # the longest suffix of tokens occurring before the last token
        self.extend(tokens)

    def sync(self, tokens: Sequence[int]) -> None:
        """Catch up with `tokens` (prompt + decided tokens); rebuild when they are another sequence."""
        m = len(self.tokens)
        if len(tokens) < m or list(tokens[:m]) != self.tokens:
            self.reset(tokens)
        elif len(tokens) > m:
            self.extend(tokens[m:])

    def extend(self, new: Sequence[int]) -> None:
        for t in new:
            self._append(int(t))

    def _append(self, t: int) -> None:
        nxt, link, length, first = self.nxt, self.link, self.length, self.first
        # 1. match: the longest suffix of tokens + [t] that occurs in tokens (read before t is added)
        s, ln = self.state, self.matched
        while s and t not in nxt[s]:
            s = link[s]
            ln = length[s]
        if t in nxt[s]:
            s, ln = nxt[s][t], ln + 1
        else:
            s = ln = 0
        # 2. extend the automaton by t
        i = len(self.tokens)
        self.tokens.append(t)
        cur = len(nxt)
        nxt.append({})
        link.append(-1)
        length.append(length[self.last] + 1)
        first.append(i)
        p = self.last
        while p != -1 and t not in nxt[p]:
            nxt[p][t] = cur
            p = link[p]
        if p == -1:
            link[cur] = 0
        else:
            q = nxt[p][t]
            if length[p] + 1 == length[q]:
                link[cur] = q
            else:
                clone = len(nxt)
                nxt.append(dict(nxt[q]))
                link.append(link[q])
                length.append(length[p] + 1)
                first.append(first[q])
                while p != -1 and nxt[p].get(t) == q:
                    nxt[p][t] = clone
                    p = link[p]
                link[q] = link[cur] = clone
                if s == q and ln <= length[clone]:     # the matched string now belongs to the clone
                    s = clone
        self.last = cur
        self.state, self.matched = s, ln

    def match(self) -> tuple[int, int]:
        """(length, end): the longest suffix of the text that also occurs ending before the last token, and the end
        position of its earliest occurrence (so tokens[end + 1] exists). (0, -1) when even the last token is new."""
        if not self.matched:
            return 0, -1
        return self.matched, self.first[self.state]


class _Column:
    """Token `j` of the suffixes sa[lo:hi], indexable for bisect without gathering the whole interval."""

    def __init__(self, index: "SuffixIndex", j: int):
        self.padded, self.sa, self.j = index.padded, index.sa, j

    def __getitem__(self, i: int) -> int:
        return int(self.padded[int(self.sa[i]) + self.j])

    def __len__(self) -> int:
        return len(self.sa)


class SuffixIndex:
    """Suffix array of a token stream (documents separated by SEP), sorted on the first `depth` tokens."""

    def __init__(self, tokens: np.ndarray, sa: np.ndarray, depth: int, meta: dict | None = None):
        self.tokens = np.asarray(tokens, dtype=np.int32)
        self.sa, self.depth, self.meta = np.asarray(sa, dtype=np.int32), depth, meta or {}
        self.padded = np.concatenate([self.tokens, np.full(depth + 64, SEP, dtype=np.int32)])
        self.heads = self.tokens[self.sa] if len(self.sa) else np.zeros(0, np.int32)   # sorted first tokens

    @classmethod
    def build(cls, tokens: np.ndarray, depth: int = DEPTH, meta: dict | None = None) -> "SuffixIndex":
        """Prefix doubling: after the round with shift h every suffix is ranked by its first 2h tokens."""
        tokens = np.asarray(tokens, dtype=np.int32)
        n = len(tokens)
        rank = tokens.astype(np.int64) + 1                 # SEP -> 0, the smallest (as in the padded view)
        sa = np.argsort(rank, kind="stable")
        h = 1
        while h < depth and n:
            second = np.zeros(n, dtype=np.int64)
            if h < n:
                second[: n - h] = rank[h:]
            sa = np.lexsort((second, rank))
            a, b = rank[sa], second[sa]
            new = np.empty(n, dtype=np.int64)
            new[sa] = np.cumsum(np.r_[True, (a[1:] != a[:-1]) | (b[1:] != b[:-1])])
            rank = new
            h *= 2
            if int(rank.max()) == n:                       # all distinct: the order is final
                break
        info = {"tokens": int(n), "depth": depth, **(meta or {})}
        return cls(tokens, sa.astype(np.int32), depth, info)

    def interval(self, pattern: Sequence[int]) -> tuple[int, int]:
        """[lo, hi): the suffixes that start with `pattern` (at most `depth` tokens)."""
        if len(pattern) > self.depth:
            raise ValueError(f"pattern of {len(pattern)} tokens; the index is sorted to depth {self.depth}")
        lo, hi = 0, len(self.sa)
        for j, t in enumerate(pattern):
            t = np.int32(t)          # the arrays' dtype: a Python int would make numpy convert the whole array
            if j == 0:
                lo, hi = int(np.searchsorted(self.heads, t, "left")), int(np.searchsorted(self.heads, t, "right"))
            elif hi - lo <= 4096:                             # small: gather the column, two vector searches
                col = self.padded[self.sa[lo:hi] + j]
                lo, hi = lo + int(np.searchsorted(col, t, "left")), lo + int(np.searchsorted(col, t, "right"))
            else:
                col = _Column(self, j)
                lo, hi = bisect.bisect_left(col, t, lo, hi), bisect.bisect_right(col, t, lo, hi)
            if lo >= hi:
                return lo, lo
        return lo, hi

    def longest(self, context: Sequence[int], low: int = 1, high: int | None = None) -> tuple[int, int, int]:
        """(n, lo, hi) for the longest suffix of `context` of n in [low, high] tokens that occurs; (0, 0, 0) when
        none does. If a suffix occurs so do its shorter suffixes, so the length is bisected."""
        high = min(self.depth if high is None else high, self.depth, len(context))
        best = (0, 0, 0)
        a, b = low, high
        while a <= b:
            mid = (a + b) // 2
            lo, hi = self.interval(context[len(context) - mid:])
            if hi > lo:
                best, a = (mid, lo, hi), mid + 1
            else:
                b = mid - 1
        return best

    def starts(self, lo: int, hi: int, n: int, limit: int) -> np.ndarray:
        """Where the continuations of the matches sa[lo:hi] of an n-token pattern start (the first `limit`)."""
        return self.sa[lo: min(hi, lo + limit)].astype(np.int64) + n

    def earliest(self, lo: int, hi: int) -> int:
        """The first position in the stream of the matches sa[lo:hi] (SAM's min_endpos, as a start)."""
        return int(self.sa[lo:hi].min())

    def read(self, start: int, length: int) -> list[int]:
        """`length` tokens from `start`, cut at the document's end."""
        out = self.padded[start: start + length].tolist()
        return out[: out.index(SEP)] if SEP in out else out

    def save(self, path: Path) -> Path:
        return save_npz(path, {**self.meta, "depth": self.depth}, {"tokens": self.tokens, "sa": self.sa})

    @classmethod
    def load(cls, path: Path) -> "SuffixIndex":
        with np.load(path) as z:
            meta = json.loads(str(z["meta"]))
            return cls(z["tokens"], z["sa"], int(meta["depth"]), meta)


# --- the cached static indexes of a target model ----------------------------------------------------------------

def corpus_file(model: str) -> Path:
    from .. import paths
    return paths.lookup_dir(model) / "suffix-corpus.npz"


def datastore_file(model: str, profile: str) -> Path:
    from .. import paths
    return paths.lookup_dir(model) / f"suffix-corpus-history-{profile}.npz"


@lru_cache(maxsize=4)
def _load(path: str, mtime: int) -> SuffixIndex:
    return SuffixIndex.load(Path(path))


def _index(path: Path) -> SuffixIndex:
    return _load(str(path), path.stat().st_mtime_ns)


def _cached(path: Path, want: dict, make, env) -> tuple[SuffixIndex, dict]:
    """The index at `path` if it was built from `want`'s sources and matches its seal, else built now (seconds),
    sealed and saved (a damaged or unreadable one is said in one line and built again)."""
    index = seal.load_or_build(
        path, _index, lambda tmp: SuffixIndex.build(make(), meta=want).save(tmp), env.log,
        fresh=lambda index: all(index.meta.get(k) == v for k, v in want.items()),
        say=f"building the suffix index {path.name} for {env.cfg.model} into {path.parent} (seconds; once)")
    return index, {"path": str(path), "tokens": index.meta["tokens"], "depth": index.depth,
                   **{k: v for k, v in index.meta.items() if k not in ("files", "tokens", "depth")}}


def _corpus_files(env) -> list[str]:
    from tasks import corpus_files
    from .corpus import default_corpus_files
    return [str(f) for f in (corpus_files(Path(env.cfg.data_dir)) if env.cfg.data_dir else default_corpus_files())]


def corpus_index(env) -> tuple[SuffixIndex, dict]:
    """SAM's static automaton: the rescorers' corpus (C4 + WikiText, tokenized once and shared)."""
    from .tables import _corpus
    return _cached(corpus_file(env.cfg.model), {"source": "corpus", "files": _corpus_files(env)},
                   lambda: _corpus(env)[0], env)


def datastore_index(env, profile: str) -> tuple[SuffixIndex, dict]:
    """REST's datastore: the corpus followed by the model's greedy history of `profile` (generated on first use,
    as hierarchy's; FileNotFoundError under --no-auto-train when it would take minutes)."""
    from . import history as history_lib
    from .formats import stream
    from .tables import _corpus, history_table
    history, _ = history_table(env, profile)               # makes sure the history exists
    hist = history_lib.history_file(env.cfg.model, profile)
    want = {"source": "corpus+history", "files": _corpus_files(env), "profile": profile,
            "history_bytes": hist.stat().st_size}

    def make() -> np.ndarray:
        seqs, _ = history_lib.load(hist)
        return np.concatenate([_corpus(env)[0], stream(seqs)])
    return _cached(datastore_file(env.cfg.model, profile), want, make, env)


def needs(model: str, what: tuple[str, ...], profile: str = "quick") -> list[Requirement]:
    """What `bpdbench methods` shows (missing indexes are built on first use)."""
    from .tables import FIRST_USE_MINUTES, needs as table_needs
    out = []
    if "corpus" in what:
        path = corpus_file(model)
        out.append(Requirement("corpus suffix index", path.exists(), "suffix-index", path, FIRST_USE_MINUTES))
    if "datastore" in what:
        out += table_needs(model, ("history",), profile)          # the history's own minutes, beside this
        path = datastore_file(model, profile)
        out.append(Requirement(f"corpus + history ({profile}) suffix index", path.exists(), "suffix-index", path,
                               FIRST_USE_MINUTES))
    return out
