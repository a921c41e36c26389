"""transformers' own decoding loops as peers: greedy `generate`, prompt lookup, assisted generation.

They run transformers' loop, not ours, so they can be timed (`speed`) and checked for identical output, but not
replayed or counted step by step; target forwards are counted with a forward hook that is removed after each call.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .base import Method, MethodSpec, Param
from .env import Env

DEFAULT_ASSISTANT = "qwen2.5-coder-0.5b"
# The default target is the smallest Qwen we have, so it has no smaller same-tokenizer assistant; SmolLM2-135M drafts
# for it through transformers' universal assisted decoding (different tokenizers, re-tokenised drafts).
FALLBACK_ASSISTANT = "smollm2-135m"


@dataclass
class Output:
    tokens: list[int]
    serial_calls: int       # forwards of the target model, prefill included
    draft_seconds: float | None = None   # time spent proposing (our loop only; transformers' loops do not say)
    verified: int | None = None          # tokens scored in verify forwards (our loop only): the calibrated prediction
    verify_sizes: dict | None = None     # "n" or "n:tree" -> verify forwards of that size (our loop only)


Decoder = Callable[[list[int]], Output]


class MethodUnavailable(RuntimeError):
    """A peer whose model is not installed here (speed skips it when the user did not ask for it by name)."""


def decoder(env: Env, assistant=None, tokenizers=None, **extra) -> Decoder:
    """transformers greedy `generate`; the output is cut exactly like ours so token ids are comparable.
    `tokenizers` = (target, assistant) when they differ (universal assisted decoding)."""
    model, limits = env.model, env.limits
    pad_id = env.tok.pad_token_id if env.tok.pad_token_id is not None else min(limits.eos_ids, default=0)
    budget = assistant.generation_config.num_assistant_tokens if assistant is not None else None
    if assistant is not None:
        extra["assistant_model"] = assistant
    if tokenizers is not None:
        extra["tokenizer"], extra["assistant_tokenizer"] = tokenizers

    def run(prompt: list[int]) -> Output:
        if assistant is not None:  # under a 'heuristic' schedule HF writes the adapted draft length back: reset
            assistant.generation_config.num_assistant_tokens = budget
        x = torch.tensor([prompt], device=model.device)
        calls = [0]
        hook = model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
        try:
            out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                                 max_new_tokens=limits.max_new_tokens, eos_token_id=sorted(limits.eos_ids),
                                 pad_token_id=pad_id, temperature=None, top_p=None, top_k=None, **extra)
        finally:
            hook.remove()
        return Output(limits.truncate(out[0, len(prompt):].tolist()), calls[0])
    return run


def assisted(env: Env, method: Method) -> Decoder:
    from .. import models
    name = method.get("assistant") or (DEFAULT_ASSISTANT if env.cfg.model != DEFAULT_ASSISTANT
                                       else FALLBACK_ASSISTANT)
    try:
        draft_model, draft_tok = models.load(name, env.cfg.dtype, env.cfg.device)  # own instance: generate mutates it
    except (models.ModelError, ModuleNotFoundError) as e:
        raise MethodUnavailable(f"assistant {name} unavailable ({e}); pass hf-assisted:assistant=<model>") from None
    same = draft_tok.get_vocab() == env.tok.get_vocab()
    env.resolved[method.label] = {"assistant": name,
                                  "assistant_tokenizer": "same" if same else "different (universal assisted)"}
    return decoder(env, assistant=draft_model, tokenizers=None if same else (env.tok, draft_tok))


def _pld(env: Env, method: Method) -> Decoder:
    tokens = method.get("tokens", 10)
    env.resolved[method.label] = {"tokens": tokens}
    return decoder(env, prompt_lookup_num_tokens=tokens)


def _assistant_ready(model: str, cfg) -> list[tuple[str, bool]]:
    import importlib.util
    from .. import models
    name = DEFAULT_ASSISTANT if model != DEFAULT_ASSISTANT else FALLBACK_ASSISTANT
    spec = models.MODELS[name]
    return [(f"assistant model {name}", all(importlib.util.find_spec(m) for m in spec.modules))]


SPECS = [
    MethodSpec("hf-greedy", "transformers `generate`, greedy (a second AR baseline)", lambda env, m: decoder(env),
               external=True, artefacts=()),
    MethodSpec("hf-pld", "transformers prompt lookup decoding (prompt_lookup_num_tokens)", _pld,
               (Param("tokens", int, "draft length", low=1),), external=True, artefacts=()),
    MethodSpec("hf-assisted", "transformers assisted generation with a smaller draft model (universal when the "
               "tokenizers differ)", assisted, (Param("assistant", str, "draft model"),), _assistant_ready,
               external=True, artefacts=()),
]
