"""Speculative decoding with a draft model (Leviathan et al. 2023; Chen et al. 2023), in our loop.

A smaller same-tokenizer causal LM drafts γ tokens autoregressively and the target verifies them in one forward.
What q is: greedy (the default), the draft model's argmax, a point mass. At T > 0 (`--temperature`), each token is
*sampled* from the draft model's own warped distribution q (the target's temperature/top-k/top-p warpers, the
example's generator) and q's full distribution is reported in `Proposal.dists`, so the speculative-sampling rule
(engine/sampling.py) applies Leviathan's min(1, p/q) test with residual resampling and the output is distributed
exactly as sampling the target alone. Unlike transformers' assisted generation (`hf-assisted`, which runs its own loop and can only be timed),
this drafter runs inside our decode loop, so it is counted step by step, replayed, and compared with every other
drafter on the same terms. The drafter keeps its own KV cache in step with what the target decided: after each
step the rejected draft suffix is cropped, and the next proposal feeds only the tokens the cache has not seen (the
bonus token, plus the last accepted draft token, which was drafted but never fed). Each proposed token carries its
draft probability q(token); greedy acceptance ignores it.

γ schedules: `fixed`, or transformers' `heuristic` (AssistedCandidateGenerator.update_candidate_strategy): after a
step that accepted the whole draft γ += 2, otherwise γ = max(1, γ - 1); the drafter learns acceptance from
`observe` (decided tokens - 1 = accepted draft tokens), so real decoding and replay adapt identically.

`stop=p` ends a draft after a token the draft itself gives probability below p (transformers' `ConfidenceCriteria`,
`assistant_confidence_threshold`, 0.4 by default in its assisted generation; SpecDec++ learns the same decision).
Why: every drafted token costs a draft forward and a verify row whether or not it is accepted, and the tokens after
a doubtful one are rarely accepted, so a longer `length` with a stop drafts long only where the draft is sure. The
stop reads only the draft's own q, so at T > 0 speculative sampling stays exact (the draft's length is a function of
its own samples).
"""
from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache

from ..engine import DraftContext, Proposal
from ..engine.cache import draft_view
from .base import Method, MethodError, MethodSpec, Param
from .contract import Input, Kind, Reads, Requirement
from .env import Env
from .search import Chain

# target -> the default same-tokenizer draft model: the 0.5B for the 1.5B (the only registered pair that shares a
# tokenizer); for the 0.5B, which has no smaller sibling, our smallest neural LM (rescorers/neural.py), trained on
# first use like the rescorers that share it
DEFAULT_DRAFT = {"qwen2.5-coder-1.5b": "qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b": "neural-s"}
NEURAL = ("neural-s", "neural-m", "neural-l")
SCHEDULES = ("fixed", "heuristic")
SINK = 4                  # a windowed draft keeps the prompt's first 4 tokens too (StreamingLLM's attention sinks)
GAMMA_AUTO = 8            # gamma=auto: one replay at 8 draft tokens; a draft model pays per drafted token
CACHES = ("own", "base")
CACHE = Param("cache", str, "own: the draft prefills and keeps a KV cache of its own; base: it drafts on "
              "the target's cache, nothing to prefill (QSpec; Draft & Verify)", choices=CACHES)
STOP = Param("stop", float, "stop drafting after a token the draft gives probability below this (transformers' "
             "assistant_confidence_threshold, 0.4 in its assisted generation; default 0: always `length` tokens)",
             low=0.0, high=1.0)
SHARPEN = Param("sharpen", float, "at T > 0 the draft samples at T x sharpen (default 1): any draft stays exact under "
                "the exact rule, and a sharpened one shows the lossy controls' error in a sampling certificate "
                "(grids/sampling.toml)", low=0.05)


