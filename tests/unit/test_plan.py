"""Prepare once, then execute: a command's config is validated, its methods parsed and its examples selected once,
by `prepare`, and the drafters are built from the plan's own `Method` objects."""
from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from bpdbench import config as config_lib
from bpdbench.cli import app
from bpdbench.config import ConfigError, RunConfig
from bpdbench.experiments import plan as plan_lib
from bpdbench.methods import parse
from tests.conftest import write_prompts


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("BPDBENCH_RESULTS", str(tmp_path / "results"))


def test_a_run_folder_names_the_threshold_only_where_the_method_reads_it():
    """--draft-threshold is part of the label of a method that reads it (methods.bind), so its folder names it."""
    from bpdbench.methods import bind
    cfg = RunConfig(task="xsum", draft_threshold=0.4)
    folder = lambda spelling: plan_lib.run_folder(cfg, bind(parse(spelling), cfg)).name     # noqa: E731
    assert "bpd-threshold0.4" in folder("bpd")
    assert "hydra-threshold0.4" in folder("hydra")                    # draft networks read it too
    for label in ("pld", "ar", "sps", "hierarchy"):
        assert "threshold" not in folder(label), label
    assert "threshold0.2" in folder("bpd:threshold=0.2") and "0.4" not in folder("bpd:threshold=0.2")   # spelled


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
    assert [m.label for m in plan.methods] == ["bpd:heads=2", "pld"]       # --heads 2 bound once, named
    assert all(any(b is m for b in built) for m in plan.methods)          # the plan's objects, not re-parsed ones
    assert json.loads((out / "config.json").read_text())["methods"] == ["bpd:heads=2", "pld"]


def test_a_commands_own_settings_are_typed_on_the_plan_from_a_flag_or_a_grid(tmp_path):
    """speed's repeats, certify's rules, alpha-law's temperatures: one typed object on the Plan, whichever of the CLI
    or a grid cell made it, and `ar` first in a speed plan (put there when the plan is made, not by the command)."""
    from bpdbench.experiments.commands import COMMANDS
    cfg = RunConfig(task="prompts", data_file=str(write_prompts(tmp_path, 2)), limit=2)
    plan = plan_lib.prepare(cfg, "speed", "pld,hierarchy", files=False, options=plan_lib.SpeedOptions(5))
    assert [m.label for m in plan.methods] == ["ar", "pld", "hierarchy"] and plan.options.repeats == 5
    assert plan_lib.prepare(cfg, "speed", "pld,ar", files=False).methods[0].label == "ar"
    assert plan_lib.prepare(cfg, "speed", "pld", files=False).options == plan_lib.SpeedOptions()
    assert plan_lib.prepare(cfg, "replay", "bpd", files=False).options is None
    with pytest.raises(ValueError, match="speed takes SpeedOptions"):
        plan_lib.prepare(cfg, "speed", "pld", files=False, options=plan_lib.CertifyOptions())
    assert COMMANDS["certify"].typed({"rules": ["exact", "always-accept"], "samples": 20, "positions": 2,
                                      "level": 0.05, "per_category": None}) == \
        plan_lib.CertifyOptions(("exact", "always-accept"), 20, 2, 0.05)
    assert COMMANDS["alpha_law"].typed({"gamma_max": 4, "temperatures": [0, 1]}) == \
        plan_lib.AlphaLawOptions(4, (0.0, 1.0))
    assert COMMANDS["replay"].typed({"per_category": 2}) is None
    # the options check themselves, in the CLI's words, whichever of a flag or a grid key made them
    for bad, words in ((lambda: plan_lib.SpeedOptions(0), "--repeats must be an integer >= 1"),
                       (lambda: plan_lib.CertifyOptions(samples=10), "--samples must be an integer >= 20"),
                       (lambda: plan_lib.CertifyOptions(rules=("exakt",)), "unknown rule 'exakt'"),
                       (lambda: plan_lib.CertifyOptions(level=1.5), "--level must be in (0, 1)"),
                       (lambda: plan_lib.AlphaLawOptions(temperatures=(-1.0,)), "--temperatures must be numbers")):
        with pytest.raises(ConfigError, match=re.escape(words)):
            bad()
