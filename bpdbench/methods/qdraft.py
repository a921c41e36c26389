"""`qdraft`: the target's own weights, quantized, as its draft model (ML-SpecQD, Georganas et al. 2025; the
self-speculation of QSpec and of llama.cpp's quantized drafts).

Why: on a CPU one decode step is bound by reading the weights, so the target with int8 or int4 weights drafts the
target's own continuation at a fraction of a step per token, with no training and no second model. The copy runs in
bfloat16 with torch's weight-only CPU kernels (nets/quant.py: measured there, and the reason why bfloat16); its
agreement with the target on the tune split and its cost per draft token on this machine are measured at build
(methods/selfdraft.py) and recorded in the result (`resolved.<label>.profile`).

Drafting is methods/sps.py's: a chain of `length` greedy tokens (sampled from the draft's own q at T > 0, so
speculative sampling stays exact), the draft keeping its own KV cache, rolled back to what the target decided after
every step and reused across steps. `levels=2` is ML-SpecQD's multi-level drafting: an int4 copy drafts for the int8
copy, which checks each int4 guess in one forward of its own and keeps the longest prefix equal to its argmax
(methods/cascade.py's vertical cascade), so the draft is the int8 draft for fewer int8 forwards, up to rounding: the
int8 kernel over several rows need not round as over one (on the 0.5B model, 13 Spec-Bench prompts, 4 replayed:
block efficiency 5.55 at length 6 against the int8 chain's 5.86). Whether it pays depends on the machine: an int8
forward over k rows costs about one row's where bfloat16 is native, and k times more where it is emulated. At T > 0
the int8 level samples alone (a guess checked by argmax is not a sample of q).

The draft reads only the prompt's last `window` tokens (64; `window=0`: all), then everything generated. Why: the
draft must prefill what it reads, and its weight-only kernels are matrix-vector kernels. On an AVX2 CPU, where
bfloat16 is emulated, each extra row costs about another decode step's share (int8: 69 ms at 1 row, 175 ms at 8),
so a 500-token prompt cost the draft several seconds, as much as the whole answer's decoding. Positions are
rotary, so attention within the window is as the full draft's. What a long prompt holds beyond the window, SAM over
qdraft retrieves (`sam:fallback=qdraft`). ML-SpecQD drafts from the full context, and `window=0` does too.

Published configuration: ML-SpecQD drafts with MXFP4 weights (4-bit, one scale per block of 32; the closest torch
CPU kernel: int4 with group 32, the default) and a draft length tuned per model; `length=auto` is that tuning on this
machine (experiments/autoshape.py). Measured top-1 agreement with the float32 0.5B target, teacher-forced over 840
positions of 10 Spec-Bench tune prompts: int8 0.963; int4 group 64 0.799, group 32 0.818 (0.845 with an int8 output
projection, not offered: the body's 4 bits are what cost agreement).

`runtime=gguf` drafts with the registered target's own GGUF file run by llama.cpp (nets/llamacpp.py, `make
llamacpp`): the very blocks the dense target was dequantized from (Q5_0, Q4_K, Q6_K and Q8_0 for the 0.5B), with
llama.cpp's quantized kernels instead of torch's emulated-bfloat16 ones. Measured on an AMD EPYC with AVX2 only
(float32 target, 2 threads, tests/slow/test_gguf_draft.py and `bpdbench speed`): top-1 agreement 0.9956 on the
tune split (int8: 0.963), 0.204 target steps per draft token (44 ms against 224 ms; int8 0.537, int4 0.293), its
prompt prefilled at about 90 tokens/s. On an AMD EPYC with AVX512-BF16 (bfloat16 target, onednn linear): 16-17 ms
per draft token against a 35-42 ms step (0.49 steps; agreement 0.9867 with the bfloat16 target), prefill 311
tokens/s against the target's 759. It reads the whole prompt by default (`window=0`): a 64-token window saves the
long prompts' prefill but loses what the draft needs to follow them (grids/frontier.toml, frontier-selfdraft, on
that CPU: `length=auto` sized to 1 token on the Spec-Bench tune split with the window, 3 without; 0.84x against
0.94x AR on Spec-Bench, 1.18x against 1.25x on MT-Bench).

`quant=` (runtime=gguf) drafts with a copy of that file requantized by llama.cpp, made once into the cache
(nets/llamacpp.requantized). Why: the file's mix (Q8_0 embeddings, Q4_K/Q6_K blocks) keeps the target's quality,
but a draft needs only to agree often; its cost per token follows its bytes. Measured on an Intel Xeon with AMX
(bfloat16 target, 2 threads), per token after a 100-token prompt: the file 55.7 ms, Q4_0 41.3 ms, IQ4_NL 39.9 ms,
Q8_0 50.9 ms, Q4_K_S 53.9 ms.
"""
from __future__ import annotations

