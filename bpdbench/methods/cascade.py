"""Cascade Speculative Drafting (Chen et al. 2023, github lfsszd/CS-Drafting), exact greedy, in our loop.

What the published code does (`csd.py` `_csd_iteration`, `mag.py`, `model.py`): drafters are ordered from the
target down; level i drafts until `sum(k_matrix[0][:i+1])` tokens exist, having the levels below draft for it and
verifying their drafts itself (vertical cascade: each drafter's autoregressive drafting is sped up by the level
below), and later positions go to smaller drafters (horizontal cascade: later tokens are accepted less often, so
a cheaper drafter is good enough there). The bottom level is MaG, model-free: the longest n-gram match in the prompt,
then in the generated text, then a greedy bigram table (`bigram_models/*.json`), always 10 tokens. `review` accepts
a non-argmax token when p_target > p_draft / leniency; the published README's configurations use leniency 2-5, so the
published numbers are not greedy-exact. Costs are counted as forwards x a per-model constant, not timed.

What bpdbench does:
- Exact greedy acceptance only, at every level: the target keeps only tokens equal to its argmax, and a draft
  model keeps only MaG tokens equal to its own argmax, so the vertical cascade drafts exactly what the draft
  model alone would (it only needs fewer of its forwards). No leniency variant.
- Two levels above MaG, from what we have: `top=bpd` (the heads' top-1 block, from the hidden state the last
  verify forward already computed: no extra model call) or `top=sps` (a draft model with its own KV cache, as in
  methods/sps.py: one of our neural LMs or a same-tokenizer HF model), or `top=none` (MaG alone).
- Shape: the top drafts the first `split` positions, MaG continues after the top's tokens up to `length`
  (horizontal); with `vertical=1` MaG also drafts for the draft model, which verifies MaG's guess in one forward of
  its own and keeps the longest prefix equal to its argmax plus its own next token (vertical).
- MaG: one pass over prompt + decided tokens (an incremental n-gram index), the longest match up to `ngram`
  tokens, earliest occurrence (so the prompt before the generated text, as mag.py searches the prompt first),
  continued past the end LZ77-style; only when nothing matches, the bigram chain (`bottom=lookup`: no bigram).
  The bigram table is the corpus's most frequent successor per token (or the model history's, `bigram=history`).
- `tree=1` (the default when both levels are on): MaG's own draft from the first position is verified beside the
  cascade's path, in the same trie. Why: with our quick heads, a fixed split hurts whenever the context holds
  the continuation (the heads' first tokens break MaG's copy): on 15 Spec-Bench examples (bf16, 64 tokens,
  replayed) heads 2 + MaG gave block efficiency 1.32 and MaG alone 1.85, both paths together 2.30, at ~16
  verified tokens a step, which on this CPU costs about what 8 do.
- The draft stops after an EOS (nothing after it can be kept).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

import torch

from ..engine import DraftContext, Proposal
from .base import THRESHOLD, Method, MethodError, MethodSpec, Param
from .compose import HIDDEN, Wrapper
from .contract import RUN_HEADS, Input, Kind, Reads, Requirement
from .env import Env
from .lattice import HeadsSource, LatticeDrafter
from .lookup import MaG, ContextIndex, cut_after_eos
from .search import Chain
from .sps import DraftModelDrafter

TOPS = ("bpd", "sps", "none")
AUTO_LENGTH = 16          # length=auto chooses among split..16 (the spec's shapes, below)
BOTTOMS = ("mag", "lookup", "none")


class AssistedDraftModel(DraftModelDrafter):
    """A draft model drafting greedily, each of its forwards checking a guess from the level below.

    With `guess` None it is plain sps drafting. Otherwise, per forward: feed the unseen decided tokens plus the
    guess, keep the guess's longest prefix equal to the draft model's argmax and the draft model's next token,
    crop the rejected guess from its cache. The draft is token for token what the draft model alone drafts."""

    def __init__(self, name: str, model: Any, gamma: int, guess: Callable[[list[int], int], list[int]] | None,
                 window: int = 0):
        super().__init__(name, model, gamma, "fixed", window)
        self.guess = guess
        self.forwards = 0                 # draft-model forwards, for the vertical cascade's bookkeeping

    def _forward_last(self, ids: list[int], keep: int) -> torch.Tensor:
        """Feed `ids` after the cached prefix; the logits [keep, V] after each of the last `keep` of them."""
        x = torch.tensor([ids], device=self.model.device)
        out = self.model(input_ids=x, past_key_values=self.cache, use_cache=True, logits_to_keep=keep)
        self.fed.extend(ids)
        self.forwards += 1
        return out.logits[0, -keep:].float()

    @torch.inference_mode()
    def draft(self, ctx: DraftContext, n: int) -> list[int]:
        if n <= 0:
            return []
        tokens = self._view(ctx.tokens)
        self._crop_to(tokens, keep_last_unfed=True)
        pending = tokens[len(self.fed):]
        out: list[int] = []
        while len(out) < n:
            g = self.guess(out, n - len(out) - 1) if self.guess is not None else []
            g = g[: n - len(out) - 1]
            preds = self._forward_last(pending + g, len(g) + 1).argmax(-1).tolist()
            a = 0
            while a < len(g) and g[a] == preds[a]:
                a += 1
            if a < len(g):                  # the rejected guess leaves the draft cache
                self.cache.crop(a - len(g))
                self.fed = self.fed[: len(self.fed) - (len(g) - a)]
            out += g[:a] + [preds[a]]
            pending = [preds[a]]            # drafted, not fed: fed next forward, or next step if accepted
        return out


class CascadeDrafter(Wrapper):
    """`tree`: verify the bottom level's own draft (from the first position) beside the cascade's, as a second
    path of one trie: the top level's guess at the first positions and MaG's copy are both tried. The top level is
    a drafter of its own, wrapped (methods/compose.py) so reset and observe reach it; it is asked every step that
    drafts, with that step's context, so it misses no hidden state."""

    def __init__(self, name: str, top: LatticeDrafter | AssistedDraftModel | None, split: int, length: int,
                 mag: MaG | None, eos: frozenset[int] = frozenset(), tree: bool = False):
        super().__init__()
        self.name, self.top, self.split, self.length, self.mag, self.eos = name, top, split, length, mag, eos
        self.tree = tree
        self.index = ContextIndex(mag.ngram if mag is not None else 1)

    def inner_drafters(self) -> list:
        return [] if self.top is None else [self.top]

    def reset(self, prompt_ids: list[int]) -> None:
        self.index.reset(prompt_ids)
        super().reset(prompt_ids)

    def propose(self, ctx: DraftContext) -> Proposal:
        self.index.sync(ctx.tokens)
        length = min(self.length, ctx.budget)
        if length <= 0:
            return Proposal()
        head = self._top(ctx, min(self.split, length))
        draft = cut_after_eos(head, self.eos)
        if self.mag is not None and len(draft) == len(head):
            draft = cut_after_eos(head + self.mag.draft(self.index, head, length - len(head)), self.eos)
        paths = [draft] if draft else []
        if self.tree and self.mag is not None and head:
            alone = self.mag.draft(self.index, [], length)
            if alone and alone[: len(draft)] != draft:
                paths.append(alone)
        return Proposal(paths) if paths else Proposal()

    def _top(self, ctx: DraftContext, n: int) -> list[int]:
        if self.top is None or n <= 0:
            return []
        if isinstance(self.top, LatticeDrafter):
            lat = self.top.lattice(ctx)
            return [] if lat is None else lat.ids[:n, 0].tolist()
        return self.top.draft(ctx, n)


