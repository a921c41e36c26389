"""The one auto-train rule, for every artefact a method needs and this machine can build.

A missing artefact is built on first use, said first with its expected time, where it goes and the command that
builds it alone, so a long run never starts a training silently. Under --no-auto-train (`auto_train = false`) an
artefact that takes more than a minute is refused instead, with that command; the one-minute ones (the `ci`
profiles, n-gram tables) are always built. Preflight checks (before the model loads) and the builders ask the same
`Need`, so a refusal comes before any model loads, worded the same everywhere.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

MINUTES = {"quick": 10, "full": 60, "bench": 120, "ci": 1}   # a trained profile's expected minutes on 2 CPU cores

# kind -> the function that builds it. The command runtime registers them (experiments.session.register_builders:
# the trainers' and a method's first use), so decoding code asks for a build by kind and never imports a trainer.
BUILDERS: dict[str, Callable[..., object]] = {}


def register(kind: str, fn: Callable[..., object]) -> None:
    BUILDERS[kind] = fn


def builder(kind: str) -> Callable[..., object]:
    """The registered builder of `kind`; a missing one means no command imported the training package."""
    try:
        return BUILDERS[kind]
    except KeyError:
        raise RuntimeError(f"no builder for {kind} is registered: call "
                           f"bpdbench.experiments.session.register_builders() first (the commands do)") from None


@dataclass(frozen=True)
class Need:
    what: str            # e.g. "'quick' heads for qwen2.5-coder-0.5b"
    command: str         # the command that builds it alone, e.g. "bpdbench train-heads --profile quick"
    minutes: float       # expected time to build it here
    label: str = ""      # the method asking, prefixed to a refusal ("hydra:tree=4: no ...")

    def allowed(self, auto_train: bool) -> bool:
        return auto_train or self.minutes <= 1

    def refusal(self) -> str:
        head = f"{self.label}: " if self.label else ""
        return f"{head}no {self.what} and --no-auto-train: run `{self.command}` (about {self.minutes:g} min)"

    def check(self, auto_train: bool, error: type[Exception] = FileNotFoundError) -> None:
        """Refuse now (preflight, or just before building) when the rule says so."""
        if not self.allowed(auto_train):
            raise error(self.refusal())

    def build(self, auto_train: bool, make: Callable[[], object], log: Callable[[str], None],
              where: Path | str | None = None, error: type[Exception] = FileNotFoundError) -> None:
        """Build it with `make` when the rule allows, said first; a place it cannot be written to is one line before
        the build starts, not after its minutes."""
        self.check(auto_train, error)
        if where is not None:
            from ..store.seal import check_writable
            check_writable(Path(where))
        into = f" into {where}" if where is not None else ""
        log(f"no {self.what} cached: building it now, about {self.minutes:g} min ({self.command}; "
            f"--no-auto-train refuses){into}")
        make()


def network_need(model: str, name: str, profile: str, label: str = "") -> Need:
    """A trained draft network (`name` as saved, e.g. koala-adv) of a profile: what a method's first use and the
    artefact graph's network node both say and check."""
    return Need(f"'{profile}' {name} drafter for {model}", f"bpdbench train-network {name} --profile {profile}",
                MINUTES[profile], label)


def warn_use(warning: str | None, where: str, log: Callable[[str], None]) -> None:
    """A run that loads a flagged artefact (held-out quality under its floor) says so: never used silently (loading
    happens once per run: Env caches it)."""
    if warning:
        log(f"WARNING: {where}: {warning} (recorded in the run's config.json and summary as quality_warning)")
