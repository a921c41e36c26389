"""Every kind of thing the cache holds, declared once: the files that are one, what it is, and the command that
builds it alone.

Why a registry: about fourteen modules each write their own corner of `$BPDBENCH_CACHE` (models, heads, networks,
tables, self-draft timings, shape searches, cost curves, ...), with nothing saying what a file there is, which
command made it, or whether a file belongs to nothing at all (left by an older version, and read by nobody). Here
each kind has its patterns, so `bpdbench cache` lists the cache by kind, and a test lists the cache after a run of
every registered method and finds no file outside a registered kind: a new cache location must be declared here.

The artefact graph's kinds (graph.py: KINDS, the nodes a sweep builds before its cells) are kinds of this registry,
by the same names; a test checks it. Build locks (`.<name>.lock`), seals (`<name>.sha256`, a folder's
`SHA256SUMS`) and a killed build's leftovers (`<name>.tmp-<pid>`, `.<name>.<pid>.tmp`) belong to the artefact they
guard.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path


@dataclass(frozen=True)
class ArtefactSpec:
    """One kind of cached thing. `files`: patterns of its paths under the cache root (`*` spans folders); a path
    belongs to the first kind in `SPECS` whose pattern it matches, so a narrower kind comes before a wider one that
    shares its folder."""
    kind: str
    files: tuple[str, ...]
    holds: str          # what one is, in words
    command: str        # what builds one alone
    per_machine: bool = False   # kept per machine fingerprint (timings): another CPU or library measures its own


SPECS: tuple[ArtefactSpec, ...] = (
    ArtefactSpec("model", ("models/*",), "a registered model's dense safetensors copy at one dtype",
                 "any command on the model (converted from its GGUF package on first load)"),
    ArtefactSpec("requantized", ("gguf/*-llamacpp*.gguf",), "a GGUF copy requantized by llama.cpp (qdraft runtime=gguf)",
                 "bpdbench run --method qdraft:runtime=gguf,quant=<quant>"),
    ArtefactSpec("gguf", ("gguf/*",), "a registered model's GGUF file, assembled from its package's parts",
                 "any command on the model"),
    ArtefactSpec("distill", ("distill/*",), "training data: the target's greedy continuations or teacher-forced "
                 "prefill features", "bpdbench distill-data --profile <budget>"),
    ArtefactSpec("heads", ("heads/*",), "blockwise draft heads of one training profile",
                 "bpdbench train-heads --profile <profile>"),
    ArtefactSpec("network", ("drafters/*",), "a trained draft network (and a fit's resumable state beside it)",
                 "bpdbench train-network <name> --profile <profile>"),
    ArtefactSpec("corpus", ("rescorers/corpus-*.pt",), "the training corpus tokenized for one model",
                 "bpdbench train-rescorer ngram --order 4 (its first step)"),
    ArtefactSpec("rescorer", ("rescorers/*",), "an n-gram (KenLM) or neural rescoring LM",
                 "bpdbench train-rescorer ngram --order N, or neural --size S"),
    ArtefactSpec("table", ("lookup/*/static.npz", "lookup/*/bigram-*"), "a lookup drafter's n-gram or bigram table",
                 "bpdbench run --method <lookup method> (built on its first use)"),
    ArtefactSpec("history", ("lookup/*/history-*",), "the target's own greedy outputs on the train split",
                 "bpdbench build-history --profile <profile>"),
    ArtefactSpec("suffix-index", ("lookup/*/suffix-*",), "a suffix index over the corpus (sam, rest)",
                 "bpdbench run --method sam (built on its first use)"),
    ArtefactSpec("rounding", ("selfdraft/scales/*",), "an int4 self-draft's calibrated scales and rounding (AWQ, "
                 "GPTQ)", "bpdbench run --method qdraft:scales=awq (built on its first use)"),
    ArtefactSpec("draft-profile", ("selfdraft/*",), "a self-draft's measured cost and agreement on this machine",
                 "bpdbench run --method qdraft (measured on its first use)", per_machine=True),
    ArtefactSpec("shape", ("shapes/*",), "the shape `auto` chose for a method on this machine",
                 "bpdbench run --method <method>:<param>=auto", per_machine=True),
    ArtefactSpec("greedy", ("greedy/*",), "the target's greedy outputs for a task's examples (what losslessness "
                 "is checked against)", "bpdbench run --method ar (made on any run's first pass)"),
    ArtefactSpec("dtype", ("calibration/*/dtype.json",), "which dtype `--dtype auto` runs at on this machine",
                 "bpdbench run --dtype auto", per_machine=True),
    ArtefactSpec("kernel", ("calibration/*/linear-*.json",), "whether packed oneDNN linears beat torch's here",
                 "any command (probed on first load)", per_machine=True),
    ArtefactSpec("engine-curve", ("calibration/*-llamacpp*",), "llama.cpp's forward cost against its width",
                 "bpdbench speed --methods llamacpp (measured on first use)", per_machine=True),
    ArtefactSpec("calibration", ("calibration/*",), "the forward's cost against its width (the cost model)",
                 "bpdbench calibrate --model <model>", per_machine=True),
)
BY_KIND = {s.kind: s for s in SPECS}

_LOCK = re.compile(r"^\.(?P<name>.+)\.lock$")
_LEFTOVER = (re.compile(r"^(?P<stem>.+)\.(?:tmp|old)-\d+(?P<suffix>\.[^.]*)?$"),   # store/seal.py: building()
             re.compile(r"^\.(?P<stem>.+)\.\d+\.tmp$"))                             # nets/llamacpp.py: requantized()


def subject(rel: str) -> str:
    """The artefact a cache path is part of: a lock, seal or killed build's leftover names what it guards."""
    folder, _, name = rel.rpartition("/")
    if m := _LOCK.match(name):
        name = m["name"]
    elif name.endswith(".sha256"):
        name = name[: -len(".sha256")]
    else:
        for pattern in _LEFTOVER:
            if m := pattern.match(name):
                name = m["stem"] + (m.groupdict().get("suffix") or "")
                break
    return f"{folder}/{name}" if folder else name


def owner(rel: str) -> ArtefactSpec | None:
    """The kind a path under the cache root (POSIX, relative) belongs to; None: nothing registered makes it."""
    what = subject(rel)
    return next((s for s in SPECS if any(fnmatchcase(what, p) for p in s.files)), None)


@dataclass(frozen=True)
class CachedFile:
    path: str           # relative to the cache root
    kind: str | None    # None: no registered kind makes it
    size: int


def listing(root: Path) -> list[CachedFile]:
    """Every file under the cache root with its kind; an empty list where there is no cache."""
    if not root.is_dir():
        return []
    out = []
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.is_symlink():
            rel = p.relative_to(root).as_posix()
            spec = owner(rel)
            out.append(CachedFile(rel, spec.kind if spec else None, p.stat().st_size))
    return out


def unowned(root: Path) -> list[str]:
    """Files under the cache root that no registered kind makes (a location written without being declared here,
    or a file left by an older version that nothing reads)."""
    return [e.path for e in listing(root) if e.kind is None]
