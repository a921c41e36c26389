"""Result folders and result files that must not be trusted, refused in one line before anything loads or is
written: a folder another command made, a prompt edited under --resume, a broken speed.csv, config.json, tuned-alpha
table or regression baseline. The cases of options and data files are test_bad_input.py's (whose helpers these use).
"""
from __future__ import annotations

import json
import shutil

import pytest

from tests.conftest import write_prompts
from tests.integration.test_bad_input import (base_args, cli, finished_run, isolated, snapshot,  # noqa: F401
                                               with_opts, write_lines)   # finished_run, isolated: fixtures


def refused(code: int, text: str, *expect: str) -> str:
    """The one `error:` line of a refused command, checked to hold every expected word."""
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in text, text
    for word in expect:
        assert word in errors[0], (word, errors[0])
    return errors[0]


@pytest.mark.parametrize("recorded", [True, False], ids=["records-command", "old-folder"])
def test_a_folder_of_another_command_is_refused(recorded, finished_run, tiny_model_dir, tmp_path):
    """`run --resume --out <a replay folder>` used to write run files there and overwrite the replay's config.json:
    the folder's command (config.json `command`; a folder written before it was recorded: its result file) is
    checked before the model loads, with or without --resume, and by every command."""
    _, prompts = finished_run
    replay = tmp_path / "replay"
    code, text = cli("replay", "--task", "prompts", "--data-file", prompts, "--model", tiny_model_dir,
                     "--heads-profile", "init", "--heads", "2", "--methods", "bpd", "--limit", "2",
                     "--max-new-tokens", "6", "--dtype", "float32", "--out", replay)
    assert code == 0, text
    meta = json.loads((replay / "config.json").read_text())
    assert meta["command"] == "replay"
    if not recorded:
        del meta["command"]
        (replay / "config.json").write_text(json.dumps(meta))
    before = snapshot(replay)
    args = base_args(prompts, tiny_model_dir, replay)
    for attempt in (args, [a for a in args if a != "--resume"]):
        refused(*cli(*attempt), str(replay), "`bpdbench replay`", "`bpdbench run`", "--out")
    refused(*cli("analyze", "--task", "prompts", "--data-file", prompts, "--model", tiny_model_dir,
                 "--heads-profile", "init", "--heads", "2", "--limit", "2", "--out", replay), "`bpdbench analyze`")
    assert snapshot(replay) == before


def test_a_folder_without_a_recorded_command_resumes_as_before(finished_run, tiny_model_dir, tmp_path):
    src, prompts = finished_run
    out = tmp_path / "run"
    shutil.copytree(src, out)
    meta = json.loads((out / "config.json").read_text())
    assert meta.pop("command") == "run"
    (out / "config.json").write_text(json.dumps(meta))
    code, text = cli(*base_args(prompts, tiny_model_dir, out))
    assert code == 0, text
    assert json.loads((out / "config.json").read_text())["command"] == "run"


def test_resume_after_a_prompt_changed_is_refused(tiny_model_dir, tmp_path):
    """Only the data file's path was compared, so a resumed run kept the old output for an edited prompt: each
    record states its prompt's hash, and a resume whose prompt for an id differs is refused before the model
    loads. A record written before the hash was recorded resumes as before."""
    prompts = write_prompts(tmp_path, 3)
    out = tmp_path / "run"
    args = with_opts(base_args(prompts, tiny_model_dir, out), limit="1")
    code, text = cli(*args)
    assert code == 0, text
    assert all(json.loads(x).get("prompt_sha256") for x in (out / "examples.jsonl").read_text().splitlines())
    lines = prompts.read_text().splitlines()
    prompts.write_text("\n".join([json.dumps({"id": "p0", "prompt": "An edited prompt"}), *lines[1:]]) + "\n")
    before = snapshot(out)
    line = refused(*cli(*with_opts(args, limit="2")), f"cannot resume {out}", "'p0'", "--out")
    assert "examples.jsonl" in line
    assert snapshot(out) == before
    old = [{k: v for k, v in json.loads(x).items() if k != "prompt_sha256"}
           for x in (out / "examples.jsonl").read_text().splitlines()]
    write_lines(out / "examples.jsonl", old)
    code, text = cli(*with_opts(args, limit="2"))
    assert code == 0 and "1 done" in text, text