def cache_inputs(method: Method) -> frozenset[Input]:
    """What a self-draft takes from the loop: the base's KV cache with `cache=base`."""
    return frozenset({Input.BASE_CACHE}) if method.get("cache", "own") == "base" else frozenset()


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class DraftModelDrafter:
    """Greedy drafts from a second causal LM that keeps its own KV cache aligned with the decided context.

    Invariant: the draft cache holds the keys/values of exactly `self.fed` (a prefix of the decided context once
    `observe` has run), so a step costs the draft model one forward over the unseen decided tokens plus one per
    further drafted token, never a re-prefill."""

    def __init__(self, name: str, model: Any, gamma: int = 4, schedule: str = "fixed", window: int = 0,
                 sharpen: float = 1.0, stop: float = 0.0):
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
        self.name, self.model, self.gamma0, self.schedule = name, model, gamma, schedule
        self.window = window             # > 0: the draft sees only the prompt's last `window` tokens (qdraft)
        self.sharpen = sharpen           # T > 0: the draft samples at T x sharpen (a certificate's control)
        self.stop = stop                 # > 0: a draft ends after a token of draft probability below it (STOP)
        self.start = 0                   # where the draft's view of the context begins
        self.gamma = gamma
        self.cache = self._new_cache()
        self.fed: list[int] = []         # tokens whose keys/values are in self.cache, in order
        self.decided: list[int] = []     # prompt + decided tokens, as observe reports them
        self.drafted: int | None = None  # length of the last proposal, None before the first

    def reset(self, prompt_ids: list[int]) -> None:
        """A new example: empty cache, γ back to its start value (the heuristic adapts per example, as HF does
        per `generate` call)."""
        self.gamma = self.gamma0
        self.cache = self._new_cache()
        self.fed, self.decided, self.drafted = [], list(prompt_ids), None
        cut = len(prompt_ids) - self.window if self.window else 0
        self.start = cut if cut > SINK else 0

    def _view(self, tokens: list[int]) -> list[int]:
        """What the draft reads of `tokens`: all of them, or with a window the prompt's first SINK tokens and then
        everything from `start` on. Why the first ones: a causal LM rests much of its attention on the sequence's
        first tokens, so a window cut off from them predicts worse than one that keeps them (StreamingLLM's attention
        sinks; here the chat template's opening)."""
        return tokens[:SINK] + tokens[self.start:] if self.start else tokens

    def _new_cache(self):
        return self.model.new_cache() if hasattr(self.model, "new_cache") else DynamicCache()

    def _crop_to(self, tokens: list[int], keep_last_unfed: bool) -> None:
        """Roll the cache back to the longest prefix of `tokens` it holds; with `keep_last_unfed`, at most
        len(tokens) - 1 so the last token is fed again and yields the next-token logits."""
        keep = _common_prefix(self.fed, tokens)
        if keep_last_unfed:
            keep = min(keep, len(tokens) - 1)
        if keep < len(self.fed):
            self.cache.crop(keep - len(self.fed))   # transformers 5: a negative count of tokens to drop
            self.fed = self.fed[:keep]

    def _forward(self, ids: list[int]) -> torch.Tensor:
        """Feed `ids` after the cached prefix; the logits [V] after the last one."""
        x = torch.tensor([ids], device=self.model.device)
        out = self.model(input_ids=x, past_key_values=self.cache, use_cache=True, logits_to_keep=1)
        self.fed.extend(ids)
        return out.logits[0, -1].float()

    @torch.inference_mode()
    def propose(self, ctx: DraftContext) -> Proposal:
        n = min(self.gamma, ctx.budget)
        if n <= 0:
            self.drafted = 0
            return Proposal()
        tokens = self._view(ctx.tokens)
        self._crop_to(tokens, keep_last_unfed=True)
        logits = self._forward(tokens[len(self.fed):])
        draft: list[int] = []
        probs: list[float] = []
        dists: list[torch.Tensor] = []
        for i in range(n):
            if ctx.sampler is None:
                p = torch.softmax(logits, dim=-1)
                t = int(torch.argmax(p))
            else:                          # T > 0: sample from the warped q and report all of q
                p = ctx.sampler.probs(logits / self.sharpen)
                t = ctx.sampler.draw(p)
                dists.append(p)
            draft.append(t)
            probs.append(float(p[t]))
            if probs[-1] < self.stop:      # the draft doubts it: the tokens after it would rarely be accepted
                break
            if i + 1 < n:                  # the last drafted token is fed next step, only if it is accepted
                logits = self._forward([t])
        self.drafted = len(draft)
        return Proposal([draft], probs=[probs], dists=[torch.stack(dists)] if dists else None)

    @torch.inference_mode()
    def chain(self, tokens: list[int], n: int) -> list[int]:
        """`n` greedy tokens after `tokens`, the cache rolled back to them first (a guess for the level above in a
        multi-level draft: methods/qdraft.py)."""
        tokens = self._view(tokens)
        self._crop_to(tokens, keep_last_unfed=True)
        logits = self._forward(tokens[len(self.fed):])
        out: list[int] = []
        for i in range(n):
            out.append(int(torch.argmax(logits)))
            if i + 1 < n:
                logits = self._forward(out[-1:])
        return out

    def observe(self, tokens: list[int]) -> None:
        """Drop the rejected draft suffix from the cache now and adapt γ to the acceptance the step shows."""
        self.decided.extend(tokens)
        self._crop_to(self._view(self.decided), keep_last_unfed=False)
        if self.drafted and self.schedule == "heuristic":
            accepted = len(tokens) - 1
            self.gamma = self.gamma + 2 if accepted >= self.drafted else max(1, self.gamma - 1)
        self.drafted = None


