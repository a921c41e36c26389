"""`ar:rows=N` (a decode step's forward padded to N rows by filler tokens), `ar:rows=auto` (the N this machine's
calibration prices lowest) and `null` (AR under its own label): token-identical to greedy decoding, filler kept only
where it is the greedy token, and the auto choice read from the cost curve."""
from __future__ import annotations

import pytest

from bpdbench.config import RunConfig
from bpdbench.engine import DraftContext, EmptyDrafter, Limits, generate, ratios
from bpdbench.hardware.calibration import Calibration
from bpdbench.hardware.shapes import TableCost, cheapest_rows
from bpdbench.methods import Env, parse
from bpdbench.methods.ar import PaddedRows
from bpdbench.methods.search import Cheapest
from tests.helpers import decode_and_replay

PROMPTS = [[1, 2, 3, 4, 5], [7, 3, 3, 9, 12, 40, 2], [50, 51, 52, 50, 51, 52, 50, 51], [90, 10, 80, 20, 70, 30]]
CHEAP_AT_1 = TableCost({2: 1.03, 3: 1.09, 4: 1.02, 6: 1.10, 8: 1.15})     # no row count beats one row
CHEAP_AT_4 = TableCost({2: 0.97, 3: 1.02, 4: 0.88, 6: 0.95, 8: 1.05})     # the EPYC's dip at 4 rows


def build(model, spelling: str, limits: Limits):
    env = Env(model, None, RunConfig(dtype="float32"), limits, log=lambda m: None)
    method = parse(spelling)
    return env.build(method), env


@pytest.mark.parametrize("rows", range(1, 9))
def test_padded_rows_decode_exactly_greedy(tiny_model, rows):
    """Every N, several prompts: greedy decoding's tokens, replay's counters equal real decoding's, and every
    forward that the budget allows carries N rows (the root and N - 1 filler tokens)."""
    limits = Limits(24)
    drafter, env = build(tiny_model, f"ar:rows={rows}", limits)
    assert isinstance(drafter, EmptyDrafter if rows == 1 else PaddedRows)
    assert drafter.name == ("ar:rows=1" if rows == 1 else f"ar:rows={rows}")
    for prompt in PROMPTS:
        real = decode_and_replay(tiny_model, drafter, prompt, limits, label=(rows, prompt))
        for (scored, _, _), made in zip(real.verify_log, _decided_before(real)):
            assert scored == min(rows, limits.max_new_tokens - made), (rows, prompt)
    if rows > 1:
        assert env.resolved[f"ar:rows={rows}"] == {"rows": rows}


def _decided_before(gen) -> list[int]:
    """Per verify step, the tokens decided before it (the prefill decided the first)."""
    out, made = [], 1
    for _, accepted in gen.step_log:
        out.append(made)
        made += accepted + 1
    return out


def test_padded_rows_stop_at_eos_like_greedy(tiny_model):
    prompt = PROMPTS[1]
    greedy = generate(tiny_model, None, prompt, Limits(24)).tokens
    limits = Limits(24, frozenset({greedy[9]}))
    drafter, _ = build(tiny_model, "ar:rows=6", limits)
    decode_and_replay(tiny_model, drafter, prompt, limits)


def test_the_filler_follows_the_latest_earlier_occurrence():
    d = PaddedRows("ar:rows=5", 5)
    d.reset([])
    assert d.propose(DraftContext([4, 9, 4, 7, 4], None, 100)).paths == [[7, 4, 7, 4]]   # 4 -> 7 (latest), 7 -> 4
    assert d.propose(DraftContext([4, 9, 4, 7, 4, 9], None, 100)).paths == [[4, 9, 4, 9]]  # grown: 4 -> 9 now
    assert d.propose(DraftContext([3, 8], None, 100)).paths == [[8, 8, 8, 8]]   # a new context: no successor of 8
    assert d.propose(DraftContext([3, 8], None, 2)).paths == [[8, 8]]           # the budget caps the rows
    assert d.propose(DraftContext([3, 8], None, 0)).paths == [[]]               # and at none, a plain step


