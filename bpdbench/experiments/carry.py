"""Cross-example drafter state saved beside a result file, so `--resume` continues exactly where a run stopped.

A drafter that learns across examples (engine/state.py: Token Recycling with persist=1) decodes example n from what
examples 0..n-1 taught it. A resumed run that skipped the finished examples would start it cold and measure
something the uninterrupted run never did, so after each example the commands that resume (replay, speed) write the
state of every such drafter atomically to `<result>.state.json`, keyed to the selection's examples visited so far
in order. Order of writes: the example's record first, then the state; a crash between the two leaves a record the
state does not cover, which resuming drops and measures again (at most the example in flight). A resume whose
saved state cannot be the uninterrupted run's (missing, another selection's, another method's) is refused in one
line rather than measured from the wrong state.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from ..engine.state import restore, snapshot
from ..store import write_atomic


class CarriedState:
    """The state file of one result file; inert (writes nothing) when no drafter keeps state."""

    def __init__(self, path: Path, drafters: dict[str, Any], log: Callable[[str], None] = print):
        self.path, self.log = Path(path), log
        self.drafters = {m: d for m, d in drafters.items() if snapshot(d) is not None}

    @classmethod
    def beside(cls, out: Path, results: str, drafters: dict[str, Any], log: Callable[[str], None] = print
               ) -> "CarriedState":
        return cls(Path(out) / f"{Path(results).stem}.state.json", drafters, log)

    def start_fresh(self) -> None:
        """A new run: the initial states, no example visited (a stale file of an earlier run must never be read)."""
        if self.drafters:
            self.save([], set())
        elif self.path.exists():
            self.path.unlink()

    def save(self, visited: list[str], recorded: set[str]) -> None:
        """After an example's record is on disk: the states now, following the selection's first examples `visited`
        in order, of which `recorded` have records (the others were skipped: replay's outputs under 2 tokens)."""
        if self.drafters:
            write_atomic(self.path, json.dumps({"examples": list(visited), "recorded": sorted(recorded), "states": {
                m: snapshot(d) for m, d in self.drafters.items()}}, separators=(",", ":")))

    def open(self, resume: bool, selection: list[str], records: list[dict], jsonl) -> tuple[set[str], list[dict]]:
        """The one start of a run that carries state: fresh, or resumed (`resume`) with the records the saved state
        does not follow dropped from `jsonl` to be measured again. Returns (ids to skip, the records kept)."""
        if not resume:
            self.start_fresh()
            return set(), records
        skip, redo = self.resume(selection, {r["id"] for r in records})
        if redo:
            records = [r for r in records if r["id"] not in redo]
            jsonl.rewrite(records)
        return skip, records

    def resume(self, selection: list[str], done: set[str]) -> tuple[set[str], set[str]]:
        """Restore the saved states for a resumed run over `selection` (ids in order) where the records of `done`
        exist. Returns (ids to skip, ids whose records to drop and measure again: written after the last state).
        Raises ValueError (one line) when the saved state is not the uninterrupted run's at this point."""
        if not self.drafters:
            return set(done), set()
        names = ", ".join(self.drafters)
        refuse = f"cannot resume {self.path.parent}: {names} keeps state across examples and"
        if not self.path.exists():
            if done & set(selection) and any(i not in done for i in selection):
                raise ValueError(f"{refuse} {self.path.name}, the state after the examples done, is missing (an "
                                 f"older bpdbench?); drop --resume to measure again from the start")
            return set(done), set()
        saved = json.loads(self.path.read_text())
        visited, recorded, states = saved["examples"], set(saved["recorded"]), saved["states"]
        drop = set(done) - recorded
        if drop:
            self.log(f"resuming: {len(drop)} record(s) written after the last saved drafter state "
                     f"({', '.join(sorted(drop)[:3])}) are dropped and measured again")
        gone = (recorded - set(done)) & set(selection)      # records the state follows that are no longer there
        skip = (set(visited) - gone) | (set(done) - drop)
        if all(i in skip for i in selection):
            return skip, drop
        if gone:
            raise ValueError(f"{refuse} the records of {len(gone)} examples its saved state follows are gone from "
                             f"the results; drop --resume to measure again from the start")
        if selection[:len(visited)] != visited or any(m not in states for m in self.drafters):
            raise ValueError(f"{refuse} its saved state ({self.path.name}) follows examples that do not start this "
                             f"selection or other methods; select the same first examples or drop --resume")
        for m, d in self.drafters.items():
            restore(d, states[m])
        return set(visited), drop
