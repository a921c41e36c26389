"""llama.cpp on the model's own GGUF file as peers timed by `speed`: its greedy AR (`llamacpp`) and the speculative
mode llama-cpp-python ships, prompt lookup (`llamacpp-pld`, its `LlamaPromptLookupDecoding`).

Why: they are what a CPU user runs instead of this engine. The registered targets are GGUF files that bpdbench
dequantizes into a dense torch model (float32 or bfloat16); llama.cpp runs the same file's blocks with its own
quantized kernels, which read a quarter of float32's bytes per token. A speedup over bpdbench's AR that is still
slower per token than llama.cpp's plain greedy is not what a reader would pick, so the board shows both in ms per
token.

Numerics: the weights are the file's blocks (Q5_0, Q4_K, Q6_K, Q8_0 for the 0.5B); activations are float32, rounded
to 8-bit blocks where they meet a quantized weight (ggml's CPU dot products); the KV cache is llama.cpp's default
(float16); the logits are float32 and the sampler is llama.cpp's greedy (temperature 0). Each row records the file,
its quantization type, its sha256 prefix, the llama-cpp-python version and these settings in config.json
(resolved.methods.<label>).

Certification: llama.cpp's tokens are not bpdbench's (other kernels, other rounding), so `llamacpp` is not compared
with `ar`; how many of its leading tokens equal ar's is recorded as information (experiments/engines.py). Its
speculative mode is certified against its own greedy (`baseline="llamacpp"`), by llama.cpp's own near-tie rule: at
the first token where `llamacpp-pld` differs from `llamacpp`, llama.cpp's logits there are recomputed three ways
(`logits_three_ways`: one token at a time as its greedy runs, teacher-forced in one batch, in a verify batch as its
prompt lookup runs); the divergence is a near-tie when the method's token trails the greedy token by no more than
those evaluations differ by, as bpdbench's own certificate does for its bfloat16 kernels, else it is lost.

One call decodes one prompt from scratch: `Llama.generate` reuses a cached prefix of its previous call, so the
context is reset first, and every repeat pays the prefill as bpdbench's AR does. Forwards are counted per `eval`
call (one prefill, then one per decode or verify step), as `serial_calls` counts ours.
"""
from __future__ import annotations

import importlib.util
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .base import Method, MethodError, MethodSpec, Param
from .contract import Requirement
from .env import Env
from .hf import Decoder, Output

# context beyond the prompt and the new tokens: the draft a verify step scores past the last kept token
SLACK = 64


def _registered(method: Method, cfg) -> Any:
    from .. import models
    spec = models.MODELS.get(cfg.model)
    if spec is None:
        raise MethodError(f"{method.label}: llama.cpp runs a registered model's GGUF file; {cfg.model} is not one "
                          f"({', '.join(models.MODELS)})")
    return spec


def _preflight(method: Method, cfg) -> None:
    """llama-cpp-python, a registered model whose GGUF package is installed, and the CPU: said before any load."""
    from ..models import resolve_device
    from ..nets.llamacpp import available
    spec = _registered(method, cfg)
    if not resolve_device(str(cfg.device)).startswith("cpu"):     # `auto` on a GPU machine too: ours on the GPU
        raise MethodError(f"{method.label}: llama.cpp is built for the CPU here (make llamacpp); run with "
                          f"--device cpu")
    if not available():
        raise MethodError(f"{method.label}: needs llama-cpp-python; install it with `make llamacpp`")
    missing = [m for m in spec.modules if not _installed(m)]
    if missing:
        raise MethodError(f"{method.label}: the GGUF file of {spec.name} is missing (no module {missing[0]}); "
                          f"pip install {' '.join(spec.pip)}")


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None     # without running the package's __init__


def _needs(model: str, cfg) -> list[Requirement]:
    from ..nets.llamacpp import available
    return [Requirement("llama-cpp-python (`make llamacpp`)", available())]


def describe_file(path: Path) -> dict:
    """The file's quantization as its header says it: the file type and how many tensors each block type holds."""
    from collections import Counter

    from gguf import GGUFReader, LlamaFileType
    reader = GGUFReader(str(path))
    field = reader.fields.get("general.file_type")
    ftype = int(field.parts[field.data[0]][0]) if field is not None else None
    try:
        name = LlamaFileType(ftype).name if ftype is not None else "unknown"
    except ValueError:
        name = f"file type {ftype}"
    types = Counter(t.tensor_type.name for t in reader.tensors)
    return {"quantization": name, "tensor_types": dict(sorted(types.items()))}


