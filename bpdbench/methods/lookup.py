"""Model-free lookup pieces shared by the lookup drafters (`pld`, `cascade`, `hierarchy`).

- `ContextIndex`: every n-gram (1..max_n tokens) of prompt + decided tokens -> the positions where it ends, kept up
  to date incrementally (a step adds max_n dict entries per decided token, never rescans the context). `pld` reads
  its earliest occurrence (transformers' semantics), `hierarchy` its most recent ones, `cascade`'s MaG the longest.
- `continuation`: what followed an occurrence, copied forward LZ77-style: when the copy runs past the end of what
  is known it keeps copying its own output, so a loop the model is in ("a b c a b c") is drafted as a loop.
  (The tables' formats, `FrequencyTable`, `bigram_table` and token streams, are artefacts: artefacts/formats.py.)
- `MaG`: CS-Drafting's bottom level: the longest n-gram match in the context (prompt first, it comes first), else
  the bigram chain.
"""
from __future__ import annotations

from typing import Iterable, Iterator, Sequence

import numpy as np


class ContextIndex:
    """n-gram -> end positions (the index of its last token) in `tokens`, in order of occurrence."""

    def __init__(self, max_n: int):
        self.max_n = max_n
        self.tokens: list[int] = []
        self.pos: dict[tuple[int, ...], list[int]] = {}

    def reset(self, tokens: Sequence[int] = ()) -> None:
        self.tokens, self.pos = [], {}
        self.extend(tokens)

    def extend(self, new: Iterable[int]) -> None:
        toks, pos, max_n = self.tokens, self.pos, self.max_n
        for t in new:
            toks.append(int(t))
            i = len(toks) - 1
            for n in range(1, min(max_n, i + 1) + 1):
                key = tuple(toks[i - n + 1: i + 1])
                lst = pos.get(key)
                if lst is None:
                    pos[key] = [i]
                else:
                    lst.append(i)

    def sync(self, tokens: Sequence[int]) -> None:
        """Catch up with `tokens` (prompt + decided tokens): append what is new, rebuild if they are another
        sequence (a drafter reused without `reset`). The prefix check is one C-level list comparison."""
        m = len(self.tokens)
        if len(tokens) < m or list(tokens[:m]) != self.tokens:
            self.reset(tokens)
        elif len(tokens) > m:
            self.extend(tokens[m:])

    def ends(self, tail: Sequence[int], size: int, extra: int = 0, recent: bool = False) -> Iterator[int]:
        """End positions of the last `size` tokens of `tail`, earliest (or most recent) first, except the tail
        itself. `extra`: how many tokens `tail` has beyond `tokens` (drafted, not yet decided)."""
        if size > len(tail):
            return
        lst = self.pos.get(tuple(tail[len(tail) - size:]))
        if not lst:
            return
        own = len(self.tokens) + extra - 1          # the tail's own occurrence has nothing after it
        for e in (reversed(lst) if recent else lst):
            if e != own:
                yield e

    def longest(self, tail: Sequence[int], extra: int = 0, recent: bool = False) -> int | None:
        """End position of the longest n-gram (<= max_n) ending `tail` that occurred before, or None."""
        for size in range(min(self.max_n, len(tail)), 0, -1):
            for e in self.ends(tail, size, extra, recent):
                return e
        return None


def continuation(tokens: Sequence[int], extra: Sequence[int], end: int, length: int) -> list[int]:
    """`length` tokens after position `end` of tokens + extra, copying its own output once past their end."""
    n = len(tokens)
    out = list(tokens[end + 1: end + 1 + length])
    if len(out) < length and extra:
        a = max(end + 1 - n, 0)
        out += list(extra[a: a + length - len(out)])
    total = n + len(extra)
    while len(out) < length:
        out.append(out[end + 1 + len(out) - total])
    return out


def cut_after_eos(draft: list[int], eos: frozenset[int]) -> list[int]:
    """Nothing after an EOS can be kept, so it is not worth verifying."""
    for j, t in enumerate(draft):
        if t in eos:
            return draft[: j + 1]
    return draft


class MaG:
    """CS-Drafting's model-free bottom level (mag.py): the continuation of the longest n-gram match (<= `ngram`
    tokens, earliest occurrence, so the prompt before the generated text), else a greedy bigram chain.

    `draft(index, extra, k)` drafts k tokens after context + `extra` (tokens a higher level already drafted,
    not yet decided): the match is looked up for that whole tail, so MaG continues where the level above stopped."""

    def __init__(self, ngram: int = 4, bigram: np.ndarray | None = None, eos: frozenset[int] = frozenset()):
        self.ngram, self.bigram, self.eos = ngram, bigram, eos

    def draft(self, index: ContextIndex, extra: Sequence[int], k: int) -> list[int]:
        if k <= 0:
            return []
        tail = index.tokens[-self.ngram:] + list(extra)
        end = index.longest(tail, len(extra))
        out = continuation(index.tokens, extra, end, k) if end is not None else []
        if not out and self.bigram is not None and tail:
            last = tail[-1]
            while len(out) < k and 0 <= last < len(self.bigram) and self.bigram[last] >= 0:
                last = int(self.bigram[last])
                out.append(last)
        return cut_after_eos(out, self.eos)
