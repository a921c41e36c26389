"""CLI end to end on a tiny model: result files, certificate, resume after an interrupt, one-line errors."""
from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from bpdbench.experiments.plan import prepare
from bpdbench.experiments.execute import execute
from bpdbench.cli import app
from tests.conftest import write_prompts
from bpdbench.config import RunConfig


@pytest.fixture()
def prompts_file(tmp_path):
    return write_prompts(tmp_path, 5)


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path / "cache"))


def cli(*args):
    result = CliRunner().invoke(app, [str(a) for a in args])
    return result.exit_code, result.output


def test_run_writes_results_and_certifies(tiny_model_dir, prompts_file, tmp_path):
    out = tmp_path / "run"
    code, text = cli("run", "--task", "prompts", "--data-file", prompts_file, "--model", tiny_model_dir,
                     "--heads-profile", "init", "--heads", "4", "--limit", "3", "--max-new-tokens", "12",
                     "--dtype", "float32", "--out", out)
    assert code == 0, text
    records = [json.loads(line) for line in (out / "examples.jsonl").read_text().splitlines()]
    assert [r["id"] for r in records] == ["p0", "p1", "p2"]
    assert all(r["lossless"] and r["first_divergence"] is None for r in records)
    summary = pd.read_csv(out / "summary.csv")
    for col in ("task", "model", "method", "rescorer", "dtype", "n_examples", "new_tokens", "serial_calls",
                "block_efficiency", "lossless_rate", "seconds", "tokens_per_s"):
        assert col in summary.columns
    row = summary.iloc[0]
    assert row.new_tokens == sum(r["new_tokens"] for r in records)
    assert row.block_efficiency == row.new_tokens / row.serial_calls
    config = json.loads((out / "config.json").read_text())
    assert config["config"]["dtype"] == "float32" and "git_commit" in config["environment"]
    assert "torch" in config["environment"]["versions"] and config["environment"]["threads"] >= 1
    assert (out / "summary.md").read_text().startswith("| task |")
    # the terminal summary: the reader's columns, the certificate counts (not the bare lossless_rate), the file
    for col in ("method", "examples", "block efficiency", "certified (exact + near-tie)", "lost", "tokens/s"):
        assert col in text, text
    assert "3 of 3 outputs certified, 0 lost" in text and "lossless_rate" not in text, text
    assert f"{row.block_efficiency:.3f}" in text and str(out / "summary.csv") in text.replace("\n", ""), text


def test_ar_block_efficiency_is_exactly_one(tiny_model_dir, prompts_file, tmp_path):
    cfg = RunConfig(task="prompts", data_file=str(prompts_file), model=str(tiny_model_dir), method="ar", limit=4,
                    max_new_tokens=10, dtype="float32", out=str(tmp_path / "ar"))
    row = execute(prepare(cfg, "run"), log=lambda m: None)
    assert row["block_efficiency"] == 1.0 and row["lossless_rate"] == 1.0


def test_resume_after_interrupt_loses_nothing(tiny_model_dir, prompts_file, tmp_path):
    cfg = RunConfig(task="prompts", data_file=str(prompts_file), model=str(tiny_model_dir), heads_profile="init",
                    heads=2, limit=5, max_new_tokens=8, dtype="float32", out=str(tmp_path / "r"))
    seen = []

    def interrupt_after_two(record):
        seen.append(record["id"])
        if len(seen) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        execute(prepare(cfg, "run"), log=lambda m: None, progress=interrupt_after_two)
    lines = (tmp_path / "r" / "examples.jsonl").read_text().splitlines()
    assert len(lines) == 2
    with pytest.raises(FileExistsError):
        execute(prepare(cfg, "run"), log=lambda m: None)
    row = execute(prepare(cfg.replace(resume=True), "run"), log=lambda m: None)
    ids = [json.loads(line)["id"] for line in (tmp_path / "r" / "examples.jsonl").read_text().splitlines()]
    assert ids == ["p0", "p1", "p2", "p3", "p4"] and row["n_examples"] == 5


def test_resume_rejects_a_changed_config(tiny_model_dir, prompts_file, tmp_path):
    cfg = RunConfig(task="prompts", data_file=str(prompts_file), model=str(tiny_model_dir), heads_profile="init",
                    heads=2, limit=1, max_new_tokens=4, dtype="float32", out=str(tmp_path / "r"))
    execute(prepare(cfg, "run"), log=lambda m: None)
    with pytest.raises(ValueError, match=r"config.json differs in config.heads; pass a new --out"):
        execute(prepare(cfg.replace(resume=True, heads=1), "run"), log=lambda m: None)


