"""The formats of the lookup tables the artefact layer builds and the lookup drafters read: token streams with a
document separator, the `FrequencyTable` of n-gram continuations and the greedy bigram table, each saved as one .npz.

Why here, below methods/: the tables are artefacts (artefacts/tables.py and suffix.py build and seal them), and the
artefact layer imports nothing above it; the drafters that read them (`hierarchy`, `cascade`, `rest`, `sam`) import
the formats from here.

- `FrequencyTable`: for n-gram keys of a large token stream (the rescorers' corpus, the model's own greedy
  continuations), the most frequent continuations per key, as sorted numpy arrays (searchsorted per query, a few
  microseconds; saved as one .npz). Why not dicts: a 1.4M-token corpus gives ~10^6 keys, hundreds of MB as Python
  tuples, a few MB as arrays.
- `bigram_table`: the most frequent successor of every token (MaG's last resort, CS-Drafting's greedy bigram).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

SEP = -1            # document separator in token streams (never a token id)


def stream(docs: Iterable[Sequence[int]]) -> np.ndarray:
    """Documents (token id lists) as one int32 array, SEP after each."""
    parts = []
    for d in docs:
        if len(d):
            parts += [np.asarray(d, dtype=np.int32), np.array([SEP], dtype=np.int32)]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)


def _bits(tokens: np.ndarray) -> int:
    """Bits per token in a packed key: room for the largest id + 1 (continuations shift SEP to 0)."""
    return max(1, (int(tokens.max(initial=0)) + 1).bit_length())


def _code(cols: Sequence[np.ndarray], bits: int) -> np.ndarray:
    out = np.zeros(len(cols[0]), dtype=np.int64)
    for c in cols:
        out = (out << bits) | c.astype(np.int64)
    return out


def save_npz(path: Path, meta: dict, arrays: dict[str, np.ndarray]) -> Path:
    """The lookup tables' file: the arrays plus a JSON `meta`, written to a temporary file and renamed, so a killed
    build never leaves half a table where the next run loads it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, meta=np.array(json.dumps(meta)), **arrays)
    tmp.replace(path)
    return path


