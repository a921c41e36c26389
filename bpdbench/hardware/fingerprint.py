"""The machine fingerprint that every calibration, auto shape and result file is keyed by.

Two CPUs with the same model name can differ in what they execute natively (a VM may hide AVX-512), and the cost
of verifying 16 tokens differs by 7x between an AVX512-BF16 CPU and an AVX2 one in bfloat16. So the key is what
the code can see and what changes the numbers: ISA flags, cores, threads, library versions, the GPU.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path

# The flags that decide which kernels torch runs (oneDNN's bf16/amx paths need avx512_bf16 or amx_bf16).
FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile", "amx_int8", "neon",
         "asimd", "sve", "bf16")


@dataclass(frozen=True)
class Fingerprint:
    cpu: str
    flags: tuple[str, ...]        # the subset of FLAGS this CPU reports
    cores: int
    threads: int
    torch: str
    transformers: str
    machine: str                  # platform.machine(): x86_64, aarch64
    gpu: str | None = None        # CUDA device name, where the run uses one
    gpu_capability: str | None = None
    extra: dict = field(default_factory=dict)

    def key(self) -> str:
        """A short stable hash: the calibration cache folder of this machine + software + thread count."""
        blob = json.dumps({k: v for k, v in asdict(self).items() if k != "extra"}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def has(self, flag: str) -> bool:
        return flag in self.flags

    @property
    def bf16_native(self) -> bool:
        """Hardware bfloat16 matrix units: AVX512-BF16 or AMX on x86, the BF16 extension on Arm, or a CUDA GPU of
        compute capability >= 8.0 (Ampere)."""
        if self.gpu:
            return float(self.gpu_capability or 0) >= 8.0
        return any(self.has(f) for f in ("avx512_bf16", "amx_bf16", "bf16"))

    def describe(self) -> str:
        where = f"{self.gpu} (sm {self.gpu_capability})" if self.gpu else f"{self.cpu}, {self.cores} cores"
        return f"{where}; flags {' '.join(self.flags) or 'none'}; {self.threads} threads; torch {self.torch}"

    def to_dict(self) -> dict:
        return {**asdict(self), "key": self.key(), "bf16_native": self.bf16_native}


def cpu_flags(cpuinfo: str | None = None) -> tuple[str, ...]:
    """The FLAGS present in /proc/cpuinfo (first processor's `flags` or Arm's `Features` line)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return ()
    for line in cpuinfo.splitlines():
        if line.startswith(("flags", "Features")):
            have = set(line.split(":", 1)[1].split())
            return tuple(f for f in FLAGS if f in have)
    return ()


def cpu_name(cpuinfo: str | None = None) -> str:
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text() if cpuinfo is None else cpuinfo
        for line in cpuinfo.splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(pkg: str) -> str:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return "absent"


def current(threads: int | None = None, device: str = "cpu") -> Fingerprint:
    """This machine as a run with `threads` threads on `device` sees it."""
    import torch

    gpu = cap = None
    if str(device).startswith("cuda") and torch.cuda.is_available():
        index = torch.device(device).index or 0
        gpu = torch.cuda.get_device_name(index)
        cap = "%d.%d" % torch.cuda.get_device_capability(index)
    return Fingerprint(cpu_name(), cpu_flags(), os.cpu_count() or 1, threads or torch.get_num_threads(),
                       _version("torch"), _version("transformers"), platform.machine(), gpu, cap)


def resolve_device(device: str) -> str:
    """`auto` as this machine has it; a one-line ValueError for a device that is not cpu, cuda or cuda:N."""
    import torch
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise ValueError(f"unknown device '{device}'; valid: cpu, cuda, auto")
    return device
