"""A certificate for every divergence from the greedy reference: `exact`, `near_tie` or `lost`.

Why: in bfloat16 a 9-token verify forward and a 1-token decode forward round differently, so a near-tie between the
two best tokens can flip and the output legitimately differs from greedy. A real bug (say in KV-cache handling)
looks exactly the same in a bare lossless_rate. So at the first divergent token i we measure, for this example:

- the reference decode's own logits at i, recomputed with the loop's prefill/verify along the reference (1-token
  forwards, bit for bit what produced the reference): the top-2 margin, and the gap between the reference's token
  and the token the method emitted;
- the numerical difference between block and 1-token forwards at i: the largest absolute logit difference between
  (a) one teacher-forced forward over prompt + reference[:i] and (b) a block verify forward (the method's block
  width, from the same cache) against the 1-token logits.

The divergence is a `near_tie` when the gap is within the measured difference (so the top-2 margin is too), else
`lost`. float32 divergences are always `lost`: there is no rounding story to tell. While replaying the reference we
also check that it is what greedy decoding produces now; if not, the cached reference is corrupt or stale, which
is reported as such (the caller recomputes it) instead of being blamed on a near-tie.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from ..engine.acceptance import Decision
from ..engine.loop import advance, prefill, verify
from ..engine.replay import teacher_forced
from ..engine.types import EMPTY, Proposal

OUTCOMES = ("exact", "near_tie", "lost")


class LostExamples(RuntimeError):
    """A run produced output that differs from greedy beyond numerical noise: a real loss, never a pass."""


@dataclass(frozen=True)
class Certificate:
    certificate: str                    # exact | near_tie | lost
    divergence: int | None = None       # first divergent token
    top2_margin: float | None = None    # reference decode: logit(top-1) - logit(top-2) at the divergence
    token_gap: float | None = None      # reference decode: logit(reference token) - logit(method's token)
    numeric_diff: float | None = None   # max |block-forward logit - 1-token-forward logit| at the divergence
    reason: str = ""
    reference_ok: bool = True           # False: the cached reference is not what greedy decoding produces now

    def to_record(self) -> dict:
        rec = asdict(self)
        rec.pop("divergence")
        rec.pop("reference_ok")
        return rec


EXACT = Certificate("exact", reason="identical to greedy")


@torch.inference_mode()
def _logits(model, hidden: torch.Tensor) -> torch.Tensor:
    return model.lm_head(hidden).float()


@torch.inference_mode()
def _replay_reference(model, prompt: list[int], ref: list[int], i: int, draft: list[int]
                      ) -> tuple[torch.Tensor, torch.Tensor | None, int | None]:
    """(1-token logits at i, block-verify logits at i or None, first position where the reference is not greedy).

    Uses the engine's own prefill/verify/advance with empty proposals: exactly the computation that made the
    reference, so a mismatch with it means the reference file is wrong, not the rounding."""
    state = prefill(model, prompt)
    if i == 0:
        return _logits(model, state.hidden[None])[0], None, None if state.context[-1] == ref[0] else 0
    if state.context[-1] != ref[0]:
        return _logits(model, state.hidden[None])[0], None, 0
    block = None
    for j in range(1, i + 1):
        if j == i and draft:
            past = state.cache.get_seq_length()
            vb = verify(model, state, Proposal([draft]))
            block = _logits(model, vb.hidden)[0]
            state.cache.crop(-(state.cache.get_seq_length() - past))   # drop the block again
        v = verify(model, state, EMPTY)
        if j == i:
            logits = _logits(model, v.hidden)[0]
            bad = None if j >= len(ref) or v.targets[0] == ref[j] else j
            return logits, block, bad
        if v.targets[0] != ref[j]:
            return _logits(model, v.hidden)[0], None, j
        advance(state, v, Decision(0, 0, ref[j]))
    raise AssertionError("unreachable")


def _teacher_forced(model, ids: list[int]) -> torch.Tensor:
    """Logits after one teacher-forced forward over `ids` (the engine's replay forward, last position)."""
    return _logits(model, teacher_forced(model, ids[:1], ids[1:] + [0])[-1:])[0]


def certify_output(model, prompt: list[int], output: list[int], ref: list[int], dtype: str, width: int = 8
            ) -> Certificate:
    """Certificate of one example: `output` (the method's) against `ref` (greedy), both for `prompt`.
    `width` is the number of draft tokens the method verifies per block (the block measurement uses as many)."""
    from .reference import first_divergence
    i = first_divergence(output, ref)
    if i is None:
        return EXACT
    if i >= len(ref) or i >= len(output):
        return Certificate("lost", i, reason=f"lengths differ ({len(output)} vs greedy {len(ref)}) after an "
                                             f"identical prefix: a stopping bug, not rounding")
    draft = (output[i:] + ref[i:])[:max(width, 1)]
    one, block, bad = _replay_reference(model, prompt, ref, i, draft)
    if bad is not None:
        return Certificate("lost", i, reason=f"the greedy reference is not what greedy decoding gives now (token "
                                             f"{bad}): corrupt or stale reference file", reference_ok=False)
    tf = _teacher_forced(model, prompt + ref[:i])
    diffs = [float((tf - one).abs().max())] + ([float((block - one).abs().max())] if block is not None else [])
    numeric = max(diffs)
    top2 = one.topk(2).values
    margin = float(top2[0] - top2[1])
    gap = float(one[ref[i]] - one[output[i]])
    numbers = dict(top2_margin=margin, token_gap=gap, numeric_diff=numeric)
    if dtype == "float32":
        return Certificate("lost", i, **numbers, reason="float32 output differs from greedy: a bug, please report")
    if gap <= numeric:
        return Certificate("near_tie", i, **numbers,
                           reason=f"the method's token trails greedy's by {gap:.4g}, within the {numeric:.4g} that "
                                  f"block and 1-token forwards differ by here ({dtype} rounding)")
    return Certificate("lost", i, **numbers,
                       reason=f"the method's token trails greedy's by {gap:.4g} logits, more than the {numeric:.4g} "
                              f"block and 1-token forwards differ by: a real divergence")
