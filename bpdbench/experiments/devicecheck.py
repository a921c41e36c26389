"""`make gpu-check`'s measurement: what a decode step and a verify forward cost on an accelerator.

Why its own module: CI and most sessions have CPUs only, so the accelerator path (the KV cache, the tree buffers
kept on the device, the synchronised clocks) is measured only when a session has a GPU, in one short run that writes
everything it saw to one folder (`--parts`). `caches`: the same prompts decoded with the concatenating cache and the
preallocated one (engine/cache.py: tokens equal or certified near-ties; the ms per token choose `SLOT_DEVICES`).
`profile`: the share of a step the GPU spends in kernels. `calibration`: the forward cost curve the cost model reads
(hardware/calibration.py), with the cache decoding uses there. `hf` (not by default: it compiles for minutes):
transformers' generate, eager and compiled into CUDA graphs, the bound a captured step would reach.

`--random-weights DIR`: a machine that cannot have the weights (no registry, no Hub) builds the model of DIR's
config.json with random weights. Costs depend on shapes, not on values, so the step costs stand; acceptance and
speedups do not and are not measured from it.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import DynamicCache

from ..engine.cache import SlotCache
from ..engine.loop import Limits, generate
from ..hardware.calibration import measure, save
from ..hardware.fingerprint import current
from ..hardware.timing import synchronize
from ..models import load, resolve_dtype


def random_model(folder: str, dtype: torch.dtype, device: str):
    from transformers import AutoConfig, AutoModelForCausalLM
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(folder)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval().requires_grad_(False)


def save_with_tokenizer(model, source: str, folder: str) -> None:
    import shutil
    model.save_pretrained(folder)
    for f in Path(source).iterdir():
        if f.name.startswith("tokenizer") or f.name in ("generation_config.json", "chat_template.jinja"):
            shutil.copy(f, Path(folder) / f.name)


def decode(model, cache_kind, prompt: list[int], n: int) -> tuple[list[int], float]:
    """(tokens, ms per new token) of one AR decode with `cache_kind` in place of the engine's choice."""
    synchronize(model.device)
    t0 = time.perf_counter()
    tokens = generate(model, None, prompt, Limits(n), cache=lambda device, capacity: cache_kind(capacity)).tokens
    synchronize(model.device)
    return tokens, (time.perf_counter() - t0) * 1000 / n


def compare_caches(model, prompt: list[int], n: int, repeats: int, dtype: str) -> dict:
    """Both caches on one prompt, interleaved (a warm-up each first), medians; a difference in tokens gets the
    certificate speed gives a method's (near_tie within the dtype's rounding, or lost)."""
    kinds = {"concat": lambda capacity: DynamicCache(), "slots": SlotCache}
    times: dict[str, list[float]] = {k: [] for k in kinds}
    tokens = {}
    for r in range(repeats + 1):
        for k, make in kinds.items():
            tokens[k], ms = decode(model, make, prompt, n)
            if r:                               # the first round is the warm-up
                times[k].append(ms)
    medians = {f"{k}_ms_per_token": statistics.median(v) for k, v in times.items()}
    row = {"context": len(prompt), "new_tokens": n, **medians, "same_tokens": tokens["concat"] == tokens["slots"]}
    if not row["same_tokens"]:
        from .certificate import certify_output
        cert = certify_output(model, prompt, tokens["slots"], tokens["concat"], dtype, 1)
        row.update(cert.to_record(), divergence=cert.divergence, reference_reproduced=cert.reference_ok)
    return row


