"""Speculative sampling: the acceptance rule that keeps the target's *sampling* distribution exactly (T > 0).

p is what transformers' `generate(do_sample=True)` samples from: the target's logits (cast to float32) through its
own `TemperatureLogitsWarper`, `TopKLogitsWarper` and `TopPLogitsWarper`, in that order. An option left unset is
off; the model's generation_config (which may carry its own top_k/top_p) is not inherited. Every random draw comes
from one explicit `torch.Generator` per example (seed + example index), never from global RNG state, so a sampled
run is reproducible and two methods can be given distinct, known seeds.

The rule (Leviathan et al. 2023; Chen et al. 2023; for several candidates SpecInfer's multi-step speculative
sampling, as EAGLE's `evaluate_posterior` does for trees): at the current node the residual r starts as p; the
candidates (the next token of every proposal path still alive, in proposal order) are tried in turn. Candidate x
with draft distribution q is accepted with probability min(1, r(x) / q(x)); on rejection r <- norm(max(0, r - q)).
A point-mass draft (q = delta_x: every deterministic drafter) is the special case "accept x with probability r(x),
else remove x from r and renormalise". When a candidate is accepted the walk descends to it with a fresh r = p at
the child; when none is, the bonus token is drawn from r and the step ends (after a fully accepted path, r = p at
the leaf: the bonus token). Each trial is a Leviathan step against the current residual with a proposal drawn
independently of the earlier trials, so the token emitted at every node is distributed exactly as p.

Duplicates matter for sampled candidates: two paths that drew the same token at a node are two trials (the second
always rejects, since r(x) = 0 after the first rejection, but its residual update is part of the exact rule), which
is why candidates are read from the paths, not from the merged trie's children. For point masses a duplicate is a
no-op, which is what EAGLE's de-duplication assumes.

Two deliberately wrong variants exist to show the statistical tests have power; they are named lossy and are never
selected by default: `always-accept` keeps the first path whole, `no-residual` redraws from p instead of r.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from .acceptance import Decision
from .tree import Tree
from .types import Proposal

EXACT = "exact"
LOSSY = ("always-accept", "no-residual")   # controls for the statistical tests, never a default
RULES = (EXACT,) + LOSSY


@dataclass(frozen=True)
class SamplingParams:
    """generate's meaning: temperature 0 (or None) is greedy; top_k 0/None and top_p 1/None are off."""
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return not self.temperature

    def warpers(self) -> list:
        out = []
        if self.temperature is not None and self.temperature != 1.0:
            out.append(TemperatureLogitsWarper(float(self.temperature)))
        if self.top_k:
            out.append(TopKLogitsWarper(top_k=int(self.top_k)))
        if self.top_p is not None and self.top_p < 1.0:
            out.append(TopPLogitsWarper(top_p=float(self.top_p)))
        return out

    def label(self) -> str:
        """`T0.7`, `T1-p0.9-k50`: how run folders and tables name a sampling setting."""
        parts = [f"T{self.temperature:g}"]
        if self.top_p is not None and self.top_p < 1.0:
            parts.append(f"p{self.top_p:g}")
        if self.top_k:
            parts.append(f"k{self.top_k}")
        return "-".join(parts)

    def check(self) -> None:
        """One-line errors for values generate would also refuse."""
        t = self.temperature
        if t is not None and (not math.isfinite(t) or t < 0):
            raise ValueError(f"--temperature must be a finite number >= 0 (0: greedy), got {t}")
        if self.top_p is not None and not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"--top-p must be in (0, 1], got {self.top_p}")
        if self.top_k is not None and self.top_k < 0:
            raise ValueError(f"--top-k must be >= 0 (0: off), got {self.top_k}")
        if self.seed is not None and self.seed < 0:
            raise ValueError(f"--seed must be >= 0, got {self.seed}")
        if self.greedy and (self.top_p not in (None, 1.0) or self.top_k):
            raise ValueError("--top-p/--top-k need --temperature > 0 (temperature 0 is greedy decoding)")


class Sampler:
    """Warped probabilities and draws from one explicit generator: what the rule and sampling drafters share."""

    def __init__(self, params: SamplingParams, seed: int):
        self.params = params
        self.warpers = params.warpers()
        self.generator = torch.Generator(device="cpu").manual_seed(int(seed))

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """[n, V] or [V] logits -> warped probabilities, float32 on the CPU (where the generator lives)."""
        scores = logits.detach().float().cpu()
        squeeze = scores.dim() == 1
        scores = scores[None] if squeeze else scores
        for w in self.warpers:
            scores = w(None, scores)
        p = torch.softmax(scores, dim=-1)
        return p[0] if squeeze else p

    def draw(self, p: torch.Tensor) -> int:
        return int(torch.multinomial(p, 1, generator=self.generator))

    def uniform(self) -> float:
        return float(torch.rand((), generator=self.generator))