def gguf_of(env: Env) -> tuple[Path, dict]:
    """The run's model as its GGUF file, checked against the registry's pinned sha256, with what a result records of
    it (name, size, quantization, sha256 prefix). Once per session: both rows read the same file."""
    from .. import models
    key = "llamacpp:gguf"
    if key not in env.cache:
        spec = models.MODELS[env.cfg.model]
        path = models.gguf_path(spec)
        sha = models.sha256_file(path)
        if sha != spec.sha256:
            raise MethodError(f"llamacpp: {path.name} has sha256 {sha[:16]}..., not the pinned {spec.sha256[:16]}...; "
                              f"reinstall {spec.pip[0].split('==')[0]} at its pinned version")
        env.cache[key] = (path, {"file": path.name, "bytes": path.stat().st_size, **describe_file(path),
                                 "sha256": sha[:16]})
    return env.cache[key]


def threads_of(env: Env) -> int:
    import torch
    return int(env.cfg.threads or torch.get_num_threads())


def context_of(env: Env) -> int:
    """llama.cpp's context: the longest prompt, the new tokens and a draft's slack, in blocks of 256."""
    need = env.cfg.max_prompt_tokens + env.limits.max_new_tokens + SLACK
    return -(-need // 256) * 256


def load(path: Path, threads: int, n_ctx: int, draft: Any = None, logits_all: bool = False) -> Any:
    """A `llama_cpp.Llama` over the file with this run's threads (prompt and decode alike), its other settings the
    package's own defaults (KV cache float16, batch 512, no flash attention)."""
    from llama_cpp import Llama
    llm = Llama(model_path=str(path), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                logits_all=logits_all, draft_model=draft, verbose=False)
    _close_at_exit(llm)
    return llm


def _close_at_exit(llm: Any) -> None:
    """Close it before the interpreter's teardown, where Llama.__del__ finds its library unloaded and prints a
    traceback; a weak reference, so a context done with earlier is still freed then."""
    import atexit
    import weakref
    ref = weakref.ref(llm)

    def close() -> None:
        alive = ref()
        if alive is not None:
            alive.close()
    atexit.register(close)


def settings(llm: Any) -> dict:
    """What a result records of a loaded context: the numerics and the sizes that set its speed."""
    import llama_cpp
    from gguf import GGMLQuantizationType

    from ..nets.llamacpp import version
    p = llm.context_params

    def kind(t: int) -> str:
        try:
            return GGMLQuantizationType(int(t)).name
        except ValueError:
            return str(t)
    info = llama_cpp.llama_print_system_info()
    return {"llama_cpp_python": version(), "logits": "float32", "activations": "float32 (8-bit blocks in the "
            "quantized dot products)", "kv_cache": f"{kind(p.type_k)}/{kind(p.type_v)}",
            "sampler": "greedy (temperature 0)", "n_ctx": int(p.n_ctx), "n_batch": int(p.n_batch),
            "n_ubatch": int(p.n_ubatch), "threads": int(p.n_threads),
            "flash_attn": str(getattr(p, "flash_attn_type", getattr(p, "flash_attn", "unknown"))),
            "system_info": info.decode() if isinstance(info, bytes) else str(info)}


@dataclass
class EngineOutput(Output):
    """llama.cpp's output with the seconds of its prefill call (the first `eval`), which speed's decode-only columns
    leave out: llama-cpp-python's speculative path computes every prompt row's logits, so its prefill costs more
    than its greedy's."""
    prefill_seconds: float | None = None


def decoder(llm: Any, limits) -> Decoder:
    """llama-cpp-python's own loop (`Llama.generate`, greedy, with the draft model it was loaded with), cut exactly
    like ours so token ids compare; forwards counted per `eval` call, the first one (the prefill) timed."""
    calls, prefill = [0], [0.0]
    evaluate = llm.eval

    def counting(tokens):
        calls[0] += 1
        if calls[0] > 1:
            return evaluate(tokens)
        t0 = time.perf_counter()
        try:
            return evaluate(tokens)
        finally:
            prefill[0] = time.perf_counter() - t0
    llm.eval = counting           # generate() calls self.eval: the instance attribute is what it finds

    def run(prompt: list[int]) -> Output:
        if len(prompt) + limits.max_new_tokens + SLACK > llm.n_ctx():
            raise ValueError(f"llama.cpp's context is {llm.n_ctx()} tokens; a {len(prompt)}-token prompt and "
                             f"{limits.max_new_tokens} new tokens do not fit (lower --max-new-tokens)")
        calls[0] = 0
        llm.reset()               # from scratch: generate() would reuse the last call's prompt from the KV cache
        out: list[int] = []
        gen = llm.generate(list(prompt), temp=0.0, repeat_penalty=1.0, reset=True)
        try:
            for token in gen:
                out.append(int(token))
                if limits.done(out):
                    break
        finally:
            gen.close()
        return EngineOutput(limits.truncate(out), calls[0], prefill_seconds=prefill[0])
    return run


def verifier(llm: Any) -> tuple[Any, Any, int]:
    """(forward, crop, vocab) for hardware/engine_curve.py: llama-cpp-python's own `eval` (with logits_all, every
    row's logits copied out, as its speculative path verifies a draft) and a crop of its KV memory, done before the
    next timed call rather than inside it."""
    import llama_cpp

    def forward(ids: list[int]) -> None:
        llm.eval(ids)

    return forward, lambda length: _crop(llm, length), int(llm.n_vocab())


def _crop(llm: Any, length: int) -> None:
    """Drop the KV memory from `length` on, as llama-cpp-python's own eval does before it writes."""
    import llama_cpp
    llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(llm.ctx), -1, length, -1)
    llm.n_tokens = length