def test_lucky_filler_is_kept(tiny_model):
    """A context whose continuation repeats what it already holds: the filler guesses right and those tokens are
    accepted, so the step decides more than one token (block efficiency > 1), still exactly greedy decoding."""
    limits = Limits(40)
    seed = PROMPTS[0]
    first = generate(tiny_model, None, seed, Limits(40)).tokens
    prompt = seed + first + seed               # the same text again: greedy continues as it did (tiny model: often)
    drafter, _ = build(tiny_model, "ar:rows=4", limits)
    real = decode_and_replay(tiny_model, drafter, prompt, limits)
    assert real.counters.accepted > 0 and ratios(real.counters)["block_efficiency"] > 1.0
    plain = generate(tiny_model, None, prompt, limits)
    assert ratios(plain.counters)["block_efficiency"] == 1.0


def test_null_is_ar_under_its_own_label(tiny_model):
    limits = Limits(16)
    drafter, _ = build(tiny_model, "null", limits)
    assert isinstance(drafter, EmptyDrafter) and drafter.name == "null" and parse("null").label == "null"
    out = decode_and_replay(tiny_model, drafter, PROMPTS[0], limits)
    assert out.counters.drafted == 0 and out.counters.serial_calls == len(out.tokens)


# ---- rows=auto: the cheapest forward on this machine's curve -------------------------------------------------------

def test_cheapest_rows_picks_the_lowest_cost_ties_to_the_smaller():
    assert cheapest_rows({2: 1.03, 4: 1.02}).draft_nothing
    s = cheapest_rows({2: 0.97, 3: 1.02, 4: 0.88, 6: 0.95, 8: 1.05})
    assert s.params == {"rows": 4} and not s.draft_nothing and s.verify_cost == 0.88 and s.tokens_per_step == 1.0
    assert s.speedup == pytest.approx(1 / 0.88) and len(s.curve) == 6
    assert cheapest_rows({2: 0.90, 4: 0.895}).params == {"rows": 2}          # within 1%: the smaller wins
    assert cheapest_rows({2: 0.995}).draft_nothing                            # a percent is no saving


@pytest.mark.parametrize("curve,rows", [(CHEAP_AT_1, None), (CHEAP_AT_4, 4)])
def test_cheapest_search_reads_the_curve(curve, rows):
    method = parse("ar:rows=auto")
    assert method.auto == ["rows"] and isinstance(method.spec.shapes, Cheapest)
    assert method.spec.shapes.plans(None, method) == [] and not method.spec.shapes.replays
    shape = method.spec.shapes.choose(method, [], curve, lambda *a: 0.0)
    assert shape.draft_nothing == (rows is None) and shape.params == ({} if rows is None else {"rows": rows})


def test_calibration_unfitted_keeps_the_dip():
    """The fitted curve floors a dip at one step (timing noise for drafts); padded rows read the measured points,
    averaged over the contexts."""
    cal = Calibration(model="m", dtype="bfloat16", device="cpu", threads=2, fingerprint={}, step_ms=60.0,
                      contexts=[128, 1024], chain={128: {1: 1.0, 2: 1.0, 4: 0.96, 8: 1.2},
                                                   1024: {1: 1.0, 2: 0.98, 4: 0.80, 8: 1.1}},
                      tree={128: {}, 1024: {}}, prefill_tok_per_s=1000.0)
    assert cal.cost(4) >= 1.0 and cal.unfitted(4) == pytest.approx(0.88) and cal.unfitted(1) == 1.0
    assert cal.unfitted(3) == pytest.approx((0.98 + 0.89) / 2)               # between measured points
    assert cheapest_rows({n: cal.unfitted(n) for n in range(2, 9)}).params == {"rows": 4}


