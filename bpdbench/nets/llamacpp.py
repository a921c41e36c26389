"""A GGUF file run by llama.cpp, behind the small part of the transformers interface that a draft model uses.

Why: the registered targets are GGUF files (Q4_K/Q5_0/Q8_0 blocks) that bpdbench dequantizes into a dense torch
model. llama.cpp runs the same blocks with its own quantized matrix-vector kernels (AVX2, AVX512, AMX), which read a
quarter of float32's bytes per token; torch's weight-only kernels emulate bfloat16 on an AVX2 CPU (nets/quant.py).
So the target's own file, served by llama.cpp, is the cheapest faithful self-draft a CPU has (`qdraft:runtime=gguf`,
methods/qdraft.py).

The runtime is `llama-cpp-python` (llama.cpp's C API through ctypes; its wheel is compiled on install, for this CPU,
by `make llamacpp`). It is optional: the method's preflight names that command when it is missing.

One sequence at a time: the model holds one llama.cpp context, whose KV memory is the one cache `new_cache` hands
out. A forward with another cache object (a `DynamicCache` from a timing helper) starts that sequence afresh, and a
forward with no cache evaluates the ids alone, every row's logits returned (teacher forcing).
"""
from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

INSTALL = "make llamacpp (pip install llama-cpp-python, compiled for this CPU: about 10 min on 2 cores)"


def available() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except (ImportError, OSError, RuntimeError):
        return False
    return True


def version() -> str:
    import llama_cpp
    return str(getattr(llama_cpp, "__version__", "unknown"))


# llama.cpp's block types a draft copy can be requantized to (`qdraft:runtime=gguf,quant=...`): Q8_0 keeps 8 bits,
# Q4_K_S mixes 4 and 5 bits by tensor, Q4_0 and IQ4_NL are 4 bits with one scale per 32 weights (MXFP4's block
# size; IQ4_NL's levels are non-uniform). "file" is the registered file's own mix.
QUANTS = ("file", "q8_0", "q4_k_s", "q4_0", "iq4_nl")


def requantized(src: Path, quant: str, out_dir: Path, threads: int) -> Path:
    """`src` requantized by llama.cpp to `quant`, made once into `out_dir` and reused.

    Why a copy: a decode step reads every weight once, so a draft's cost per token follows its bytes (the
    registered 0.5B file's mix drafts at 0.41 target steps per token on an AMX Xeon; a Q4_0 copy at about 0.30).
    The name carries the source's size and llama.cpp's version, so a new file or runtime makes a new copy; it is
    written beside its final name and renamed, so a killed build never leaves a half file that looks whole."""
    import ctypes
    import llama_cpp as lc
    if quant == "file":
        return src
    out = out_dir / f"{src.stem}-{src.stat().st_size}-{quant}-llamacpp{version()}.gguf"
    if out.exists():
        return out
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    params = lc.llama_model_quantize_default_params()
    params.ftype = getattr(lc, f"LLAMA_FTYPE_MOSTLY_{quant.upper()}")
    params.nthread, params.allow_requantize = threads, True
    try:
        code = lc.llama_model_quantize(str(src).encode(), str(tmp).encode(), ctypes.byref(params))
        if code != 0:
            raise RuntimeError(f"llama.cpp could not requantize {src.name} to {quant} (code {code})")
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


class LlamaCppCache:
    """The context's KV memory as transformers' cache: its length (the context's, while this cache holds it), and
    `crop(-k)` drops the last k positions."""

    def __init__(self, lm: "LlamaCppLM"):
        self.lm = lm

    @property
    def length(self) -> int:
        return self.lm.length if self.lm.current is self else 0

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, n: int) -> None:
        keep = self.length + n if n < 0 else n
        keep = max(0, min(keep, self.length))
        if keep < self.length:
            self.lm._forget(keep)


