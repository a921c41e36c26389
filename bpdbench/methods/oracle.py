"""Oracle top-k: the best path the heads' top-k lattice holds, known from the greedy reference (paper, Table 1).

At each position it drafts the reference token while it is among that head's top-k, then the heads' top-1 (which
the base rejects). It needs the reference, so it is an upper bound rather than a decoder, but it runs through the
same loop: in replay it reads G, in a real run the greedy reference the certificate uses. Greedy only: at T > 0
there is no single reference to draft from, so the commands refuse `--temperature` with it.
"""
from __future__ import annotations

from ..engine import DraftContext, Proposal
from .base import HEADS, Method, MethodError, MethodSpec, Param
from .contract import RUN_HEADS, Input
from .env import Env
from .heads import _needs_heads
from .lattice import HeadsSource, LatticeDrafter


class OracleDrafter:
    needs_reference = True

    def __init__(self, name: str, inner: LatticeDrafter):
        self.name, self.inner = name, inner
        self.reference: list[int] | None = None
        self.start = 0

    def use_reference(self, tokens: list[int]) -> None:
        self.reference = list(tokens)

    def reset(self, prompt_ids: list[int]) -> None:
        self.start = len(prompt_ids)

    def propose(self, ctx: DraftContext) -> Proposal:
        if self.reference is None:
            raise MethodError(f"{self.name} needs the greedy reference of each example (the session sets it)")
        lat = self.inner.lattice(ctx)
        if lat is None:
            return Proposal()
        m = len(ctx.tokens) - self.start            # reference tokens decided so far
        truth = self.reference[m:]
        path = []
        for j, row in enumerate(lat.ids.tolist()):
            if j < len(truth) and truth[j] in row and len(path) == j:
                path.append(truth[j])
            else:
                path.append(row[0])
        return Proposal([path], lattice=lat)

    def observe(self, tokens: list[int]) -> None:
        pass


def build(env: Env, method: Method) -> OracleDrafter:
    heads, _ = env.heads(method.option("heads"))
    k, n = method.option("k"), method.option("heads")     # --k and --heads where not spelled (bind)
    env.resolved[method.label] = {"n_heads": n, "k": k}
    inner = LatticeDrafter(method.label, HeadsSource(heads, env.model.lm_head), n, k=k)
    return OracleDrafter(method.label, inner)


SPECS = [MethodSpec("oracle", "oracle top-k: the best lattice path, known from the greedy reference (an upper bound)",
                    build, (Param("k", int, "top-k per head (default: --k)", low=1, flag="k"), HEADS), _needs_heads,
                    inputs=frozenset({Input.HIDDEN, Input.REFERENCE}), artefacts=(RUN_HEADS,))]
