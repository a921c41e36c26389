"""One of our small neural LMs (rescorers/neural.py) as an `sps` draft model: `sps:model=neural-s|m|l`.

Why: the default target (Qwen2.5-Coder-0.5B) is the smallest model of its tokenizer family, so a same-tokenizer
draft model for speculative decoding has to be one we train. The small LM predicts only the heads' shortlist (~32k
of 152k ids) and attends to a 256-token window; this adapter gives it the two things `DraftModelDrafter` uses from a
transformers causal LM: `model(input_ids=, past_key_values=, use_cache=, logits_to_keep=1).logits` over the
*target's* vocabulary (ids outside the shortlist get -inf, so q is 0 there) and a cache with `crop` and
`get_seq_length`. When the window would overflow, the cache is re-encoded from the last 3/4 of the window starting at
position 0, as the rescorer does, so decoding sees training-like positions.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


class WindowCache:
    """The small LM's preallocated KV cache plus the token history, so a crop behind the window can re-encode.
    `get_seq_length` counts every token fed (what DraftModelDrafter's invariant is about), not the window."""

    def __init__(self, lm):
        from rescorers.neural import KVCache
        p = next(lm.parameters())
        self.lm, self.kv = lm, KVCache(lm.cfg, lm.cfg.max_len, p.device, p.dtype)
        self.history: list[int] = []       # every token fed, in order
        self.window = 0                    # history[start:] is in the cache, start = len(history) - window

    def get_seq_length(self) -> int:
        return len(self.history)

    def crop(self, n: int) -> None:
        """transformers 5's convention: a negative n drops that many tokens from the end."""
        drop = -n if n < 0 else len(self.history) - n
        self.history = self.history[: len(self.history) - drop]
        if drop <= self.window:
            self.window -= drop
            self.kv.length = self.window
        else:                              # rolled back past the window's start: rebuild from the history
            self.window, self.kv.length = 0, 0
            if self.history:
                self._encode(self.history[-self.lm.cfg.max_len * 3 // 4:])

    def _encode(self, ids: list[int]) -> torch.Tensor:
        x = self.lm.cols(torch.tensor(ids, device=self.kv.k[0].device)).view(1, -1)
        hidden = self.lm(x, self.kv)[0, -1]
        self.window += len(ids)
        return hidden

    def feed(self, ids: list[int]) -> torch.Tensor:
        """Append `ids`; the final hidden state after the last one."""
        self.history.extend(ids)
        if self.kv.length + len(ids) > self.lm.cfg.max_len:
            self.window, self.kv.length = 0, 0
            return self._encode(self.history[-self.lm.cfg.max_len * 3 // 4:])
        return self._encode(ids)


@dataclass
class _Out:
    logits: torch.Tensor


class SmallLMDraft:
    """A SmallLM behind the slice of the causal-LM interface DraftModelDrafter calls."""

    def __init__(self, lm: Any, vocab_size: int):
        self.lm, self.vocab = lm, vocab_size
        self.device = next(lm.parameters()).device
        self.ids = lm.shortlist.to(self.device)

    def new_cache(self) -> WindowCache:
        return WindowCache(self.lm)

    def __call__(self, input_ids: torch.Tensor, past_key_values: WindowCache, use_cache: bool = True,
                 logits_to_keep: int = 1) -> _Out:
        hidden = past_key_values.feed(input_ids[0].tolist())
        small = (hidden @ self.lm.out_weight.T).float()
        full = torch.full((self.vocab,), float("-inf"), device=small.device)
        full[self.ids] = small
        return _Out(full.view(1, 1, -1))


def load(size: str, env) -> SmallLMDraft:
    """The trained neural-{size} LM for the run's target (trained on first use, said before it starts, as the
    rescorer methods do; --no-auto-train refuses), in the run's dtype."""
    import rescorers
    from rescorers.neural import load_lm
    from .artefacts import ensure
    spec = rescorers.get_rescorer(f"neural-{size}")
    ensure(spec, env.cfg, env.tok, env.log)
    dtype = getattr(torch, env.cfg.dtype)
    lm = load_lm(rescorers.artefact_dir(spec, env.cfg.model), str(env.model.device), dtype)
    return SmallLMDraft(lm, env.model.lm_head.out_features)
