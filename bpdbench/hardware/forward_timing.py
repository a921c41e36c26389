"""Timing the engine's verify forward over given draft shapes, and its output projection alone, for the
calibration (calibration.py).

The shapes: a chain of n tokens (the root + n - 1 draft tokens, plain causal attention) and a Medusa-like tree of n
nodes: breadth first, the root has 4 children, each depth-1 node 2, each depth-2 node 2, deeper nodes 1; the last
level is filled left to right until n nodes. Any fixed shape would do; this one is what Medusa's sparse trees look
like (wide near the root, where the heads are surest), so its mask costs what a real tree's costs.
"""
from __future__ import annotations

ONE = ("chain", 1)         # the 1-token decode step: the unit of every cost
BRANCHING = (4, 2, 2)      # children per node at depth 0, 1, 2; deeper nodes have 1
LONG_N = 16                # shapes over this many tokens are timed once per context (see time_shapes)
HEAD_ROWS = (1, 8, 16, 17, 24, 32, 48, 64)  # rows of the output projection timed (a wide tree projects inner nodes)
HEAD_ROUNDS = 9          # rounds over every row count: a lazily projected tree's cost is a difference of two of them


def tree_parents(n: int) -> list[int]:
    """Parent index per node (root = -1) of the n-node Medusa-like tree, breadth first (see the module doc)."""
    parents, level, depth = [-1], [0], 0
    while len(parents) < n:
        fan = BRANCHING[depth] if depth < len(BRANCHING) else 1
        nxt = []
        for p in level:
            for _ in range(fan):
                if len(parents) < n:
                    nxt.append(len(parents))
                    parents.append(p)
        level, depth = nxt, depth + 1
    return parents


def tree_drafts(n: int, tokens: list[int]) -> list[list[int]]:
    """Root-to-leaf drafts (root excluded) whose trie is the n-node tree; node i carries tokens[i] (distinct)."""
    parents = tree_parents(n)
    leaves = [i for i in range(1, n) if i not in set(parents)]
    drafts = []
    for leaf in leaves:
        path, j = [], leaf
        while j > 0:
            path.append(tokens[j])
            j = parents[j]
        drafts.append(path[::-1])
    return drafts


def shapes(vocab: int, ns, tree_ns, g) -> dict:
    """The proposals to verify, keyed (kind, n): a chain of n - 1 draft tokens, or the n-node tree's drafts."""
    import torch

    from ..engine.types import Proposal
    draft = torch.randint(0, vocab, (max(list(ns) + list(tree_ns)),), generator=g).tolist()
    nodes = torch.randperm(vocab, generator=g)[: max(tree_ns, default=1)].tolist()   # distinct: no merged nodes
    out = {("chain", n): Proposal([draft[: n - 1]]) for n in sorted({int(n) for n in ns} | {1})}
    out.update({("tree", int(n)): Proposal(tree_drafts(int(n), nodes)) for n in tree_ns if n <= vocab})
    return out


def time_shapes(model, cache, hidden, context: list[int], shapes: dict, repeats: int, warm: bool,
                device: str, long_n: int = LONG_N, long_repeats: int = 1) -> list[dict[tuple[str, int], list[float]]]:
    """Seconds of the engine's verify per round and shape on top of `context` (its last token is the root, the rest
    is in `cache`), the cache cropped back after each. Rounds interleave the shapes so load drift hits all alike; the
    1-token step (the unit) is timed at the start, middle and end of every round. Shapes over `long_n` tokens
    take several steps each, so one sample's jitter is a small fraction of it: they are timed in the first
    `long_repeats` rounds only, which keeps a calibration near a minute."""
    from ..engine.loop import State, verify
    from .timing import timed

    past = len(context) - 1
    state = State(cache, hidden, context)

    def run(p) -> float:
        secs, _ = timed(lambda: verify(model, state, p, lazy=False), device)   # the full projection: see `head`
        crop_to(cache, past)
        return secs

    if warm:
        for p in shapes.values():
            run(p)
    rounds = []
    others = [k for k in shapes if k != ONE]
    for r in range(repeats):
        times: dict[tuple[str, int], list[float]] = {ONE: [run(shapes[ONE])]}
        for j, k in enumerate(others):
            if j == len(others) // 2:
                times[ONE].append(run(shapes[ONE]))
            if k[1] <= long_n or r < long_repeats:
                times[k] = [run(shapes[k])]
        times[ONE].append(run(shapes[ONE]))
        rounds.append(times)
    return rounds


def costs(rounds: list[dict]) -> tuple[float, dict[tuple[str, int], float]]:
    """(median 1-token step in seconds, cost per shape in steps). Each sample is divided by the step of its own
    round, timed next to it, so a change in machine load between rounds cancels out of the ratio."""
    import statistics

    step = statistics.median(t for r in rounds for t in r[ONE])
    ratios: dict[tuple[str, int], list[float]] = {}
    for r in rounds:
        unit = statistics.median(r[ONE])
        for k, ts in r.items():
            ratios.setdefault(k, []).extend(t / unit for t in ts)
    return step, {k: 1.0 if k == ONE else statistics.median(v) for k, v in ratios.items()}


def crop_to(cache, length: int) -> None:
    """Drop every cache entry past `length` (transformers' crop takes the number to remove, negated)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def head_costs(model, hidden, device: str, rounds: int = HEAD_ROUNDS) -> dict[int, float]:
    """Seconds of the output projection (and argmax) per row count, the median of `rounds` interleaved rounds after
    one warm-up each. Why interleaved and not 5 calls per size in turn: a tree verify that projects 22 of its 64
    rows is predicted as the full tree's cost less head(64) plus head(22), so a drift between two sizes' timings
    moves that prediction by the whole drift (CI once predicted medusa at 0.53x AR where it ran at 0.45x)."""
    import statistics

    import torch

    from .timing import timed
    hidden = hidden[torch.arange(max(HEAD_ROWS), device=hidden.device) % len(hidden)]   # short contexts: reused
    calls = {r: (lambda r=r: model.lm_head(hidden[:r]).argmax(-1)) for r in HEAD_ROWS}
    for fn in calls.values():
        fn()
    samples: dict[int, list[float]] = {r: [] for r in calls}
    for _ in range(rounds):
        for r, fn in calls.items():
            samples[r].append(timed(fn, device)[0])
    return {r: statistics.median(ts) for r, ts in samples.items()}