def _shape(method: Method) -> tuple[str, int, int, str, int]:
    """(top, split, length, bottom, vertical) with defaults filled in."""
    top, bottom = method.get("top", "bpd"), method.get("bottom", "mag")
    split = method.get("split", 0 if top == "none" else 2 if top == "bpd" else 4)
    return top, split, method.get("length", 8 if bottom != "none" else split), bottom, method.get("vertical", 0)


def _check(method: Method) -> None:
    """Shapes that cannot work, refused when the spelling is parsed (before any model loads)."""
    top, split, length, bottom, vertical = _shape(method)
    length = AUTO_LENGTH if length == "auto" else length
    label, given = method.label, set(method.params)
    if top == "none" and "split" in given:
        raise MethodError(f"{label}: split= needs a top level (top=bpd or top=sps); top=none drafts with MaG only")
    if top == "none" and bottom == "none":
        raise MethodError(f"{label}: top=none and bottom=none draft nothing; pass top=bpd|sps or bottom=mag|lookup")
    if top != "none" and split < 1:
        raise MethodError(f"{label}: split=0 leaves top={top} nothing to draft; pass split>=1 or top=none")
    if split > length:
        raise MethodError(f"{label}: split={split} exceeds length={length} (the draft's total length)")
    if vertical and (top != "sps" or bottom == "none"):
        raise MethodError(f"{label}: vertical=1 needs top=sps and a bottom level (the bottom drafts for the draft "
                          f"model)")
    if top != "sps" and "model" in given:
        raise MethodError(f"{label}: model= names the draft model of top=sps")
    if top != "bpd" and "threshold" in given:
        raise MethodError(f"{label}: threshold= belongs to top=bpd")
    if bottom == "none" and {"ngram", "bigram"} & given:
        raise MethodError(f"{label}: ngram= and bigram= belong to the MaG bottom level (bottom=mag|lookup)")
    if method.get("tree") and (top == "none" or bottom == "none"):
        raise MethodError(f"{label}: tree=1 verifies the bottom level's draft beside the top's: it needs both")
    if bottom == "lookup" and "bigram" in given:
        raise MethodError(f"{label}: bigram= needs bottom=mag (bottom=lookup drafts without the bigram table)")


