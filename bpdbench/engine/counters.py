"""Raw integer counters and the one place where ratios are computed.

Every reported ratio is a ratio of sums over examples (never a mean of per-example ratios), so that long examples
weigh what they cost, as in Stern et al. and Spec-Bench.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class Counters:
    new_tokens: int = 0        # tokens emitted (after EOS / max-new-tokens truncation)
    serial_calls: int = 0      # forwards of the base model, prefill included (AR: one per token)
    steps: int = 0             # verify steps (BPD) or decode steps (AR) after the prefill
    drafted: int = 0           # draft tokens proposed to the verifier (best draft, per step)
    accepted: int = 0          # draft tokens that matched the base's greedy choice
    accepted_per_head: list[int] = field(default_factory=list)  # [j]: steps where draft position j was accepted
    hist: list[int] = field(default_factory=list)              # [a]: steps that accepted exactly a draft tokens
    verified: int = 0          # tokens the base scores in verify forwards: root + trie nodes (AR 1, chain of d: d+1)

    def record_step(self, drafted: int, accepted: int, verified: int | None = None) -> None:
        """One verify forward. `verified` is the size of the verified token trie, root included; the default,
        drafted + 1, is exact for a single chain draft (and AR, drafted = 0), not for several drafts."""
        self.serial_calls += 1
        self.steps += 1
        self.drafted += drafted
        self.accepted += accepted
        self.verified += drafted + 1 if verified is None else verified
        need = max(drafted, accepted) + 1
        self.hist += [0] * (need - len(self.hist))
        self.accepted_per_head += [0] * (need - 1 - len(self.accepted_per_head))
        self.hist[accepted] += 1
        for j in range(accepted):
            self.accepted_per_head[j] += 1

    def add(self, other: "Counters") -> "Counters":
        out = Counters(**asdict(self))
        for name in ("new_tokens", "serial_calls", "steps", "drafted", "accepted", "verified"):
            setattr(out, name, getattr(out, name) + getattr(other, name))
        out.hist = _add_lists(out.hist, other.hist)
        out.accepted_per_head = _add_lists(out.accepted_per_head, other.accepted_per_head)
        return out

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Counters":
        """Counters from a result record; files written before `verified` existed get drafted + steps, what every
        step would have verified with one chain draft (an undercount for multi-draft and tree methods)."""
        kw = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        if kw.get("verified") is None:
            kw["verified"] = kw.get("drafted", 0) + kw.get("steps", 0)
        return cls(**kw)


def _add_lists(a: list[int], b: list[int]) -> list[int]:
    n = max(len(a), len(b))
    return [(a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(n)]


def ratios(c: Counters) -> dict[str, float]:
    """Derived metrics from summed counters."""
    def div(x: float, y: float) -> float:
        return x / y if y else float("nan")
    out = {"block_efficiency": div(c.new_tokens, c.serial_calls),
           "acceptance_rate": div(c.accepted, c.drafted),
           "mean_accepted_per_step": div(c.accepted, c.steps)}
    for j, n in enumerate(c.accepted_per_head):
        out[f"head{j + 1}_accept"] = div(n, c.steps)
    return out
