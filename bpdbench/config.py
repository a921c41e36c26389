"""The typed run configuration. The CLI only fills this in; the resolved copy is stored with every result."""
from __future__ import annotations

import os
import platform
import subprocess
from dataclasses import asdict, dataclass, replace
from importlib import metadata
from pathlib import Path

HEAD_PROFILES = ("quick", "full", "ci", "bench", "init")  # ci: tiny fixed-step heads for CI smoke and regression


class ConfigError(ValueError):
    """One-line configuration problems (unknown names, bad values)."""


@dataclass(frozen=True)
class RunConfig:
    task: str = "xsum"
    model: str = "qwen2.5-coder-0.5b"
    method: str = "bpd"                   # a method spelling (`bpdbench methods`), e.g. ngram4, bpd:heads=4
    heads: int = 8                        # use the first N heads
    heads_profile: str = "quick"          # which cached heads to use / train when missing ("init" = untrained)
    heads_path: str | None = None         # explicit heads directory (ours or a Medusa-1 checkpoint)
    rescorer: str = "none"                # alias: --rescorer R is --method R
    alpha: float | None = None
    k: int = 16
    draft_threshold: float = 0.0          # verify draft tokens only while head top-1 prob >= this (0 = full block)
    limit: int | None = 10
    offset: int = 0
    max_new_tokens: int | None = None     # None -> the task's default
    max_prompt_tokens: int = 1024         # prompts are left-truncated beyond this (long articles)
    dtype: str = "auto"                   # auto: bfloat16 where native, float32 where emulated (hardware/dtype.py)
    device: str = "cpu"
    threads: int | None = None
    data_dir: str | None = None
    data_file: str | None = None
    out: str | None = None
    resume: bool = False
    check_lossless: bool = True
    alpha_file: str | None = None         # tuned-alpha table; None: <results>/alpha.json
    greedy_dir: str | None = None         # greedy-reference cache; None: <cache>/greedy
    auto_train: bool = True               # train missing heads / neural rescorers on first use (else: an error)
    # sampling (generate's meaning; None = unset, so result folders written before these existed still resume)
    temperature: float | None = None      # None or 0: greedy decoding, lossless against greedy per example
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None               # example i draws from a generator seeded with seed + i (default 0)
    prompts: str | None = None            # a draw file (`bpdbench draw`): exactly these eval prompts, in its order
    turns: int | None = None              # decode the first N turns of multi-turn questions (None: the first)

    @property
    def sampling(self):
        """The engine's SamplingParams (greedy when no temperature > 0 is set)."""
        from .engine.sampling import SamplingParams
        return SamplingParams(self.temperature, self.top_p, self.top_k, self.seed)

    def validate(self) -> "RunConfig":
        from tasks import TASKS
        from .models import DTYPES

        if self.task not in TASKS:
            raise ConfigError(f"unknown task '{self.task}'; valid: {', '.join(TASKS)}")
        if self.dtype not in DTYPES and self.dtype != "auto":
            raise ConfigError(f"unknown dtype '{self.dtype}'; valid: auto, {', '.join(DTYPES)}")
        if self.heads_profile not in HEAD_PROFILES:
            raise ConfigError(f"unknown heads profile '{self.heads_profile}'; valid: {', '.join(HEAD_PROFILES)}")
        import math
        for name in ("alpha", "draft_threshold"):
            v = getattr(self, name)
            if v is not None and not math.isfinite(v):
                raise ConfigError(f"--{name.replace('_', '-')} must be a finite number, got {v}")
        if self.alpha is not None and self.alpha < 0:
            raise ConfigError(f"--alpha must be >= 0, got {self.alpha}")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"--threads must be >= 1, got {self.threads}")
        for name in ("heads", "k", "offset"):
            if getattr(self, name) < (0 if name == "offset" else 1):
                raise ConfigError(f"--{name} must be positive, got {getattr(self, name)}")
        if not 0.0 <= self.draft_threshold < 1.0:
            raise ConfigError(f"--draft-threshold must be in [0, 1), got {self.draft_threshold}")
        if self.turns is not None and self.turns < 1:
            raise ConfigError(f"--turns must be >= 1, got {self.turns}")
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"--limit must be >= 1, got {self.limit}")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ConfigError(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")
        if self.max_prompt_tokens < 1:
            raise ConfigError(f"max_prompt_tokens must be >= 1, got {self.max_prompt_tokens}")
        try:
            self.sampling.check()
        except ValueError as e:
            raise ConfigError(str(e)) from None
        check_device(self.device)
        if self.dtype == "auto":   # resolved once, here: every layer below sees the concrete dtype it runs in
            from .hardware.dtype import resolve
            from .models import resolve_device
            return replace(self, dtype=resolve("auto", resolve_device(self.device), self.threads))
        return self

    def replace(self, **kw) -> "RunConfig":
        return replace(self, **kw)

    def to_dict(self) -> dict:
        return asdict(self)


def check_device(dev: str) -> None:
    """A missing GPU is one line now, not a CUDA traceback after the model has loaded (every command that loads a
    model calls this first)."""
    if dev not in ("cpu", "cuda", "auto") and not (dev.startswith("cuda:") and dev[5:].isdigit()):
        raise ConfigError(f"unknown device '{dev}'; valid: cpu, cuda, cuda:N, auto")
    if dev.startswith("cuda"):
        import torch
        if not torch.cuda.is_available():
            raise ConfigError(f"--device {dev} but torch sees no CUDA GPU (torch {torch.__version__}, "
                              f"cuda {torch.version.cuda}); use --device cpu or --device auto")
        if ":" in dev and int(dev[5:]) >= torch.cuda.device_count():
            raise ConfigError(f"--device {dev} but only {torch.cuda.device_count()} CUDA device(s) are "
                              f"visible; use cuda:0..{torch.cuda.device_count() - 1}")


def environment(threads: int, device: str, dtype: str) -> dict:
    """What a reader needs to reproduce or compare a number: versions, machine, commit."""
    versions = {}
    for pkg in ("torch", "transformers", "tokenizers", "gguf", "numpy", "kenlm", "bpdbench"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    from .hardware.fingerprint import current
    fp = current(threads, device)
    return {"versions": versions, "python": platform.python_version(), "platform": platform.platform(),
            "processor": _cpu_name(), "cpu_flags": list(fp.flags), "bf16_native": fp.bf16_native,
            "fingerprint": fp.key(), "cpu_count": os.cpu_count(), "threads": threads, "device": device,
            "dtype": dtype, "linear": _linear(dtype, device, threads), "load_average": _load_average(),
            "git_commit": git_commit()}


def _linear(dtype: str, device: str, threads: int) -> str | None:
    """The linear-layer kernel the model of this run uses (hardware/kernels.py), None where it cannot be told."""
    from .hardware import kernels
    try:
        return kernels.choose(dtype, device, threads).backend
    except (ValueError, RuntimeError, AttributeError):
        return None


def _load_average() -> list[float] | None:
    """1/5/15-minute load averages when the result was written: a number taken on a busy machine says so."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def git_commit() -> str:
    root = Path(__file__).resolve().parents[1]
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                             timeout=5).stdout.strip()
        # results/ is output (a sweep's artefact build rewrites its training record there): only code makes dirty
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!results"],
                               cwd=root, capture_output=True, text=True, timeout=5).stdout.strip()
        return (sha + ("-dirty" if dirty else "")) or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()
