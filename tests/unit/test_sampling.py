"""Speculative sampling is exact: the statistical certificate on a model whose output distribution we can enumerate.

The target is a stub with the transformers interface the engine uses (`model.model(...)` with a KV cache, tree
masks and position ids; `model.lm_head`): a second-order Markov chain over a 10-token vocabulary, so the exact
distribution of the first three generated tokens (T, top-k, top-p applied by transformers' warpers) is a table of
1,000 cells. For every acceptance path (a chain of sampled drafts via the real `sps` drafter; a point-mass chain; a
tree of point-mass children with duplicates; a tree of independently sampled chains) 10,000 seeded runs of the real
`engine.loop.generate` (4 new tokens, so the first step verifies 2-token drafts and tokens 2-3 come from acceptance,
residual or bonus draws) are compared with that table by Pearson's chi-square (cells with expected count < 5
pooled; about 100 cells remain). Each exactness check has a false-alarm rate of 1e-3 (6 checks: <= 0.6% that any
fails by chance, Bonferroni; the seeds are fixed, so the outcome is deterministic). The two lossy controls (always
accept; redraw from p instead of the residual) must fail the same test at p < 1e-6 with 2,000 runs. About a minute
on one thread: a run of the loop costs ~1.5 ms here, which is what bounds the sample sizes.
"""
from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest
import torch
from transformers import DynamicCache

from bpdbench.engine import DraftContext, Limits, Proposal, SamplingParams, SpeculativeSampling, generate
from bpdbench.engine.sampling import Sampler
from bpdbench.methods.sps import DraftModelDrafter
from bpdbench.stats import goodness_of_fit, homogeneity, holm

V = 10
PROMPT = [3, 7]
N = 10_000          # runs per exactness check (AR and the top-p check: fewer, see below)
N_CONTROL = 2_000   # the lossy controls fail by orders of magnitude; fewer runs keep the module near a minute
ALPHA = 1e-3
PARAMS = SamplingParams(temperature=0.9, top_k=8)


class _Body:
    """Keys are the token ids themselves; a node's hidden state is the one-hot of its last two visible tokens."""

    def __init__(self, vocab: int):
        self.vocab = vocab

    def __call__(self, input_ids, past_key_values, use_cache=True, attention_mask=None, position_ids=None,
                 **_):
        new = input_ids[0]
        past, t = past_key_values.get_seq_length(), len(new)
        ids = new.float().view(1, 1, -1, 1)
        seq = past_key_values.update(ids, ids, 0)[0].view(-1).long()
        pos = torch.arange(len(seq))
        vis = pos[None] <= (past + torch.arange(t))[:, None] if attention_mask is None else attention_mask[0, 0]
        last = torch.where(vis, pos, -1).max(1).values
        second = torch.where(vis & (pos[None] < last[:, None]), pos, -1).max(1).values
        a = torch.where(second >= 0, seq[second.clamp_min(0)], self.vocab)
        hidden = torch.zeros(t, (self.vocab + 1) * self.vocab)
        hidden[torch.arange(t), a * self.vocab + seq[last]] = 1.0
        return SimpleNamespace(last_hidden_state=hidden[None])


class MarkovLM:
    """A second-order Markov chain behind the target interface (and the draft-model interface sps calls)."""

    def __init__(self, table: torch.Tensor):
        vocab = table.shape[-1]
        self.table = table.reshape(-1, vocab)               # [(V + 1) * V, V] logits, row a * V + b
        self.model = _Body(vocab)
        self.lm_head = torch.nn.Linear(self.table.shape[0], vocab, bias=False)
        self.lm_head.weight.data = self.table.T.contiguous()
        self.device = torch.device("cpu")

    def __call__(self, input_ids, past_key_values, use_cache=True, logits_to_keep=1):
        h = self.model(input_ids, past_key_values).last_hidden_state
        return SimpleNamespace(logits=self.lm_head(h))

    def row(self, a: int, b: int) -> torch.Tensor:
        return self.table[a * self.table.shape[-1] + b]