def test_resume_rejects_other_heads_under_the_same_settings(tiny_model_dir, prompts_file, tmp_path):
    """Heads retrained between two runs of the same command: resuming would keep the old heads' examples under a
    config.json naming the new heads, so it refuses and names what differs."""
    from bpdbench.nets.heads import Heads, HeadsInfo, save

    def heads(where, seed):
        torch.manual_seed(seed)
        h = Heads(32, 2)
        for p in h.parameters():
            torch.nn.init.normal_(p, std=0.3)
        save(h, HeadsInfo(str(tiny_model_dir), 2, extra={"training": {"profile": "quick", "seconds": seed}}), where)
        return str(where)

    cfg = RunConfig(task="prompts", data_file=str(prompts_file), model=str(tiny_model_dir), heads=2, limit=1,
                    max_new_tokens=4, dtype="float32", heads_path=heads(tmp_path / "h", 1), out=str(tmp_path / "r"))
    execute(prepare(cfg, "run"), log=lambda m: None)
    execute(prepare(cfg.replace(resume=True, limit=2), "run"), log=lambda m: None)      # same heads: resumes
    heads(tmp_path / "h", 2)                                                          # retrained in place
    with pytest.raises(ValueError, match=r"config.json differs in heads.seconds; pass a new --out"):
        execute(prepare(cfg.replace(resume=True, limit=3), "run"), log=lambda m: None)


@pytest.mark.parametrize("args,needle", [
    (["--task", "nope"], "unknown task 'nope'; valid: lambada"),
    (["--method", "beam"], "unknown method 'beam'; valid: ar, null, bpd"),
    (["--method", "medusa", "--rescorer", "ngram4"], "name two methods; pass one"),
    (["--rescorer", "nope"], "unknown method 'nope'; valid: ar, null, bpd"),
    (["--method", "bpd:heads=0"], "bpd: heads must be >= 1, got 0"),
    (["--method", "bpd:depth=3"], "bpd: unknown parameter 'depth'; valid: heads, threshold"),
    (["--dtype", "int3"], "unknown dtype 'int3'"),
    (["--model", "no-such-model"], "unknown model 'no-such-model'; valid: qwen2.5-coder-0.5b"),
    (["--task", "prompts"], "pass --data-file"),
])
def test_bad_input_is_one_line_error(args, needle, tmp_path):
    code, text = cli("run", *args, "--out", tmp_path / "x")
    assert code == 2
    error = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and needle in error[0], text


def test_medusa_auto_without_a_heads_report_is_one_line_error(tiny_model_dir, prompts_file, tmp_path):
    code, text = cli("run", "--task", "prompts", "--data-file", prompts_file, "--model", tiny_model_dir,
                     "--heads-profile", "init", "--heads", "4", "--limit", "1", "--max-new-tokens", "6",
                     "--dtype", "float32", "--rescorer", "medusa-auto", "--out", tmp_path / "auto")
    error = [line for line in text.splitlines() if line.startswith("error:")]
    assert code == 2 and len(error) == 1 and "held-out agreement report" in error[0], text


def test_medusa_auto_with_a_heads_report_is_lossless(tiny_model_dir, prompts_file, tmp_path):
    """Heads saved with a training report (as train-heads writes it): the tree comes from its per-rank accuracy."""
    import torch
    from bpdbench.nets import heads as H
    from transformers import AutoConfig
    d = AutoConfig.from_pretrained(tiny_model_dir).hidden_size
    torch.manual_seed(0)
    h = H.Heads(d, 4)
    for p in h.parameters():
        torch.nn.init.normal_(p, std=0.3)
    report = {"profile": "test", "heldout": {"top1": [0.5, 0.3, 0.2, 0.1], "top16": [0.9, 0.7, 0.6, 0.5]}}
    H.save(h, H.HeadsInfo(str(tiny_model_dir), 4, extra={"training": report}), tmp_path / "heads")
    code, text = cli("run", "--task", "prompts", "--data-file", prompts_file, "--model", tiny_model_dir,
                     "--heads-path", tmp_path / "heads", "--heads", "4", "--limit", "2", "--max-new-tokens", "10",
                     "--dtype", "float32", "--rescorer", "medusa-auto", "--out", tmp_path / "auto")
    assert code == 0, text
    assert "63-node tree from the heads' held-out accuracy" in text
    row = pd.read_csv(tmp_path / "auto" / "summary.csv").iloc[0]
    assert row.lossless_rate == 1.0 and row.rescorer == "medusa-auto" and row.method == "medusa:tree=auto,heads=4"
    config = json.loads((tmp_path / "auto" / "config.json").read_text())
    assert config["resolved"]["heads"]["heldout"]["top1"][0] == 0.5