def build(env: Env, method: Method) -> CascadeDrafter:
    from ..artefacts import tables
    _check(method)
    top, split, length, bottom, vertical = _shape(method)
    ngram, source = method.get("ngram", 4), method.get("bigram", "corpus")
    label = method.label
    resolved: dict[str, Any] = {"top": top, "split": split, "length": length, "bottom": bottom, "vertical": vertical}
    mag = None
    if bottom != "none":
        table = None
        if bottom == "mag":
            try:
                table, resolved["bigram"] = tables.bigram(env, source)
            except FileNotFoundError as e:
                raise MethodError(f"{label}: {e}") from None
        mag = MaG(ngram, table, env.limits.eos_ids)
        resolved["ngram"] = ngram
    tree = bool(method.get("tree", int(top != "none" and bottom != "none")))
    resolved.update(tree=int(tree), width=length * (1 + tree))   # most draft tokens verified in a step
    drafter = CascadeDrafter(label, None, split, length, mag, env.limits.eos_ids, tree)
    if top == "bpd":
        heads, _ = env.heads(split)
        if split > heads.num_heads:
            raise MethodError(f"{label}: split={split} but the heads have only {heads.num_heads}")
        threshold = method.get("threshold", 0.0)
        drafter.top = LatticeDrafter(label, HeadsSource(heads, env.model.lm_head), split, 1, threshold)
        resolved.update(n_heads=split, threshold=threshold)
    elif top == "sps":
        from .sps import load_draft
        name, model = load_draft(env, method)
        guess = None
        if vertical:
            guess = lambda out, k: mag.draft(drafter.index, out, k)   # noqa: E731
        drafter.top = AssistedDraftModel(label, model, split, guess)
        resolved["draft_model"] = name
    env.resolved[label] = resolved
    return drafter


def _needs(model: str, cfg) -> list[Requirement]:
    from .heads import _needs_heads
    from ..artefacts.tables import needs
    return _needs_heads(model, cfg) + needs(model, ("bigram",))


def _bigram(method: Method, cfg) -> list[str]:
    """MaG's bigram table (built by cascade's first use)."""
    from ..artefacts.tables import needs
    return [r.what for r in needs(cfg.model, ("bigram",))]


def _inputs(method: Method) -> frozenset[Input]:
    """Only the heads' top level reads hidden states (a draft model keeps its own cache, MaG reads tokens)."""
    return frozenset({HIDDEN}) if _shape(method)[0] == "bpd" else frozenset()


SPECS = [MethodSpec("cascade", "cascade drafting (CS-Drafting), exact: a top drafter (heads or a draft model) for "
                    "the first positions, MaG lookup (n-gram match, then a bigram chain) for the rest; vertical=1 "
                    "lets MaG draft for the draft model", build,
                    (Param("top", str, "the top level: bpd (the heads' top-1 block, split heads), sps (a draft "
                           "model), none (MaG only)",
                           choices=TOPS),
                     Param("split", int, "draft positions from the top level (default: bpd 2, sps 4)", low=0),
                     Param("length", int, "total draft length (the bottom level drafts the rest; auto: the length "
                           "fastest on this machine, at least split)", low=1, auto=True),
                     Param("bottom", str, "the bottom level: mag (n-gram match, then bigram), lookup (match only), "
                           "none", choices=BOTTOMS),
                     Param("vertical", int, "1: the bottom level drafts for the draft model (top=sps)", low=0, high=2),
                     Param("tree", int, "1 (default with two levels): also verify the bottom level's own draft "
                           "from the first position (two paths, one trie); 0: the cascade's path alone", low=0, high=2),
                     Param("model", str, "the draft model of top=sps (as sps:model=)"),
                     replace(THRESHOLD, flag=None, help="top=bpd: verify the heads' draft only while their top-1 "
                             "probability is >= this (default 0: the whole split)"),
                     Param("ngram", int, "MaG's longest n-gram", low=1),
                     Param("bigram", str, "where MaG's bigram table comes from", choices=("corpus", "history"))),
                    _needs, check=_check, inputs=_inputs,
                    artefacts=(RUN_HEADS, Reads(Kind.BUILT, _bigram)),     # the default spelling's: top=bpd
                    # length=auto: one replay at AUTO_LENGTH, every length from the split up a truncation of it
                    shapes=Chain("length", longest=AUTO_LENGTH, shortest=lambda m: max(_shape(m)[1], 1)))]
