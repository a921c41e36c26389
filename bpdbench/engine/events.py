"""The per-step event: what one verify step drafted, verified and decided, as real decoding and replay both saw it.

Analyses (draft repetition, the α law's per-step β, the auto shapes' acceptance per depth and rank, drafting time)
observe steps through this one hook instead of wrapping the drafter, so a drafter is never hidden behind a wrapper
that must forward its optional hooks (feedback, reference) to keep the loop's behaviour unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .acceptance import Decision
from .tree import Tree
from .types import DraftContext, Proposal


@dataclass(frozen=True)
class StepEvent:
    context: DraftContext     # what the drafter saw
    proposal: Proposal        # what was verified: clipped to the budget
    tree: Tree                # its token trie (draft and scored-only nodes)
    decision: Decision        # the winning path, tokens kept, bonus
    new: list[int]            # tokens decided by this step (kept draft tokens + bonus, cut at EOS)
    produced: int             # output tokens so far, this step's included
    draft_seconds: float      # wall time of `propose` (synchronised on a GPU in real decoding)


OnStep = Callable[[StepEvent], None]
