"""Nothing lost when a cache or a disk fails: each fault injected for real on the tiny model, and none ends in a
traceback, a wrong result or a damaged result file.

Each test names its fault. Faults covered elsewhere (not repeated here): kill -9 in the middle of a run and a second
writer (test_crash_safety: test_second_writer_fails_at_once_and_kill9_loses_nothing), a leftover lock file after a
kill (test_crash_safety: test_output_lock_names_the_holder), a torn or garbled examples.jsonl line
(test_crash_safety, test_bad_input: test_corrupt_middle_line_is_named_not_dropped), truncated heads or model weights
and an invalid heads config.json (test_bad_input: heads-truncated, model-truncated, heads-config-corrupt), corrupt
greedy references (test_crash_safety), truncated distillation data (test_distill), an interrupt raised inside a run
(test_cli: test_resume_after_interrupt_loses_nothing) and two tune cells writing one table (test_sweep).
"""
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

REPO = Path(__file__).resolve().parents[2]
# The tokenized-corpus build of artefacts/corpus.py (the tiny model's character tokenizer, without loading
# transformers), with a torch.save that writes half the file, says so on stderr and waits for the file
# $FAULT_RELEASE (a kill or an interrupt lands meanwhile), then writes it whole. argv: corpus file, cache path.
CORPUS_CHILD = r"""
import io, os, sys, time
from pathlib import Path
import torch
real_save = torch.save

def save(obj, f, *args, **kwargs):
    buf = io.BytesIO()
    real_save(obj, buf, *args, **kwargs)
    data = buf.getvalue()
    with open(f, "wb") as out:
        out.write(data[: len(data) // 2])
    print("FAULT: writing " + os.path.basename(str(f)), file=sys.stderr, flush=True)
    deadline = time.time() + 120
    while not os.path.exists(os.environ.get("FAULT_RELEASE", "/nonexistent")) and time.time() < deadline:
        time.sleep(0.05)
    with open(f, "wb") as out:
        out.write(data)

torch.save = save
from bpdbench.artefacts.corpus import tokenized_corpus
tokenize = lambda text: [ord(c) - 30 if 32 <= ord(c) < 127 else 0 for c in text]
try:
    docs = tokenized_corpus([Path(sys.argv[1])], tokenize, Path(sys.argv[2]), lambda m: print(m, file=sys.stderr))
except KeyboardInterrupt:
    print("INTERRUPTED", file=sys.stderr, flush=True)
    sys.exit(130)
print("DOCS", sum(map(len, docs)), file=sys.stderr, flush=True)
"""
# `bpdbench` commands in one process, each under its own file-size limit (`ulimit -f`: the kernel refuses a write
# past it with EFBIG). argv: JSON [[limit, args], ...]; each command's exit status follows its output as `EXIT n`.
ULIMIT_CHILD = r"""
import json, resource, sys
from bpdbench.cli import app
hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
for limit, args in json.loads(sys.argv[1]):
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        app(args, prog_name="bpdbench")
    except SystemExit as e:
        print(f"EXIT {e.code}", file=sys.stderr, flush=True)
    resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
"""


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("BPDBENCH_RESULTS", str(tmp_path / "results"))


def invoke(*args) -> tuple[int, str]:
    """The command in this process: its exit code and output, asserting it ended in no exception of its own (a
    traceback) but a clean exit."""
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exception is None or isinstance(result.exception, SystemExit), (result.output, result.exception)
    return result.exit_code, result.output


def one_error(text: str) -> str:
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in text, text
    return errors[0]


def env(**extra: str) -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
            "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1", **extra}


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "examples.jsonl").read_text().splitlines()]


def numbers(out: Path) -> list[tuple]:
    """What a run measured per example (a table that drafts differently changes these)."""
    return [(r["id"], r["new_tokens"], r["serial_calls"], r["drafted"], r["accepted"]) for r in records(out)]


def arrays(data: bytes) -> dict:
    """The arrays of an .npz (its bytes hold a write time, its arrays are what a build made)."""
    import io

    import numpy as np
    with np.load(io.BytesIO(data)) as z:
        return {k: z[k].tolist() for k in z.files}


def wait_for(predicate, proc: subprocess.Popen, what: str, seconds: float = 120) -> None:
    deadline = time.time() + seconds
    while not predicate():
        assert proc.poll() is None and time.time() < deadline, f"never saw {what}"
        time.sleep(0.05)


