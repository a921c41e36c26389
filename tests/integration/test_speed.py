"""`bpdbench speed` on a tiny model: result files, identical outputs across methods, speedup arithmetic."""
from __future__ import annotations

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from bpdbench import paths
from bpdbench.experiments.plan import prepare
from bpdbench.experiments import speed
from bpdbench.methods import hf as hf_methods
from bpdbench.cli import app
from tests.conftest import seed_calibration, write_prompts

METHODS = ["ar", "bpd", "bpd:threshold=0.3", "16best-0gram", "medusa", "pld", "hf-greedy", "hf-pld"]


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("BPDBENCH_RESULTS", str(tmp_path / "results"))  # alpha lookups must not see the repo's


@pytest.fixture()
def calibrated(calibrated_cache, tmp_path):
    """The machine's calibration already in the test's cache, for the tests whose subject is not its first use
    (test_speed_writes_results_and_all_methods_identical measures it on first use)."""
    seed_calibration(calibrated_cache, tmp_path / "cache")


@pytest.fixture()
def prompts_file(tmp_path):
    return write_prompts(tmp_path, 3)


def cli(*args):
    result = CliRunner().invoke(app, [str(a) for a in args])
    return result.exit_code, result.output


def speed_cli(model_dir, prompts_file, out, methods, *extra):
    return cli("speed", "--task", "prompts", "--data-file", prompts_file, "--model", model_dir, "--heads-profile",
               "init", "--dtype", "float32", "--threads", "1", "--methods", ",".join(methods),
               "--limit", "2", "--repeats", "2", "--max-new-tokens", "12", "--out", out, *extra)


def test_speed_writes_results_and_all_methods_identical(tiny_model_dir, prompts_file, tmp_path):
    out = tmp_path / "speed"
    code, text = speed_cli(tiny_model_dir, prompts_file, out, METHODS)
    assert code == 0, text
    assert {p.name for p in out.iterdir()} >= {"speed.jsonl", "speed.csv", "config.json"}
    csv = pd.read_csv(out / "speed.csv")
    assert list(csv.method) == METHODS
    for col in ("n_prompts", "n_identical", "tokens", "seconds", "tokens_per_s", "speedup_vs_ar",
                "block_efficiency", "step_cost", "median_spread"):
        assert col in csv.columns
    assert (csv.n_prompts == 2).all() and (csv.n_identical == 2).all(), text  # float32: exact ties only
    ar = csv.set_index("method").loc["ar"]
    assert ar.speedup_vs_ar == 1.0 and ar.block_efficiency == 1.0
    assert (csv.tokens == ar.tokens).all()
    records = [json.loads(line) for line in (out / "speed.jsonl").read_text().splitlines()]
    assert len(records) == 2 * len(METHODS)
    assert all(len(r["times"]) == 2 and r["identical"] and r["first_divergence"] is None for r in records)
    config = json.loads((out / "config.json").read_text())
    assert config["methods"] == METHODS and config["repeats"] == 2
    assert "torch" in config["environment"]["versions"] and config["environment"]["dtype"] == "float32"
    assert "| method |" in text  # the Markdown table, rendered from the CSV
    assert config["environment"]["linear"] in ("torch", "onednn")
    assert (csv.n_counted == 2).all() and (csv.n_near_tie == 0).all()
    from bpdbench.hardware import calibration
    cal = calibration.cached(str(tiny_model_dir), "float32", "cpu", 1)
    assert cal is not None and set(cal.drafting_ms) >= {"bpd", "pld"}     # speed measured them for the machine
    assert not (out / "speed_by_category.csv").exists()  # `prompts` has no categories
    # predicted beside measured, from this machine's calibration of the same model (measured on first use)
    for col in ("predicted_speedup", "engine_efficiency", "verify_tokens_per_step", "speedup_ci_low",
                "speedup_ci_high", "block_efficiency_ci_low", "share_draft", "share_verify", "load_average_max"):
        assert col in csv.columns
    assert ar.predicted_speedup == 1.0 and ar.verify_tokens_per_step == 1.0
    ours = csv[~csv.method.str.startswith("hf-")]         # transformers' loops report no per-step counts
    assert (ours.predicted_speedup > 0).all() and (ours.engine_efficiency > 0).all()
    assert (csv.speedup_ci_low <= csv.speedup_vs_ar + 1e-9).all() and (csv.speedup_vs_ar <= csv.speedup_ci_high + 1e-9).all()
    assert all(r["verified"] >= r["serial_calls"] - 1 for r in records if not r["method"].startswith("hf-"))
    # acceptance per draft position from our loop's counters; transformers' loops have none, so none is written
    for r in records:
        assert len(r["repeat_serial_calls"]) == 2 and r["repeat_serial_calls"][0] == r["serial_calls"]
        if r["method"].startswith("hf-"):
            assert "steps" not in r and "accepted_per_head" not in r
        else:
            assert r["steps"] == r["serial_calls"] - 1 and sum(r["accepted_per_head"]) == r["repeat_accepted"][0]
    assert ar.repeat_drift == 1.0 and csv.repeat_drift.notna().all()        # two repeats: the check ran
    drafted = {r["method"] for r in records if r.get("accepted_per_head")}    # hf-* and ar: none; bpd drafts
    assert "bpd" in drafted and not {"ar", "hf-greedy", "hf-pld"} & drafted
    assert csv.accept_per_position.fillna("").str.len().gt(0).tolist() == [m in drafted for m in METHODS]


