"""Local neural rescoring (the paper's "neural BPD"): a small LM re-ranks the lattice left to right.

The network and its sizes are in `nets/small_lm.py`. Decode never normalises: the greedy choice at position i is
argmax_j head_lp[i, j] + alpha * log P_LM(c_j | .), and log Z is the same for all k candidates, so only the k
candidate logits are computed (k x d MACs instead of S x d).
"""
from __future__ import annotations

from pathlib import Path

import torch

from ..nets.small_lm import KVCache, SmallLM, load_lm
from .base import Lattice

class _SmallState:
    """Decode state of a SmallLM: inputs are shortlist columns, the cache is preallocated to the window."""

    def __init__(self, lm: SmallLM, device: torch.device, dtype: torch.dtype):
        self.lm = lm
        self.cache = KVCache(lm.cfg, lm.cfg.max_len, device, dtype)

    def length(self) -> int:
        return self.cache.length

    def truncate(self, n: int) -> None:
        self.cache.length = n

    def inputs(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm.cols(ids)

    def feed(self, inp: torch.Tensor) -> torch.Tensor:
        return self.lm(inp.view(1, -1), self.cache)[0]

    def out_rows(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        S = self.lm.cfg.shortlist_size
        cols = self.lm.cols(ids)
        return self.lm.out_weight[cols.clamp(max=S - 1)], cols < S


class _HFState:
    """Decode state of a Hugging Face causal LM over the target's own vocabulary (e.g. a smaller sibling model)."""

    def __init__(self, model, device: torch.device, dtype: torch.dtype):
        self.body, self.cache = model.base_model, None
        self.w = model.get_output_embeddings().weight
        self.vocab = self.w.shape[0]

    def length(self) -> int:
        return 0 if self.cache is None else self.cache.get_seq_length()

    def truncate(self, n: int) -> None:
        if n == 0:
            self.cache = None
        elif self.cache is not None and self.length() > n:
            self.cache.crop(n - self.length())  # transformers 5: a negative count removes that many tokens

    def inputs(self, ids: torch.Tensor) -> torch.Tensor:
        return ids.clamp(0, self.vocab - 1)

    def feed(self, inp: torch.Tensor) -> torch.Tensor:
        out = self.body(input_ids=inp.view(1, -1), past_key_values=self.cache, use_cache=True)
        self.cache = out.past_key_values
        return out.last_hidden_state[0]

    def out_rows(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.w[ids.clamp(0, self.vocab - 1)], ids < self.vocab


class NeuralRescorer:
    """Local rescoring, p = 1: greedy over draft positions with a KV cache carried across decoding steps.

    Per `refine`: one forward of the context tokens new since the last call (usually accepted + bonus, 1-9 tokens)
    together with the heads' top-1 path (speculating the LM keeps it), then one more forward from each position
    where the LM picks another candidate; the draft is then rolled back. At most h forwards, 1 when nothing changes;
    the choices are those of the one-token-at-a-time greedy loop (causal attention; batched and single-token kernels
    may round differently, which can only matter at exact near-ties).
    `lm` is a SmallLM directory or instance, or a Hugging Face causal LM sharing the target's tokenizer (kept in
    its own dtype; the window bound applies to it as well).
    """

    p = 1

    def __init__(self, name: str, lm, alpha: float, k: int = 16, device: str = "cpu",
                 dtype: torch.dtype | str = torch.float32, max_len: int = 256):
        """Thread counts are the session's (--threads), never changed here: a rescorer that switched torch's
        global setting inside `refine` would silently change the base model's speed too."""
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype)
        self.name, self.alpha, self.k = name, float(alpha), int(k)
        if isinstance(lm, (str, Path)):
            lm = load_lm(lm, device, dtype)
        if isinstance(lm, SmallLM):
            self.lm, self.max_len = lm.to(device=device, dtype=dtype).eval().requires_grad_(False), lm.cfg.max_len
            self._make = lambda: _SmallState(self.lm, self.device, dtype)
        else:
            self.lm, self.max_len = lm.eval().requires_grad_(False), max_len
            self._make = lambda: _HFState(self.lm, self.device, dtype)
        self.keep = self.max_len * 3 // 4
        self.device = torch.device(device)
        self.forwards = 0    # LM forward calls since construction: 1 per refine while the LM keeps the heads' top-1
        self.ctx_tokens = 0  # context tokens encoded (tests check that the cached prefix is reused)
        self.reset([])

    def reset(self, prompt_ids: list[int]) -> None:
        self.state = self._make()
        self._ctx: list[int] = []      # the full context the cache state corresponds to
        self._window: list[int] = []   # the context tokens actually held in the cache
        self._hidden: torch.Tensor | None = None  # final hidden state after the last context token

    def _feed(self, inp: torch.Tensor) -> torch.Tensor:
        self.forwards += 1
        return self.state.feed(inp)

    def _advance(self, context: list[int], h: int) -> list[int]:
        """Context tokens to encode so the cache holds `context` (or its window); reuses the previous call's prefix
        when the context only grew, and makes room for h - 1 draft tokens."""
        n = len(self._ctx)
        if n and len(context) >= n and context[n - 1] == self._ctx[-1] and context[:n] == self._ctx:
            new = context[n:]
        else:
            self.state.truncate(0)
            self._window, self._hidden, new = [], None, list(context)
        if self.state.length() + len(new) + h - 1 > self.max_len:  # window overflow: re-encode a suffix from 0
            self.state.truncate(0)
            new, self._window = list(context[-self.keep:]), []
        self._window.extend(new)
        self._ctx = list(context)
        self.ctx_tokens += len(new)
        return new

    @torch.inference_mode()
    def refine(self, lattice: Lattice, context: list[int]) -> list[list[int]]:
        ids, lp = lattice.ids[:, : self.k].to(self.device), lattice.logprobs[:, : self.k].to(self.device).float()
        h = ids.shape[0]
        if h - 1 > self.max_len - self.keep:
            raise ValueError(f"draft length {h} too long for the rescorer window ({self.max_len})")
        new = self._advance(list(context), h)
        if not new and self._hidden is None:  # empty context: nothing to condition on, the heads decide
            return [ids[:, 0].tolist()]
        inp = self.state.inputs(ids)                          # [h, k]
        w, known = self.state.out_rows(ids)                   # [h, k, d]: only candidate rows are ever needed
        rare = not bool(known.all())
        # Speculate that the LM keeps the heads' top-1 tokens: encode new context + that path in one forward (a
        # batch-1 forward is weight-bandwidth bound, so T tokens cost about one); re-run from the first change.
        base = self.state.length() + len(new)
        x = torch.cat([self.state.inputs(torch.tensor(new, dtype=torch.long, device=self.device)), inp[: h - 1, 0]])
        out = self._feed(x) if len(x) else self._hidden.new_zeros((0, self._hidden.shape[-1]))
        if new:
            hs = out[len(new) - 1:]
            self._hidden = hs[0]
        else:
            hs = torch.cat([self._hidden[None], out])
        off, chosen = 0, []                                   # hs[m - off]: hidden state that predicts position m
        for i in range(h):
            lm = (w[i] @ hs[i - off]).float()                 # unnormalised: log Z is shared by all k candidates
            if rare:  # out-of-vocabulary candidate (should not happen): no LM bonus, the weakest known logit
                floor = lm[known[i]].min() if bool(known[i].any()) else lm.new_zeros(())
                lm = torch.where(known[i], lm, floor)
            j = int(torch.argmax(lp[i] + self.alpha * lm))    # ties -> first = best head score
            chosen.append(j)
            if j != 0 and i + 1 < h:                          # speculation broken at i: re-encode from i
                self.state.truncate(base + i)
                hs, off = self._feed(torch.cat([inp[i, j].view(1), inp[i + 1: h - 1, 0]])), i + 1
        self.state.truncate(base)                             # roll the draft back
        return [ids[torch.arange(h, device=ids.device), torch.tensor(chosen, device=ids.device)].tolist()]
