"""Damaged, killed and contended artefact builds (tests/integration/test_faults.py holds the refused writes and unusable caches,
and the helpers both share): each fault injected for real on the tiny model, and none ends in a traceback, a wrong
result or a half artefact."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from bpdbench.store import seal
from bpdbench.cli import app
from tests.conftest import write_prompts
from tests.helpers import write_corpus
from tests.integration.test_bad_input import base_args, finished_run, heads_dir, snapshot, with_opts  # noqa: F401 (fixture)

from tests.integration.test_faults import (CORPUS_CHILD, REPO, arrays, env, invoke, isolated, numbers, one_error,  # noqa: F401
                                 records, wait_for)  # (isolated: the autouse fixture)


@pytest.fixture(scope="module")
def lookup_cache(tiny_model_dir, tmp_path_factory):
    """A cache holding the tiny model's lookup tables (corpus n-gram table, ci model history, corpus suffix index),
    built on first use by real runs, and those runs' result folders."""
    root = tmp_path_factory.mktemp("lookup")
    data, prompts = write_corpus(root / "data"), write_prompts(root, 3)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BPDBENCH_CACHE", str(root / "cache"))
        for method in ("hierarchy:history=ci", "sam"):
            assert invoke(*lookup_args(prompts, tiny_model_dir, data, method, root / method))[0] == 0
    return root


def lookup_args(prompts, model, data, method, out) -> list:
    return with_opts(base_args(prompts, model, out), method=method, data_dir=data, heads_profile=None, heads=None,
                     resume=None)


def random_bytes(path: Path) -> None:
    path.write_bytes(os.urandom(3000))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def other_table(path: Path) -> None:
    """A valid table with other contents (what a stray write or another build could leave): loads without a word."""
    from bpdbench.artefacts.formats import FrequencyTable
    table = FrequencyTable.load(path)
    FrequencyTable.build(table.tokens[::-1].copy(), sizes=(2, 3), top=4, min_count=2, meta=table.meta).save(path)


def unsealed(damage):
    """An artefact from before seals, then damaged: its loader's error still becomes a rebuild, said in one line."""
    def apply(path: Path) -> None:
        seal.sidecar(path).unlink(missing_ok=True)
        damage(path)
    return apply


LOOKUP_CASES = [  # (case, method, {file: damage})
    ("garbage", "hierarchy:history=ci", {"static.npz": random_bytes, "history-ci.json": unsealed(random_bytes)}),
    ("garbage-unsealed", "sam", {"suffix-corpus.npz": unsealed(random_bytes)}),
    ("truncated", "sam", {"suffix-corpus.npz": truncate}),
    ("valid-but-changed", "hierarchy:history=ci", {"static.npz": other_table}),
]


@pytest.mark.parametrize("case,method,damage", LOOKUP_CASES, ids=[c[0] for c in LOOKUP_CASES])
def test_damaged_lookup_tables_are_said_and_built_again(case, method, damage, lookup_cache, tiny_model_dir,
                                                        tmp_path, monkeypatch):
    """Random bytes (the `'utf-8' codec can't decode byte` of the review), a truncated file, or a valid table that
    differs from the one built: each file is named in one warning line and built again, and the run measures what
    the intact tables measure."""
    from bpdbench import paths
    cache = tmp_path / "cache"
    shutil.copytree(lookup_cache / "cache", cache)
    folder = paths.lookup_dir(str(tiny_model_dir))
    intact = {name: (folder / name).read_bytes() for name in damage}
    for name, apply in damage.items():
        apply(folder / name)
    out = tmp_path / "run"
    code, text = invoke(*lookup_args(lookup_cache / "prompts.jsonl", tiny_model_dir, lookup_cache / "data", method,
                                     out))
    assert code == 0, text
    for name in damage:
        said = [line for line in text.splitlines() if line.startswith("warning:") and str(folder / name) in line]
        assert len(said) == 1 and "building it again" in said[0], (name, text)
        assert seal.sealed(folder / name) and seal.problem(folder / name) is None
        if name.endswith(".npz"):            # the history is generated again: the same tokens, other timings
            assert arrays((folder / name).read_bytes()) == arrays(intact[name]), name
    assert numbers(out) == numbers(lookup_cache / method)
    assert not [p for p in folder.iterdir() if ".tmp-" in p.name]


def test_a_damaged_history_that_takes_minutes_is_refused_in_one_line_under_no_auto_train(tiny_model_dir, tmp_path):
    """Random bytes in the `quick` history, which --no-auto-train may not rebuild: one line naming the file and the
    command that rebuilds it (not a decoder's words about a byte), and the file is left for the user."""
    from bpdbench import paths
    history = paths.lookup_dir(str(tiny_model_dir)) / "history-quick.json"
    history.parent.mkdir(parents=True)
    random_bytes(history)
    code, text = invoke(*lookup_args(write_prompts(tmp_path, 2), tiny_model_dir, write_corpus(tmp_path / "data"),
                                     "hierarchy", tmp_path / "run"), "--no-auto-train")
    error = one_error(text)
    assert code == 2 and str(history) in error and "build-history --profile quick" in error, text
    assert history.stat().st_size == 3000                                 # refused, not deleted