from typing import Any

import torch

from ..engine import DraftContext, Proposal
from ..hardware.kernels import PackedLinear
from ..nets.llamacpp import QUANTS
from ..nets.quant import BITS, kernels, quantized_copy
from .base import Method, MethodError, MethodSpec, Param
from .calibrated import ROUNDINGS, SCALES, calibrated
from .contract import Requirement
from .cascade import AssistedDraftModel
from .env import Env
from .search import Chain
from .selfdraft import FORWARD, lean_runner, profile
from .sps import CACHE, SHARPEN, STOP, BaseCacheDrafter, DraftModelDrafter, cache_inputs, check_stop

LENGTH_AUTO = 8           # length=auto: one replay at 8 draft tokens; the draft pays per drafted token
LENGTH_AUTO_GGUF = 16     # runtime=gguf: 16 (its tune split accepted 7.88 of 8 at 0.9956 agreement: 8 was the ceiling)

GROUPS = (32, 64, 128, 256)
GROUP = 32               # MXFP4's block: 32 weights share one scale
RUNTIMES = ("torch", "gguf")
WINDOW = 64              # the draft's view of the prompt: its last 64 tokens (0: all; module docstring)


def _is_linear(m: torch.nn.Module) -> bool:
    return isinstance(m, (torch.nn.Linear, PackedLinear))


def quantized(env: Env, bits: int, group: int, scales: str = "minmax", rounding: str = "nearest") -> Any:
    """The target quantized to `bits`, built once per session (levels and fallbacks share it)."""
    key = ("qdraft", bits, group, scales, rounding)
    if key not in env.cache:
        found, parts, _ = calibrated(env, bits, group, scales, rounding, _is_linear)
        env.cache[key] = quantized_copy(env.model, bits, group, _is_linear, found, parts)
    return env.cache[key]


class MultiLevelDrafter(AssistedDraftModel):
    """The int8 draft, each of its forwards checking a guess from the int4 draft (its own cache, cropped to the
    context every time it guesses)."""

    def __init__(self, name: str, model: Any, gamma: int, lower: DraftModelDrafter, window: int = 0):
        super().__init__(name, model, gamma, self._guess, window)
        self.lower, self.context = lower, []

    def _guess(self, drafted: list[int], n: int) -> list[int]:
        if n <= 0:
            return []
        return self.lower.chain(self.context + drafted, n)

    def reset(self, prompt_ids: list[int]) -> None:
        super().reset(prompt_ids)
        self.lower.reset(prompt_ids)

    @torch.inference_mode()
    def propose(self, ctx: DraftContext) -> Proposal:
        if ctx.sampler is not None:
            return DraftModelDrafter.propose(self, ctx)
        n = min(self.gamma, ctx.budget)
        self.drafted = max(n, 0)
        self.context = ctx.tokens
        draft = self.draft(ctx, n)
        return Proposal([draft]) if draft else Proposal()


def build_gguf(env: Env, method: Method) -> DraftModelDrafter:
    """`runtime=gguf`: the registered target's own GGUF file run by llama.cpp (nets/llamacpp.py) drafts, its
    blocks at the file's own precision, from the whole context by default (module docstring: a window cost it more
    acceptance than prefill)."""
    from .. import models, paths
    from ..nets.llamacpp import LlamaCppLM, requantized, version
    length, window, quant = method.get("length", 4), method.get("window", 0), method.get("quant", "file")
    stop = method.get("stop", 0.0)
    threads = env.cfg.threads or torch.get_num_threads()
    source = models.gguf_path(models.MODELS[env.cfg.model])
    if quant != "file":
        paths.check_cache_writable()
    path = source if quant == "file" else requantized(source, quant, paths.requantized_dir(), threads)
    draft = LlamaCppLM(path, threads=threads)
    prof = profile(env, draft, "gguf" if quant == "file" else f"gguf-{quant}")
    env.resolved[method.label] = {"runtime": "gguf", "file": path.name, "source_file": source.name, "quant": quant,
                                  "bytes": path.stat().st_size, "llama_cpp": version(), "length": length,
                                  "window": window, **({"stop": stop} if stop else {}), "profile": prof}
    env.log(f"{method.label}: {path.name} by llama.cpp, agreement {prof['agreement']} on the tune split, "
            f"{prof['cost_steps']} steps per draft token")
    return DraftModelDrafter(method.label, draft, length, window=window, sharpen=method.get("sharpen", 1.0),
                             stop=stop)


