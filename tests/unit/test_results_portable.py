"""The committed results name no machine: no absolute path in any tracked file under results/, no folder a shell
misreads, paths recorded through paths.portable and read back through paths.resolve, and results/README.md as
`bpdbench tables` renders it."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from bpdbench import paths

REPO = paths.REPO
# an absolute path of some machine: a POSIX one under the usual roots (not inside a URL or a ratio like 1/2), a
# home-relative one, or a Windows drive path (as text, C:\x, or JSON-escaped, C:\\x)
MACHINE_PATH = re.compile(r"(?<![\w.~:/-])(?:/(?:work|root|home|tmp|Users|private|mnt|var|opt|scratch)/[^\s\"'<>|]+"
                          r"|~/[^\s\"'<>|]+|(?<![\w\\])[A-Z]:\\{1,2}[\w$. -])")
SHELL_SPECIAL = set(";&|$`'\"()<>*?[]{}!#~\\") | {" ", "\t"}


def tracked(under: str = "results") -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z", under], cwd=REPO, capture_output=True, text=True)
    if out.returncode:
        pytest.skip("not a git checkout")
    return [p for p in out.stdout.split("\0") if p]


def test_the_pattern_finds_machine_paths_and_nothing_else():
    for hit in ('"/work/main/results/alpha.json"', "report /tmp/tp/cpus1/report.json", '"/root/.cache/bpdbench"',
                '"/home/u/x"', '"/Users/me/x"', r'"C:\\Users\\me"', r"C:\data\x", "~/.cache/bpdbench/greedy"):
        assert MACHINE_PATH.search(hit), hit
    for miss in ("https://github.com/home/x", "1/2", "tokens/s", "http://example.org/tmp/x", '"results/alpha.json"',
                 '"$BPDBENCH_CACHE/greedy"', '"<outside>/gguf_only.toml"', r'"a:\nb"', "speedup 1.4x / 2"):
        assert not MACHINE_PATH.search(miss), miss


def test_no_tracked_file_under_results_holds_an_absolute_machine_path():
    found = []
    for rel in tracked():
        path = REPO / rel
        if not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:          # figures
            continue
        if m := MACHINE_PATH.search(text):
            found.append(f"{rel}: {m.group(0)[:80]}")
    assert not found, (f"{len(found)} files under results/ name a machine's absolute path (record it with "
                       f"paths.portable; scripts/portable_results.py rewrites old ones):\n" + "\n".join(found[:20]))


def test_no_folder_name_under_results_holds_a_shell_special_character():
    bad = sorted({part for rel in tracked() for part in Path(rel).parts[:-1] if SHELL_SPECIAL & set(part)})
    assert not bad, f"folder names a shell misreads: {bad}"


def test_the_folder_rule_never_makes_a_shell_special_name():
    label = "layerskip:sharpen=0.25+hybrid:model=qdraft;bits=8;length=6 & $x|`y` (z) <a> *?[b]{c}!#~\\"
    assert not SHELL_SPECIAL & set(paths.folder_name(label))
    assert paths.folder_name("hybrid:model=qdraft;bits=8") == "hybrid-modelqdraft-bits8"
    assert paths.folder_name("bpd:heads=3") == "bpd-heads3"          # the names committed folders have kept
    assert not SHELL_SPECIAL & set(paths.run_dir("mt_bench", "my model", "sam:fallback=qdraft;bits=8", "bf16").name)


def test_portable_inside_the_checkout_is_relative_and_resolves_back():
    p = REPO / "results" / "alpha.json"
    assert paths.portable(p) == "results/alpha.json"
    assert paths.resolve("results/alpha.json") == p
    assert paths.portable(REPO) == "."


def test_portable_inside_the_cache_names_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path / "cache"))
    p = tmp_path / "cache" / "heads" / "qwen-quick"
    assert paths.portable(p) == "$BPDBENCH_CACHE/heads/qwen-quick"
    assert paths.resolve("$BPDBENCH_CACHE/heads/qwen-quick") == p
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path / "elsewhere"))      # the same record on another machine
    assert paths.resolve("$BPDBENCH_CACHE/heads/qwen-quick") == tmp_path / "elsewhere" / "heads" / "qwen-quick"


def test_a_cache_inside_the_checkout_is_the_cache(monkeypatch):
    monkeypatch.setenv("BPDBENCH_CACHE", str(REPO / ".cache" / "bpdbench"))
    assert paths.portable(REPO / ".cache" / "bpdbench" / "greedy") == "$BPDBENCH_CACHE/greedy"


def test_portable_outside_names_the_file_and_its_content(tmp_path, monkeypatch):
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path / "cache"))
    f = tmp_path / "grid.toml"
    f.write_text("a = 1\n")
    text = paths.portable(f)
    assert text.startswith("<outside>/grid.toml#sha256=") and len(text.split("=")[-1]) == 16
    f.write_text("a = 2\n")
    assert paths.portable(f) != text                                     # the hash tells the two apart
    assert paths.comparable({"f": text}) == paths.comparable({"f": str(f)}) == {"f": "<outside>/grid.toml"}
    assert paths.portable(tmp_path / "somewhere") == "<outside>/somewhere"   # a folder: no hash
    assert paths.resolve(text) is None                                   # not on this machine
    assert paths.portable("results/x") == "results/x"                    # a relative path is kept as typed


def test_resolve_reads_the_old_absolute_form():
    assert paths.resolve("/root/.cache/bpdbench/greedy") == Path("/root/.cache/bpdbench/greedy")
    assert paths.resolve(None) is None


def test_portable_tree_rewrites_paths_only(tmp_path, monkeypatch):
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path / "cache"))
    meta = {"config": {"out": str(REPO / "results" / "runs" / "x"), "limit": 3, "ratio": "1/2"},
            "resolved": {"greedy_dir": str(tmp_path / "cache" / "greedy"), "ids": ["/x-not-a-root", 1.5]}}
    out = paths.portable_tree(meta)
    assert out == {"config": {"out": "results/runs/x", "limit": 3, "ratio": "1/2"},
                   "resolved": {"greedy_dir": "$BPDBENCH_CACHE/greedy", "ids": ["<outside>/x-not-a-root", 1.5]}}
    assert paths.portable_tree(out) == out                               # idempotent


def test_a_folder_recorded_with_absolute_paths_still_resumes(tmp_path, monkeypatch):
    """Resume compares config dicts: an old config.json with absolute paths and a new one with portable paths
    are the same settings."""
    import json
    from bpdbench import store
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path / "cache"))
    heads = str(tmp_path / "cache" / "heads" / "h")
    old = {"config": {"task": "mt_bench", "heads_path": heads}, "resolved": {"heads": {"path": heads}}}
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "config.json").write_text(json.dumps(old))
    (tmp_path / "out" / "examples.jsonl").write_text('{"id": "a"}\n')
    new = paths.portable_tree(old)
    assert new["config"]["heads_path"] == "$BPDBENCH_CACHE/heads/h"
    assert store.resumable(tmp_path / "out", "examples.jsonl", new, store.settings_and_heads, True) == [{"id": "a"}]
    store.precheck_run(tmp_path / "out", new["config"], True)
    other = {**new, "config": {**new["config"], "heads_path": "$BPDBENCH_CACHE/heads/other"}}
    with pytest.raises(ValueError, match="heads_path"):
        store.resumable(tmp_path / "out", "examples.jsonl", other, store.settings_and_heads, True)


def test_the_committed_results_readme_is_the_rendered_one():
    import tasks
    from bpdbench.report import results_index
    if tasks.default_data_dir() is None or not (tasks.default_data_dir() / "mt_bench").is_dir():
        pytest.skip("needs ../shared/data to audit the speed folders, as the leaderboard does")
    committed = REPO / "results" / results_index.FILE
    assert committed.exists(), "results/README.md is missing: run `bpdbench tables`"
    assert committed.read_text() == results_index.render(REPO / "results"), \
        "results/README.md differs from a fresh render: run `bpdbench tables` and commit it"


def test_audit_of_a_folder_whose_data_lay_outside_uses_what_the_run_recorded(tmp_path):
    """`<outside>/...` data cannot be read again here: the audit the run made of its selection stands in, said so;
    without one the folder is not proven clean."""
    import json
    from bpdbench.experiments import audit
    recorded = {"rule": audit.RULE, "evaluated": 1, "in_train": 0, "in_tune": 0, "not_in_data": 0, "artefacts": {},
                "clean": True}
    (tmp_path / "examples.jsonl").write_text('{"id": "a"}\n')
    meta = {"config": {"task": "mt_bench", "data_file": "<outside>/p.jsonl#sha256=0123456789abcdef"},
            "resolved": {"overlap": recorded}}
    (tmp_path / "config.json").write_text(json.dumps(meta))
    got = audit.folder(tmp_path)
    assert got["clean"] and "recorded by the run" in got["source"]
    (tmp_path / "config.json").write_text(json.dumps({**meta, "resolved": {}}))
    got = audit.folder(tmp_path)
    assert not got["clean"] and "outside the checkout" in got["error"]
