"""Replay: any drafter walked along a known greedy output, through the loop's own propose and decide code.

Greedy decoding with any drafter is lossless, so every method walks the same token sequence G; methods differ only
in how many tokens each step keeps. One teacher-forced forward over prompt + G gives the base's hidden state at
every position, which is what the loop would hand the drafter; the base's greedy choice at a tree node is known
whenever the node's path agrees with G (and no path can be kept past a node that disagrees). So replay calls the
drafter's `propose`/`observe` with the contexts real decoding would give and the acceptance rule's `decide` with
targets read from G, and records the same counters. It differs from a real run only where floating point differs
between a teacher-forced forward and incremental verification (never in float32 in our tests; near-ties in
bfloat16). It makes oracle and method grids affordable: one base forward per example instead of one per step.
"""
from __future__ import annotations

import time

import torch

from .acceptance import GREEDY, Acceptance
from .counters import Counters
from .events import OnStep, StepEvent
from .loop import Limits, TreeScorer, give_feedback, step_decision
from .tree import Tree, build_tree
from .types import DraftContext, Drafter, Layers, layers_of

UNKNOWN = -1   # target of a node off the greedy path: nothing can equal it


@torch.inference_mode()
def teacher_forced(model, prompt: list[int], greedy: list[int], with_prompt: bool = False) -> torch.Tensor:
    """[N, d]: row m is the final hidden state that produced greedy[m] (the prompt's last position for m = 0).
    `with_prompt`: [P - 1 + N, d], the prompt's other positions first (what feature drafters see at prefill)."""
    ids = torch.tensor([list(prompt) + list(greedy[:-1])], device=model.device)
    return model.model(input_ids=ids).last_hidden_state[0, 0 if with_prompt else len(prompt) - 1:]


@torch.inference_mode()
def teacher_forced_layers(model, prompt: list[int], greedy: list[int], indices, with_prompt: bool = False
                          ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """`teacher_forced`'s states and, from the same forward, those of the layers `indices` (their union over the
    drafters replayed: {index: [N, d]}, rows as the final states'), for drafters that declare layers."""
    indices = sorted(set(indices))
    ids = torch.tensor([list(prompt) + list(greedy[:-1])], device=model.device)
    out = model.model(input_ids=ids, output_hidden_states=indices)
    start = 0 if with_prompt else len(prompt) - 1
    return out.last_hidden_state[0, start:], {i: out.hidden_states[i][0, start:] for i in indices}


def declared(layer_states: dict[int, torch.Tensor] | None, layers: Layers | None, name: str
             ) -> torch.Tensor | None:
    """[N, k, d]: a drafter's declared layers out of a replay's `layer_states`; a one-line error when missing."""
    if layers is None:
        return None
    missing = [i for i in layers.indices if layer_states is None or i not in layer_states]
    if missing:
        raise ValueError(f"{name}: replaying a drafter that reads the hidden states of layers {list(layers.indices)} "
                         f"needs them (engine.replay.teacher_forced_layers); missing {missing}")
    return torch.stack([layer_states[i] for i in layers.indices], 1)


def targets_from_reference(tree: Tree, truth: list[int]) -> list[int]:
    """What the base's argmax after each node is, as far as G tells: truth[depth] for nodes on G's path."""
    on_path = [True] + [False] * (len(tree.tokens) - 1)
    out = [truth[0] if truth else UNKNOWN] + [UNKNOWN] * (len(tree.tokens) - 1)
    for n in range(1, len(tree.tokens)):
        p, depth = tree.parents[n], tree.depths[n]
        if on_path[p] and depth - 1 < len(truth) and tree.tokens[n] == truth[depth - 1]:
            on_path[n] = True
            out[n] = truth[depth] if depth < len(truth) else UNKNOWN
    return out


@torch.inference_mode()
def replay(drafter: Drafter, prompt: list[int], greedy: list[int], hidden: torch.Tensor | None, limits: Limits,
           acceptance: Acceptance = GREEDY, memo: dict | None = None, scorer: TreeScorer | None = None,
           on_step: OnStep | None = None, layer_states: dict[int, torch.Tensor] | None = None) -> Counters:
    """Counters of decoding `prompt` with `drafter`, given the greedy output G (truncated as the loop truncates).
    `hidden` from `teacher_forced` (None for drafters that never look at it); with `with_prompt=True` it also
    holds the prompt's positions, and the first proposal's `accepted_hidden` covers the prompt as in real decoding.
    `scorer` (engine.loop.TreeScorer): needed by drafters with `feedback_k`, which it gives the top-k ids at every
    node of each verified tree, as the verify forward does in real decoding (called at the same point: after the
    decision, before `observe`), and by drafters with `needs_base_cache`, which it gives the base's KV cache of
    the decided context, teacher-forced. `on_step`: as in `generate`, once per step. `layer_states`: from
    `teacher_forced_layers`, for a drafter that declares `hidden_layers` (rows as `hidden`'s)."""
    feedback_k = int(getattr(drafter, "feedback_k", 0) or 0)
    shares_cache = bool(getattr(drafter, "needs_base_cache", False))
    if (feedback_k or shares_cache) and scorer is None:
        what = "learns from the verify forward" if feedback_k else "drafts on the base's KV cache"
        raise ValueError(f"{drafter.name}: replaying a drafter that {what} needs a scorer "
                         f"(engine.loop.TreeScorer(model))")
    c = Counters(serial_calls=1)          # the prefill decides G[0]
    drafter.reset(list(prompt))
    g, n = list(greedy), len(greedy)
    fresh = chosen = fresh_layers = None
    if hidden is not None:
        chosen = declared(layer_states, layers_of(drafter), drafter.name)
        lead = hidden.shape[0] - n if hidden.shape[0] == len(prompt) - 1 + n else 0
        fresh, hidden = hidden[: lead + 1], hidden[lead:]
        if chosen is not None:
            fresh_layers, chosen = chosen[: lead + 1], chosen[lead:]
    drafter.observe(g[:1])
    m = 0                                  # G[:m+1] is decided
    while m + 1 < n:
        out = g[: m + 1]
        budget = limits.budget(out)
        ctx = DraftContext(list(prompt) + out, None if hidden is None else hidden[m], budget, memo,
                           accepted_hidden=fresh, accepted_layers=fresh_layers)
        if shares_cache:
            ctx.base_cache = scorer.base_cache(ctx.tokens)
        t0 = time.perf_counter()
        proposal = drafter.propose(ctx).clip(budget)
        t_draft = time.perf_counter() - t0
        tree = build_tree(g[m], proposal.paths, proposal.scored)
        d = step_decision(tree, targets_from_reference(tree, g[m + 1:]), proposal, limits, acceptance)
        c.record_step(len(proposal.paths[d.path]), d.accepted, len(tree.tokens))
        new = g[m + 1: m + 2 + d.accepted]
        if feedback_k:         # the top-k and the drafter's update are drafting, as `generate` counts them
            ids = scorer.topk(ctx.tokens, tree, feedback_k)
            t_draft += scorer.topk_s + give_feedback(drafter, tree, ids)
        drafter.observe(new)
        fresh = None if hidden is None else hidden[m + 1: m + 2 + d.accepted]
        fresh_layers = None if chosen is None else chosen[m + 1: m + 2 + d.accepted]
        m += d.accepted + 1
        if on_step:
            on_step(StepEvent(ctx, proposal, tree, d, new, m + 1, t_draft))
    c.new_tokens = n
    return c