@pytest.mark.parametrize("case", ["weights-changed", "file-missing"])
def test_sealed_heads_that_changed_or_lost_a_file_are_refused_in_one_line(case, finished_run, tiny_model_dir,
                                                                          tmp_path):
    """Heads whose weights are a valid checkpoint but not the trained one (they would draft without a word), or
    whose folder lost a file its seal lists: refused naming the file and how to get them back."""
    heads = heads_dir(tmp_path, corrupt="shortlist-ok")
    seal.seal(heads)
    if case == "weights-changed":
        state = torch.load(heads / "medusa_lm_head.pt", weights_only=True)
        torch.save({k: v + 1 for k, v in state.items()}, heads / "medusa_lm_head.pt")
        file, words = "medusa_lm_head.pt", "truncated or damaged"
    else:
        (heads / "shortlist.pt").unlink()
        file, words = "shortlist.pt", "is missing"
    _, prompts = finished_run
    code, text = invoke(*with_opts(base_args(prompts, tiny_model_dir, tmp_path / "run"), heads_profile=None,
                                   heads_path=heads))
    error = one_error(text)
    assert code == 2 and str(heads / file) in error and words in error and "train-heads" in error, text
    assert not (tmp_path / "run" / "examples.jsonl").exists()


def test_calibration_and_dtype_caches_that_changed_are_measured_again(monkeypatch):
    """An invalid calibration JSON and one whose numbers changed since they were measured (valid JSON, so it would
    price every shape wrongly without a word) are not used: measured again, said in one line; the same for the
    dtype decision."""
    from bpdbench.hardware import calibration as lib
    from bpdbench.hardware import dtype as dtype_lib
    from bpdbench.hardware.fingerprint import current
    monkeypatch.setenv("BPDBENCH_LINEAR", "torch")
    cal = lib.Calibration(model="tiny", dtype="float32", device="cpu", threads=1, fingerprint={"key": "k"},
                          step_ms=10.0, contexts=[16], chain={16: {1: 1.0, 4: 1.5}}, tree={16: {4: 1.6}},
                          prefill_tok_per_s=100.0, head={1: 0.1}, linear="torch")
    path = lib.save(cal)
    assert lib.cached("tiny", "float32", "cpu", 1) == cal and seal.sealed(path)
    for damage in (lambda: path.write_text('{"model": "tiny", '),
                   lambda: path.write_text(path.read_text().replace('"step_ms": 10.0', '"step_ms": 1.0'))):
        lib.save(cal)
        damage()
        assert lib.cached("tiny", "float32", "cpu", 1) is None and lib.meta("tiny", "float32", "cpu", 1) is None
    monkeypatch.setattr(lib, "estimate_seconds", lambda *a, **k: 1.0)
    monkeypatch.setattr(lib, "measure", lambda *a, **k: cal)
    said: list[str] = []
    assert lib.ensure("tiny", "float32", "cpu", 1, model=object(), log=said.append) == cal
    assert any(str(path) in m and "measuring it again" in m for m in said), said
    assert lib.cached("tiny", "float32", "cpu", 1) == cal

    monkeypatch.setattr(dtype_lib, "probe", lambda *a, **k: 0.5)        # bfloat16 clearly faster: bfloat16
    fp = current(1, "cpu")
    assert dtype_lib.choose(fp=fp).dtype == "bfloat16"
    dtype_lib.persist()
    choice = dtype_lib._cache_file(fp)
    choice.write_text(choice.read_text().replace("bfloat16", "float32"))   # valid JSON, another decision
    assert dtype_lib.choose(fp=fp).dtype == "bfloat16"
    dtype_lib._PENDING.clear()


# --- kills, interrupts and two builders --------------------------------------------------------------------------

def corpus_build(tmp_path: Path, model, log: Path, **extra: str) -> subprocess.Popen:
    """The tokenized-corpus build of `model`'s cache over the fixture corpus, in a process of its own
    (CORPUS_CHILD), its stderr in `log`."""
    from bpdbench.artefacts.corpus import corpus_cache
    data = write_corpus(tmp_path / "data") if not (tmp_path / "data").exists() else tmp_path / "data"
    corpus = data / "corpus" / "c4_en_validation_2k.jsonl"
    with open(log, "w") as err:
        return subprocess.Popen([sys.executable, "-c", CORPUS_CHILD, str(corpus), str(corpus_cache(str(model)))],
                                env=env(**extra), stdout=subprocess.DEVNULL, stderr=err)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["kill-9", "sigint"])
