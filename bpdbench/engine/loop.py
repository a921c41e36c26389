"""One decode loop for every method: prefill -> propose -> verify -> accept -> advance.

Autoregressive decoding is this loop with the empty drafter, so AR and every drafting method share prefill,
stopping, KV-cache handling and counting; only the proposal differs. The verify forward of step n also yields the
hidden state that step n+1 drafts from (Stern et al.), so each step is exactly one serial call of the base model.
Proposals are clipped to the generation budget and acceptance stops at EOS: a token that would be cut from the
output is never counted as accepted, which is also what replay (replay.py) can see.
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field, replace
from collections.abc import Sequence

import torch
from transformers import DynamicCache

from .acceptance import GREEDY, Acceptance, Decision
from .cache import CacheFactory, new_cache
from .counters import Counters
from .events import OnStep, StepEvent
from .tree import Tree, build_tree, compact_cache, inner_nodes, is_chain, model_inputs
from .types import DraftContext, Drafter, EmptyDrafter, Feedback, Layers, Proposal, layers_of, select_layers


@dataclass(frozen=True)
class Limits:
    max_new_tokens: int
    eos_ids: frozenset[int] = frozenset()

    def done(self, out: list[int]) -> bool:
        return len(out) >= self.max_new_tokens or any(t in self.eos_ids for t in out)

    def truncate(self, out: list[int]) -> list[int]:
        for i, t in enumerate(out):
            if t in self.eos_ids:
                out = out[: i + 1]
                break
        return out[: self.max_new_tokens]

    def budget(self, out: list[int]) -> int:
        """Draft tokens that can still be kept: what remains of the budget minus the bonus token."""
        return self.max_new_tokens - len(out) - 1

    def stop_at_eos(self, tokens: list[int], accepted: int) -> int:
        for j in range(accepted):
            if tokens[j] in self.eos_ids:
                return j + 1
        return accepted


@dataclass
class State:
    """Decoding state between steps. The last token of `context` is decided (base greedy) but not yet cached."""
    cache: DynamicCache
    hidden: torch.Tensor        # [d] final hidden state that produced context[-1]
    context: list[int]          # prompt + decided tokens
    fresh: torch.Tensor | None = None   # [m, d] hidden states of the positions decided since the last proposal
    fresh_layers: torch.Tensor | None = None   # [m, k, d] the same positions' declared layers (Layers), if any


@dataclass
class Generation:
    tokens: list[int]
    counters: Counters
    step_log: list[tuple[int, int]] = field(default_factory=list)  # (drafted, accepted) per step
    # (tokens scored, tree mask?, rows through the output projection) per verify forward
    verify_log: list[tuple[int, bool, int]] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(("prefill", "draft", "verify"), 0.0))


@dataclass
class Verified:
    tree: Tree
    hidden: torch.Tensor        # [n_nodes, d] final hidden states
    targets: Sequence[int]      # what each node's child must equal (greedy: the base's argmax after the node)
    past: int                   # cache length before the verify forward
    topk: torch.Tensor | None = None   # [n_nodes, k] the base's top-k ids per node, for drafters with feedback_k
    topk_s: float = 0.0         # seconds the top-k took: the drafter's work, counted as drafting (`generate`)
    layers: torch.Tensor | None = None  # [n_nodes, k, d] the drafter's declared layers (Layers), if any


TREE_ROWS = 256     # cache rows beyond prompt + new tokens that a preallocated cache reserves for a verify's tree


def forward(model, layers: Layers | None = None, **inputs):
    """The base's forward (`model.model`) and the declared layers of its first row ([n, k, d], None without
    `layers`): only the selected hidden states are kept (`output_hidden_states` by index), so a drafter that
    declares none makes the forward exactly what it was."""
    if layers is None:
        return model.model(**inputs), None
    out = model.model(**inputs, output_hidden_states=list(layers.indices))
    return out, select_layers(out.hidden_states, layers)


def prefill(model, prompt_ids: list[int], acceptance: Acceptance = GREEDY, memo: dict | None = None,
            new_tokens: int = 0, cache: CacheFactory | None = None, layers: Layers | None = None) -> State:
    """The prompt's forward and the first token. With a `memo` (many sampled decodes of one prompt, as `certify`
    runs) the forward is computed once and its cache copied per decode: same numbers, one serial call counted.
    Every prompt position's hidden state is kept (`State.fresh`) for drafters that run over the base's features.
    `new_tokens`: sizes a preallocated cache (cache.py) so no step reallocates it. `cache`: makes the base's cache
    from (device, capacity) instead of the device's choice (`new_cache`): how a measurement compares two kinds.
    `layers`: the drafter's declared layers, kept for every prompt position (`State.fresh_layers`)."""
    key = ("prefill", tuple(prompt_ids), layers)
    if memo is not None and key in memo:
        cache, hidden, logits, chosen = memo[key]
        cache = copy.deepcopy(cache)
    else:
        cache = (cache or new_cache)(model.device, len(prompt_ids) + new_tokens + TREE_ROWS)
        x = torch.tensor([prompt_ids], device=model.device)
        out, chosen = forward(model, layers, input_ids=x, past_key_values=cache, use_cache=True)
        hidden = out.last_hidden_state[0]
        logits = model.lm_head(hidden[-1:])
        if memo is not None:
            memo[key] = (copy.deepcopy(cache), hidden, logits, chosen)
    nxt = acceptance.first(logits)
    return State(cache, hidden[-1], list(prompt_ids) + [nxt], hidden, chosen)


