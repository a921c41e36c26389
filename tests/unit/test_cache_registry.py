"""Every file the cache holds belongs to one registered kind of artefact (artefacts/cache.py), and every place that
makes a cache path is in paths.py, where the registry's patterns can be checked against it.

The run of every registered method that lists its cache afterwards is tests/unit/test_replay.py's (every method on
the tiny model, in a fresh cache) and tests/integration/test_cli.py's (spellings through `bpdbench run`)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from bpdbench import paths
from bpdbench.artefacts import cache
from bpdbench.artefacts.graph import KINDS

ROOT = Path(__file__).resolve().parents[2] / "bpdbench"


@pytest.mark.parametrize("rel,kind", [
    ("heads/m-quick/config.json", "heads"), ("heads/.m-quick.lock", "heads"), ("heads/m-quick/SHA256SUMS", "heads"),
    ("heads/m-quick.tmp-123", "heads"),
    ("lookup/m/static.npz.sha256", "table"), ("lookup/m/.bigram-corpus.npy.lock", "table"),
    ("lookup/m/bigram-history-quick.npy", "table"), ("lookup/m/history-quick.json", "history"),
    ("lookup/m/suffix-corpus-history-quick.npz", "suffix-index"), ("lookup/m/suffix-corpus.tmp-9.npz", "suffix-index"),
    ("rescorers/corpus-m.pt", "corpus"), ("rescorers/ngram4-m/ngram4.bin", "rescorer"),
    ("selfdraft/scales/m-int4.pt", "rounding"), ("selfdraft/abc/m-float32-xsum-gguf.json", "draft-profile"),
    ("calibration/abc/dtype.json", "dtype"), ("calibration/abc/linear-float32.json", "kernel"),
    ("calibration/abc/m-llamacpp0.3-0123-e1.json", "engine-curve"), ("calibration/abc/m-float32-cpu-v4.json", "calibration"),
    ("gguf/m.gguf", "gguf"), ("gguf/m-123-q4_0-llamacpp0.3.gguf", "requantized"),
    ("gguf/.m-123-q4_0-llamacpp0.3.gguf.77.tmp", "requantized"),
    ("drafters/m-eagle3-bench.fit-state.pt", "network"), ("greedy/0123.json", "greedy"), ("shapes/abc/m.json", "shape"),
])
def test_a_path_belongs_to_its_kind(rel, kind):
    assert cache.owner(rel) is not None and cache.owner(rel).kind == kind


@pytest.mark.parametrize("rel", ["notes.txt", "old-heads/m/config.json", "lookup/m/unknown.bin", ".lock"])
def test_a_file_no_kind_makes_has_no_owner(rel):
    """The control: the check that finds no stray file in a real cache finds these."""
    assert cache.owner(rel) is None


def test_unowned_lists_what_nothing_makes(tmp_path):
    (tmp_path / "greedy").mkdir()
    (tmp_path / "greedy" / "a.json").write_text("{}")
    (tmp_path / "stray.bin").write_bytes(b"x")
    assert cache.unowned(tmp_path) == ["stray.bin"]
    assert cache.listing(tmp_path / "absent") == []


def test_the_graphs_kinds_are_registered_kinds():
    """A sweep's nodes are artefacts of this registry by the same names, those a method's first use builds too."""
    assert set(KINDS) <= set(cache.BY_KIND)


def test_every_cache_path_paths_makes_has_a_kind(tmp_path, monkeypatch):
    """paths.py's locations and the artefact modules' file names, each a registered kind's."""
    from bpdbench.artefacts import corpus, history, suffix, tables
    from bpdbench.hardware import dtype, engine_curve, fingerprint, kernels
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path))
    made = {"model": paths.dense_model_dir("m", "float32") / "model.safetensors", "gguf": paths.gguf_file("m"),
            "heads": paths.heads_dir("m", "quick") / "config.json", "greedy": paths.greedy_dir() / "ab.json",
            "rescorer": paths.rescorer_dir("ngram4", "m") / "ngram4.bin", "distill": paths.distill_dir("m", "quick"),
            "network": paths.network_dir("m", "eagle3", "bench") / "report.json",
            "corpus": corpus.corpus_cache("m"), "table": tables.static_file("m"),
            "history": history.history_file("m", "quick"), "suffix-index": suffix.corpus_file("m"),
            "rounding": paths.rounding_file("m.pt"), "requantized": paths.requantized_dir() / "m-1-q4_0-llamacpp1.gguf",
            "draft-profile": paths.machine_file("selfdraft", "abc", "m.json"),
            "shape": paths.machine_file("shapes", "abc", "m.json"),
            "calibration": paths.machine_file("calibration", "abc", "m-float32-cpu-v4.json"),
            "dtype": dtype._cache_file(fingerprint.current(1, "cpu")),
            "kernel": kernels._cache_file(fingerprint.current(1, "cpu"), "float32"),
            "engine-curve": engine_curve.cache_path("m", "0" * 64, "0.3", 1)}
    for kind, path in made.items():
        rel = path.relative_to(tmp_path).as_posix()
        assert cache.owner(rel) is not None and cache.owner(rel).kind == kind, (kind, rel)
    assert set(made) == set(cache.BY_KIND)
    with pytest.raises(ValueError, match="no per-machine cache area 'elsewhere'"):
        paths.machine_file("elsewhere", "abc", "m.json")


