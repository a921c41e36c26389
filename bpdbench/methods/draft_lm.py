"""Our small neural LMs (rescorers/neural.py) as draft models, behind the causal-LM calls `sps` makes.

Why: the default 0.5B target has no smaller same-tokenizer sibling, so a draft-model method needs a draft model we
train ourselves. The rescorers' LMs are exactly that (same tokenizer, a shortlist of the target's vocabulary), so
`sps:model=neural-s` drafts with the LM `16best-neural-s` rescores with, trained once per target model.

The LM predicts only shortlist tokens: its logits are scattered into the target's vocabulary with -inf elsewhere,
so a token outside the shortlist is never drafted and has draft probability 0 (exact for speculative sampling too).
Its window is `max_len` tokens (256): when the fed context outgrows it, the cache is rebuilt from the last 3/4 of the
window, as the rescorer does, so the LM always sees positions it was trained on.
"""
from __future__ import annotations

from types import SimpleNamespace

import torch

from ..nets.small_lm import KVCache, SmallLM


class WindowCache:
    """The absolute tokens fed so far and a KV cache holding those from `start` on. `crop` takes the negative
    count of tokens to drop, as transformers' DynamicCache.crop does, so the drafter rolls back either kind alike."""

    def __init__(self, lm: SmallLM):
        self.lm = lm
        self.kv = KVCache(lm.cfg, lm.cfg.max_len, lm.out_weight.device, lm.out_weight.dtype)
        self.tokens: list[int] = []
        self.start = 0
        self.stale = False           # the cache lost a prefix the kept tokens need: rebuild on the next feed

    def get_seq_length(self) -> int:
        return len(self.tokens)

    def crop(self, n: int) -> None:
        keep = len(self.tokens) + n if n < 0 else n
        self.tokens = self.tokens[:keep]
        if keep < self.start:
            self.stale = True
        else:
            self.kv.length = keep - self.start

    def feed(self, ids: list[int]) -> torch.Tensor:
        """Final hidden states [len(ids), d] of `ids` (a vertical cascade reads them all; sps the last)."""
        n = len(ids)
        self.tokens.extend(ids)
        window = self.lm.cfg.max_len
        if self.stale or len(self.tokens) - self.start > window:
            self.start = max(0, len(self.tokens) - 3 * window // 4) if len(self.tokens) > window else 0
            self.kv.length, self.stale = 0, False
            ids = self.tokens[self.start:]
        cols = self.lm.cols(torch.tensor([ids], device=self.kv.k[0].device))
        return self.lm(cols, self.kv)[0, -n:]


class NeuralDraftLM:
    """Callable like a transformers causal LM for what the draft-model drafters use: `model(input_ids=[[...]],
    past_key_values=cache, logits_to_keep=k) -> .logits [1, k, V]` with its own cache type (`new_cache`)."""

    def __init__(self, lm: SmallLM, vocab_size: int):
        self.lm, self.vocab_size = lm, vocab_size
        self.device = lm.out_weight.device

    def new_cache(self) -> WindowCache:
        return WindowCache(self.lm)

    def __call__(self, input_ids: torch.Tensor, past_key_values: WindowCache, logits_to_keep: int = 1,
                 **_) -> SimpleNamespace:
        """`.logits` [1, logits_to_keep, V] for the last fed positions (0: all, as in transformers)."""
        h = past_key_values.feed(input_ids[0].tolist())
        h = h[-logits_to_keep:] if logits_to_keep else h
        full = torch.full((1, len(h), self.vocab_size), float("-inf"), device=self.device)
        keep = self.lm.shortlist < self.vocab_size
        full[0][:, self.lm.shortlist[keep]] = self.lm.logits(h).float()[:, keep]
        return SimpleNamespace(logits=full)