class BaseCacheDrafter(DraftModelDrafter):
    """A draft made of the base's own weights (quantized: qdraft; some layers skipped: layerskip) drafting on the
    base's KV cache (`cache=base`; QSpec, Zhao et al. 2024: one model at two precisions, one KV cache; Draft &
    Verify and SWIFT: the kept layers read the target's cache). Its layers keep their indices, so each reads its own
    layer's keys and values.

    Why: a copy with a cache of its own must prefill the prompt with its matrix-vector kernels, which on a long
    prompt costs more than the answer's decoding saves (Spec-Bench's tune split, Intel Xeon with AMX: `length=auto`
    drafted nothing for the GGUF copy, the prefill of its summaries and documents priced in), and it attends to its
    own rounded keys. The base's cache already holds the exact keys and values of every decided token, so the copy
    forwards only the last decided token and its own guesses, on a copy of that cache (engine.cache.draft_view:
    the base's stays as the verify left it), and needs nothing rolled back: each proposal starts from the verified
    cache."""

    needs_base_cache = True

    def reset(self, prompt_ids: list[int]) -> None:
        super().reset(prompt_ids)
        self.cache = None                # made from the base's at each proposal

    @torch.inference_mode()
    def propose(self, ctx: DraftContext) -> Proposal:
        rows = len(ctx.tokens) - 1
        if ctx.base_cache is None or ctx.base_cache.get_seq_length() < rows:
            raise RuntimeError(f"{self.name}: drafts on the base's KV cache of the decided tokens, which this caller "
                               f"did not give (DraftContext.base_cache)")
        self.cache = draft_view(ctx.base_cache, rows, max(min(self.gamma, ctx.budget), 0) + 1,
                                getattr(self.model, "dtype", None))
        self.fed = list(ctx.tokens[:-1])
        return super().propose(ctx)

    def observe(self, tokens: list[int]) -> None:
        self.decided.extend(tokens)
        self.cache, self.fed, self.drafted = None, [], None


def _draft_name(env: Env, method: Method) -> str:
    name = method.get("model") or DEFAULT_DRAFT.get(env.cfg.model)
    if not name:
        raise MethodError(f"{method.label}: no default draft model for target {env.cfg.model}; name one: "
                          f"{method.name}:model=<registered name or HF folder> (same tokenizer as the target)")
    return name