CACHE_PATH = re.compile(r"cache_root\(\)\s*/|check_cache_writable\(\)\s*/")


def test_no_cache_path_is_made_outside_paths():
    """A location built beside paths.py would escape the registry's check above."""
    found = [f"{p.relative_to(ROOT)}:{i}" for p in ROOT.rglob("*.py") if p.name != "paths.py"
             for i, line in enumerate(p.read_text().splitlines(), 1) if CACHE_PATH.search(line)]
    assert found == []
    assert CACHE_PATH.search('path = (paths.cache_root() / "selfdraft" /')       # the control: the old shape


def test_a_result_names_the_cache_artefacts_it_used_with_their_content_hash(tmp_path, monkeypatch):
    """config.json records which heads, tables or curves a number was made with (`$BPDBENCH_CACHE/<key>#sha256=`),
    and a resume or finished check compares without the hash (a folder recorded before hashes still resumes)."""
    from bpdbench.store import seal
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path))
    heads = paths.heads_dir("m", "quick")
    heads.mkdir(parents=True)
    (heads / "config.json").write_text("{}")
    seal.seal(heads)
    (tmp_path / "greedy").mkdir()
    tree = seal.with_content_hashes(paths.portable_tree({"heads": {"path": str(heads)}, "greedy": str(tmp_path / "greedy"),
                                                         "gone": str(tmp_path / "shapes" / "x.json")}))
    key = "$BPDBENCH_CACHE/heads/m-quick"
    assert tree["heads"]["path"] == f"{key}#sha256={seal.digest(heads / 'SHA256SUMS')[:16]}"
    assert tree["greedy"] == "$BPDBENCH_CACHE/greedy"                      # a place: no one content
    assert tree["gone"] == "$BPDBENCH_CACHE/shapes/x.json#sha256=absent"      # named, not there: said so
    assert paths.comparable(tree) == paths.comparable({"heads": {"path": key}, "greedy": "$BPDBENCH_CACHE/greedy",
                                                       "gone": "$BPDBENCH_CACHE/shapes/x.json"})
    assert paths.resolve(tree["heads"]["path"]) == heads
    (heads / "config.json").write_text('{"retrained": 1}')
    seal.seal(heads)                                      # other weights: another hash
    assert seal.with_content_hashes(key) != tree["heads"]["path"]


def _unhashed(tree, where: str = "") -> list[str]:
    """The cache artefacts a result names without a content hash (or a word saying why it has none)."""
    from bpdbench.artefacts.cache import owner
    if isinstance(tree, dict):
        return [x for k, v in tree.items() for x in _unhashed(v, f"{where}.{k}")]
    if isinstance(tree, list):
        return [x for i, v in enumerate(tree) for x in _unhashed(v, f"{where}[{i}]")]
    if isinstance(tree, str) and tree.startswith(paths.CACHE_TOKEN + "/") and paths.HASH not in tree:
        return [f"{where}: {tree}"] if owner(tree[len(paths.CACHE_TOKEN) + 1:]) is not None else []
    return []


def test_every_committed_config_names_its_artefacts_by_key_and_hash():
    """Every artefact a committed config.json names has its hash, `absent`, or `unrecorded` (written before results
    recorded hashes: built on machines whose caches are gone, so no honest hash exists). A place (the greedy
    references' folder) has none."""
    import json
    import re
    configs = sorted((ROOT.parent / "results").rglob("config.json"))
    assert len(configs) > 100
    missing = [f"{c.relative_to(ROOT.parent)}{x}" for c in configs for x in _unhashed(json.loads(c.read_text()))]
    assert missing == [], missing[:5]
    marks = {m for c in configs for m in re.findall(r"#sha256=([0-9a-z]+)", c.read_text())}
    assert marks <= {paths.ABSENT, paths.UNRECORDED} | {m for m in marks if re.fullmatch(r"[0-9a-f]{16}", m)}
    assert _unhashed({"heads": "$BPDBENCH_CACHE/heads/m-quick", "greedy": "$BPDBENCH_CACHE/greedy"}) == \
        [".heads: $BPDBENCH_CACHE/heads/m-quick"]                              # the control: the old form is found
