"""Every cache and default result location, in one place.

Caches (models, heads, rescorers, greedy references) live under one root, `$BPDBENCH_CACHE` or
~/.cache/bpdbench, read when asked for, never set behind the user's back. Default result folders are inside the
repository checkout (`<repo>/results/...`), not the current directory, so a command means the same wherever it is
run from; `--out` sends results elsewhere.
"""
from __future__ import annotations

import os
import re
from pathlib import Path, PureWindowsPath

REPO = Path(__file__).resolve().parents[1]


def results_root() -> Path:
    """`$BPDBENCH_RESULTS`, else the checkout's results/ (the committed reference results), else ./results for an
    installed package. Reference results and ad-hoc runs share it only if you let them: pass --out."""
    env = os.environ.get("BPDBENCH_RESULTS")
    if env:
        return Path(env)
    return REPO / "results" if (REPO / "pyproject.toml").exists() else Path("results").resolve()


def alpha_file() -> Path:
    """The tuned-alpha table `bpdbench tune` writes and every command reads (override: --alpha-file)."""
    return results_root() / "alpha.json"


class CacheError(FileNotFoundError):
    """The cache's location cannot hold a cache (a file, a path under a file, a place where no folder can be
    made, or a read-only folder for a command that writes): one line naming BPDBENCH_CACHE and how to fix it, said
    before any model loads instead of an errno about a path the user never typed."""


_CHECKED: set[tuple[Path, bool]] = set()      # (root, writable) checks that passed in this process


def cache_setting() -> Path:
    """Where the cache lives, unchecked (for messages about a failed write, which must not fail themselves)."""
    return Path(os.environ.get("BPDBENCH_CACHE") or Path.home() / ".cache" / "bpdbench")


def cache_root() -> Path:
    """The cache root, checked once per process: it must be a folder or a place where one can be made (nothing is
    created here, so a command refused for bad input leaves nothing behind). A folder that exists but is read-only
    passes, since reading a prepared cache needs no write; `check_cache_writable` is the check of commands that
    write."""
    root = cache_setting()
    if (root, False) not in _CHECKED:
        _check_cache(root, writable=False)
    return root


def check_cache_writable() -> Path:
    """The cache root, which this command will write (greedy references, calibrations, artefacts built on first
    use): checked by making and removing a folder in it, the one test that holds for root, read-only mounts and
    /proc alike."""
    root = cache_root()
    if (root, True) not in _CHECKED:
        _check_cache(root, writable=True)
    return root


def cache_name(root: Path | None = None) -> str:
    """The cache as the user set it: `BPDBENCH_CACHE=<path>`, or the default folder when the variable is unset."""
    root = root or cache_setting()
    return f"BPDBENCH_CACHE={root}" if os.environ.get("BPDBENCH_CACHE") else f"the cache {root}"


CACHE_FIX = "set BPDBENCH_CACHE to a writable folder"


def _check_cache(root: Path, writable: bool) -> None:
    import tempfile
    name = cache_name(root)
    if root.exists() and not root.is_dir():
        raise CacheError(f"{name} is a file, not a folder; {CACHE_FIX}")
    existing = next((p for p in (root, *root.parents) if p.exists()), None)
    if existing is None or not existing.is_dir():
        raise CacheError(f"{name} lies under {existing}, a file; {CACHE_FIX}")
    if existing != root or writable:
        try:
            os.rmdir(tempfile.mkdtemp(prefix=".bpdbench-probe-", dir=existing))
        except OSError as e:
            what = "is not writable" if existing == root else f"cannot be created in {existing}"
            raise CacheError(f"{name} {what} ({e.strerror}); {CACHE_FIX}") from None
    _CHECKED.add((root, writable))
    if writable:
        _CHECKED.add((root, False))


def _safe(name: str) -> str:
    return name.replace("/", "_")


def heads_dir(model: str, profile: str) -> Path:
    return cache_root() / "heads" / f"{_safe(model)}-{profile}"


def greedy_dir() -> Path:
    return cache_root() / "greedy"


def rescorer_dir(tag: str, model: str) -> Path:
    """`tag` is e.g. ngram4 or neural-m."""
    return cache_root() / "rescorers" / f"{tag}-{_safe(model)}"


def dense_model_dir(name: str, dtype: str) -> Path:
    return cache_root() / "models" / f"{name}-{dtype}"