def gpu_busy(model, prompt: list[int], n: int) -> dict:
    """How much of an AR decode's wall time the GPU spends in kernels (torch.profiler): a small share means the step
    is bound by the host launching kernels, which a captured CUDA graph, not a faster kernel or cache, would cut."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    concat = lambda capacity: DynamicCache()        # noqa: E731
    decode(model, concat, prompt, 4)                                # warm
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        _, ms = decode(model, concat, prompt, n)
    kernels_us = sum(e.time_range.elapsed_us() for e in prof.events() if e.device_type == DeviceType.CUDA)
    return {"ms_per_token_profiled": ms, "kernel_ms_per_token": kernels_us / 1000 / n,
            "gpu_busy_share": kernels_us / 1000 / n / ms}


def hf_loop(model, prompt: list[int], n: int, repeats: int = 3) -> dict:
    """transformers' own generate on the same prompt: eagerly with its concatenating cache, then with its static
    cache, which it compiles into CUDA graphs on a GPU (torch.compile, reduce-overhead). How far a captured step
    could take a host-bound decode, before building one into our loop."""
    from transformers import GenerationConfig
    ids = torch.tensor([prompt], device=model.device)
    out = {}
    for name, extra in (("eager", {}), ("static_compiled", {"cache_implementation": "static"})):
        config = GenerationConfig(max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0, **extra)
        times = []
        for r in range(repeats + 2):                    # two warm-ups: the compile, then its first replay
            synchronize(model.device)
            t0 = time.perf_counter()
            model.generate(ids, generation_config=config)
            synchronize(model.device)
            if r >= 2:
                times.append((time.perf_counter() - t0) * 1000 / n)
        out[f"hf_{name}_ms_per_token"] = statistics.median(times)
        print(json.dumps({name: out[f"hf_{name}_ms_per_token"]}), flush=True)
    return out


PARTS = ("caches", "profile", "calibration", "hf")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--random-weights", metavar="DIR", help="a folder with config.json: its shapes, random weights")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--context", type=int, nargs="+", default=[128, 1024, 4096])
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--parts", default="caches,profile,calibration",
                    help=f"what to measure, of {','.join(PARTS)} (hf: transformers' generate, eager and compiled "
                         f"into CUDA graphs; its compile takes minutes)")
    ap.add_argument("--out", default="results/gpu-check")
    ap.add_argument("--save", metavar="DIR", help="with --random-weights: save that model (and DIR's tokenizer) here, "
                    "so `bpdbench speed --model DIR` runs every method's code path on the device")
    a = ap.parse_args(argv)
    parts = [p.strip() for p in a.parts.split(",") if p.strip()]
    if set(parts) - set(PARTS):
        sys.exit(f"devicecheck: --parts {a.parts!r}: choose from {', '.join(PARTS)}")
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit(f"gpu-check: torch {torch.__version__} sees no CUDA device; run it where a GPU and a CUDA build of "
                 f"torch are")
    name = (a.save or a.random_weights) if a.random_weights else a.model    # the calibration's key: what speed loads
    model = (random_model(a.random_weights, resolve_dtype(a.dtype), a.device) if a.random_weights
             else load(a.model, a.dtype, a.device)[0])
    if a.random_weights and a.save:
        save_with_tokenizer(model, a.random_weights, a.save)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    report = {"model": name, "random_weights": bool(a.random_weights), "dtype": a.dtype, "device": a.device,
              "gpu": torch.cuda.get_device_name() if a.device.startswith("cuda") else None,
              "machine": current(torch.get_num_threads(), a.device).to_dict(),
              "versions": {"torch": torch.__version__, "transformers": __import__("transformers").__version__},
              "decode": []}
    prompts = {ctx: torch.randint(0, model.config.vocab_size, (ctx,), generator=g).tolist() for ctx in a.context}
    first = prompts[a.context[0]]

    def write() -> None:       # after each part: a run cut by its time limit keeps what it measured
        (out / "devicecheck.json").write_text(json.dumps(report, indent=2, default=str))
    for ctx, prompt in (prompts.items() if "caches" in parts else ()):
        row = compare_caches(model, prompt, a.new_tokens, a.repeats, a.dtype)
        report["decode"].append(row)
        print(json.dumps(row), flush=True)
        write()
    if "profile" in parts and a.device.startswith("cuda"):
        report["profile"] = gpu_busy(model, first, 32)
        print(json.dumps(report["profile"]), flush=True)
        write()
    if "hf" in parts:
        report["hf"] = hf_loop(model, first, a.new_tokens)
        write()
    if "calibration" in parts:
        cal = measure(model, name, a.dtype, a.device, torch.get_num_threads(), log=print)
        report["calibration"] = cal.to_dict()
        save(cal)               # `bpdbench speed --model <name>` on this device reads it instead of measuring again
        write()
        print(f"one step {cal.step_ms:.2f} ms; 8 tokens {cal.cost(8):.2f}, 16 {cal.cost(16):.2f}, 64 "
              f"{cal.cost(64):.2f} steps")
    print(f"wrote {out / 'devicecheck.json'}")
    # a loss is a divergence the dtype's rounding does not explain; where greedy decoding does not even reproduce
    # its own tokens (random weights' near-flat logits, kernels chosen per shape), it is recorded, not failed
    lost = [r for r in report["decode"] if r.get("certificate") == "lost" and r.get("reference_reproduced", True)]
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