@pytest.fixture
def session_for(tiny_model_dir, tmp_path, monkeypatch):
    from conftest import write_prompts
    from bpdbench.experiments import autoshape, session
    from bpdbench.experiments.plan import prepare
    from bpdbench.methods import parse_list
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path / "cache"))
    costs = {"cost": CHEAP_AT_4}
    monkeypatch.setattr(autoshape, "cost_model", lambda s: costs["cost"])
    monkeypatch.setattr(autoshape, "heldout", lambda *a, **k: pytest.fail("rows=auto replays nothing"))
    prompts = write_prompts(tmp_path, 4)

    def make(methods: str):
        logs: list[str] = []
        run = RunConfig(task="prompts", data_file=str(prompts), model=str(tiny_model_dir), dtype="float32",
                        max_new_tokens=16, heads_profile="init", limit=2)
        ms = parse_list(methods)
        return session.open_session(prepare(run, "replay", ms, log=logs.append), logs.append), ms, logs, costs
    return make


def test_rows_auto_resolves_records_and_tags_ar(session_for):
    s, (m,), logs, costs = session_for("ar:rows=auto")
    d = s.drafter(m)
    rec = s.env.resolved["ar:rows=auto"]
    assert isinstance(d, PaddedRows) and d.fill == 3 and d.name == "ar:rows=auto" and rec["rows"] == 4
    assert rec["auto"]["params"] == {"rows": 4} and rec["auto"]["verify_cost"] == 0.88
    assert "calibration" in rec["auto"]["heldout"]["source"]
    assert s.meta([m])["resolved"]["methods"]["ar:rows=auto"]["auto"]["params"] == {"rows": 4}
    assert any(line.startswith("ar:rows=auto -> rows=4 (predicted 1.14x AR") for line in logs), logs
    prompt = s.prompt(s.examples[0])
    assert generate(s.model, d, prompt, s.limits).tokens == generate(s.model, None, prompt, s.limits).tokens
    costs["cost"] = CHEAP_AT_1                                        # one row cheapest: plain AR, tagged so
    s.env.resolved.clear()
    d1 = s.drafter(m)
    assert isinstance(d1, EmptyDrafter) and d1.name == "ar:rows=auto"
    assert s.env.resolved["ar:rows=auto"]["draft_nothing"] is True
    assert any("ar:rows=auto -> draft nothing" in line for line in logs)


def test_the_null_label_survives_a_result_csv(tmp_path):
    """pandas reads the string null as missing; result CSVs are read through store.read_table, which keeps it."""
    import pandas as pd
    from bpdbench.store import read_table
    path = tmp_path / "speed.csv"
    pd.DataFrame({"method": ["ar", "null", "pld"], "speedup_vs_ar": [1.0, None, 1.2]}).to_csv(path, index=False)
    assert pd.read_csv(path).method.isna().sum() == 1                      # the trap
    df = read_table(path)
    assert df.method.tolist() == ["ar", "null", "pld"] and df.speedup_vs_ar.isna().tolist() == [False, True, False]


def test_the_documented_choice_on_the_committed_epyc_curve():
    """docs/hardware.md's example: on the committed AVX512-BF16 EPYC curve rows=auto chooses 2 rows, logged as the
    page says."""
    import json
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    path = root / "results/calibration/afcf1aeb72d2/qwen2.5-coder-0.5b-bfloat16-cpu-onednn.json"
    if not path.exists():
        pytest.skip(f"{path.name} is not in this checkout")
    cal = Calibration.from_dict(json.loads(path.read_text()))
    shape = cheapest_rows({n: cal.unfitted(n) for n in range(2, 9)})
    assert shape.params == {"rows": 2} and cal.cost(2) >= 1.0                # the fitted curve cannot see it
    line = shape.describe("ar:rows=auto")
    assert " ".join(line.split()) in " ".join((root / "docs/hardware.md").read_text().split()), line