def gguf_file(name: str) -> Path:
    return cache_root() / "gguf" / f"{name}.gguf"


# Characters a shell reads as syntax or a pattern: a folder named with one must be quoted in every command that
# names it (an unquoted `;` ends the command there), so no generated name holds one.
SHELL_SPECIAL = frozenset(";&|$`'\"()<>*?[]{}!#~\\")


def shell_safe(name: str) -> str:
    """`name` with every shell-special character and every space as `_`."""
    return "".join("_" if c in SHELL_SPECIAL or c.isspace() else c for c in name)


def folder_name(label: str, sep: str = "-", equals: str = "") -> str:
    """The one rule naming a folder (or a sweep's log file) after a method label, a list of them or a cell id:
    `:`, `,` and a nested spelling's `;` become `sep`, `=` becomes `equals` (dropped by default: `bpd:heads=3` ->
    `bpd-heads3`), `/` becomes `_` so a label naming a model path stays one folder name, and any other
    shell-special character `_` (shell_safe). Why one rule: run folders, certify folders, a grid's `out` templates
    and the sweep's logs each had their own, and a folder is how a finished result is found."""
    return shell_safe(label.replace(":", sep).replace(",", sep).replace(";", sep).replace("=", equals)
                      .replace("/", "_"))


def run_dir(task: str, model: str, label: str, dtype: str) -> Path:
    return results_root() / "runs" / shell_safe(f"{task}-{_safe(model)}-{folder_name(label)}-{dtype}")


def experiment_dir(kind: str, task: str) -> Path:
    """results/<kind>/<task> for replay, oracle, analysis, speed."""
    return results_root() / kind / task


def lookup_dir(model: str) -> Path:
    """Lookup drafters' tables for a target model: the corpus n-gram index, the bigram table, the model's own
    greedy history (artefacts/tables.py)."""
    return cache_root() / "lookup" / _safe(model)


def distill_dir(model: str, budget: str) -> Path:
    """The cached distillation dataset every drafter trainer reads (`bpdbench distill-data`)."""
    return cache_root() / "distill" / f"{_safe(model)}-{budget}"


def network_dir(model: str, name: str, profile: str) -> Path:
    """A draft network (`bpdbench train-network NAME`): config.json naming its type, weights, report.json."""
    return cache_root() / "drafters" / f"{_safe(model)}-{name}-{profile}"


def corpus_file(model: str) -> Path:
    """The training corpus tokenized for `model` (the neural LMs and the lookup tables share it)."""
    return cache_root() / "rescorers" / f"corpus-{_safe(model)}.pt"


def requantized_dir() -> Path:
    """llama.cpp's requantized copies of registered GGUF files (beside the files themselves)."""
    return cache_root() / "gguf"


def rounding_file(name: str) -> Path:
    """An int4 self-draft's calibrated scales and rounding (methods/calibrated.py)."""
    return cache_root() / "selfdraft" / "scales" / name


def machine_file(area: str, machine: str, name: str) -> Path:
    """A measurement of one machine (`machine`: its fingerprint key): `area` is "selfdraft" (a self-draft's cost
    and agreement), "shapes" (what `auto` chose) or "calibration" (cost curves, the dtype and kernel choices)."""
    if area not in ("selfdraft", "shapes", "calibration"):
        raise ValueError(f"no per-machine cache area '{area}' (artefacts/cache.py declares them)")
    return cache_root() / area / machine / name


def git_ignored(root: Path, folders: list[Path]) -> set[Path]:
    """The folders among `folders` that git ignores (none outside a git checkout): outputs such as `make demo`'s
    results/runs/demo-* sit beside the committed results but are not results any table or check should read."""
    import subprocess
    if not folders:
        return set()
    try:
        out = subprocess.run(["git", "check-ignore", "--stdin"], cwd=root, capture_output=True, text=True,
                             input="\n".join(str(f) + "/" for f in folders), timeout=60)
    except (OSError, subprocess.SubprocessError):
        return set()
    if out.returncode not in (0, 1):         # 128: not a git checkout
        return set()
    return {Path(line.rstrip("/")) for line in out.stdout.splitlines()}


