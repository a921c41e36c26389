"""Replay a greedy trajectory: every draft method, the oracle, repetition and entropy, from one forward per example.

Greedy BPD is lossless, so every method walks the same token sequence G (the greedy output); methods differ only in
how many tokens each step accepts. With the hidden state at every position of G (one teacher-forced forward), the
heads' lattice at every position is known, and any drafting rule can be replayed without re-decoding: at position m
the draft(s) are compared with G[m+1:], the step accepts a tokens and the walk jumps to m + a + 1. This is exactly
the real loop's arithmetic; it differs from a real run only where floating point differs between a teacher-forced
forward and incremental verification (none in float32 in our tests; near-ties in bfloat16). `bpdbench run` remains
the real, certified decoder; replay makes oracle/analysis grids affordable on a CPU.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .heads import Heads
from .metrics import Counters
from .tree import build_tree
from rescorers.base import Lattice

Chooser = Callable[[Lattice, list[int]], list[list[int]]]


@dataclass
class Trajectory:
    prompt: list[int]
    greedy: list[int]          # G: the greedy output (N tokens, EOS included when reached)
    ids: torch.Tensor          # [N, h, K] lattice token ids per position (position m drafts G[m+1 : m+1+h])
    logprobs: torch.Tensor     # [N, h, K]
    entropy: torch.Tensor      # [N, h] entropy of each head's distribution over its draft vocabulary

    def lattice(self, m: int, k: int) -> Lattice:
        return Lattice(self.ids[m, :, :k], self.logprobs[m, :, :k])


@torch.inference_mode()
def trajectory(model, heads: Heads, prompt: list[int], greedy: list[int], n_heads: int, k_max: int = 16) -> Trajectory:
    ids = torch.tensor([prompt + greedy[:-1]], device=model.device)
    hidden = model.model(input_ids=ids).last_hidden_state[0, len(prompt) - 1:]      # [N, d]
    logp = torch.log_softmax(heads.logits(hidden, n_heads, model.lm_head).float(), -1)  # [N, h, V']
    entropy = -(logp.exp() * logp).sum(-1)
    top_lp, top_idx = logp.topk(k_max, -1)
    return Trajectory(list(prompt), list(greedy), heads.to_token_ids(top_idx).cpu(), top_lp.cpu(), entropy.cpu())


def matched(draft: list[int], truth: list[int]) -> int:
    a = 0
    while a < len(draft) and a < len(truth) and draft[a] == truth[a]:
        a += 1
    return a


def simulate(traj: Trajectory, choose: Chooser, k: int) -> Counters:
    """Walk G with a drafting rule; counters as the real decoder would record them."""
    c = Counters(serial_calls=1)          # the prefill decides G[0]
    g, n, m = traj.greedy, len(traj.greedy), 0
    while m + 1 < n:
        drafts = choose(traj.lattice(m, k), traj.prompt + g[: m + 1])
        a = max(matched(d, g[m + 1:]) for d in drafts)
        c.record_step(len(drafts[0]), a, verified=len(build_tree(0, drafts).tokens))
        m += a + 1
    c.new_tokens = n
    return c


def oracle(traj: Trajectory, k: int) -> Counters:
    """Best achievable with top-k lattices: accept while every next greedy token is among a head's top-k."""
    c = Counters(serial_calls=1)
    g, n, m = traj.greedy, len(traj.greedy), 0
    h = traj.ids.shape[1]
    while m + 1 < n:
        a = 0
        while a < h and m + 1 + a < n and g[m + 1 + a] in traj.ids[m, a, :k].tolist():
            a += 1
        c.record_step(h, a)
        m += a + 1
    c.new_tokens = n
    return c


def top1(lattice: Lattice, context: list[int]) -> list[list[int]]:
    return [lattice.ids[:, 0].tolist()]


def repetition(drafts: list[list[int]]) -> dict[str, float]:
    """Share of adjacent identical draft tokens (over all adjacent pairs) and mean of each draft's longest run."""
    pairs = same = 0
    runs = []
    for d in drafts:
        pairs += max(len(d) - 1, 0)
        same += sum(x == y for x, y in zip(d, d[1:]))
        best = cur = 1
        for x, y in zip(d, d[1:]):
            cur = cur + 1 if x == y else 1
            best = max(best, cur)
        runs.append(best)
    return {"repeat_share": same / pairs if pairs else float("nan"),
            "mean_max_run": sum(runs) / len(runs) if runs else float("nan"), "n_drafts": len(drafts)}


def h_max(mean_entropy: list[float]) -> int:
    """Last head (1-based) up to which mean entropy rises monotonically (paper's h_max)."""
    h = 1
    while h < len(mean_entropy) and mean_entropy[h] > mean_entropy[h - 1]:
        h += 1
    return h
