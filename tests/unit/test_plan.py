"""Prepare once, then execute: a command's config is validated, its methods parsed and its examples selected once,
by `prepare`, and the drafters are built from the plan's own `Method` objects."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from bpdbench import config as config_lib
from bpdbench.cli import app
from bpdbench.config import RunConfig
from bpdbench.experiments import plan as plan_lib
from bpdbench.methods import parse
from tests.conftest import write_prompts


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("BPDBENCH_RESULTS", str(tmp_path / "results"))


def test_a_run_folder_names_the_threshold_only_where_the_method_reads_it():
    cfg = RunConfig(task="xsum", draft_threshold=0.4)
    assert "-t0.4" in plan_lib.run_folder(cfg, parse("bpd")).name
    assert "-t0.4" in plan_lib.run_folder(cfg, parse("hydra")).name        # draft networks read it too
    for label in ("pld", "ar", "sps", "hierarchy"):
        assert "-t0.4" not in plan_lib.run_folder(cfg, parse(label)).name, label
    assert "-t0.4" not in plan_lib.run_folder(cfg, parse("bpd:threshold=0.2")).name   # named by the spelling


def test_bad_input_fails_in_prepare_before_any_model(tmp_path):
    prompts = write_prompts(tmp_path, 3)
    cfg = RunConfig(task="prompts", data_file=str(prompts), model=str(tmp_path / "no-model"), dtype="float32")
    with pytest.raises(config_lib.ConfigError, match="unknown method"):
        plan_lib.prepare(cfg.replace(method="bdp"), "run")
    with pytest.raises(config_lib.ConfigError, match="replay walks"):
        plan_lib.prepare(cfg.replace(temperature=0.7), "replay", "bpd")


def test_one_validation_one_parse_one_selection_per_command(tiny_model_dir, tmp_path, monkeypatch):
    """A whole `bpdbench run` on the tiny model: the config is validated once, each spelling parsed once and the
    examples selected once, and the drafter is built from the very Method object the plan holds."""
    counts = {"validate": 0, "select": 0, "parse": 0}
    real_validate, real_select, real_parse = RunConfig.validate, plan_lib.select_examples, plan_lib.parse_list

    def validate(self):
        counts["validate"] += 1
        return real_validate(self)

    def select(*a, **k):
        counts["select"] += 1
        return real_select(*a, **k)

    def parse_list(*a, **k):
        counts["parse"] += 1
        return real_parse(*a, **k)

    built = []
    from bpdbench.experiments import session
    real_build = session.Session.build
    monkeypatch.setattr(RunConfig, "validate", validate)
    monkeypatch.setattr(plan_lib, "select_examples", select)
    monkeypatch.setattr(plan_lib, "parse_list", parse_list)
    monkeypatch.setattr(session.Session, "build", lambda self, m: built.append(m) or real_build(self, m))
    prepared = []
    real_prepare = plan_lib.prepare
    monkeypatch.setattr(plan_lib, "prepare", lambda *a, **k: prepared.append(real_prepare(*a, **k)) or prepared[-1])

    out = tmp_path / "replay"
    result = CliRunner().invoke(app, ["replay", "--task", "prompts", "--data-file", str(write_prompts(tmp_path, 3)),
                                      "--model", str(tiny_model_dir), "--heads-profile", "init", "--heads", "2",
                                      "--methods", "bpd,pld", "--limit", "2", "--max-new-tokens", "6",
                                      "--dtype", "float32", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert counts == {"validate": 1, "select": 1, "parse": 1}
    (plan,) = prepared
    assert [m.label for m in plan.methods] == ["bpd", "pld"]
    assert all(any(b is m for b in built) for m in plan.methods)          # the plan's objects, not re-parsed ones
    assert json.loads((out / "config.json").read_text())["methods"] == ["bpd", "pld"]