class NodeTargets:
    """What the sampling rule compares candidates with: p at each tree node, warped lazily (only the nodes the
    walk visits, usually a few of a 64-node tree, pay for the top-p sort over the vocabulary)."""

    def __init__(self, logits: torch.Tensor, sampler: Sampler):
        self.logits, self.sampler, self._p = logits, sampler, {}

    def __len__(self) -> int:
        return self.logits.shape[0]

    def p(self, node: int) -> torch.Tensor:
        if node not in self._p:
            self._p[node] = self.sampler.probs(self.logits[node])
        return self._p[node]

    def __getitem__(self, node: int) -> int:
        """A deterministic token after `node`; the loop asks for one only after an accepted EOS, where the output
        is cut anyway (so it is never emitted and must not consume a random draw)."""
        return int(self.logits[node].argmax())


class SpeculativeSampling:
    """The acceptance rule for T > 0 (see the module docstring). One instance per example: it owns the example's
    generator, and `alphas` collects sum(min(p, q)) at every node where a full draft distribution q was tried
    first (Leviathan et al.'s per-position acceptance probability, for the acceptance-law experiment)."""

    lossless_is_exact = False
    argmax_only = False       # its targets are distributions over every visited node

    def __init__(self, params: SamplingParams, seed: int, rule: str = EXACT):
        if params.greedy:
            raise ValueError("speculative sampling needs a temperature > 0 (greedy uses GreedyAcceptance)")
        if rule not in RULES:
            raise ValueError(f"unknown acceptance rule {rule!r}; valid: {', '.join(RULES)}")
        self.params, self.rule = params, rule
        self.name = "speculative-sampling" if rule == EXACT else f"lossy-{rule}"
        self.sampler = Sampler(params, seed)
        self.alphas: list[float] = []

    def targets(self, logits: torch.Tensor) -> NodeTargets:
        return NodeTargets(logits, self.sampler)

    def first(self, logits: torch.Tensor) -> int:
        """The prefill's token: a plain draw from p (nothing was drafted for it)."""
        return self.sampler.draw(self.sampler.probs(logits[-1]))

    def decide(self, tree: Tree, targets: NodeTargets, proposal: Proposal) -> Decision:
        if self.rule == "always-accept":
            path = tree.paths[0]
            return Decision(0, len(path), self.sampler.draw(targets.p(path[-1] if path else 0)))
        alive, depth, node = list(range(len(tree.paths))), 0, 0
        while True:
            p = targets.p(node)
            r, chosen, first = p, None, True
            for j in alive:
                if len(tree.paths[j]) <= depth:
                    continue
                child = tree.paths[j][depth]
                x = tree.tokens[child]
                q = _draft_dist(proposal, j, depth, p.shape[0])
                if q is not None and first:
                    self.alphas.append(float(torch.minimum(p, q).sum()))
                first = False
                accept = float(r[x]) if q is None else min(1.0, float(r[x]) / max(float(q[x]), 1e-30))
                if self.sampler.uniform() < accept:
                    chosen = child
                    break
                r = p if self.rule == "no-residual" else _residual(r, x, q)
            if chosen is None:            # every alive path holds the accepted nodes; the first is reported
                return Decision(alive[0], depth, self.sampler.draw(r))
            alive = [j for j in alive if len(tree.paths[j]) > depth and tree.paths[j][depth] == chosen]
            node, depth = chosen, depth + 1


def _draft_dist(proposal: Proposal, path: int, depth: int, vocab: int) -> torch.Tensor | None:
    """q for the token of `path` at `depth`: its full draft distribution when the drafter sampled it, else None
    (a point mass: the drafter chose the token deterministically, so q = delta_token whatever `probs` says). A draft
    vocabulary of another size is cut or zero-padded to the target's (p is 0 past its own vocabulary)."""
    if proposal.dists is None or path >= len(proposal.dists) or proposal.dists[path] is None:
        return None
    d = proposal.dists[path]
    if depth >= len(d):
        return None
    q = d[depth].float().cpu()
    if q.shape[0] != vocab:
        q = torch.nn.functional.pad(q[:vocab], (0, max(0, vocab - q.shape[0])))
    return q


def _residual(r: torch.Tensor, x: int, q: torch.Tensor | None) -> torch.Tensor:
    """norm(max(0, r - q)); for a point mass: r with x removed. A residual that vanishes numerically (r and q
    equal to rounding; in exact arithmetic a rejection implies r(x) < q(x), so it cannot) keeps r."""
    if q is None:
        out = r.clone()
        out[x] = 0.0
    else:
        out = (r - q).clamp_min(0.0)
    total = float(out.sum())
    return out / total if total > 0 else r