def _table(seed: int, scale: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(V + 1, V, V, generator=g) * scale


TARGET = MarkovLM(_table(0, 1.6))
DRAFT = MarkovLM(_table(0, 1.6) + torch.randn(V + 1, V, V, generator=torch.Generator().manual_seed(1)) * 1.2)


def exact_joint(params: SamplingParams = PARAMS) -> dict[tuple, float]:
    """P(first three tokens) under the target's warped distribution, by enumeration."""
    warp = Sampler(params, 0).probs
    out = {}
    p1 = warp(TARGET.row(*PROMPT))
    for x1 in range(V):
        p2 = warp(TARGET.row(PROMPT[-1], x1))
        for x2 in range(V):
            p3 = warp(TARGET.row(x1, x2))
            for x3 in range(V):
                out[(x1, x2, x3)] = float(p1[x1] * p2[x2] * p3[x3])
    return out


class PointChain:
    """Deterministic drafts (q = a point mass): the draft model's argmax, `gamma` tokens."""
    name = "point-chain"

    def __init__(self, gamma: int = 3):
        self.gamma = gamma

    def reset(self, prompt_ids):
        pass

    def propose(self, ctx: DraftContext) -> Proposal:
        seq = list(ctx.tokens)
        for _ in range(min(self.gamma, ctx.budget)):
            seq.append(int(DRAFT.row(seq[-2], seq[-1]).argmax()))
        return Proposal([seq[len(ctx.tokens):]])

    def observe(self, tokens):
        pass


class PointTree:
    """Deterministic tree: the draft's top-3 first tokens with their argmax continuations, plus a duplicate of
    the first child with another continuation (two children at depth 2, a repeated token at depth 1)."""
    name = "point-tree"

    def reset(self, prompt_ids):
        pass

    def propose(self, ctx: DraftContext) -> Proposal:
        a, b = ctx.tokens[-2], ctx.tokens[-1]
        top = DRAFT.row(a, b).topk(3).indices.tolist()
        paths = []
        for t in top:
            nxt = DRAFT.row(b, t).topk(2).indices.tolist()
            paths.append([t, nxt[0]])
        paths.append([top[0], DRAFT.row(b, top[0]).topk(2).indices.tolist()[1]])
        return Proposal([p[: ctx.budget] for p in paths])

    def observe(self, tokens):
        pass


class SampledTree:
    """k independent chains sampled from the draft's warped q (duplicates are kept as separate trials), each path
    reporting its full q per position: SpecInfer's multi-draft setting."""
    name = "sampled-tree"

    def __init__(self, k: int = 3, depth: int = 2):
        self.k, self.depth = k, depth

    def reset(self, prompt_ids):
        pass

    def propose(self, ctx: DraftContext) -> Proposal:
        paths, dists = [], []
        for _ in range(self.k):
            seq, qs = list(ctx.tokens), []
            for _ in range(min(self.depth, ctx.budget)):
                q = ctx.sampler.probs(DRAFT.row(seq[-2], seq[-1]))
                seq.append(ctx.sampler.draw(q))
                qs.append(q)
            paths.append(seq[len(ctx.tokens):])
            dists.append(torch.stack(qs) if qs else torch.zeros(0, V))
        return Proposal(paths, dists=dists)

    def observe(self, tokens):
        pass


DRAFTERS = {
    "ar": lambda: None,
    "sps-sampled-chain": lambda: DraftModelDrafter("sps", DRAFT, gamma=3),
    "point-chain": PointChain,
    "point-tree": PointTree,
    "sampled-tree": SampledTree,
}


def sample(drafter_name: str, n: int = N, rule: str = "exact", params: SamplingParams = PARAMS,
           seed: int = 0) -> tuple[Counter, list[float]]:
    """Counts of the first three tokens over n runs of the real loop, one generator per run (seed + index)."""
    counts: Counter = Counter()
    alphas: list[float] = []
    drafter = DRAFTERS[drafter_name]()
    for i in range(n):
        acc = SpeculativeSampling(params, seed + i, rule)
        with torch.inference_mode():
            gen = generate(TARGET, drafter, list(PROMPT), Limits(4), acc)
        counts[tuple(gen.tokens[:3])] += 1
        alphas += acc.alphas
    return counts, alphas


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def test_stub_is_a_causal_lm_with_tree_masks():
    """The stub answers a tree-masked block forward exactly as token-by-token forwards (what the engine needs)."""
    from bpdbench.engine.tree import build_tree, model_inputs
    tree = build_tree(5, [[1, 2], [3, 4], [1, 6]])
    cache = DynamicCache()
    TARGET.model(torch.tensor([PROMPT]), cache)
    out = TARGET.model(**model_inputs(tree, cache.get_seq_length(), "cpu"), past_key_values=cache)
    for node in range(len(tree.tokens)):
        chain, j = [], node
        while j >= 0:
            chain.insert(0, tree.tokens[j])
            j = tree.parents[j]
        seq = PROMPT + chain
        want = torch.zeros((V + 1) * V)
        want[seq[-2] * V + seq[-1]] = 1
        assert torch.equal(out.last_hidden_state[0, node], want)


@pytest.mark.parametrize("name", list(DRAFTERS))
def test_first_three_tokens_follow_the_target(name):
    counts, alphas = sample(name, n=N if name != "ar" else N // 4)
    fit = goodness_of_fit(counts, exact_joint())
    assert fit.cells > 30                       # enough unpooled cells for the test to have power
    assert fit.p_value > ALPHA, (name, fit)
    if name == "sps-sampled-chain":             # alpha = sum min(p, q) is a probability, measured at every trial
        assert alphas and all(0.0 < a <= 1.0 + 1e-6 for a in alphas)


def test_top_p_with_sampled_drafts():
    params = SamplingParams(temperature=1.2, top_p=0.8)
    counts, _ = sample("sps-sampled-chain", n=N // 2, params=params, seed=10**6)
    fit = goodness_of_fit(counts, exact_joint(params))
    assert fit.p_value > ALPHA, fit


@pytest.mark.parametrize("rule,name", [("always-accept", "sps-sampled-chain"), ("always-accept", "point-tree"),
                                       ("no-residual", "sps-sampled-chain"), ("no-residual", "point-chain")])
def test_lossy_controls_fail_the_same_test(rule, name):
    counts, _ = sample(name, n=N_CONTROL, rule=rule, seed=2 * 10**6)
    fit = goodness_of_fit(counts, exact_joint())
    assert fit.p_value < 1e-6, (rule, name, fit)


def test_sampling_is_reproducible_and_seeded_per_example():
    def run(seed):
        acc = SpeculativeSampling(PARAMS, seed)
        return generate(TARGET, PointTree(), list(PROMPT), Limits(12), acc).tokens
    assert run(5) == run(5)
    assert len({tuple(run(s)) for s in range(20)}) > 10


def test_greedy_rule_is_untouched_by_sampling_options():
    with pytest.raises(ValueError, match="temperature > 0"):
        SpeculativeSampling(SamplingParams(temperature=0.0), 0)
    greedy = generate(TARGET, PointChain(), list(PROMPT), Limits(8)).tokens
    seq = list(PROMPT)
    for _ in range(8):
        seq.append(int(TARGET.row(seq[-2], seq[-1]).argmax()))
    assert greedy == seq[len(PROMPT):]


def test_stats_helpers():
    g = torch.Generator().manual_seed(0)
    a = torch.multinomial(torch.tensor([0.5, 0.3, 0.2]), 4000, True, generator=g).tolist()
    b = torch.multinomial(torch.tensor([0.5, 0.3, 0.2]), 4000, True, generator=g).tolist()
    c = torch.multinomial(torch.tensor([0.4, 0.4, 0.2]), 4000, True, generator=g).tolist()
    assert homogeneity(a, b).p_value > 0.01
    assert homogeneity(a, c).p_value < 1e-6
    assert goodness_of_fit(Counter(a), {0: 0.5, 1: 0.3, 2: 0.2}).p_value > 0.01
    assert goodness_of_fit(Counter({9: 1}), {0: 1.0}).p_value == 0.0
    assert holm([0.001, 0.04, 0.5], 0.05) == [True, False, False]
    assert holm([0.001, 0.02, 0.5], 0.05) == [True, True, False]
    assert all(0.0 < x < 1.0 for x in [goodness_of_fit(Counter(a), {0: 0.5, 1: 0.3, 2: 0.2}).p_value])


def test_alpha_law_bookkeeping_on_the_stub():
    """alpha-law's per-step log: E[sum min(p, q)] (alpha_beta) and accepted / tried (alpha_trial) estimate one
    probability, and the truncated estimate for gamma = 2 from gamma = 4 runs matches real gamma = 2 runs."""
    from bpdbench.experiments.alpha_law import StepLog, table

    def steps(gamma: int, seed: int) -> list:
        drafter, logged = DraftModelDrafter("sps", DRAFT, gamma=gamma), StepLog()
        for i in range(250):
            logged.attach(SpeculativeSampling(PARAMS, seed + i))
            generate(TARGET, drafter, list(PROMPT), Limits(24), logged.acceptance, on_step=logged)
        return logged.steps

    four, two = table(steps(4, 0), 1.0, 4), table(steps(2, 10**5), 1.0, 2)
    assert four.n_steps.iloc[0] > 1000 and 0.2 < four.alpha_trial.iloc[0] < 0.9
    assert four.alpha_beta.iloc[0] == pytest.approx(four.alpha_trial.iloc[0], abs=0.03)
    truncated = four.set_index("gamma").measured_tokens_per_call[2]
    assert truncated == pytest.approx(two.set_index("gamma").measured_tokens_per_call[2], abs=0.08)
