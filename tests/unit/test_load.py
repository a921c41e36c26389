"""The results loader (report/load.py) on a small hand-made results tree: folders of two areas, config.json read
once into typed fields, old method spellings coming back as current labels with their parsed Methods, and a folder
without config.json kept as the tables always kept it."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from bpdbench.report import hardware, load, tables


def folder(root, area: str, name: str, rows: list[dict], file: str, config: dict | None = None):
    d = root / area / name
    d.mkdir(parents=True)
    pd.DataFrame(rows).to_csv(d / file, index=False)
    if config is not None:
        (d / "config.json").write_text(json.dumps(config))
    return d


@pytest.fixture()
def results(tmp_path):
    folder(tmp_path, "replay", "squad", [
        {"task": "squad", "method": "bpd", "n_examples": 4, "block_efficiency": 1.5},
        {"task": "squad", "method": "bpd-h3", "n_examples": 4, "block_efficiency": 1.3},    # old spellings
        {"task": "squad", "method": "oracle-k16", "n_examples": 4, "block_efficiency": 2.5},
        {"task": "squad", "method": "warp-drive", "n_examples": 4, "block_efficiency": 9.0}],   # names no method
        "replay.csv", {"config": {"task": "squad", "model": "tiny", "dtype": "auto", "threads": 2, "heads": 8,
                                  "heads_profile": "quick", "max_new_tokens": None},
                       "environment": {"dtype": "float32", "threads": 2},
                       "resolved": {"max_new_tokens": 32},
                       "methods": ["bpd", "bpd-h3", "oracle-k16", "bpd:heads=3"]})
    folder(tmp_path, "replay", "xsum", [                                  # no config.json: copied by hand
        {"task": "xsum", "method": "bpd:heads=3", "n_examples": 2, "block_efficiency": 1.2}], "replay.csv")
    (tmp_path / "replay" / "cnn_dailymail").mkdir()                       # a folder without the CSV
    folder(tmp_path, "speed", "mt_bench", [{"method": "ar", "speedup_vs_ar": 1.0}, {"method": "bpd-t0.4",
                                                                                     "speedup_vs_ar": 1.4}],
           "speed.csv", {"config": {"task": "mt_bench", "model": "tiny", "dtype": "float32", "threads": 1},
                         "methods": ["ar", "bpd-t0.4"], "repeats": 3})
    return tmp_path


def test_rows_carry_current_labels_and_their_methods(results):
    rows = load.rows(results, "replay", "replay.csv")
    assert rows.frame.method.tolist() == ["bpd", "bpd:heads=3", "oracle:k=16", "warp-drive", "bpd:heads=3"]
    assert rows.frame.task.tolist() == ["squad"] * 4 + ["xsum"]           # folder order, then row order
    assert sorted(rows.methods) == ["bpd", "bpd:heads=3", "oracle:k=16"]  # warp-drive: text kept, no Method
    assert rows.methods["bpd:heads=3"].get("heads") == 3 and rows.methods["oracle:k=16"].name == "oracle"
    assert rows.where(lambda m: m.name == "bpd").tolist() == [True, True, False, False, True]
    assert [f.path.name for f in rows.folders] == ["squad", "xsum"]


def test_config_is_read_once_into_typed_fields(results):
    squad, xsum = load.folders(results, "replay", "replay.csv")
    assert (squad.task, squad.model, squad.threads, squad.heads, squad.heads_profile) == ("squad", "tiny", 2, 8,
                                                                                         "quick")
    assert squad.dtype == "float32" and squad.max_new_tokens == 32        # what ran beats what was asked
    assert [m.label for m in squad.methods] == ["bpd", "bpd:heads=3", "oracle:k=16"]   # one per label
    assert squad.has_config and not xsum.has_config
    assert (xsum.task, xsum.model, xsum.dtype, xsum.methods, xsum.config) == ("xsum", None, None, (), {})


def test_areas_stay_apart_and_folders_without_the_file_are_skipped(results):
    assert [f.path.name for f in load.folders(results, "replay")] == ["cnn_dailymail", "squad", "xsum"]
    assert [f.path.name for f in load.folders(results, "replay", "replay.csv")] == ["squad", "xsum"]
    (speed,) = load.folders(results, "speed", "speed.csv")
    assert (speed.area, speed.repeats, [m.label for m in speed.methods]) == ("speed", 3,
                                                                            ["ar", "bpd:threshold=0.4"])
    assert speed.read("speed.csv").method.tolist() == ["ar", "bpd:threshold=0.4"]
    assert load.rows(results, "oracle", "oracle.csv").empty and load.table(results, "oracle", "oracle.csv").empty


def test_per_folder_columns_and_nested_folders(results):
    rows = load.rows(results, "replay", "replay.csv", per_folder=lambda f, df: df.assign(profile=f.heads_profile))
    assert rows.frame.profile.tolist()[3:] == ["quick", None]
    folder(results, "sampling", "xsum/bpd-T0.7", [{"task": "xsum", "method": "bpd-h3", "temperature": 0.7}],
           "summary.csv")
    (nested,) = load.folders(results, "sampling", "summary.csv", depth=2)
    assert nested.task == "xsum" and load.table(results, "sampling", "summary.csv", 2).method[0] == "bpd:heads=3"


def test_jsonl_method_entries_come_back_under_current_labels(results):
    d = results / "replay" / "squad"
    (d / "replay.jsonl").write_text(json.dumps({"id": "a", "new_tokens": 6, "oracle-k16": {"steps": 2}}) + "\n")
    (squad,) = [f for f in load.folders(results, "replay", "replay.jsonl")]
    assert squad.examples("replay.jsonl") == [{"id": "a", "new_tokens": 6, "oracle:k=16": {"steps": 2}}]


def test_tables_read_through_the_loader(results):
    lattice = tables.lattice_table(results).set_index(["task", "method"])
    assert lattice.loc[("squad", "oracle:k=16"), "block_efficiency"] == 2.5          # written as oracle-k16
    (results / "replay" / "xsum" / "replay.jsonl").write_text(json.dumps({"id": "a", "new_tokens": 6}) + "\n")
    assert hardware.hardware_table(results).empty     # the only replay.jsonl is in a folder without config.json