SPEED_CSVS = [  # (case, speed.csv content, expected words besides the file's path)
    ("no-speedup-column", "method,n_prompts,seconds\nar,2,1.0\nbpd,2,0.5\n", ["no speedup_vs_ar column"]),
    ("empty", "", ["empty or not a readable CSV"]),
    ("cut-short", "method,n_prompts,speedup_vs_ar\nar,2,1.0\nbpd,2", [":3", "cut short"]),
]


@pytest.mark.parametrize("case,text,expect", SPEED_CSVS, ids=[c[0] for c in SPEED_CSVS])
def test_tables_refuse_a_broken_speed_csv_before_writing(case, text, expect, tmp_path):
    """A speed.csv without its speedup column used to rewrite the leaderboard with blank speedups (exit 0), and an
    empty one failed naming no file: refused in one line naming the file, with nothing written."""
    results = tmp_path / "results"
    (results / "speed" / "mt_bench").mkdir(parents=True)
    (results / "speed" / "mt_bench" / "speed.csv").write_text(text)
    before = snapshot(results)
    refused(*cli("tables", "--results", results), str(results / "speed" / "mt_bench" / "speed.csv"), *expect)
    assert snapshot(results) == before and not (results / "tables").exists()


@pytest.mark.parametrize("text,expect", [('{"config": {"task": ', "not valid JSON"), ("[1]", "no JSON object")],
                         ids=["bad-json", "not-an-object"])
def test_audit_names_a_broken_config_json(text, expect, tmp_path):
    results = tmp_path / "results"
    (results / "runs" / "a").mkdir(parents=True)
    (results / "runs" / "a" / "config.json").write_text(text)
    refused(*cli("audit", "--results", results), str(results / "runs" / "a" / "config.json"), expect)


ALPHA_FILES = [  # (case, file content or None for a directory, expected words)
    ("bad-json", '{"tiny/prompts/ngram2": 0.', ["not valid JSON"]),
    ("not-a-number", '{"tiny/prompts/ngram2": "high"}', ["tiny/prompts/ngram2", "'high'", "not a number"]),
    ("not-an-object", "[0.5]", ["no {"]),
    ("directory", None, ["is a directory"]),
]


@pytest.mark.parametrize("case,text,expect", ALPHA_FILES, ids=[c[0] for c in ALPHA_FILES])
def test_a_corrupt_alpha_file_is_refused_before_the_model_loads(case, text, expect, finished_run, tiny_model_dir,
                                                                 tmp_path):
    """A corrupt --alpha-file was read only by a rescorer's build, after the model loaded (and by `bpd` never)."""
    src, prompts = finished_run
    out = tmp_path / "run"
    shutil.copytree(src, out)
    table = tmp_path / "alpha.json"
    table.mkdir() if text is None else table.write_text(text)
    before = snapshot(out)
    code, text = cli(*with_opts(base_args(prompts, tiny_model_dir, out), alpha_file=table))
    refused(code, text, str(table), *expect)
    assert "━" not in text and snapshot(out) == before


BASELINES = [  # (case, baseline.json content, expected words)
    ("bad-json", '{"grid": {"tasks": ', ["not valid JSON"]),
    ("not-an-object", "[]", ["no `grid` and `results`"]),
    ("grid-lacks", '{"grid": {"tasks": {"xsum": 3}}, "results": {}}', ["grid has no methods"]),
    ("not-a-number", json.dumps({"grid": {"tasks": {"xsum": 3}, "methods": ["bpd"], "max_new_tokens": 4,
                                          "dtype": "float32", "heads_profile": "ci", "threads": 1},
                                 "results": {"xsum/bpd": {"block_efficiency": "1.3", "lossless_rate": 1.0}}}),
     ["results.xsum/bpd", "block_efficiency"]),
]


@pytest.mark.parametrize("case,text,expect", BASELINES, ids=[c[0] for c in BASELINES])
def test_a_corrupt_regress_baseline_is_named_before_the_grid_runs(case, text, expect, tmp_path):
    baseline = tmp_path / "baseline.json"
    baseline.write_text(text)
    refused(*cli("regress", "--baseline", baseline), str(baseline), "--update", *expect)
    assert baseline.read_text() == text
