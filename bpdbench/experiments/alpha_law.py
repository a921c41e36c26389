"""`bpdbench alpha-law`: the speculative-decoding law E[tokens per target call] = (1 - α^(γ+1)) / (1 - α), measured.

Leviathan et al. derive the law assuming every draft position is accepted independently with one probability α
(α = E[sum_x min(p(x), q(x))] at T > 0; at T = 0, the chance that the draft's argmax is the target's). We decode
with `sps` (a draft-model chain, γ = γ_max) and log, per verify step, how many draft tokens were accepted (A) and,
at T > 0, β = sum min(p, q) at every position the rule tried (engine.sampling records it).

Measured tokens per call for γ = g <= γ_max is 1 + mean over steps of min(A, g): a γ = g step at the same context
would test the same first g draft tokens with the same draws and accept min(A, g) of them (exact per step at T = 0,
where everything is deterministic; at T > 0 the same draws give the same decisions). Only steps that drafted the full
γ_max (not clipped by the token budget) count. Predictions use α two ways: α_trial (accepted / tried positions, what
the law's α is operationally) and, at T > 0, α_beta (mean β over tried positions, the law's definition). The gap
between measured and predicted is the law's independence assumption failing: acceptance at draft position j given
that j - 1 were accepted is not constant (`accept_given_reached` in the table shows it per position).
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ..config import ConfigError
from ..engine import StepEvent
from ..store import write_atomic
from .summary import to_markdown
from .command import Plan
from .session import Log

TEMPERATURES = (0.0, 0.7, 1.0)


def law(alpha: float, gamma: int) -> float:
    """(1 - α^(γ+1)) / (1 - α); γ + 1 at α = 1."""
    return gamma + 1.0 if alpha >= 1.0 else (1 - alpha ** (gamma + 1)) / (1 - alpha)


class StepLog:
    """A step observer (`engine.StepEvent`): per verify step (drafted, accepted, the β values the acceptance rule
    recorded during the step). `attach` the example's rule before decoding it."""

    def __init__(self):
        self.acceptance = None
        self.steps: list[tuple[int, int, list[float]]] = []
        self._seen = 0

    def attach(self, acceptance) -> None:
        self.acceptance, self._seen = acceptance, 0

    def __call__(self, ev: StepEvent) -> None:
        alphas = list(getattr(self.acceptance, "alphas", []))
        self.steps.append((len(ev.proposal.paths[0]), ev.decision.accepted, alphas[self._seen:]))
        self._seen = len(alphas)


def table(steps: list[tuple[int, int, list[float]]], temperature: float, gamma_max: int) -> pd.DataFrame:
    """One row per γ = 1..γ_max at one temperature, from the logged steps."""
    full = [(a, b) for d, a, b in steps if d == gamma_max]
    tried = sum(min(a + 1, gamma_max) for a, _ in full)
    accepted = sum(a for a, _ in full)
    betas = [x for _, b in full for x in b]
    alpha_trial = accepted / tried if tried else float("nan")
    alpha_beta = sum(betas) / len(betas) if betas else float("nan")
    rows = []
    for g in range(1, gamma_max + 1):
        reached = sum(1 for a, _ in full if a >= g - 1)
        per_step = [1 + min(a, g) for a, _ in full]
        mean = sum(per_step) / len(per_step) if per_step else None
        var = sum((x - mean) ** 2 for x in per_step) / (len(per_step) - 1) if len(per_step) > 1 else None
        rows.append({"temperature": temperature, "gamma": g, "n_steps": len(full),
                     "measured_tokens_per_call": mean,
                     "measured_se": (var / len(per_step)) ** 0.5 if var is not None else None,
                     "predicted_alpha_trial": law(alpha_trial, g),
                     "predicted_alpha_beta": law(alpha_beta, g) if betas else None,
                     "alpha_trial": alpha_trial, "alpha_beta": alpha_beta if betas else None,
                     "accept_given_reached": sum(1 for a, _ in full if a >= g) / reached if reached else None})
    df = pd.DataFrame(rows)
    df["gap_pct"] = 100 * (df.measured_tokens_per_call / df.predicted_alpha_trial - 1)
    df["gap_in_se"] = (df.measured_tokens_per_call - df.predicted_alpha_trial) / df.measured_se
    return df


def spelling(draft: str | None, gamma_max: int) -> str:
    """The one method alpha-law measures: an sps chain of gamma_max tokens (checked before the plan is made)."""
    if gamma_max < 1:
        raise ConfigError(f"--gamma-max must be >= 1, got {gamma_max}")
    return f"sps:gamma={gamma_max}" + (f",model={draft}" if draft else "")


def measure(s, plan: Plan, log: Log = print) -> Path:
    """Decode at each temperature, write alpha_law.csv / .md / .png, examples.csv, steps.jsonl, then config.json
    (the folder's lock is held: experiments/execute.py)."""
    o = plan.options
    gamma_max, temperatures = o.gamma_max, o.temperatures
    cfg, method, out = plan.cfg, plan.method, plan.out
    drafter, logged = s.drafter(method), StepLog()
    frames, per_example, steps_log = [], [], []
    for t in temperatures:
        st = s.cfg.replace(temperature=t or None)
        s.cfg = st
        logged.steps = []
        for i, ex in enumerate(s.examples):
            acc = s.acceptance(i)
            logged.attach(acc)
            gen = s.decode(drafter, s.prompt(ex), acc, on_step=logged)
            per_example.append({"temperature": t, "id": ex.id, "new_tokens": len(gen.tokens),
                                "serial_calls": gen.counters.serial_calls})
        frames.append(table(logged.steps, t, gamma_max))
        steps_log += [{"temperature": t, "drafted": d, "accepted": a, "beta": b} for d, a, b in logged.steps]
        log(f"T={t:g}: {len(logged.steps)} steps, alpha_trial {frames[-1].alpha_trial.iloc[0]:.3f}")
    df = pd.concat(frames, ignore_index=True)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "alpha_law.csv", df.to_csv(index=False))
    write_atomic(out / "alpha_law.md", to_markdown(df))
    write_atomic(out / "examples.csv", pd.DataFrame(per_example).to_csv(index=False))
    write_atomic(out / "steps.jsonl", "".join(json.dumps(r) + "\n" for r in steps_log))
    meta = s.meta([method], gamma_max=gamma_max, temperatures=list(temperatures))
    meta["config"]["temperature"] = None      # one run per temperature, listed above
    write_atomic(out / "config.json", json.dumps(meta, indent=2, default=str))
    from .figures import plot_alpha_law
    plot_alpha_law(df, out / "alpha_law.png", f"{cfg.model}, {cfg.dtype}, draft "
                   f"{meta['resolved']['methods'][method.label]['draft_model']}, {cfg.task}, "
                   f"n = {len(s.examples)} prompts x {s.limits.max_new_tokens} tokens")
    return out