@contextmanager
def read_only(folder: Path):
    """`folder` read-only as a user meets it: its mode for a normal user; root ignores modes, so for root a
    read-only bind mount (skipped where this machine allows no mount)."""
    if os.geteuid() != 0:
        mode = folder.stat().st_mode
        folder.chmod(0o555)
        try:
            yield
        finally:
            folder.chmod(mode)
        return
    bound = subprocess.run(["mount", "--bind", str(folder), str(folder)], capture_output=True).returncode == 0
    if not bound or subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], capture_output=True).returncode:
        if bound:
            subprocess.run(["umount", str(folder)], capture_output=True)
        pytest.skip("running as root without the right to mount: no way to make a folder read-only here")
    try:
        yield
    finally:
        subprocess.run(["umount", str(folder)], capture_output=True, check=True)


# --- writes the system refuses ----------------------------------------------------------------------------------

def test_a_file_size_limit_is_one_line_and_keeps_every_earlier_result(tiny_model_dir, tmp_path):
    """`ulimit -f` (as a full disk) hit by the first result file of a new folder, and while appending to a run being
    resumed: one line naming the file and the fix, no traceback; the new folder leaves nothing behind (no
    config.json.tmp, no lock file), the resumed one keeps every earlier record byte for byte with no torn line, and
    --resume without the limit finishes it."""
    prompts = write_prompts(tmp_path, 20)         # more records than fit under the limit, however long config.json
    new, resumed = tmp_path / "new", tmp_path / "resumed"
    args = with_opts(base_args(prompts, tiny_model_dir, resumed), max_new_tokens="4")
    assert invoke(*args)[0] == 0
    before = (resumed / "examples.jsonl").read_bytes()
    limit = max((resumed / "config.json").stat().st_size + 512, len(before) + int(1.25 * len(before)))
    commands = [[1500, [str(a) for a in with_opts(args, out=new)]],
                [limit, [str(a) for a in with_opts(args, limit="20")]]]
    done = subprocess.run([sys.executable, "-c", ULIMIT_CHILD, json.dumps(commands)], env=env(),
                          capture_output=True, text=True, timeout=600)
    assert done.stderr.count("EXIT ") == 2, done.stderr
    first, second, rest = done.stderr.split("EXIT ")
    assert second.startswith("2") and rest.startswith("2"), done.stderr
    error = one_error(first)
    assert f"{new / 'config.json'}: a file-size limit" in error and "ulimit -f unlimited" in error, error
    assert not new.exists(), sorted(p.name for p in new.iterdir())
    assert "examples.jsonl: a file-size limit" in one_error(second), second
    after = (resumed / "examples.jsonl").read_bytes()
    assert after.startswith(before) and after.endswith(b"\n") and len(after) < limit
    assert [r["id"] for r in records(resumed)] == [f"p{i}" for i in range(len(after.splitlines()))]
    code, text = invoke(*with_opts(args, limit="20"))
    assert code == 0 and "torn" not in text, text
    assert [r["id"] for r in records(resumed)] == [f"p{i}" for i in range(20)]


def test_a_read_only_result_folder_is_one_line_and_stays_intact(finished_run, tiny_model_dir, tmp_path):
    """--resume into a finished run whose folder became read-only: one line before the model loads, every file
    byte for byte as it was."""
    src, prompts = finished_run
    out = tmp_path / "run"
    shutil.copytree(src, out)
    before = snapshot(out)
    with read_only(out):
        code, text = invoke(*with_opts(base_args(prompts, tiny_model_dir, out), limit="3"))
    assert code == 2 and "is not writable" in one_error(text) and "writable directory" in text, text
    assert snapshot(out) == before


@pytest.mark.parametrize("case", ["proc", "file", "under-file", "read-only"])
def test_an_unusable_cache_is_one_line_naming_BPDBENCH_CACHE_before_the_model_loads(case, tiny_model_dir, tmp_path,
                                                                                     monkeypatch):
    """BPDBENCH_CACHE in /proc (the review's `[Errno 2] ... '/proc/nope'`), on a file, under a file, or on a
    read-only folder: one line that names the setting and the fix, before any model loads, and no result folder."""
    from bpdbench import models
    cache = {"proc": Path("/proc/bpdbench-nope"), "file": tmp_path / "f", "under-file": tmp_path / "f" / "cache",
             "read-only": tmp_path / "ro"}[case]
    (tmp_path / "f").write_text("not a folder")
    (tmp_path / "ro").mkdir()
    monkeypatch.setenv("BPDBENCH_CACHE", str(cache))
    monkeypatch.setattr(models, "load", lambda *a, **k: pytest.fail("the model loaded before the cache was checked"))
    out = tmp_path / "run"
    with read_only(tmp_path / "ro") if case == "read-only" else open(os.devnull):
        code, text = invoke(*base_args(write_prompts(tmp_path, 2), tiny_model_dir, out))
    error = one_error(text)
    assert code == 2 and f"BPDBENCH_CACHE={cache} " in error and "set BPDBENCH_CACHE to a writable" in error, text
    assert not out.exists()


# --- damaged artefacts -------------------------------------------------------------------------------------------