def certifying(env: Env) -> Any:
    """A context keeping every row's logits, for the near-tie certificate of llama.cpp's speculative rows
    (experiments/engines.py); loaded at a run's first divergence only."""
    path, _ = gguf_of(env)
    return load(path, threads_of(env), context_of(env), logits_all=True)


def logits_three_ways(llm: Any, prompt: list[int], decided: list[int], draft: list[int]) -> tuple[Any, Any, Any]:
    """llama.cpp's logits for the token after prompt + decided, as numpy rows: (one) as its greedy computes them,
    the prompt in one batch, then one eval per token; (tf) teacher-forced, prompt + decided in one batch; (block) as
    its prompt lookup verifies, the last decided token and `draft` in one batch on the same cache (None when nothing
    is decided). Their differences are what llama.cpp's own kernels round by at this position."""
    import numpy as np
    end = len(prompt) + len(decided) - 1             # the row that predicts the next token

    def row(i: int) -> Any:
        return np.array(llm.scores[i], dtype=np.float64)
    llm.reset()
    llm.eval(list(prompt) + list(decided))
    tf = row(end)
    llm.reset()
    llm.eval(list(prompt))
    block = None
    for j, t in enumerate(decided):
        if j == len(decided) - 1 and draft:
            n = llm.n_tokens
            llm.eval([t] + list(draft))
            block = row(n)
            _crop(llm, n)
        llm.eval([t])
    return row(end), tf, block


def _build(env: Env, method: Method, draft: Any = None, extra: dict | None = None) -> Decoder:
    """With a draft model, every row's logits are asked for explicitly: llama-cpp-python turns them on itself then,
    but sizes its logits buffer by the argument (n_batch rows), so a prompt longer than 512 tokens failed in its
    prefill ("could not broadcast ... into shape (0,)")."""
    path, file = gguf_of(env)
    llm = load(path, threads_of(env), context_of(env), draft, logits_all=draft is not None)
    env.resolved[method.label] = {"engine": "llama.cpp", **file, **settings(llm), **(extra or {}),
                                  "baseline": method.spec.baseline}
    return decoder(llm, env.limits)


def _ar(env: Env, method: Method) -> Decoder:
    return _build(env, method)


def _pld(env: Env, method: Method) -> Decoder:
    """LlamaPromptLookupDecoding in its published defaults unless a parameter is given (the package's README suggests
    num_pred_tokens=2 on CPU-only machines: `llamacpp-pld:tokens=2`)."""
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
    given = {k: method.params[p] for p, k in (("tokens", "num_pred_tokens"), ("ngram", "max_ngram_size"))
             if p in method.params}
    draft = LlamaPromptLookupDecoding(**given)
    extra = {"draft": "LlamaPromptLookupDecoding" + ("" if given else " (published defaults)"),
             "num_pred_tokens": draft.num_pred_tokens, "max_ngram_size": draft.max_ngram_size,
             "logits_all": True}
    return _build(env, method, draft, extra)


SPECS = [
    MethodSpec("llamacpp", "llama.cpp's greedy AR on the model's own GGUF file (llama-cpp-python; another engine, "
               "shown beside ours in ms per token)", _ar, needs=_needs, external=True, artefacts=(),
               preflight=_preflight, baseline="llamacpp"),
    MethodSpec("llamacpp-pld", "llama.cpp with llama-cpp-python's prompt lookup draft model "
               "(LlamaPromptLookupDecoding, its published defaults), certified against `llamacpp`", _pld,
               (Param("tokens", int, "num_pred_tokens: draft length", low=1),
                Param("ngram", int, "max_ngram_size: longest n-gram matched", low=1)),
               _needs, external=True, artefacts=(), preflight=_preflight, baseline="llamacpp"),
]