# How a result records a path, so that a results tree means the same on every machine and names none of them
# (docs/result-schema.md): inside the checkout, relative to it (`results/alpha.json`); inside the cache,
# `$BPDBENCH_CACHE/<rest>`; anywhere else, `<outside>/<name>` (plus `#sha256=<16 hex>` of a file's content, so a
# reader can still tell which file it was). Old folders recorded absolute paths; `resolve` reads both forms.
CACHE_TOKEN, OUTSIDE, HASH = "$BPDBENCH_CACHE", "<outside>", "#sha256="
# In place of the 16 hex digits: the artefact was not in the cache when the result was written (ABSENT), or the result
# was written before results recorded hashes and was marked so later (UNRECORDED: its artefacts were built on other
# machines and are not here to hash; writing this machine's hashes would be a false record).
ABSENT, UNRECORDED = "absent", "unrecorded"
_ABSOLUTE = re.compile(r"^(?:/|~/|[A-Za-z]:[\\/])")


def is_absolute(text: str) -> bool:
    """Whether a recorded string is a machine's absolute path (POSIX, home-relative or a Windows drive)."""
    return bool(_ABSOLUTE.match(text))


def _within(path: Path, root: Path) -> str | None:
    try:
        rel = path.relative_to(root)
    except ValueError:
        return None
    return rel.as_posix()


def portable(path: str | os.PathLike, hashed: bool = True) -> str:
    """`path` as a result records it: relative to the checkout, under `$BPDBENCH_CACHE`, or `<outside>/<name>`
    with the file's content hash (`hashed`). A relative path is recorded as given (it was typed so). Why one
    function: config.json, certify.json, sweep reports and training reports each recorded `str(path)`, so 223 of
    224 committed folders named the home, cache and temporary folders of the machine that made them."""
    text = os.fspath(path)
    if not is_absolute(text):
        return text
    if re.match(r"^[A-Za-z]:", text) and os.name != "nt":      # another machine's Windows path
        return f"{OUTSIDE}/{PureWindowsPath(text).name}"
    p = Path(os.path.abspath(Path(text).expanduser()))
    found = []
    for root, token in ((REPO, ""), (cache_setting().expanduser(), CACHE_TOKEN)):
        for r in {Path(os.path.abspath(root)), Path(os.path.realpath(root))}:
            for q in {p, Path(os.path.realpath(p))}:
                rel = _within(q, r)
                if rel is not None:
                    found.append((len(r.parts), token, "" if rel == "." else rel))
    if found:
        _, token, rel = max(found)        # the deeper root: a cache inside the checkout is the cache
        return "/".join(x for x in (token, rel) if x) or "."
    out = f"{OUTSIDE}/{p.name}"
    if hashed and p.is_file():
        out += HASH + file_sha256(p)[:16]
    return out


def file_sha256(path: Path) -> str:
    import hashlib
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def resolve(text: str | os.PathLike | None) -> Path | None:
    """The path a recorded string names on this machine: a checkout-relative one under the checkout, a
    `$BPDBENCH_CACHE/...` one under this machine's cache, an old absolute one as it was written; None for
    `<outside>/...` (a place on the machine that made the result, not here) and for None."""
    if text is None:
        return None
    text = os.fspath(text)
    if text.startswith(OUTSIDE):
        return None
    if text == CACHE_TOKEN or text.startswith(CACHE_TOKEN + "/"):
        return cache_setting() / text[len(CACHE_TOKEN) + 1:].split(HASH)[0]
    if is_absolute(text):
        return Path(text).expanduser()
    return REPO / text


def portable_tree(obj, hashed: bool = True):
    """`obj` (a result's JSON: dicts, lists, strings) with every string that is an absolute path made `portable`:
    what every writer of config.json, certify.json and reports records, and what a resume check compares (both
    sides, `hashed=False`), so a folder written before this rule still resumes."""
    if isinstance(obj, dict):
        return {k: portable_tree(v, hashed) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [portable_tree(v, hashed) for v in obj]
    if isinstance(obj, os.PathLike) or (isinstance(obj, str) and is_absolute(obj)):
        out = portable(obj, hashed)
        return out if hashed else out.split(HASH)[0]
    if not hashed and isinstance(obj, str) and obj.startswith((OUTSIDE + "/", CACHE_TOKEN)):  # recorded with its hash
        return obj.split(HASH)[0]
    return obj


def comparable(obj):
    """`obj` as a resume or finished-cell check compares it: paths portable, content hashes left out (a settings
    file edited since changes no setting)."""
    return portable_tree(obj, hashed=False)
