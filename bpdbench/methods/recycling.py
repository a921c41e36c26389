"""Token Recycling (Luo et al. 2024): draft from the base's own top-k guesses, recycled from earlier verify forwards.

Every verify forward computes the base's distribution after *every* node of the tree it scores, accepted or not;
plain decoding throws all but the accepted path away. Token Recycling keeps, for each token, the top-k tokens the
base predicted after it the last time it was scored (an adjacency matrix V x k, here a dict of rows for the tokens
seen so far, which is the same matrix without its empty rows), and drafts by expanding that matrix breadth-first
from the context's last token into a fixed tree: the authors' 80-node template (`tree_template_.py`, version
2.2.2: 80 draft nodes of depth <= 6 under the root), where entry [i, j, ...] is the rank-i successor of the root,
then its rank-j successor, and so on. After each verify forward every scored node's row is overwritten with its
top-k (`Drafter.feedback`), as the authors' `update` does with all positions, accepted or not.

Choices stated: a template node whose parent token has no row yet (never scored) is left out with its subtree
(the authors' static tree verifies filler tokens there; leaving them out only saves verify work); `nodes` cuts the
template in its breadth-first order; the matrix persists across the examples of a run (`persist=1`, the authors
keep it across queries) and is cleared per example with `persist=0`. With `persist=1` the matrix is state kept
across examples, so the drafter implements `snapshot`/`restore` (engine/state.py): `speed` puts it back before every
repeat of a prompt (else the second repeat drafts from the first one's successors of that very output: 0.82 of the
first repeat's time in results/speed-field/spec_bench, where every other method took 0.98-1.03), and `replay` and
`speed` save it after each example so that `--resume` continues where the interrupted run was. Real decoding and
replay see the same rows because replay's scorer hands the same top-k after every node (engine.loop.TreeScorer).
The prompt's prefill does not fill the matrix (the loop computes only its last position's logits). The draft is a
deterministic function of the context and the matrix, so q is a point mass on each proposed token and T > 0 is
exact.
"""
from __future__ import annotations

from ..engine import DraftContext, Feedback, Proposal
from .base import Method, MethodSpec, Param
from .contract import Input
from .env import Env
from .search import Sizes

# The authors' default template (version 2.2.2), breadth-first: 80 draft nodes, ranks 0..7, depths 1..6.
TEMPLATE: tuple[tuple[int, ...], ...] = tuple(tuple(e) for e in (
    [0], [1], [2], [3], [4], [5], [6], [7],
    [0, 0], [0, 1], [0, 2], [0, 3], [0, 4], [0, 5], [0, 6], [0, 7], [1, 0], [1, 1], [1, 2], [1, 3], [2, 0], [2, 1],
    [2, 2], [3, 0], [3, 1], [4, 0], [5, 0], [6, 0], [7, 0],
    [0, 0, 0], [0, 0, 1], [0, 0, 2], [0, 0, 3], [0, 0, 4], [0, 0, 5], [0, 0, 6], [0, 0, 7], [0, 1, 0], [0, 1, 1],
    [0, 1, 2], [0, 2, 0], [0, 2, 1], [0, 3, 0], [0, 4, 0], [0, 5, 0], [0, 6, 0], [0, 7, 0], [1, 0, 0], [1, 0, 1],
    [1, 1, 0], [2, 0, 0], [3, 0, 0], [4, 0, 0], [5, 0, 0],
    [0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 0, 3], [0, 0, 0, 4], [0, 0, 1, 0], [0, 0, 1, 1], [0, 0, 2, 0],
    [0, 0, 3, 0], [0, 0, 4, 0], [0, 1, 0, 0], [0, 2, 0, 0], [1, 0, 0, 0], [2, 0, 0, 0], [3, 0, 0, 0],
    [0, 0, 0, 0, 0], [0, 0, 0, 0, 1], [0, 0, 0, 0, 2], [0, 0, 0, 1, 0], [0, 0, 0, 2, 0], [0, 0, 1, 0, 0],
    [0, 1, 0, 0, 0], [1, 0, 0, 0, 0],
    [0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 1], [0, 0, 0, 1, 0, 0]))