class FrequencyTable:
    """Top continuations per n-gram key of a token stream, most frequent first (ties: earliest in the stream).

    Per key size n: `keys[n]` (sorted int64 codes of the n key tokens), `offsets[n]` ([K+1] into `starts[n]`) and
    `starts[n]` (positions in `tokens` where a continuation starts, best first). A continuation is read at query
    time up to any length, cut at the document separator. Continuations are told apart by their first `group`
    tokens: two occurrences that agree that far count as one continuation."""

    def __init__(self, tokens: np.ndarray, bits: int, keys: dict, offsets: dict, starts: dict, meta: dict):
        self.tokens, self.bits, self.keys, self.offsets, self.starts, self.meta = tokens, bits, keys, offsets, starts, meta
        self.sizes = sorted(keys, reverse=True)

    @classmethod
    def build(cls, tokens: np.ndarray, sizes: Sequence[int] = (1, 2, 3), top: int = 4, min_count: int = 1,
              group: int = 3, meta: dict | None = None) -> "FrequencyTable":
        tokens = np.asarray(tokens, dtype=np.int32)
        bits = _bits(tokens)
        if bits * max(max(sizes), group) > 62:
            raise ValueError(f"token ids of {bits} bits do not fit a {max(sizes)}-gram key in 62 bits")
        keys, offsets, starts = {}, {}, {}
        N = len(tokens)
        padded = np.concatenate([tokens, np.full(group, SEP, dtype=np.int32)]).astype(np.int64)
        for n in sizes:
            m = N - n                                   # key tokens[i:i+n] and at least one continuation token
            if m <= 0:
                keys[n], offsets[n], starts[n] = np.zeros(0, np.int64), np.zeros(1, np.int64), np.zeros(0, np.int32)
                continue
            window = [padded[j: j + m] for j in range(n + 1)]
            ok = np.logical_and.reduce([w != SEP for w in window])
            idx = np.nonzero(ok)[0]
            key = _code([w[idx] for w in window[:n]], bits)
            cont = _code([padded[n + j: n + j + m][idx] + 1 for j in range(group)], bits)   # SEP -> 0
            order = np.lexsort((cont, key))             # stable: equal pairs keep stream order
            key, cont, first = key[order], cont[order], idx[order]
            new_pair = np.r_[True, (key[1:] != key[:-1]) | (cont[1:] != cont[:-1])]
            p0 = np.nonzero(new_pair)[0]
            p_count = np.diff(np.r_[p0, len(key)])
            p_key, p_first = key[p0], first[p0]
            k_start = np.r_[True, p_key[1:] != p_key[:-1]]
            k_id = np.cumsum(k_start) - 1
            k_total = np.bincount(k_id, weights=p_count)
            keep = k_total[k_id] >= min_count
            p_key, p_count, p_first = p_key[keep], p_count[keep], p_first[keep]
            order = np.lexsort((p_first, -p_count, p_key))
            p_key, p_first = p_key[order], p_first[order]
            k_start = np.r_[True, p_key[1:] != p_key[:-1]] if len(p_key) else np.zeros(0, bool)
            k_pos = np.nonzero(k_start)[0]
            rank = np.arange(len(p_key)) - np.repeat(k_pos, np.diff(np.r_[k_pos, len(p_key)]))
            sel = rank < top
            p_key, p_first = p_key[sel], p_first[sel]
            k_pos = np.nonzero(np.r_[True, p_key[1:] != p_key[:-1]])[0] if len(p_key) else np.zeros(0, np.int64)
            keys[n] = p_key[k_pos]
            offsets[n] = np.r_[k_pos, len(p_key)].astype(np.int64)
            starts[n] = (p_first + n).astype(np.int32)
        info = {"sizes": list(sizes), "top": top, "min_count": min_count, "group": group, "tokens": int(N),
                "keys": {str(n): int(len(keys[n])) for n in sizes}, **(meta or {})}
        return cls(tokens, bits, keys, offsets, starts, info)

    def lookup(self, key: Sequence[int], length: int) -> list[list[int]]:
        """Continuations (up to `length` tokens, best first) of the n-gram `key`; [] when it is not a key."""
        n = len(key)
        keys = self.keys.get(n)
        if keys is None or not len(keys) or any(t < 0 or t >> self.bits for t in key):
            return []
        code = 0
        for t in key:
            code = (code << self.bits) | int(t)
        i = int(np.searchsorted(keys, code))
        if i >= len(keys) or int(keys[i]) != code:
            return []
        out = []
        for s in self.starts[n][self.offsets[n][i]: self.offsets[n][i + 1]].tolist():
            c = self.tokens[s: s + length].tolist()
            if SEP in c:
                c = c[: c.index(SEP)]
            if c:
                out.append(c)
        return out

    def save(self, path: Path) -> Path:
        arrays = {"tokens": self.tokens}
        for n in self.keys:
            arrays.update({f"keys{n}": self.keys[n], f"offsets{n}": self.offsets[n], f"starts{n}": self.starts[n]})
        return save_npz(path, {**self.meta, "bits": self.bits}, arrays)

    @classmethod
    def load(cls, path: Path) -> "FrequencyTable":
        with np.load(path) as z:
            meta = json.loads(str(z["meta"]))
            sizes = meta["sizes"]
            return cls(z["tokens"], meta.pop("bits"), {n: z[f"keys{n}"] for n in sizes},
                       {n: z[f"offsets{n}"] for n in sizes}, {n: z[f"starts{n}"] for n in sizes}, meta)


def bigram_table(tokens: np.ndarray, vocab: int) -> np.ndarray:
    """[vocab] int32: each token's most frequent successor in the stream (ties: the smaller id), -1 if none."""
    a = np.asarray(tokens, dtype=np.int64)
    ok = (a[:-1] != SEP) & (a[1:] != SEP) & (a[:-1] < vocab) & (a[1:] < vocab)
    pairs, counts = np.unique(a[:-1][ok] * vocab + a[1:][ok], return_counts=True)
    first, second = pairs // vocab, pairs % vocab
    order = np.lexsort((second, -counts, first))
    first, second = first[order], second[order]
    lead = np.r_[True, first[1:] != first[:-1]] if len(first) else np.zeros(0, bool)
    table = np.full(vocab, -1, dtype=np.int32)
    table[first[lead]] = second[lead]
    return table