def verify(model, state: State, proposal: Proposal, acceptance: Acceptance = GREEDY, feedback_k: int = 0,
           lazy: bool = True, layers: Layers | None = None) -> Verified:
    """One serial call: the base scores [next token] + every proposed path (a chain, or a trie of several), plus
    the proposal's scored-only paths. `feedback_k`: also the top-k ids per node, from the same logits. `lazy=False`
    projects every node (the calibration's reference cost, which `projected_rows` then corrects). `layers`: the
    drafter's declared layers at every node (`Verified.layers`)."""
    tree = build_tree(state.context[-1], proposal.paths, proposal.scored)
    past = state.cache.get_seq_length()
    out, chosen = forward(model, layers, **model_inputs(tree, past, model.device), past_key_values=state.cache,
                          use_cache=True)
    hidden = out.last_hidden_state[0]
    inner = lazy_inner(tree.parents) if lazy and getattr(acceptance, "argmax_only", False) and not feedback_k \
        and not tree.scored else None      # scored-only nodes keep the full projection
    if inner is not None:
        return Verified(tree, hidden, LazyArgmax(model.lm_head, hidden, inner), past, layers=chosen)
    logits = model.lm_head(hidden)
    topk, took = None, 0.0
    if feedback_k:
        t0 = time.perf_counter()
        topk = logits.topk(min(feedback_k, logits.shape[-1]), dim=-1).indices.cpu()
        took = time.perf_counter() - t0
    return Verified(tree, hidden, acceptance.targets(logits), past, topk, took, chosen)


LAZY_MIN_LEAVES = 8   # below this, the leaves' rows cost less than the rare second pass over the output matrix


def projected_rows(verified: "Verified") -> int:
    """Rows the verify forward sent through the output projection (the nodes, or the lazily projected ones)."""
    t = verified.targets
    return len(t.known) if isinstance(t, LazyArgmax) else len(verified.tree.tokens)


def lazy_inner(parents: list[int]) -> list[int] | None:
    """The nodes a greedy verify of a tree with these parents projects up front, or None where it projects every
    node. The output projection (V x d, a quarter of a 0.5B model's weights) dominates a wide tree's verify, and
    greedy acceptance reads the argmax only at nodes with children plus the node the walk ends on; so a tree with
    many leaves projects its inner nodes in one matmul and a leaf only if the walk ends there (one extra row, which
    re-reads the matrix, hence the threshold). Chains keep the full projection. Cost models read it too."""
    inner = inner_nodes(parents)
    return inner if not is_chain(parents) and len(parents) - len(inner) >= LAZY_MIN_LEAVES else None