def build(env: Env, method: Method) -> DraftModelDrafter:
    if method.get("runtime", "torch") == "gguf":
        return build_gguf(env, method)
    if env.cfg.device != "cpu" and not str(env.cfg.device).startswith("cpu"):
        raise MethodError(f"{method.label}: the weight-only kernels qdraft uses are torch's CPU ones; "
                          f"run with --device cpu")
    bits, group, length, levels = (method.get("bits", 4), method.get("group", GROUP), method.get("length", 4),
                                   method.get("levels", 1))
    window, sharpen, stop = method.get("window", WINDOW), method.get("sharpen", 1.0), method.get("stop", 0.0)
    top_bits = 8 if levels == 2 else bits
    scales, rounding = method.get("scales", "minmax"), method.get("rounding", "nearest")
    top_rounding = rounding if top_bits == 4 else "nearest"           # gptq rounds int4 levels (levels=2: the lower)
    tag = lambda r: ("" if scales == "minmax" else f"-{scales}") + ("" if r == "nearest" else f"-{r}")  # noqa: E731
    copy = quantized(env, top_bits, group, scales, top_rounding)
    draft = lean_runner(env, copy, method) or copy
    lean = "-lean" if draft is not copy else ""
    rescore = method.get("rescore", 0)
    if rescore:
        if not lean:
            raise MethodError(f"{method.label}: rescore= rescores the lean forward's output projection, and this "
                              f"draft runs the library's; drop rescore= or forward=transformers")
        head = env.model.get_output_embeddings()
        draft = draft.rescoring(head.weight, getattr(head, "bias", None), rescore)
        lean += f"-r{rescore}"
    prof = profile(env, draft, f"int{top_bits}-g{group}{tag(top_rounding)}{lean}")
    resolved = {"bits": top_bits, "group": group, "length": length, "levels": levels, "window": window,
                "scales": calibrated(env, top_bits, group, scales, top_rounding, _is_linear)[2],
                "kernels": kernels(copy), "forward": "lean" if lean else "transformers", "rescore": rescore,
                **({"stop": stop} if stop else {}), "profile": prof}
    if levels == 2:
        lower_copy = quantized(env, 4, group, scales, rounding)
        lower_model = lean_runner(env, lower_copy, method) or lower_copy
        lower = DraftModelDrafter(f"{method.label}/int4", lower_model, length, window=window)
        resolved["lower"] = {"bits": 4, "kernels": kernels(lower_copy),
                             "profile": profile(env, lower_model, f"int4-g{group}{tag(rounding)}{lean}"),
                             "scales": calibrated(env, 4, group, scales, rounding, _is_linear)[2]}
        drafter: DraftModelDrafter = MultiLevelDrafter(method.label, draft, length, lower, window)
        drafter.sharpen = sharpen                        # the int8 level samples alone at T > 0
    elif method.get("cache", "own") == "base":
        drafter = BaseCacheDrafter(method.label, draft, length, sharpen=sharpen, stop=stop)
        resolved.update(cache="base", window=0)
    else:
        drafter = DraftModelDrafter(method.label, draft, length, window=window, sharpen=sharpen, stop=stop)
    env.resolved[method.label] = resolved
    env.log(f"{method.label}: int{top_bits} draft, agreement {prof['agreement']} on the tune split, "
            f"{prof['cost_steps']} steps per draft token")
    return drafter


