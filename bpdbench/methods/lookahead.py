"""Lookahead decoding (Fu et al. 2024, hao-ai-lab/LookaheadDecoding): Jacobi iteration fills an n-gram pool, and
the pool's n-grams that start with the context's last token are verified.

Each verify forward carries two branches after the base's next token (the root):
- the lookahead branch, a 2D window of `ngram` - 1 levels x `window` columns of guessed tokens. Level 0 column i
  sits at position root + 1 + i, level l column i at root + 1 + i + l; token (l, i) attends to level 0's columns
  0..i and to levels 1..l of column i (LADE's mask), which is a path from the root: level0[:i + 1] + [level1[i],
  ..., level_l[i]]. These paths are scored but never candidates (`Proposal.scored`); where a column repeats
  level 0's next tokens (a converged diagonal) the trie scores them once, the same token after the same ancestors
  being the same computation, so a forward scores at most window x (ngram - 1) window tokens. The base's greedy
  token after each column's top node is that column's next level (one Jacobi step along every diagonal); once
  `ngram` - 1 levels exist, each column's levels plus its new token form an n-gram, added to the pool keyed by its
  first token, and the window drops its oldest level (LADE's `past_tokens` shift). Level 0 starts as tokens
  drawn from the prompt (LADE draws at random; here from a generator seeded per example, so real decoding and
  replay agree) and the levels above fill one per step, as LADE's `fill_level` does;
- the verification branch: up to `guesses` n-grams (each `ngram` - 1 tokens after the key) from the pool's entry
  for the root, most recent first; each key keeps its `guesses` most recent distinct n-grams (LADE's
  GUESS_SET_SIZE, least recently added dropped).
A forward scores up to window x (ngram - 1) window tokens plus at most guesses x (ngram - 1) candidate tokens:
`guesses` sizes the verified part (`guesses=auto`). The pool and window are per example (LADE's are per generate call).
The candidates are deterministic given the context and the pool, so q is a point mass on each proposed token.
"""
from __future__ import annotations

import random

from ..engine import DraftContext, Feedback, Proposal
from .base import Method, MethodSpec, Param
from .contract import Input
from .env import Env
from .search import Sizes

GUESSES_AUTO = (1, 2, 3, 4, 5, 7)   # guesses=auto: one replay per count (the pool it fills depends on it)


class LookaheadDrafter:
    """The window's greedy continuations come back through `feedback` (k = 1: the argmax after each node)."""
    feedback_k = 1

    def __init__(self, name: str, window: int = 7, ngram: int = 5, guesses: int = 7):
        self.name, self.window, self.ngram, self.guesses = name, window, ngram, guesses
        self.levels: list[list[int]] = []
        self.pool: dict[int, list[tuple[int, ...]]] = {}
        self.scored: list[list[int]] = []

    def reset(self, prompt_ids: list[int]) -> None:
        rng = random.Random(len(prompt_ids))
        self.levels = [[rng.choice(prompt_ids) for _ in range(self.window)]]
        self.pool, self.scored = {}, []

    def propose(self, ctx: DraftContext) -> Proposal:
        lv = self.levels
        self.scored = [lv[0][: i + 1] + [level[i] for level in lv[1:]] for i in range(self.window)]
        cands = [list(g) for g in reversed(self.pool.get(ctx.tokens[-1], []))]
        if not cands:
            return Proposal(scored=self.scored)
        return Proposal(cands, [[1.0] * len(c) for c in cands], scored=self.scored)

    def feedback(self, fb: Feedback) -> None:
        """One Jacobi step: each column's new token is the base's argmax after its top node in the window. A tree
        without this step's window leaves the window as it is: as a wrapper's fallback (sam, methods/compose.py)
        lookahead gets every verify forward's feedback, also of the steps the wrapper drafted itself."""
        tree, top = fb.tree, fb.topk[:, 0].tolist()
        node_of = {_path(tree, n): n for n in tree.scored}    # the scored nodes: their own trie under the root
        window, self.scored = self.scored, []                 # one proposal's window is stepped at most once
        if not window or any(tuple(path) not in node_of for path in window):
            return
        new = [top[node_of[tuple(path)]] for path in window]
        if len(self.levels) < self.ngram - 1:
            self.levels.append(new)
            return
        for i, tok in enumerate(new):
            gram = tuple(level[i] for level in self.levels) + (tok,)
            self._add(gram[0], gram[1:])
        self.levels = self.levels[1:] + [new]

    def _add(self, key: int, gram: tuple[int, ...]) -> None:
        grams = self.pool.setdefault(key, [])
        if gram in grams:
            grams.remove(gram)
        grams.append(gram)
        if len(grams) > self.guesses:
            del grams[0]

    def observe(self, tokens: list[int]) -> None:
        pass


def _path(tree, node: int) -> tuple[int, ...]:
    """The tokens after the root on the way to `node`."""
    key: list[int] = []
    while node > 0:
        key.append(tree.tokens[node])
        node = tree.parents[node]
    return tuple(reversed(key))


def build(env: Env, method: Method) -> LookaheadDrafter:
    window, ngram, guesses = method.get("window", 7), method.get("ngram", 5), method.get("guesses", 7)
    env.resolved[method.label] = {"window": window, "ngram": ngram, "guesses": guesses,
                                  "width": guesses * (ngram - 1), "window_nodes": window * (ngram - 1)}
    return LookaheadDrafter(method.label, window, ngram, guesses)


SPECS = [MethodSpec("lookahead", "Lookahead decoding: a Jacobi window scored alongside each verify fills an n-gram "
                    "pool; the pool's n-grams starting with the last token are verified", build,
                    (Param("window", int, "Jacobi window columns W (lookahead tokens per level)", low=1),
                     Param("ngram", int, "n-gram size N (window levels + 1; candidates of N-1 tokens)", low=2),
                     Param("guesses", int, "most n-grams verified per step, and kept per key G (auto: the count "
                           "fastest on this machine)", low=1, auto=True)),
                    inputs=frozenset({Input.FEEDBACK}), artefacts=(), shapes=Sizes("guesses", GUESSES_AUTO))]