class LazyArgmax(Sequence[int]):
    """The greedy targets of a verify forward, computed in one matmul for `rows` and on demand for any other node.
    The same projection and argmax as the full path, so the same tokens up to the kernel's row-blocking rounding
    (which the certificates already cover, as verify and 1-token decoding differ in the same way)."""

    def __init__(self, head, hidden: torch.Tensor, rows: list[int]):
        self.head, self.hidden, self.n = head, hidden, hidden.shape[0]
        ids = head(hidden[rows]).argmax(-1).tolist() if rows else []
        self.known = dict(zip(rows, ids))

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self.n))]
        i = i + self.n if i < 0 else i
        if not 0 <= i < self.n:
            raise IndexError(i)
        if i not in self.known:
            self.known[i] = int(self.head(self.hidden[i: i + 1]).argmax(-1))
        return self.known[i]


class TreeScorer:
    """What a verify forward would compute at every node of a tree, for replay, which has no verify logits off the
    greedy path: the base runs over the tree on a KV cache of the teacher-forced context (extended incrementally
    as the replay walks G, cropped back after each tree). Used for drafters with `feedback_k` (the top-k at every
    node) and for those with `needs_base_cache` (`base_cache`: the base's keys and values of the decided context)."""

    def __init__(self, model):
        self.model, self.cache, self.ids, self.topk_s = model, None, [], 0.0

    @torch.inference_mode()
    def base_cache(self, context: list[int]) -> DynamicCache:
        """The base's KV cache of context[:-1], extended from the last call's (what a drafter with
        `needs_base_cache` reads in replay, as the loop hands it the verified one in real decoding)."""
        need = list(context[:-1])
        if self.cache is None or need[: len(self.ids)] != self.ids:
            self.cache, self.ids = DynamicCache(), []
        if len(need) > len(self.ids):
            x = torch.tensor([need[len(self.ids):]], device=self.model.device)
            self.model.model(input_ids=x, past_key_values=self.cache, use_cache=True)
            self.ids = need
        return self.cache

    @torch.inference_mode()
    def topk(self, context: list[int], tree: Tree, k: int) -> torch.Tensor:
        """[n_nodes, k] top-k ids after each node of `tree`, whose root is context[-1] (not yet cached)."""
        self.base_cache(context)
        past = len(self.ids)
        out = self.model.model(**model_inputs(tree, past, self.model.device), past_key_values=self.cache,
                               use_cache=True)
        self.cache.crop(-len(tree.tokens))
        logits = self.model.lm_head(out.last_hidden_state[0])
        t0 = time.perf_counter()
        ids = logits.topk(min(k, logits.shape[-1]), dim=-1).indices.cpu()
        self.topk_s = time.perf_counter() - t0      # drafting in real decoding (`generate`), so in replay too
        return ids


def give_feedback(drafter: Drafter, tree: Tree, topk: torch.Tensor) -> float:
    """Hand a feedback drafter the verified tree and its top-k; the seconds its update took (its drafting, in
    `generate` and `replay` alike)."""
    t0 = time.perf_counter()
    drafter.feedback(Feedback(tree, topk))
    return time.perf_counter() - t0


def advance(state: State, v: Verified, d: Decision) -> list[int]:
    """Keep the root and the accepted nodes in the KV cache; the bonus token becomes the next decided token."""
    path = v.tree.paths[d.path][: d.accepted]
    keep = [0] + path
    compact_cache(state.cache, v.past, len(v.tree.tokens), keep)
    new = [v.tree.tokens[n] for n in path] + [d.bonus]
    state.hidden = v.hidden[keep[-1]]
    state.fresh = v.hidden[keep]
    state.fresh_layers = None if v.layers is None else v.layers[keep]
    state.context.extend(new)
    return new