class LlamaCppLM:
    """`model(input_ids=[1, n], past_key_values=cache, logits_to_keep=1)` -> `.logits` [1, rows, vocab], float32."""

    device = torch.device("cpu")

    def __init__(self, path: Path | str, threads: int, n_ctx: int = 4096, n_batch: int = 512):
        import llama_cpp as lc
        from llama_cpp._logger import set_verbose
        set_verbose(False)            # llama.cpp's load report (hundreds of lines) only on errors
        self.lc, self.path = lc, str(path)
        lc.llama_backend_init()
        mparams = lc.llama_model_default_params()
        self.model = lc.llama_model_load_from_file(self.path.encode(), mparams)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {self.path}")
        cparams = lc.llama_context_default_params()
        cparams.n_ctx, cparams.n_batch, cparams.n_ubatch = n_ctx, n_batch, n_batch
        cparams.n_threads, cparams.n_threads_batch = threads, threads
        self.ctx = lc.llama_init_from_model(self.model, cparams)
        if not self.ctx:
            raise RuntimeError(f"llama.cpp could not make a context for {self.path}")
        self.vocab = int(lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(self.model)))
        self.n_ctx, self.n_batch = n_ctx, n_batch
        self.memory = lc.llama_get_memory(self.ctx)
        self.current: Any = None      # the cache object whose sequence the context's memory holds
        self.length = 0

    def new_cache(self) -> LlamaCppCache:
        cache = LlamaCppCache(self)
        self._clear(cache)
        return cache

    def _clear(self, owner: Any) -> None:
        self.lc.llama_memory_clear(self.memory, True)
        self.current, self.length = owner, 0

    def _forget(self, keep: int) -> None:
        if not self.lc.llama_memory_seq_rm(self.memory, 0, keep, -1):
            raise RuntimeError(f"llama.cpp could not drop positions {keep}.. of its KV memory")
        self.length = keep

    def __call__(self, input_ids: torch.Tensor, past_key_values: Any = None, use_cache: bool = True,
                 logits_to_keep: int = 0, **_: Any) -> SimpleNamespace:
        ids = [int(t) for t in input_ids[0].tolist()]
        if past_key_values is None or past_key_values is not self.current:
            self._clear(past_key_values)
        if self.length + len(ids) > self.n_ctx:
            raise ValueError(f"llama.cpp draft context is {self.n_ctx} tokens; {self.length + len(ids)} asked")
        rows = len(ids) if not logits_to_keep else min(int(logits_to_keep), len(ids))
        logits = self._decode(ids, rows)
        return SimpleNamespace(logits=logits[None])

    def _decode(self, ids: list[int], rows: int) -> torch.Tensor:
        """Feed `ids` after the held positions in batches of n_batch; the logits of the last `rows` of them."""
        out: list[np.ndarray] = []
        first_kept = len(ids) - rows
        for start in range(0, len(ids), self.n_batch):
            chunk = ids[start:start + self.n_batch]
            batch = self.lc.llama_batch_init(len(chunk), 0, 1)
            try:
                batch.n_tokens = len(chunk)
                wanted = 0
                for i, tok in enumerate(chunk):
                    batch.token[i] = tok
                    batch.pos[i] = self.length + i
                    batch.n_seq_id[i] = 1
                    batch.seq_id[i][0] = 0
                    keep = start + i >= first_kept
                    batch.logits[i] = 1 if keep else 0
                    wanted += keep
                code = self.lc.llama_decode(self.ctx, batch)
                if code != 0:
                    raise RuntimeError(f"llama_decode failed with code {code} ({self.path})")
                self.length += len(chunk)
                if wanted:
                    ptr = self.lc.llama_get_logits(self.ctx)
                    out.append(np.ctypeslib.as_array(ptr, shape=(wanted * self.vocab,))
                               .reshape(wanted, self.vocab).copy())
            finally:
                self.lc.llama_batch_free(batch)
        return torch.from_numpy(np.concatenate(out) if len(out) > 1 else out[0])

    def close(self) -> None:
        if self.ctx:
            self.lc.llama_free(self.ctx)
            self.ctx = None
        if self.model:
            self.lc.llama_model_free(self.model)
            self.model = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:       # interpreter shutdown: the library may be gone already
            pass