def test_speed_hf_assisted_with_tiny_model_as_its_own_assistant(tiny_model_dir, prompts_file, tmp_path, calibrated):
    out = tmp_path / "assisted"
    code, text = speed_cli(tiny_model_dir, prompts_file, out, ["hf-assisted"], "--assistant", tiny_model_dir)
    assert code == 0, text
    csv = pd.read_csv(out / "speed.csv").set_index("method")
    label = f"hf-assisted:assistant={tiny_model_dir}"   # --assistant M is hf-assisted:assistant=M
    assert list(csv.index) == ["ar", label]  # ar is always added as the baseline
    assert csv.loc[label, "n_identical"] == 2
    assert csv.loc[label, "block_efficiency"] > 1.0  # a self-draft is always accepted


def test_speed_resume_keeps_finished_prompts_and_redoes_the_one_in_flight(tiny_model_dir, prompts_file,
                                                                          tmp_path, calibrated):
    out = tmp_path / "resume"
    methods = ["ar", "bpd"]
    assert speed_cli(tiny_model_dir, prompts_file, out, methods)[0] == 0
    lines = (out / "speed.jsonl").read_text().splitlines()
    first = [json.loads(x) for x in lines[:2]]
    (out / "speed.jsonl").write_text("\n".join(lines[:3]) + "\n" + lines[3][:20])  # prompt 2 cut mid-write
    code, text = speed_cli(tiny_model_dir, prompts_file, out, methods, "--resume")
    assert code == 0 and "resuming: 1 prompts already measured" in text, text
    records = [json.loads(x) for x in (out / "speed.jsonl").read_text().splitlines()]
    assert len(records) == 4 and records[:2] == first  # the finished prompt was not re-timed
    assert pd.read_csv(out / "speed.csv").n_prompts.tolist() == [2, 2]
    code, text = speed_cli(tiny_model_dir, prompts_file, out, methods, "--resume", "--repeats", "1")
    assert code != 0 and "differs in repeats" in text


def _build(tiny_model_dir, monkeypatch, fallback):
    monkeypatch.setattr(hf_methods, "DEFAULT_ASSISTANT", str(tiny_model_dir))
    monkeypatch.setattr(hf_methods, "FALLBACK_ASSISTANT", fallback)
    from bpdbench.config import RunConfig
    from bpdbench.experiments.session import open_session
    from bpdbench.methods import parse_list
    logs = []
    cfg = RunConfig(task="prompts", data_file=str(write_prompts(tiny_model_dir.parent, 1)),
                    model=str(tiny_model_dir), dtype="float32", max_new_tokens=8)
    s = open_session(prepare(cfg, "replay"), logs.append)
    decoders, skipped = speed.decoders(s, parse_list("ar,hf-assisted"), logs.append)
    return decoders, {**s.env.resolved.get("hf-assisted", {}), "skipped": skipped}, logs