def step_decision(tree: Tree, targets: list[int], proposal: Proposal, limits: Limits,
                  acceptance: Acceptance) -> Decision:
    """The rule's decision, with acceptance stopped at the first EOS (what follows it is never output).
    Real decoding and replay both call this, so they count identically."""
    d = acceptance.decide(tree, targets, proposal)
    tokens = [tree.tokens[n] for n in tree.paths[d.path][: d.accepted]]
    a = limits.stop_at_eos(tokens, d.accepted)
    if a == d.accepted:
        return d
    last = tree.paths[d.path][a - 1]
    return Decision(d.path, a, targets[last])


@torch.inference_mode()
def generate(model, drafter: Drafter | None, prompt_ids: list[int], limits: Limits,
             acceptance: Acceptance = GREEDY, on_step: OnStep | None = None,
             memo: dict | None = None, cache: CacheFactory | None = None) -> Generation:
    """Decode one prompt with one drafter. Stops at EOS (kept) or max_new_tokens, identically for every method.
    `on_step`: called once per verify step with its `StepEvent` (replay calls it at the same point).
    `memo`, `cache`: see `prefill`."""
    drafter = drafter or EmptyDrafter()
    counters = Counters()
    gen = Generation([], counters)
    clock = time.perf_counter()
    drafter.reset(list(prompt_ids))
    layers = layers_of(drafter)             # the hidden states of chosen layers, when the drafter declares them
    state = prefill(model, prompt_ids, acceptance, memo, limits.max_new_tokens, cache, layers)
    counters.serial_calls += 1
    gen.seconds["prefill"], clock = _lap(clock)
    out = [state.context[-1]]
    drafter.observe([state.context[-1]])
    sampler = getattr(acceptance, "sampler", None)     # sampling rules share their generator with the drafter
    feedback_k = int(getattr(drafter, "feedback_k", 0) or 0)
    shares_cache = bool(getattr(drafter, "needs_base_cache", False))
    while not limits.done(out):
        budget = limits.budget(out)
        ctx = DraftContext(state.context, state.hidden, budget, sampler=sampler, accepted_hidden=state.fresh,
                           base_cache=state.cache if shares_cache else None, accepted_layers=state.fresh_layers)
        proposal = drafter.propose(ctx).clip(budget)
        t_draft, clock = _lap(clock)
        verified = verify(model, state, proposal, acceptance, feedback_k, layers=layers)
        d = step_decision(verified.tree, verified.targets, proposal, limits, acceptance)
        seen = len(ctx.tokens)        # advance() appends to the list the drafter saw: the event gets what it saw
        new = advance(state, verified, d)
        out.extend(new)
        # the top-k over every node and the drafter's update from it: drafting, not verifying
        fed = verified.topk_s + give_feedback(drafter, verified.tree, verified.topk) if feedback_k else 0.0
        drafter.observe(new)
        drafted = len(proposal.paths[d.path])
        counters.record_step(drafted, d.accepted, len(verified.tree.tokens))
        gen.step_log.append((drafted, d.accepted))
        gen.verify_log.append((len(verified.tree.tokens), not verified.tree.is_chain, projected_rows(verified)))
        t_verify, clock = _lap(clock)
        gen.seconds["draft"] += t_draft + fed
        gen.seconds["verify"] += t_verify - fed
        if on_step:
            on_step(StepEvent(replace(ctx, tokens=ctx.tokens[:seen]), proposal, verified.tree, d, new, len(out),
                              t_draft + fed))
    gen.tokens = limits.truncate(out)
    counters.new_tokens = len(gen.tokens)
    return gen


def _lap(since: float) -> tuple[float, float]:
    """Stage clock. A GPU runs ahead of the host, so the stage split (drafting vs verifying ms per step) is only
    true after a synchronise; on a CPU this is a plain read of the clock."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    now = time.perf_counter()
    return now - since, now
