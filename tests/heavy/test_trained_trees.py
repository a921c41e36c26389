"""`auto` for the trees of trained draft networks (heavy: it trains two tiny networks, minutes of CPU)."""
from __future__ import annotations

import pytest

from tests.unit.test_shapes import session_for  # noqa: F401  (fixture)


@pytest.mark.train          # trains two tiny drafters (about 2 minutes on 2 cores before the fp32 fit)
def test_auto_for_trained_drafter_trees(session_for, tiny_model_dir, tmp_path):
    """tree=auto chooses a width and a depth jointly; depth=auto a chain's depth; decoding stays lossless."""
    from bpdbench import models
    from tests.drafter_fixtures import build_tiny_drafters
    model, tok = models.load(str(tiny_model_dir), "float32")
    build_tiny_drafters(model, tok, str(tiny_model_dir), tmp_path / "cache", names=("hydra", "eagle"))
    s, methods, logs, costs = session_for("hydra:tree=auto,eagle:depth=auto")
    prompt = s.prompt(s.examples[0])
    greedy = s.reference.get(prompt, s.limits)[0]
    for m in methods:
        d = s.drafter(m)
        auto = s.env.resolved[m.label]["auto"]
        assert s.decode(d, prompt).tokens == greedy, m.label
        if not auto["draft_nothing"]:
            assert d.depth == auto["params"]["depth"] == s.env.resolved[m.label]["depth"]
    hydra = s.env.resolved["hydra:tree=auto"]["auto"]
    assert {c["params"].get("tree") for c in hydra["curve"][1:]} == {0, 2, 3, 4, 6, 8}
    assert set(hydra["params"]) <= {"tree", "depth"}
    eagle = s.env.resolved["eagle:depth=auto"]["auto"]
    assert all(set(c["params"]) == {"depth"} for c in eagle["curve"][1:])