def test_target_equal_to_default_assistant_falls_back(tiny_model_dir, tmp_path, monkeypatch):
    """The default target has no smaller same-tokenizer sibling: the fallback assistant drafts for it."""
    import shutil
    other = tmp_path / "fallback"
    shutil.copytree(tiny_model_dir, other)
    decoders, resolved, logs = _build(tiny_model_dir, monkeypatch, str(other))
    assert list(decoders) == ["ar", "hf-assisted"] and not resolved["skipped"]
    assert resolved["assistant"] == str(other) and resolved["assistant_tokenizer"] == "same"
    assert decoders["hf-assisted"]([5, 6, 7], 0).tokens == decoders["ar"]([5, 6, 7], 0).tokens


def test_unavailable_fallback_assistant_is_skipped_with_reason(tiny_model_dir, monkeypatch):
    decoders, resolved, logs = _build(tiny_model_dir, monkeypatch, "no-such-model")
    assert list(decoders) == ["ar"] and "no-such-model" in resolved["skipped"]["hf-assisted"]
    assert len(logs) == 1 and logs[0].startswith("skipping hf-assisted")


def test_speed_by_category(tiny_model_dir, tmp_path, calibrated):
    path = tmp_path / "q.jsonl"
    rows = [{"question_id": i, "category": cat, "turns": [f"Question {i} about {cat}"]}
            for i, cat in enumerate(["writing", "math", "writing", "math", "qa"])]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "cat"
    code, text = cli("speed", "--task", "spec_bench", "--data-file", path, "--model", tiny_model_dir,
                     "--dtype", "float32", "--threads", "1", "--methods", "ar,hf-greedy", "--per-category", "1",
                     "--repeats", "1", "--max-new-tokens", "6", "--out", out)
    assert code == 0, text
    by_cat = pd.read_csv(out / "speed_by_category.csv")
    assert sorted(set(by_cat.category)) == ["math", "qa", "writing"]
    assert len(by_cat) == 6 and (by_cat.n_prompts == 1).all()
    from bpdbench.report.tables import build                  # the per-category figure is drawn from these files
    (tmp_path / "res" / "speed").mkdir(parents=True)
    (out).rename(tmp_path / "res" / "speed" / "cat")
    written = build(tmp_path / "res")
    png = tmp_path / "res" / "tables" / "speed_by_category_cat.png"
    assert png in written and png.stat().st_size > 0


def test_unknown_method_is_one_line_error(tiny_model_dir, prompts_file, tmp_path):
    code, text = speed_cli(tiny_model_dir, prompts_file, tmp_path / "x", ["ar", "warp-drive"])
    assert code == 2 and "unknown method 'warp-drive'" in text


def _rec(pid, method, seconds, identical=True, tokens=10, calls=10, category=None, certificate=None):
    return {"id": pid, "category": category, "method": method, "tokens": tokens, "serial_calls": calls,
            "median_s": seconds, "spread": 0.1, "identical": identical, "first_divergence": None if identical else 3,
            "certificate": "exact" if identical else certificate, "diverged_tokens": 0 if identical else 7,
            "certificate_reason": None if identical else f"{certificate} reason"}


def test_speedup_counts_near_ties_and_never_lost_prompts():
    records = [_rec("a", "ar", 4.0), _rec("b", "ar", 6.0), _rec("c", "ar", 10.0),
               _rec("a", "bpd", 2.0, calls=4), _rec("b", "bpd", 2.0, calls=5), _rec("c", "bpd", 1.0, identical=False,
                                                                                  certificate="lost"),
               _rec("a", "hf-pld", 8.0, identical=False, certificate="near_tie"), _rec("b", "hf-pld", 3.0),
               _rec("c", "hf-pld", 20.0)]
    df = speed.summarize(records).set_index("method")
    assert df.loc["ar", "speedup_vs_ar"] == 1.0 and df.loc["ar", "n_identical"] == 3
    # bpd: c lost -> excluded: (4 + 6) / (2 + 2); tokens and calls only over a, b
    assert df.loc["bpd", "speedup_vs_ar"] == pytest.approx(2.5)
    assert df.loc["bpd", "n_counted"] == 2 and df.loc["bpd", "n_prompts"] == 3
    assert df.loc["bpd", "tokens"] == 20 and df.loc["bpd", "block_efficiency"] == pytest.approx(20 / 9)
    assert df.loc["bpd", "tokens_per_s"] == pytest.approx(20 / 4)
    # hf-pld: a is a certified near-tie -> counted: (4 + 6 + 10) / (8 + 3 + 20), its tokens after the divergence too
    assert df.loc["hf-pld", "speedup_vs_ar"] == pytest.approx(20 / 31)
    assert df.loc["hf-pld", "n_counted"] == 3 and df.loc["hf-pld", "n_identical"] == 2
    assert df.loc["hf-pld", "n_near_tie"] == 1 and df.loc["hf-pld", "near_tie_tokens"] == 7
    logs = []
    lost = speed.report_divergence(speed.summarize(records), records, logs.append)
    assert lost == ["bpd c@3 (lost reason)"]
    assert any(line.startswith("near-tie: hf-pld diverges from ar on 1/3") for line in logs)
    assert any(line.startswith("LOST: bpd c@3") for line in logs)