@pytest.mark.parametrize("method", ["medusa", "pld", "oracle:k=4", "16best-0gram:k=3", "bpd:heads=2,threshold=0.1"])
def test_every_spelling_works_in_run(method, tiny_model_dir, prompts_file, tmp_path):
    """`run --method` takes every registry spelling (it used to reject medusa: "drafting methods are rescorers")."""
    code, text = cli("run", "--task", "prompts", "--data-file", prompts_file, "--model", tiny_model_dir,
                     "--heads-profile", "init", "--heads", "4", "--limit", "2", "--max-new-tokens", "8",
                     "--dtype", "float32", "--method", method, "--out", tmp_path / "m")
    assert code == 0, text
    row = pd.read_csv(tmp_path / "m" / "summary.csv").iloc[0]
    # --heads 4 is part of what a method that reads it drafts, so its label names it
    named = {"medusa": "medusa:heads=4", "oracle:k=4": "oracle:k=4,heads=4", "16best-0gram:k=3": "16best-0gram:heads=4,k=3"}
    assert row.lossless_rate == 1.0 and row.method == named.get(method, method)
    from bpdbench.artefacts.cache import listing, unowned
    assert listing(tmp_path / "cache") and unowned(tmp_path / "cache") == []     # all of it registered artefacts


def test_methods_lists_every_registered_method():
    from bpdbench.methods import REGISTRY
    code, text = cli("methods")
    assert code == 0, text
    for name in REGISTRY:
        assert f"\n{name} " in "\n" + text
    assert "ngram4 " in text
    bpd = text.split("\nbpd ")[1].splitlines()[1]          # the graph's answer: there, or cost and command
    assert "heads (quick) present" in bpd or "heads (quick) to build, about" in bpd, bpd
    # the heads' distillation data is said where the heads are to be built (before them), and only there
    assert ("distillation data (heads-quick) to build" in bpd) == ("heads (quick) to build" in bpd), bpd


def test_methods_plan_says_what_a_run_would_build_where_and_how_long():
    """`bpdbench methods --plan <spellings>`: the artefact graph's answer for those methods alone, on an empty cache
    (this test's): every node to build with its minutes, command and path, and the total; a bad spelling is one line."""
    code, text = cli("methods", "--plan", "bpd,ngram4")
    assert code == 0, text
    lines = text.splitlines()
    heads = next(x for x in lines if x.startswith("heads (quick)"))
    assert "to build, about" in heads and "bpdbench train-heads" in heads and "into " in heads
    assert any(x.startswith("ngram4") for x in lines) and not any(x.startswith("hydra") for x in lines)
    assert lines[-1].startswith("bpd, ngram4 on qwen2.5-coder-0.5b: ") and "to build, about" in lines[-1]
    code, text = cli("methods", "--plan", "sam,hydra:profile=bench")     # what a first use builds: where, too
    lines = text.splitlines()
    index = next(x for x in lines if x.startswith("corpus suffix index"))
    assert code == 0 and "to build" in index and index.endswith("suffix-corpus.npz"), index
    hydra = next(x for x in lines if x.startswith("hydra drafter (bench)"))     # the spelling's profile, not quick's
    assert "about 120 min (bpdbench train-network hydra --profile bench) into " in hydra, hydra
    code, text = cli("methods", "--plan", "bpd:nope=1")
    assert code == 2 and len(text.strip().splitlines()) == 1 and "--plan: bpd: unknown parameter 'nope'" in text


def test_a_run_records_no_absolute_path(tiny_model_dir, prompts_file, tmp_path):
    """Every path a run's config.json records (out, data file, model folder, greedy cache, alpha table, a lookup
    method's table) is portable: no folder of this machine (paths.portable; tests/unit/test_results_portable.py)."""
    from tests.unit.test_results_portable import MACHINE_PATH
    for method in ("pld", "sam"):
        cfg = RunConfig(task="prompts", data_file=str(prompts_file), model=str(tiny_model_dir), method=method,
                        heads_profile="init", heads=2, limit=1, max_new_tokens=4, dtype="float32",
                        out=str(tmp_path / method))
        execute(prepare(cfg, "run"), log=lambda m: None)
        text = (tmp_path / method / "config.json").read_text()
        assert not MACHINE_PATH.search(text), MACHINE_PATH.search(text).group(0)
        meta = json.loads(text)
        assert meta["config"]["out"] == f"<outside>/{method}"
        assert meta["resolved"]["greedy_dir"].startswith("$BPDBENCH_CACHE/")
