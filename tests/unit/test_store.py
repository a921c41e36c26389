"""Writes the system refuses and sealed artefacts, at the level of the functions (the CLI-level faults, with real
file-size limits, kills and read-only folders, are in test_faults.py): a refused write leaves the earlier file as it
was and no temporary file, and says in one line which file and what to do; a seal catches a file that changed, a
file that went missing and an unreadable seal, and accepts an artefact built before seals."""
from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from bpdbench import paths, store
from bpdbench.store import seal
from bpdbench.store import AppendOnlyJsonl, WriteError, write_atomic, write_failed


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path / "cache"))


def refuse_after(monkeypatch, code: int, after: int = 5):
    """os.write writes `after` bytes, then fails with `code`, as a full disk or a file-size limit does."""
    real = os.write
    state = {"left": after}

    def write(fd, data):
        if state["left"] <= 0:
            raise OSError(code, os.strerror(code))
        n = real(fd, bytes(data)[: state["left"]])
        state["left"] -= n
        return n
    monkeypatch.setattr(store.os, "write", write)


@pytest.mark.parametrize("code,words", [(errno.EFBIG, ["file-size limit", "ulimit -f", "--resume"]),
                                        (errno.ENOSPC, ["disk is full", "free space", "--resume"]),
                                        (errno.EROFS, ["read-only", "--out"])])
def test_a_refused_append_cuts_the_file_back_and_says_the_fix(code, words, tmp_path, monkeypatch):
    out = tmp_path / "run"
    with AppendOnlyJsonl(out, "examples.jsonl") as f:
        f.append([{"id": "a"}, {"id": "b"}])
        before = (out / "examples.jsonl").read_bytes()
        refuse_after(monkeypatch, code)
        with pytest.raises(WriteError) as e:
            f.append([{"id": "c", "text": "x" * 100}])
        monkeypatch.undo()
        assert (out / "examples.jsonl").read_bytes() == before          # no torn line left behind
        message = str(e.value)
        assert "\n" not in message and str(out / "examples.jsonl") in message
        for word in words:
            assert word in message, (word, message)
        assert f.append([{"id": "c"}]) == [{"id": "c"}]                 # the id was not counted as written


def test_write_atomic_keeps_the_old_file_and_leaves_no_temporary_one(tmp_path, monkeypatch):
    path = tmp_path / "config.json"
    path.write_text('{"old": true}')

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(store.os, "fsync", full)
    with pytest.raises(WriteError, match="config.json: the disk is full"):
        write_atomic(path, '{"new": true}')
    assert path.read_text() == '{"old": true}' and sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]


def test_a_refused_write_in_the_cache_names_BPDBENCH_CACHE(tmp_path):
    e = write_failed(OSError(errno.EACCES, "Permission denied"), tmp_path / "cache" / "greedy" / "x.json")
    assert "set BPDBENCH_CACHE to a writable folder" in str(e) and "--out" not in str(e)


@pytest.mark.parametrize("setting,words", [("{tmp}/file", ["is a file"]), ("{tmp}/file/sub", ["lies under"]),
                                           ("/proc/bpdbench-nope", ["cannot be created in /proc"])])
def test_cache_root_names_a_setting_that_cannot_hold_a_cache(setting, words, tmp_path, monkeypatch):
    (tmp_path / "file").write_text("x")
    monkeypatch.setenv("BPDBENCH_CACHE", setting.format(tmp=tmp_path))
    with pytest.raises(paths.CacheError) as e:
        paths.cache_root()
    assert str(e.value).startswith(f"BPDBENCH_CACHE={setting.format(tmp=tmp_path)} ")
    assert all(w in str(e.value) for w in words) and "set BPDBENCH_CACHE" in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]      # nothing created, not even a probe


def test_a_cache_that_does_not_exist_yet_is_fine_and_not_created(tmp_path, monkeypatch):
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path / "a" / "b"))
    assert paths.check_cache_writable() == tmp_path / "a" / "b" and not (tmp_path / "a").exists()


def test_seal_catches_a_changed_file_a_missing_file_and_an_unreadable_seal(tmp_path):
    folder = tmp_path / "art"
    folder.mkdir()
    (folder / "weights.bin").write_bytes(b"\x00" * 100)
    (folder / "config.json").write_text("{}")
    assert seal.problem(folder) is None and not seal.sealed(folder)    # built before seals: accepted
    seal.seal(folder)
    assert seal.sealed(folder) and seal.problem(folder) is None
    (folder / "weights.bin").write_bytes(b"\x00" * 99 + b"\x01")       # same size, one byte changed
    assert "weights.bin is truncated or damaged" in seal.problem(folder)
    seal.seal(folder)
    (folder / "config.json").unlink()
    assert "config.json is missing" in seal.problem(folder)
    (folder / seal.SUMS).write_bytes(os.urandom(64))
    assert "is unreadable" in seal.problem(folder)


def test_building_a_file_seals_it_and_a_failed_build_keeps_the_earlier_one(tmp_path):
    path = tmp_path / "table.npy"
    with seal.building(path) as tmp:
        assert tmp.suffix == ".npy" and tmp != path
        tmp.write_bytes(b"first")
    assert path.read_bytes() == b"first" and seal.problem(path) is None and seal.sealed(path)
    with pytest.raises(KeyboardInterrupt):
        with seal.building(path) as tmp:
            tmp.write_bytes(b"half")
            raise KeyboardInterrupt
    assert path.read_bytes() == b"first" and seal.problem(path) is None
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == ["table.npy",
                                                                                         "table.npy.sha256"]


def test_a_build_that_hits_a_write_limit_in_a_writers_own_words_is_one_line(tmp_path, monkeypatch):
    """torch.save says a refused write as a RuntimeError of its zip writer: the place is probed, and the probe's
    errno gives the line."""
    path = tmp_path / "data.pt"
    real_open = open

    def refusing_open(file, mode="r", *args, **kwargs):
        if "w" in mode and Path(file).parent == tmp_path:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_open(file, mode, *args, **kwargs)
    with pytest.raises(WriteError, match="data.pt: the disk is full"):
        with seal.building(path) as tmp:
            tmp.write_bytes(b"x")
            monkeypatch.setattr("builtins.open", refusing_open)
            monkeypatch.setattr(seal.tempfile, "TemporaryFile", lambda dir=None: refusing_open(dir / "p", "wb"))
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")
    monkeypatch.undo()
    assert not path.exists() and not list(tmp_path.glob("data.tmp-*"))


def test_a_bug_in_a_build_is_not_called_a_refused_write(tmp_path):
    with pytest.raises(RuntimeError, match="a bug"):
        with seal.building(tmp_path / "x.pt"):
            raise RuntimeError("a bug")