def load_draft(env: Env, method: Method) -> tuple[str, Any]:
    """(name, draft model): one of our neural LMs, the target itself (its weights shared, its cache separate), or
    another same-tokenizer model. Shared by every method that drafts with a draft model (sps, cascade)."""
    from .. import models
    name = _draft_name(env, method)
    if name in NEURAL:
        return name, _neural(env, name)
    if name == env.cfg.model:
        return name, env.model                        # own cache, shared weights: no second copy in memory
    try:
        draft_model, draft_tok = models.load(name, env.cfg.dtype, env.cfg.device)
    except (models.ModelError, ModuleNotFoundError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise MethodError(f"{method.label}: cannot load draft model {name} ({first}); "
                          f"pass {method.name}:model=<name or path>") from None
    if draft_tok.get_vocab() != env.tok.get_vocab():
        raise MethodError(f"{method.label}: draft model {name} has a different tokenizer from target "
                          f"{env.cfg.model}; a draft model needs the same vocabulary (try hf-assisted for "
                          f"different ones)")
    return name, draft_model


def build(env: Env, method: Method) -> DraftModelDrafter:
    name, draft_model = load_draft(env, method)
    gamma, schedule, stop = method.get("gamma", 4), method.get("schedule", "fixed"), method.get("stop", 0.0)
    env.resolved[method.label] = {"draft_model": name, "gamma": gamma, "schedule": schedule,
                                  **({"stop": stop} if stop else {})}
    return DraftModelDrafter(method.label, draft_model, gamma, schedule, stop=stop)


def _neural(env: Env, tag: str):
    """One of our neural LMs as the draft model, trained on first use (--no-auto-train refuses)."""
    from .. import refine
    from ..nets.small_lm import load_lm
    from ..artefacts.rescorers import ensure
    from .draft_lm import NeuralDraftLM
    ensure(refine.get_rescorer(tag), env.cfg, env.tok, env.log)
    lm = load_lm(refine.artefact_dir(tag, env.cfg.model), env.cfg.device,
                 torch.float32 if env.cfg.dtype == "float32" else env.model.dtype)
    return NeuralDraftLM(lm, env.model.lm_head.weight.shape[0])


def check_stop(method: Method, length: str) -> None:
    """`stop=` with `<length>=auto` is refused: auto prices every shorter length from one replay's acceptance per
    position, which a confidence stop leaves unmeasured past where it stopped."""
    if method.get("stop", 0.0) > 0 and method.get(length) == "auto":
        raise MethodError(f"{method.label}: {length}=auto sizes a fixed-length draft, and stop= ends drafts early; "
                          f"pass {length}=N with stop=, or drop stop=")


def _check(method: Method) -> None:
    if method.get("gamma") == "auto" and method.get("schedule") == "heuristic":
        raise MethodError(f"{method.label}: gamma=auto picks one fixed draft length for this machine; the heuristic "
                          f"schedule changes it every step: pass schedule=fixed or a start value gamma=N")
    check_stop(method, "gamma")


def _draft(method: Method, cfg) -> str | None:
    """The draft model a spelling names, or the target's default one."""
    return method.get("model") or DEFAULT_DRAFT.get(cfg.model)


# The draft model: one of our neural LMs (a rescorer artefact, trained on first use) or a registered model's cache.
READS = (Reads(Kind.RESCORER, lambda m, cfg: [d for d in [_draft(m, cfg)] if d in NEURAL]),
         Reads(Kind.MODEL, lambda m, cfg: [d for d in [_draft(m, cfg)] if d and d not in NEURAL]))


def _needs(model: str, cfg) -> list[Requirement]:
    import importlib.util
    from .. import models
    name = DEFAULT_DRAFT.get(model)
    if name in NEURAL:
        from .. import refine
        where = refine.artefact_dir(name, model)
        return [Requirement(f"draft model {name}", (where / "config.json").exists(), "rescorer", where)]
    if name is None:
        return [Requirement("a draft model (sps:model=<name or path>)", False)]
    spec = models.MODELS[name]         # its package: a prerequisite (its dense copy is a model artefact, READS)
    return [Requirement(f"draft model {name}", all(importlib.util.find_spec(m) for m in spec.modules))]


SPECS = [MethodSpec("sps", "speculative decoding with a same-tokenizer draft model drafting gamma tokens (argmax; "
                    "sampled from its own q at T > 0; Leviathan et al.), verified in our loop", build,
                    (Param("model", str, "the draft model: a registered model, an HF folder or id, or one of our neural LMs "
                           "neural-s|m|l (default: qwen2.5-coder-0.5b for the 1.5B, neural-s for the 0.5B)"),
                     Param("gamma", int, "draft length (start value under the heuristic schedule; auto: the fixed "
                           "length fastest on this machine)", low=1, auto=True),
                     Param("schedule", str, "fixed gamma, or transformers' heuristic (+2 after a fully accepted "
                           "draft, -1 otherwise)", choices=SCHEDULES), STOP),
                    _needs, check=_check, artefacts=READS,
                    shapes=Chain("gamma", longest=GAMMA_AUTO, drafts_per_token=True))]