def _check(method: Method) -> None:
    if method.get("levels", 1) == 2 and method.get("bits") not in (None, 8):
        raise MethodError(f"{method.label}: levels=2 is int4 drafting for int8; drop bits= or pass bits=8")
    if method.get("rounding", "nearest") == "gptq" and method.get("bits", 4) == 8 and method.get("levels", 1) == 1:
        raise MethodError(f"{method.label}: rounding=gptq rounds the int4 copy; drop it or pass bits=4")
    if method.get("levels", 1) == 2 and "stop" in method.params:
        raise MethodError(f"{method.label}: levels=2 drafts a fixed length (each int8 forward checks an int4 guess); "
                          f"drop stop= or levels=")
    check_stop(method, "length")
    if method.get("rescore", 0) and method.get("forward", "lean") != "lean":
        raise MethodError(f"{method.label}: rescore= rescores the lean forward's output projection; drop rescore= "
                          f"or forward=transformers")
    if method.get("cache", "own") == "base":
        clash = (["runtime=gguf"] if method.get("runtime", "torch") == "gguf" else []) + \
            (["levels=2"] if method.get("levels", 1) == 2 else []) + (["window="] if "window" in method.params else [])
        if clash:
            raise MethodError(f"{method.label}: cache=base drafts one torch copy on the base's cache, over the "
                              f"whole context; drop {', '.join(clash)}")
    if method.get("runtime", "torch") == "gguf":
        fixed = [k for k in ("bits", "group", "levels", "scales", "rounding", "forward", "rescore")
                 if k in method.params]
        if fixed:
            raise MethodError(f"{method.label}: runtime=gguf drafts with the GGUF file's own blocks; drop "
                              f"{', '.join(fixed)}=")
    elif "quant" in method.params:
        raise MethodError(f"{method.label}: quant= names llama.cpp blocks; add runtime=gguf, or use bits= for "
                          f"torch's copy")


def _preflight(method: Method, cfg) -> None:
    """runtime=gguf needs llama.cpp and a registered model (its GGUF file): said before the model loads."""
    if method.get("runtime", "torch") != "gguf":
        return
    from .. import models
    from ..nets.llamacpp import INSTALL, available
    if cfg.model not in models.MODELS:
        raise MethodError(f"{method.label}: runtime=gguf drafts with a registered model's GGUF file; "
                          f"{cfg.model} is not one ({', '.join(models.MODELS)})")
    if str(cfg.device) not in ("cpu", "auto") and not str(cfg.device).startswith("cpu"):
        raise MethodError(f"{method.label}: runtime=gguf runs llama.cpp on the CPU; run with --device cpu")
    if not available():
        raise MethodError(f"{method.label}: runtime=gguf needs llama.cpp: {INSTALL}")


def _longest(env: Env, method: Method) -> int:
    """The replayed length `auto` prices every shorter one from: past where the draft's acceptance stops paying."""
    return LENGTH_AUTO_GGUF if method.get("runtime", "torch") == "gguf" else LENGTH_AUTO


def _needs(model: str, cfg) -> list[Requirement]:
    from ..nets.llamacpp import available
    return [Requirement("torch's CPU weight-only kernels", hasattr(torch.ops.aten, "_weight_int8pack_mm")),
            Requirement("llama.cpp for runtime=gguf (`make llamacpp`)", available())]


SPECS = [MethodSpec("qdraft", "self-speculation: the target with int8 or int4 weight-only weights (bfloat16 "
                    "activations) drafts `length` tokens with its own KV cache (ML-SpecQD); levels=2: int4 drafts "
                    "for int8", build,
                    (Param("bits", int, "weight bits of the draft copy", choices=BITS),
                     Param("length", int, "draft length (auto: the length fastest on this machine)", low=1,
                           auto=True),
                     Param("levels", int, "1: one quantized draft; 2: int4 drafts for int8, which drafts for the "
                           "target", low=1, high=3),
                     Param("group", int, "int4 group size (input columns per scale)", choices=GROUPS),
                     Param("window", int, "the draft sees the prompt's last N tokens (0: all of it; default 64, "
                           "runtime=gguf 0)", low=0),
                     SHARPEN,
                     Param("scales", str, "minmax: each group's range (the published rounding); awq: activation-"
                           "aware input scales chosen on the train split (nets/awq.py)", choices=SCALES),
                     Param("rounding", str, "nearest: each int4 weight to its nearest level; gptq: column by "
                           "column, the error spread over the rest by the train split's inputs (nets/gptq.py)",
                           choices=ROUNDINGS),
                     Param("runtime", str, "torch: a quantized copy with torch's weight-only kernels; gguf: the "
                           "registered model's own GGUF file run by llama.cpp", choices=RUNTIMES),
                     Param("rescore", int, "the draft's top N tokens at each position scored again by the "
                           "target's own output rows (0: none, the published copy; 8: nets/lean.py RescoredHead)",
                           low=0),
                     CACHE, FORWARD, STOP,
                     Param("quant", str, "runtime=gguf: the file's own blocks, or a copy requantized by llama.cpp "
                           "(made once into the cache)", choices=QUANTS)),
                    _needs, check=_check, preflight=_preflight, inputs=cache_inputs,
                    artefacts=(),      # its int8/int4 copy is made at build, per run
                    shapes=Chain("length", longest=_longest, drafts_per_token=True))]
