"""The recipe behind every number in results/: each committed folder holding a config.json (a certify folder:
certify.json) is the output folder (`SweepPlan.results / cell.rel`) of exactly one cell of grids/*.toml, so
`bpdbench sweep grids/<name>.toml --dry-run` lists the command that remakes it. Whether each of those cells is also
finished (its config.json matching the cell) is tests/integration/test_sweep_grids.py's check. Loading a grid checks its settings
and selects its examples from the shared data; no model is loaded."""
from __future__ import annotations

import fnmatch
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RESULTS = (REPO / "results").resolve()
RECORDS = ("config.json", "certify.json")       # what a result folder records its settings in


def committed_folders(root: Path) -> list[str]:
    """Every folder under `root` holding a config.json or certify.json, relative to it (rendered tables excluded),
    less what git ignores: `make demo` writes results/runs/demo-*, which are outputs, not committed results, so the
    README's `make demo` then `make test` must pass."""
    found = sorted({p.parent.relative_to(root).as_posix() for name in RECORDS for p in root.rglob(name)
                    if "tables" not in p.parent.relative_to(root).parts})
    return [f for f in found if f not in ignored(root, found)]


def ignored(root: Path, folders: list[str]) -> set[str]:
    """The folders among `folders` (relative to `root`) that git ignores (bpdbench.paths.git_ignored)."""
    from bpdbench.paths import git_ignored
    return {p.relative_to(root).as_posix() for p in git_ignored(root, [root / f for f in folders])}


def owners(root: Path) -> dict[str, list[str]]:
    """Folder pattern (relative to `root`) -> the "grid: cell" of every cell that writes it: the folder itself, or
    with its machine part as `*` where the cell's out template names {machine} (grids/leaderboard.toml: another
    machine's board is the same cell run there). A grid whose results go elsewhere (throughput:
    $BPDBENCH_RESULTS) owns nothing here."""
    from bpdbench.sweep import grid
    out: dict[str, list[str]] = {}
    for path in sorted((REPO / "grids").glob("*.toml")):
        plan = grid.load(path)
        for cell in plan.cells:
            folder = (plan.results / cell.rel).resolve()
            if cell.rel and folder.is_relative_to(root):
                rel = folder.relative_to(root).as_posix()
                pattern = rel.replace(cell.machine, "[0-9a-f]" * len(cell.machine)) if cell.machine else rel
                out.setdefault(pattern, []).append(f"{path.name}: {cell.id}")
    return out


def owning(folder: str, cells: dict[str, list[str]]) -> list[str]:
    return [owner for pattern, found in cells.items() if fnmatch.fnmatchcase(folder, pattern) for owner in found]


def test_every_committed_result_folder_is_the_cell_of_exactly_one_grid():
    if not (REPO.parent / "shared" / "data" / "xsum").is_dir():
        pytest.skip("needs ../shared/data (loading a grid selects its examples)")
    folders = committed_folders(RESULTS)
    assert folders, "no committed results found"
    cells = owners(RESULTS)
    assert [f for f in folders if not owning(f, cells)] == [], "folders no grid cell writes"
    assert {f: owning(f, cells) for f in folders if len(owning(f, cells)) > 1} == {}, \
        "folders more than one cell writes"


def test_another_machines_board_is_owned_by_the_same_cell():
    """The control for the machine part: a board folder named after any fingerprint is the leaderboard cell's,
    one with a name that is not a fingerprint is no cell's."""
    cells = {"leaderboard-" + "[0-9a-f]" * 12 + "/mt_bench": ["leaderboard.toml: x"], "speed/mt_bench": ["y"]}
    assert owning("leaderboard-afcf1aeb72d2/mt_bench", cells) == ["leaderboard.toml: x"]
    assert owning("leaderboard-mine/mt_bench", cells) == owning("leaderboard/mt_bench", cells) == []
    assert owning("speed/mt_bench", cells) == ["y"]


def test_committed_folders_finds_config_and_certify_records(tmp_path):
    for rel, name in [("runs/a", "config.json"), ("certify/b", "certify.json"), ("tables/c", "config.json"),
                      ("runs/d", "summary.csv")]:
        (tmp_path / rel).mkdir(parents=True)
        (tmp_path / rel / name).write_text("{}")
    assert committed_folders(tmp_path) == ["certify/b", "runs/a"]


def test_folders_git_ignores_are_not_committed_results(tmp_path):
    """The control: the demo's folder (ignored by .gitignore) is left out, a folder beside it is not."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("runs/demo-*/\n")
    for rel in ("runs/demo-xsum", "runs/kept"):
        (tmp_path / rel).mkdir(parents=True)
        (tmp_path / rel / "config.json").write_text("{}")
    assert committed_folders(tmp_path) == ["runs/kept"]


def test_tables_read_no_folder_git_ignores(tmp_path):
    """`bpdbench tables` after `make demo`: the demo's run folders (ignored) are not read, a committed one is."""
    from bpdbench.report import load
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("runs/demo-*/\n")
    for rel in ("runs/demo-xsum", "runs/kept"):
        (tmp_path / rel).mkdir(parents=True)
        (tmp_path / rel / "config.json").write_text("{}")
    assert [f.path.name for f in load.folders(tmp_path, "runs", "config.json")] == ["kept"]
