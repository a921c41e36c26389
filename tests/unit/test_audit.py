"""`bpdbench audit`: a result folder's evaluated examples against the splits and against what artefacts saw. The
control: a folder that evaluated a train example, or an example an artefact recorded, is flagged."""
from __future__ import annotations

import json

from bpdbench.experiments import audit


def _data(tmp_path):
    folder = tmp_path / "data" / "samsum"
    folder.mkdir(parents=True)
    rows = [{"id": str(i), "document": f"d{i}", "summary": "s"} for i in range(30)]
    (folder / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path / "data"


def _folder(root, name, ids, data, resolved=None):
    out = root / name
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps({"config": {"task": "samsum", "data_dir": str(data)},
                                                 "resolved": resolved or {}}))
    (out / "examples.jsonl").write_text("".join(json.dumps({"id": i}) + "\n" for i in ids) + '{"id": "torn')
    return out


def test_audit_flags_train_tune_and_artefact_overlap(tmp_path):
    data = _data(tmp_path)
    res = tmp_path / "results"
    _folder(res, "clean", ["0", "1", "2"], data)
    _folder(res, "trained-on", ["0", "9"], data)                       # 9: index % 10 == 9, the train split
    _folder(res, "tuned-on", ["0", "28"], data)                        # 28, 29 minus 29 (train), 27: the tail
    _folder(res, "seen", ["0", "1"], data, {"heads": {"seen": {"ids": {"samsum": ["1"]}, "sha256": "x"}}})
    tuned = {"file": "alpha.json", "split": "tune", "seen": {"ids": {"samsum": ["27"]}}}
    _folder(res, "alpha-tuned", ["0", "1"], data, {"ngram4": {"alpha": 0.5, "alpha_table": tuned}})
    _folder(res, "alpha-unknown", ["0", "1"], data, {"ngram4": {"alpha": 0.5, "alpha_table": {
        "file": "alpha.json", "split": None, "seen": None}}})          # tuned before the splits: saw unknown
    _folder(res, "alpha-old", ["0"], data, {"ngram4": {"alpha": 0.5, "alpha_source": "results/alpha.json"}})
    found = audit.tree(res)
    assert found["alpha-tuned"]["clean"] and found["alpha-tuned"]["artefacts"]["ngram4.alpha_table"]["overlap"] == 0
    assert not found["alpha-unknown"]["clean"]
    assert found["alpha-unknown"]["artefacts"]["ngram4.alpha_table"]["overlap"] is None
    assert not found["alpha-old"]["clean"] and found["alpha-old"]["artefacts"]["ngram4.alpha_table"]["overlap"] is None
    assert found["clean"]["clean"] and found["clean"]["evaluated"] == 3
    assert not found["trained-on"]["clean"] and found["trained-on"]["in_train"] == 1
    assert not found["tuned-on"]["clean"] and found["tuned-on"]["in_tune"] == 1
    assert not found["seen"]["clean"] and found["seen"]["artefacts"]["heads"]["overlap"] == 1
    assert found["seen"]["in_train"] == found["seen"]["in_tune"] == 0


def test_audit_command_prints_every_folder_and_strict_fails_on_overlap(tmp_path):
    from tests.integration.test_sweep import cli
    data = _data(tmp_path)
    res = tmp_path / "results"
    _folder(res, "clean", ["0"], data)
    code, text = cli("audit", "--results", res, "--strict")
    assert code == 0 and "1 folders, 1 clean" in text, text
    _folder(res, "dirty", ["19"], data)
    code, text = cli("audit", "--results", res, "--strict")
    assert code == 1 and "OVERLAP" in text and "2 folders, 1 clean, 1 with overlap" in text, text
    _folder(res, "old-alpha", ["0"], data, {"ngram4": {"alpha_table": {"file": "a", "split": None, "seen": None}}})
    code, text = cli("audit", "--results", res)
    assert "OVERLAP (unknown: an alpha tuned before the splits" in text and "3 folders, 1 clean" in text, text