def test_a_build_killed_or_interrupted_half_way_leaves_no_half_artefact(sig, tiny_model_dir, tmp_path,
                                                                        monkeypatch):
    """kill -9 or Ctrl-C while the tokenized corpus is half written: nothing half-built where the next run looks
    (an interrupt also removes its temporary file), and the next run, through the CLI, builds it and decodes."""
    from bpdbench.artefacts.corpus import corpus_cache
    log = tmp_path / "stderr.txt"
    proc = corpus_build(tmp_path, tiny_model_dir, log)
    try:
        wait_for(lambda: "FAULT: writing" in log.read_text(), proc, "the corpus being written")
        proc.send_signal(sig)
        code = proc.wait(timeout=60)
    finally:
        proc.kill()
    cache = corpus_cache(str(tiny_model_dir))
    assert not cache.exists(), "a half-written artefact where the next run reads it"
    if sig == signal.SIGINT:
        assert code == 130 and "INTERRUPTED" in log.read_text(), log.read_text()
        assert not [p for p in cache.parent.iterdir() if ".tmp-" in p.name]
    monkeypatch.setenv("BPDBENCH_DATA", str(tmp_path / "data"))
    code, text = invoke(*lookup_args(write_prompts(tmp_path, 2), tiny_model_dir, None, "sam", tmp_path / "run"))
    assert code == 0 and "tokenized" in text and "warning:" not in text, text
    assert seal.sealed(cache) and seal.problem(cache) is None
    assert not [p for p in cache.parent.iterdir() if ".tmp-" in p.name]    # the killed build's file is cleared


def test_sigint_in_the_middle_of_a_run_says_how_to_resume_and_loses_nothing(tiny_model_dir, tmp_path, monkeypatch):
    """A real SIGINT (Ctrl-C), delivered while the second example decodes: one line saying how to continue, exit
    130, the finished record whole, and --resume ends with every id exactly once."""
    import threading

    from bpdbench import store
    out = tmp_path / "run"
    args = with_opts(base_args(write_prompts(tmp_path, 20), tiny_model_dir, out), limit="20", max_new_tokens="32")
    real, timers = store.ResultWriter.append, []

    def append(self, record):
        real(self, record)
        if not timers:                          # mid-decode of the next example, wherever the main thread is
            timers.append(threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT)))
            timers[0].start()
    monkeypatch.setattr(store.ResultWriter, "append", append)
    code, text = invoke(*args)
    timers[0].join()
    assert code == 130 and "rerun with --resume" in text, text
    monkeypatch.setattr(store.ResultWriter, "append", real)
    n = len(records(out))
    assert 1 <= n < 20
    code, text = invoke(*with_opts(args, limit=str(n + 1)))
    assert code == 0 and "torn" not in text, text
    assert [r["id"] for r in records(out)] == [f"p{i}" for i in range(n + 1)]


def test_two_processes_that_need_one_artefact_build_it_once(tiny_model_dir, tmp_path):
    """Two processes that need the same missing artefact at once: the second says whom it waits for, waits, and
    reads what the first built (built once, not twice racing on one file); both get the same tokens."""
    release = tmp_path / "release"
    first, second = tmp_path / "a.txt", tmp_path / "b.txt"
    procs = []
    try:
        procs.append(corpus_build(tmp_path, tiny_model_dir, first, FAULT_RELEASE=str(release)))
        wait_for(lambda: "FAULT: writing" in first.read_text(), procs[0], "the first build")
        procs.append(corpus_build(tmp_path, tiny_model_dir, second, FAULT_RELEASE=str(release)))
        wait_for(lambda: "waiting for" in second.read_text(), procs[1], "the second process waiting")
        release.touch()
        codes = [p.wait(timeout=120) for p in procs]
    finally:
        release.touch()
        for p in procs:
            p.kill()
    a, b = first.read_text(), second.read_text()
    assert codes == [0, 0], (a, b)
    assert f"waiting for pid {procs[0].pid}" in b and (a + b).count("FAULT: writing") == 1, (a, b)
    assert "tokenized" in a and "tokenized" not in b, (a, b)
    assert a.split("DOCS")[1] == b.split("DOCS")[1] and int(a.split("DOCS")[1]) > 0


def test_a_folder_build_killed_half_way_keeps_the_earlier_folder(tmp_path):
    """kill -9 while a folder artefact (heads, drafters, distillation data) is written: the earlier folder stays
    whole and sealed, and the next build clears what the killed one left."""
    out = tmp_path / "heads"
    with seal.building(out, folder=True) as tmp:
        (tmp / "medusa_lm_head.pt").write_bytes(b"old" * 1000)
        (tmp / "config.json").write_text("{}")
    code = ("import sys, time; from pathlib import Path; from bpdbench.store import seal\n"
            "with seal.building(Path(sys.argv[1]), folder=True) as tmp:\n"
            "    (tmp / 'medusa_lm_head.pt').write_bytes(b'new' * 1000)\n"
            "    print('half', flush=True); time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(out)], env=env(), stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "half"
    finally:
        proc.kill()
        proc.wait()
    assert (out / "medusa_lm_head.pt").read_bytes() == b"old" * 1000 and seal.problem(out) is None
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == [f"heads.tmp-{proc.pid}"]
    with seal.building(out, folder=True) as tmp:
        (tmp / "medusa_lm_head.pt").write_bytes(b"new" * 1000)
        (tmp / "config.json").write_text("{}")
    assert (out / "medusa_lm_head.pt").read_bytes() == b"new" * 1000 and seal.problem(out) is None
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == ["heads"]
