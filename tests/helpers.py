"""Checks the drafters' tests share: lossless decoding with replay equal to real decoding, drafts that can never be
right accepting nothing, bad spellings failing in one line, and the small corpus the lookup databases are built
from. Each helper asserts inside, so the test that calls it fails on its own, at its own case (the assertion
messages name the case); it returns what the test goes on to check."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable

import pytest

from bpdbench.engine import Limits, generate, layers_of, replay, teacher_forced, teacher_forced_layers
from bpdbench.methods import MethodError, parse

VOCAB = 96          # the tiny model's (tests/conftest.py: make_tiny_model)


class _FreeClock:
    """`auto`'s step clock (experiments/autoshape.StepClock) with steps of 1e9 ms: drafting costs nothing, so a
    test's shapes depend on acceptance and its cost table alone, not on this machine's timing."""

    def tick(self, n: int = 4) -> None:
        pass

    def ms(self) -> float:
        return 1e9


FREE_DRAFTING = _FreeClock()


def eos_limits(model, prompt, eos_at: int | None, max_new: int) -> Limits:
    """`max_new` tokens, stopping at the token greedy decoding of `prompt` writes at `eos_at` (None: no EOS), so an
    EOS falls inside the output."""
    if eos_at is None:
        return Limits(max_new, frozenset())
    return Limits(max_new, frozenset({generate(model, None, list(prompt), Limits(max_new)).tokens[eos_at]}))


def never_written(greedy: list[int], vocab: int = VOCAB) -> list[int]:
    """The tokens greedy decoding does not write here (drafts made of them are always wrong)."""
    seen = set(greedy)
    return [t for t in range(vocab) if t not in seen]


def decode_and_replay(model, drafter, prompt, limits: Limits, greedy: list[int] | None = None, hidden=None,
                      features: bool = False, label=None, **replay_options):
    """Decode `prompt` with `drafter`: the output must be greedy decoding's, and replaying the drafter on it must
    give the same counters. `hidden`: the base's states for the replay (`features`: computed here, prompt rows
    included, as feature drafters see them at prefill; neither: None). The real decoding, for the caller's own
    checks of what it accepted."""
    prompt = list(prompt)
    if greedy is None:
        greedy = generate(model, None, prompt, limits).tokens
    real = generate(model, drafter, prompt, limits)
    assert real.tokens == greedy, label
    if features:
        hidden = teacher_forced(model, prompt, greedy, with_prompt=True)
        layers = layers_of(drafter)
        if layers is not None and "layer_states" not in replay_options:     # a drafter that reads chosen layers
            replay_options["layer_states"] = teacher_forced_layers(model, prompt, greedy, layers.indices,
                                                                   with_prompt=True)[1]
    sim = replay(drafter, prompt, greedy, hidden, limits, **replay_options)
    assert sim.to_dict() == real.counters.to_dict(), (label, prompt)
    return real


def assert_wrong_drafts_accept_nothing(model, make: Callable[[int], object], prompt, limits: Limits):
    """`make(wrong)`: a drafter that drafts only `wrong`, a token greedy decoding never writes here. The output stays
    greedy decoding's, the drafter drafts, and nothing it drafts is accepted."""
    greedy = generate(model, None, list(prompt), limits)
    ours = generate(model, make(min(never_written(greedy.tokens))), list(prompt), limits)
    assert ours.tokens == greedy.tokens
    assert ours.counters.accepted == 0 and ours.counters.drafted > 0
    return ours


def parse_error(spelling: str) -> str:
    """The message of the MethodError that parsing `spelling` raises; it must be one line."""
    with pytest.raises(MethodError) as e:
        parse(spelling)
    message = str(e.value)
    assert "\n" not in message, message
    return message


def write_corpus(root: Path) -> Path:
    """A data folder whose C4 corpus file holds 30 short documents about a cat and a dog (the lookup databases'
    fixture corpus)."""
    corpus = root / "corpus"
    corpus.mkdir(parents=True)
    rows = [{"text": f"the cat sat on the mat number {i}. the dog sat on the log."} for i in range(30)]
    (corpus / "c4_en_validation_2k.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return root


PAGE_FILE = re.compile(r"^File: `([^`]+)` \((new|edit)\)$")


def page_files(lines: list[str]) -> dict[str, tuple[str, str]]:
    """The files a docs page tells a user to create or edit (a line "File: `path` (new|edit)" above a code block):
    path -> (new|edit, the code block under its line). The how-to pages' tests write and run exactly these."""
    out: dict[str, tuple[str, str]] = {}
    for i, line in enumerate(lines):
        m = PAGE_FILE.match(line.strip())
        if m:
            start = next(k for k in range(i + 1, len(lines)) if lines[k].startswith("```"))
            end = next(k for k in range(start + 1, len(lines)) if lines[k].startswith("```"))
            assert m.group(1) not in out, f"the page names {m.group(1)} twice"
            out[m.group(1)] = (m.group(2), "\n".join(lines[start + 1: end]) + "\n")
    return out