def test_speedup_per_category():
    records = [_rec("a", "ar", 4.0, category="x"), _rec("b", "ar", 6.0, category="y"),
               _rec("a", "bpd", 2.0, category="x"), _rec("b", "bpd", 1.0, category="y")]
    df = speed.summarize(records, ("category", "method")).set_index(["category", "method"])
    assert df.loc[("x", "bpd"), "speedup_vs_ar"] == 2.0 and df.loc[("y", "bpd"), "speedup_vs_ar"] == 6.0


def test_threshold_method_names_are_validated_up_front():
    from bpdbench.methods import MethodError, parse_list
    assert [m.label for m in parse_list("bpd-t0.3,bpd:threshold=0.3")] == ["bpd:threshold=0.3"]
    for bad, needle in (("bpd-tx", "not a float"), ("bpd-t1.5", "must be < 1"), ("bpd:threshold=nan", "finite"),
                        ("bpd:threshold=-1", "must be >= 0")):
        with pytest.raises(MethodError, match=needle):
            parse_list(bad)


def test_tables_render_speed_from_result_files(tiny_model_dir, prompts_file, tmp_path, calibrated):
    out = tmp_path / "results" / "speed" / "prompts"
    assert speed_cli(tiny_model_dir, prompts_file, out, ["ar", "bpd"])[0] == 0
    code, text = cli("tables", "--results", tmp_path / "results")
    assert code == 0, text
    table = pd.read_csv(tmp_path / "results" / "tables" / "speed.csv").set_index("method")
    assert table.loc["ar", "task"] == "prompts" and table.loc["ar", "speedup_vs_ar"] == 1.0
    assert table.loc["ar", "model"] == paths.portable(tiny_model_dir)      # a model folder, recorded portably
    assert table.loc["bpd", "threads"] == 1 and table.loc["bpd", "repeats"] == 2
    assert table.loc["bpd", "max_new_tokens"] == 12 and table.loc["bpd", "dtype"] == "float32"
    # a speed-* folder is a study, on the machine's studies page (which page a bare glob lists first is the file
    # system's order: this machine page said "no board yet" on one machine and passed on others)
    studies = list((tmp_path / "results" / "tables" / "leaderboard").glob("*-studies.md"))
    assert len(studies) == 1 and "Speed, ranked by speedup" in studies[0].read_text()


