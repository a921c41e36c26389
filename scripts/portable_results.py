"""Rewrite the committed results to the portable path form (bpdbench/paths.py `portable`; docs/result-schema.md).

Folders written before paths were recorded portably name the home, cache, checkout and temporary folders of the
machine that made them (`/root/.cache/bpdbench/greedy`, `/work/main/results/alpha.json`, `/tmp/bpdbench-greedy-x`).
This rewrites those strings in every tracked file under results/ and nothing else: a number, a key or the layout
of a file never changes (each path is replaced in the text, so the JSON keeps its formatting). Idempotent: a second
run finds nothing to change.

- a cache folder of any machine (`.../.cache/bpdbench*/rest`) becomes `$BPDBENCH_CACHE/rest`;
- a checkout's results (`/work/<checkout>/results/rest`) become `results/rest`;
- anything else becomes `<outside>/<name>` (no hash: the file is not on this machine to read).

It also renames the one folder whose name held `;` (the folder rule, paths.folder_name, no longer makes such a
name) with every reference to it, and records the grid the two frontier-gguf folders ran from: a temporary copy
of grids/frontier.toml's frontier-gguf cell (the commits that added them say so, and their methods, prompts,
tokens and repeats are that cell's), so the grid is recorded as grids/frontier.toml and the copy as `grid_copy`.

    python scripts/portable_results.py [--check]
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ABSOLUTE = re.compile(r"(?<![\w.~-])/(?:work|root|tmp|home|Users|var|mnt|opt|private|data|scratch)/[^\s\"']*")
CACHE = re.compile(r"^/(?:.*/)?\.cache/bpdbench[^/]*(?=/|$)")
CHECKOUT = re.compile(r"^/work/[^/]+/results(?=/|$)")
RENAMED = {"certify/mt_bench-layerskip-sharpen0.25+hybrid-modelqdraft;bits8;length6;sharpen0.25-T1-bfloat16":
           "certify/mt_bench-layerskip-sharpen0.25+hybrid-modelqdraft-bits8-length6-sharpen0.25-T1-bfloat16"}
GRID_COPIES = {
    "frontier-gguf/mt_bench": ("/tmp/gguf_only.toml", "65f56f8"),
    "frontier-gguf/spec_bench": ("/tmp/gguf_sb.toml", "b1c1cf0"),
}


def portable(path: str) -> str:
    """Another machine's absolute path, as bpdbench/paths.py `portable` would have recorded it there."""
    if m := CACHE.match(path):
        return "$BPDBENCH_CACHE" + path[m.end():]
    if m := CHECKOUT.match(path):
        return "results" + path[m.end():]
    return f"<outside>/{path.rstrip('/').rsplit('/', 1)[-1]}"


def rewrite(rel: str, text: str) -> str:
    """`text` of results/`rel` with its paths portable, the renamed folder's new name and the recorded grid."""
    folder = rel.rsplit("/", 1)[0].removeprefix("results/")
    if folder in GRID_COPIES:
        tmp, commit = GRID_COPIES[folder]
        text = text.replace(f'"grid": "{tmp}",', f'"grid": "grids/frontier.toml",\n    "grid_copy": "{portable(tmp)}: '
                            f'a temporary grid holding only this cell of grids/frontier.toml at {commit}",')
    for old, new in RENAMED.items():
        text = text.replace(old.rsplit("/", 1)[1], new.rsplit("/", 1)[1])
    return ABSOLUTE.sub(lambda m: portable(m.group(0)), text)


def tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z", "results"], cwd=REPO, capture_output=True, text=True, check=True)
    return [p for p in out.stdout.split("\0") if p]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 when something would change")
    a = ap.parse_args()
    changed = []
    for old, new in RENAMED.items():
        src, dst = REPO / "results" / old, REPO / "results" / new
        if src.exists():
            changed.append(f"results/{old} -> results/{new}")
            if not a.check:
                subprocess.run(["git", "mv", str(src), str(dst)], cwd=REPO, check=True)
    for rel in tracked():
        path = REPO / rel
        if not path.is_file() or path.suffix in (".png", ".pt", ".npz", ".npy", ".bin"):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        new = rewrite(rel, text)
        if new != text:
            changed.append(rel)
            if not a.check:
                path.write_text(new, encoding="utf-8")
    print(f"{len(changed)} {'to change' if a.check else 'changed'}" + "".join(f"\n  {c}" for c in changed[:20])
          + (f"\n  ... {len(changed) - 20} more" if len(changed) > 20 else ""))
    return 1 if a.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
