"""Other engines' rows in `speed` (llama.cpp: methods/llamacpp.py): what certifies their tokens, and the verify cost
curve their folder records beside bpdbench's.

Certification: every method's tokens are compared with its baseline's (`MethodSpec.baseline`): `ar` for this
engine's methods, as always; `llamacpp` for llama.cpp's speculative mode. bpdbench's near-tie certificate
(experiments/certificate.py) recomputes bpdbench's own logits, which says nothing about llama.cpp's kernels, so a
divergence from llama.cpp's greedy gets the same rule on llama.cpp's logits (`near_tie_against`): near-tie when the
method's token trails the greedy one by no more than llama.cpp's batched and 1-token evaluations differ by there.
Any other engine's divergence is lost. An engine's own greedy (`llamacpp`, its own baseline) is checked across its repeats only,
and how many of its leading tokens equal ar's is recorded as information (`tokens_equal_ar`), never as a failure:
another engine rounds differently, so its greedy output may leave ours at a near-tie and never come back.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Callable, Iterable

from .. import paths
from ..config import ConfigError
from ..methods import Method
from .reference import first_divergence

AR = "ar"
LLAMACPP = "llamacpp"       # llama.cpp's greedy: its speculative mode's baseline, certified on its own logits


def baselines(methods: Iterable[Method]) -> dict[str, str]:
    """label -> the label whose tokens certify it."""
    return {m.label: m.spec.baseline for m in methods}


def check(methods: Iterable[Method]) -> None:
    """A method certified against another engine's greedy needs that greedy in the same run (one line, before any
    model loads)."""
    methods = list(methods)
    labels = {m.label for m in methods}
    for m in methods:
        base = m.spec.baseline
        if base != AR and base not in labels:
            raise ConfigError(f"{m.label} is certified against {base}'s tokens; add {base} to --methods")


def lost_against(base: str) -> Callable[..., Any]:
    """A certifier with `certify_output`'s signature for a method whose baseline is another engine: every divergence
    is lost, named with its first differing token."""
    def certify(prompt: list[int], output: list[int], ref: list[int], width: int) -> Any:
        return SimpleNamespace(certificate="lost", divergence=first_divergence(output, ref),
                               reason=f"differs from {base}'s greedy (no near-tie certificate applies to another "
                                      f"engine's kernels)")
    return certify


def near_tie_against(base: str, context: Callable[[], Any], three_ways: Callable[..., tuple]) -> Callable[..., Any]:
    """A certifier with `certify_output`'s signature for a divergence from another engine's greedy, on that engine's
    logits: `three_ways(llm, prompt, decided, draft)` gives them one token at a time, teacher-forced and in a verify
    batch (methods/llamacpp.py); `context()` loads the engine once, at the first divergence."""
    held: list[Any] = []

    def certify(prompt: list[int], output: list[int], ref: list[int], width: int) -> Any:
        i = first_divergence(output, ref)
        if i >= len(ref) or i >= len(output):
            return SimpleNamespace(certificate="lost", divergence=i, reason=f"lengths differ ({len(output)} vs "
                                   f"{base}'s {len(ref)}) after an identical prefix: a stopping bug, not rounding")
        if not held:
            held.append(context())
        one, tf, block = three_ways(held[0], prompt, ref[:i], (output[i:] + ref[i:])[:max(width, 1)])
        if int(one.argmax()) != ref[i]:
            return SimpleNamespace(certificate="lost", divergence=i, reason=f"{base}'s greedy token {ref[i]} is not "
                                   f"the argmax of its logits recomputed here: its greedy did not reproduce")
        numeric = max([float(abs(tf - one).max())] + ([float(abs(block - one).max())] if block is not None else []))
        gap = float(one[ref[i]] - one[output[i]])
        if gap <= numeric:
            return SimpleNamespace(certificate="near_tie", divergence=i, reason=(
                f"the method's token trails {base}'s greedy one by {gap:.4g} logits, within the {numeric:.4g} that "
                f"its batched and 1-token evaluations differ by here (its quantized kernels)"))
        return SimpleNamespace(certificate="lost", divergence=i, reason=(
            f"the method's token trails {base}'s greedy one by {gap:.4g} logits, more than the {numeric:.4g} its "
            f"batched and 1-token evaluations differ by: a real divergence"))
    return certify


def certifiers(s) -> Callable[[str], Callable[..., Any]]:
    """baseline -> the certifier of a divergence from it, for a method certified against another engine: llama.cpp's
    near-tie rule on its own logits (one context, loaded at the run's first divergence), else lost."""
    from ..methods import llamacpp
    made: dict[str, Callable[..., Any]] = {}

    def of(base: str) -> Callable[..., Any]:
        if base not in made:
            made[base] = (near_tie_against(base, lambda: llamacpp.certifying(s.env), llamacpp.logits_three_ways)
                          if base == LLAMACPP else lost_against(base))
        return made[base]
    return of


def compared(base: str, tokens: list[int], ar_tokens: list[int]) -> dict:
    """What a record adds for a method certified against another engine: that baseline, and (information only) how
    many of its leading tokens equal ar's."""
    if base == AR:
        return {}
    same = first_divergence(tokens, ar_tokens)
    return {"baseline": base, "tokens_equal_ar": len(tokens) if same is None else same}


def engine_rows(methods: Iterable[Method], labels: Iterable[str]) -> list[Method]:
    """The methods of another engine that the run times (those not skipped)."""
    timed = set(labels)
    return [m for m in methods if m.spec.baseline != AR and m.label in timed]


def verify_curves(s, cal, methods: Iterable[Method], labels: Iterable[str], log: Callable[[str], None]
                  ) -> dict | None:
    """Both engines' verify cost curves at the same context, for config.json when llama.cpp rows run: n -> decode
    steps of one forward over n tokens, bpdbench's from its calibration, llama.cpp's measured once per machine
    (hardware/engine_curve.py), each in its own engine's 1-token steps. None without llama.cpp rows."""
    if not any(m.spec.name.startswith("llamacpp") for m in engine_rows(methods, labels)):
        return None
    from ..hardware import engine_curve
    from ..methods import llamacpp
    from ..nets.llamacpp import version
    path, file = llamacpp.gguf_of(s.env)
    threads = llamacpp.threads_of(s.env)
    curve = engine_curve.ensure(
        s.cfg.model, file["file"], file["sha256"], version(), threads,
        lambda: llamacpp.verifier(llamacpp.load(path, threads, llamacpp.context_of(s.env), logits_all=True)), log)
    ctx = curve.context
    return {"context": ctx, "ns": list(engine_curve.NS),
            "bpdbench": {str(n): round(cal.cost(n, context=ctx), 4) for n in engine_curve.NS},
            "llamacpp": {str(n): round(c, 4) for n, c in curve.fitted().items() if n in engine_curve.NS},
            "bpdbench_step_ms": round(cal.step_ms_at(ctx), 3), "llamacpp_step_ms": round(curve.step_ms, 3),
            "bpdbench_dtype": cal.dtype, "llamacpp_file": curve.file, "llamacpp_version": curve.version,
            "llamacpp_curve": paths.portable(engine_curve.cache_path(curve.model, curve.sha256, curve.version,
                                                                     curve.threads), hashed=False),
            "llamacpp_measured_at": curve.measured_at, "llamacpp_others_cores": curve.others_cores,
            "llamacpp_raw": {str(n): round(c, 4) for n, c in curve.cost.items()}}