MAX_NODES = len(TEMPLATE)
MAX_K = 1 + max(r for e in TEMPLATE for r in e)
assert all(e[:-1] in set(TEMPLATE[:i]) | {()} for i, e in enumerate(TEMPLATE)), "template is not breadth-first"
NODES_AUTO = (4, 8, 12, 16, 24, 32, 48, 64, 80)   # nodes=auto: the template's breadth-first prefixes, one replay each


class RecyclingDrafter:
    """Adjacency rows in, a BFS-expanded tree out; `feedback_k` = k asks the loop for each node's top-k."""

    def __init__(self, name: str, nodes: int = MAX_NODES, k: int = MAX_K, persist: bool = True):
        self.name, self.k, self.persist = name, k, persist
        self.feedback_k = k
        self.template = [e for e in TEMPLATE[:nodes] if max(e) < k]
        self.rows: dict[int, list[int]] = {}

    def reset(self, prompt_ids: list[int]) -> None:
        if not self.persist:
            self.rows = {}

    def propose(self, ctx: DraftContext) -> Proposal:
        tok: dict[tuple[int, ...], int] = {(): ctx.tokens[-1]}
        for e in self.template:
            parent = tok.get(e[:-1])
            row = None if parent is None else self.rows.get(parent)
            if row is not None and e[-1] < len(row):
                tok[e] = row[e[-1]]
        inner = {e[:-1] for e in tok if e}
        leaves = [e for e in tok if e and e not in inner]
        if not leaves:
            return Proposal()
        paths = [[tok[e[: i + 1]] for i in range(len(e))] for e in leaves]
        return Proposal(paths, [[1.0] * len(p) for p in paths])

    def feedback(self, fb: Feedback) -> None:
        """Every scored node's row becomes the base's top-k after it (later nodes win where a token repeats)."""
        for token, top in zip(fb.tree.tokens, fb.topk.tolist()):
            self.rows[token] = top

    def observe(self, tokens: list[int]) -> None:
        pass

    def snapshot(self) -> dict[int, list[int]] | None:
        """A shallow copy of the matrix (None with persist=0: nothing outlives an example). Shallow is enough and
        cheap: `feedback` replaces a row, never changes one in place, so a row list is never written after it is
        made; copying 150k rows per repeat would also leave the garbage collector work that lands in a timed
        decode."""
        return dict(self.rows) if self.persist else None

    def restore(self, state: dict) -> None:
        """A new dict each time (one snapshot is restored before every repeat of a prompt); keys come back as
        strings from JSON (a resumed replay)."""
        ints = not state or isinstance(next(iter(state)), int)
        self.rows = dict(state) if ints else {int(t): row for t, row in state.items()}

def build(env: Env, method: Method) -> RecyclingDrafter:
    nodes, k, persist = method.get("nodes", MAX_NODES), method.get("k", MAX_K), bool(method.get("persist", 1))
    drafter = RecyclingDrafter(method.label, nodes, k, persist)
    env.resolved[method.label] = {"nodes": nodes, "k": k, "persist": int(persist), "width": len(drafter.template)}
    return drafter


SPECS = [MethodSpec("recycling", "Token Recycling: each token's top-k successors from earlier verify forwards, "
                    "expanded breadth-first into the authors' 80-node static tree", build,
                    (Param("nodes", int, f"draft nodes of the template kept in breadth-first order, 1..{MAX_NODES} "
                           "(auto: the size fastest on this machine)", low=1, high=MAX_NODES + 1, auto=True),
                     Param("k", int, f"successors kept per token, 1..{MAX_K}", low=1, high=MAX_K + 1),
                     Param("persist", int, "1: keep the matrix across the run's examples (the authors'); 0: clear it "
                           "per example", low=0, high=2)),
                    inputs=frozenset({Input.FEEDBACK}), artefacts=(), shapes=Sizes("nodes", NODES_AUTO))]