def test_prediction_and_bootstrap_on_hand_made_records():
    """prefill + steps x step x c(verified per step) + drafting, against AR's prefill + tokens x step; intervals
    contain the point estimate and shrink to it when every prompt agrees."""
    from bpdbench.experiments import prediction
    from bpdbench.stats import bootstrap_ratio

    class Cal:
        step_ms, prefill_tok_per_s = 100.0, 1000.0

        def seconds_for(self, n, tree=False, context=None, rows=None):
            return 0.1 * (1.0 if n <= 1 else 2.0)

    ar = {"id": "a", "method": "ar", "prompt_tokens": 100, "tokens": 10, "serial_calls": 11, "verified": 10,
          "draft_s": 0.0}
    bpd = {"id": "a", "method": "bpd", "prompt_tokens": 100, "tokens": 10, "serial_calls": 5, "verified": 16,
           "draft_s": 0.04}
    p_ar, p_bpd = prediction.predict_record(ar, Cal()), prediction.predict_record(bpd, Cal())
    assert abs(p_ar["predicted_s"] - (0.1 + 10 * 0.1)) < 1e-9
    assert abs(p_bpd["predicted_s"] - (0.1 + 4 * 0.2 + 0.04)) < 1e-9 and p_bpd["verify_tokens_per_step"] == 4
    assert prediction.predict_record({**bpd, "verified": None}, Cal()) == {}      # transformers' loops
    mixed = {**bpd, "serial_calls": 5, "verified": 13, "verify_sizes": {"1": 3, "10": 1}}  # lookup: 3 misses, 1 hit
    assert abs(prediction.predict_record(mixed, Cal())["predicted_s"] - (0.1 + 3 * 0.1 + 0.2 + 0.04)) < 1e-9
    lo, hi = bootstrap_ratio([2.0, 2.0, 2.0], [1.0, 1.0, 1.0])
    assert lo == hi == 2.0
    lo, hi = bootstrap_ratio([1.0, 3.0, 2.0, 2.5], [1.0, 1.0, 1.0, 1.0])
    assert lo < 2.125 < hi
    assert bootstrap_ratio([1.0], [1.0]) != bootstrap_ratio([1.0], [1.0])        # nan: one prompt has no interval


def test_drafting_is_priced_at_the_calibrations_speed_by_ars_timing_of_the_same_prompt():
    """A host running at half the calibration's speed on one prompt and at its speed on another: every forward and
    every drafting second takes twice as long on the first. Priced by AR's timing of each prompt, the predicted
    speedup is the measured one; the drafting taken at face value (the control) predicts less."""
    from bpdbench.experiments import prediction

    class Cal:
        step_ms, prefill_tok_per_s = 100.0, 1000.0

        def seconds_for(self, n, tree=False, context=None, rows=None):
            return 0.1 * (1.0 if n <= 1 else 1.2)

    records = []
    for pid, slow in (("a", 2.0), ("b", 1.0)):
        ar = {"id": pid, "method": "ar", "prompt_tokens": 100, "tokens": 10, "serial_calls": 11, "verified": 10,
              "draft_s": 0.0, "median_s": slow * (0.1 + 10 * 0.1)}
        own = {"id": pid, "method": "qdraft", "prompt_tokens": 100, "tokens": 10, "serial_calls": 3, "verified": 10,
               "draft_s": slow * 0.3, "median_s": slow * (0.1 + 2 * 0.12 + 0.3)}
        records += [ar, own]
    raw = [dict(r) for r in records]
    for r in raw:
        r.update(prediction.predict_record(r, Cal()))
    priced = prediction.annotate([dict(r) for r in records], Cal())
    speedup = lambda rs, key: (sum(r[key] for r in rs if r["method"] == "ar")        # noqa: E731
                               / sum(r[key] for r in rs if r["method"] == "qdraft"))
    assert abs(speedup(priced, "predicted_s") - speedup(records, "median_s")) < 1e-9
    assert speedup(raw, "predicted_s") < 0.95 * speedup(records, "median_s")
    assert [r["host_factor"] for r in priced if r["method"] == "qdraft"] == [0.5, 1.0]


def test_a_peer_that_diverges_is_left_out_but_only_our_methods_fail_the_run():
    records = [_rec("a", "ar", 4.0), _rec("b", "ar", 6.0),
               _rec("a", "hf-pld", 8.0, identical=False, certificate="lost"), _rec("b", "hf-pld", 3.0),
               _rec("a", "bpd", 2.0, identical=False, certificate="lost"), _rec("b", "bpd", 2.0)]
    summary = speed.summarize(records)
    assert summary.set_index("method").loc["hf-pld", "n_counted"] == 1          # left out of its numbers
    logs = []
    lost = speed.report_divergence(summary, records, logs.append, peers=frozenset({"hf-pld"}))
    assert lost == ["bpd a@3 (lost reason)"]                                     # ours still fails the run
    assert any(line.startswith("PEER DIVERGED: hf-pld a@3") for line in logs)
