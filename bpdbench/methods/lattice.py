"""One drafter for every head-type network: per-depth logits -> top-k lattice -> threshold -> rescorer's paths.

Why one: the heads of `bpd` and the paper's refinements, and the parallel draft networks (Medusa/KOALA heads,
Amphista), all give every depth's next-token logits in one call. Drafting from them differs only in where those
logits come from, so the lattice, the draft threshold, the refine stage and the replay memo live here once and a
network plugs in through `Source`. Sequential drafters (EAGLE, Hydra) cannot give later depths before earlier ones
are drafted; their chain (methods/trained.py) applies the same rule (`sure_depths`) depth by depth and hands its
lattice to the same refine code (`Refined`).
"""
from __future__ import annotations

from typing import Hashable, Protocol

import torch
from torch import nn

from ..engine import DraftContext, Lattice, Proposal
from ..nets.base import DraftModel
from ..nets.heads import Heads
from ..refine import Rescorer


def sure_depths(top1_logprobs: torch.Tensor, threshold: float) -> int:
    """The number of leading depths whose top-1 probability reaches `threshold` (0: no draft; threshold <= 0: every
    depth). The draft stops at the first unsure depth rather than skipping it: a token after a rejected one can
    never be kept, and on a CPU the verify forward's cost grows with the block (a 9-token block costs ~1.35 decode
    steps in bf16, a 2-token one barely more than one) while far depths rarely hit. The probability is compared
    exactly (float64), so a threshold that float32 would round down is not silently lowered."""
    if threshold <= 0:
        return len(top1_logprobs)
    unsure = (top1_logprobs.exp().double() < threshold).nonzero()
    return int(unsure[0]) if len(unsure) else len(top1_logprobs)


class Source(Protocol):
    """A network that gives every depth's next-token logits at once, over its drafting vocabulary."""

    @property
    def key(self) -> Hashable:
        """What the logits depend on besides the position and the depth (the replay memo's key)."""

    def logits(self, ctx: DraftContext, n: int) -> torch.Tensor:
        """[n, S] logits of draft depths 1..n at the context's last position."""

    def to_token_ids(self, idx: torch.Tensor) -> torch.Tensor:
        """Drafting-vocabulary indices (a shortlist's rows) -> token ids."""


class HeadsSource:
    """Blockwise heads with the base's vocabulary projection: `Heads.draft_logits`, whose packed path is two
    batched matmuls. `context` is passed because test oracles and context drafters subclass `Heads`."""

    def __init__(self, heads: Heads, lm_head: nn.Linear):
        self.heads, self.lm_head = heads, lm_head

    @property
    def key(self) -> Hashable:
        return ("heads-lattice", id(self.heads))

    def logits(self, ctx: DraftContext, n: int) -> torch.Tensor:
        return self.heads.draft_logits(ctx.hidden, n, self.lm_head, context=ctx.tokens)

    def to_token_ids(self, idx: torch.Tensor) -> torch.Tensor:
        return self.heads.to_token_ids(idx)


class ParallelSource:
    """A parallel draft network (`DraftModel.drafting == "parallel"`): its depths may read the base's next token
    (Amphista) as well as its hidden state."""

    def __init__(self, model: DraftModel):
        self.model = model

    @property
    def key(self) -> Hashable:
        return ("parallel-lattice", id(self.model))

    def logits(self, ctx: DraftContext, n: int) -> torch.Tensor:
        return self.model.parallel_logits(ctx.hidden, ctx.tokens[-1], n)

    def to_token_ids(self, idx: torch.Tensor) -> torch.Tensor:
        return self.model.to_token_ids(idx)


class Refined:
    """What every lattice drafter does with its lattice: the rescorer's paths (none: the top-1 path), the rescorer
    kept in step with the example (`reset`) and the decided tokens (`observe`, for rescorers that cache them)."""

    rescorer: Rescorer | None

    def reset(self, prompt_ids: list[int]) -> None:
        if self.rescorer is not None:
            self.rescorer.reset(list(prompt_ids))

    def observe(self, tokens: list[int]) -> None:
        if hasattr(self.rescorer, "observe"):
            self.rescorer.observe(tokens)

    def proposal(self, lat: Lattice | None, ctx: DraftContext) -> Proposal:
        if lat is None:
            return Proposal()
        if self.rescorer is None:
            return Proposal([lat.ids[:, 0].tolist()], lattice=lat)
        return Proposal(self.rescorer.refine(lat, ctx.tokens), lattice=lat)


class LatticeDrafter(Refined):
    """Top-k candidates of the source's first `depth` depths at the current position, cut by the threshold, then
    the rescorer's paths.

    All depths are scored in one call even when the threshold cuts the draft short: drafting is bound by reading
    the shortlisted projection, which one head costs as much as eight. Depths the rescorer never reads (a fixed
    Medusa tree's `max_depth`) are not computed: `bpdbench speed --task mt_bench --limit 6 --max-new-tokens 32
    --methods medusa:nodes=auto --dtype bfloat16` drafted in 3.0 ms per step instead of 3.7 (AVX512-BF16 EPYC). Every
    row's top-k is unchanged: k is not cut, since a top-k of fewer ranks can order bfloat16 ties differently.

    `budgeted`: draft at most `ctx.budget` depths. The draft networks always have and the heads never have; the
    loop clips the paths to the budget either way, but a rescorer's paths over the longer lattice, and the lattice
    that analyses read, differ from those over the cut one, so each keeps its own rule and its numbers."""

    def __init__(self, name: str, source: Source, depth: int, k: int = 1, threshold: float = 0.0,
                 rescorer: Rescorer | None = None, budgeted: bool = False):
        self.name, self.source, self.depth = name, source, depth
        self.k, self.threshold, self.rescorer, self.budgeted = k, threshold, rescorer, budgeted

    def lattice(self, ctx: DraftContext) -> Lattice | None:
        """The lattice at this position; in replay it is kept in the example's memo under everything it depends
        on (source, depths, k, threshold, position), so drafters sharing those share one computation."""
        n = min(self.depth, ctx.budget) if self.budgeted else self.depth
        n = min(n, getattr(self.rescorer, "max_depth", n))   # a fixed tree reads no head past its deepest node
        if n <= 0:
            return None
        if ctx.memo is None:
            return self._lattice(ctx, n)
        key = (self.source.key, n, self.k, self.threshold, len(ctx.tokens))
        if key not in ctx.memo:
            ctx.memo[key] = self._lattice(ctx, n)
        return ctx.memo[key]

    @torch.no_grad()
    def _lattice(self, ctx: DraftContext, n: int) -> Lattice | None:
        logp, idx = torch.log_softmax(self.source.logits(ctx, n).float(), -1).topk(self.k, dim=-1)
        sure = sure_depths(logp[:, 0], self.threshold)
        if sure == 0:
            return None
        if sure < len(logp):
            logp, idx = logp[:sure], idx[:sure]
        return Lattice(self.source.to_token_ids(idx).cpu(), logp.cpu())

    def propose(self, ctx: DraftContext) -> Proposal:
        return self.proposal(self.lattice(ctx), ctx)
