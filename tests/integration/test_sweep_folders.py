"""Where a grid's cells write: `out` templates and their placeholders (sweep/folders.py), on grids loaded from the
shared test data without running anything."""
from __future__ import annotations

from pathlib import Path

from tests.integration.test_sweep import data  # noqa: F401 (data is a fixture)


def test_out_templates_name_the_folders(tiny_model_dir, data, tmp_path):
    """`out` names any folder under the results root (the scripts' names); a cell outside its command's default
    folder gets --out <results>/<folder>, one in it gets none, as the command line would."""
    from bpdbench.sweep import grid
    path = tmp_path / "g.toml"
    path.write_text("\n".join([
        "[sweep]", 'results = "res"', "", "[defaults]", 'dtype = "float32"', 'heads_path = "~/medusa-quick"', "",
        "[[run]]", 'out = "certificates/{task}-{method}"', 'tasks = ["xsum"]',
        'methods = ["bpd:threshold=0.4", "oracle:k=16", "koala:base=hydra,tree=4"]', "",
        "[[run]]", 'out = "drafters/runs/{task}-{method:_}-fp32-{heads_profile}"', 'tasks = ["mt_bench"]',
        'method = "koala:base=hydra,tree=4"', 'heads_profile = "full"', "",
        "[[run]]", 'out = "sampling/{task}/{method}-T{temperature}-{dtype}-{model}"', 'tasks = ["xsum"]',
        'method = "pld"', "temperatures = [0, 0.7, 1.0]", "private_greedy = true", f'model = "{tiny_model_dir}"', "",
        "[[replay]]", 'out = "drafters/replay/{task}-koala"', 'tasks = ["xsum", "mt_bench"]', "",
        "[[oracle]]", 'out = "oracle/{task}"', 'tasks = ["xsum"]', "",
        "[[speed]]", 'out = "speed/{task}-s{seed}"', 'tasks = ["mt_bench"]', "temperature = 0.7", "seed = 3"]))
    plan = grid.load(path, data=str(data))
    cells = {c.id: c for c in plan.cells}
    m = str(tiny_model_dir).replace("/", "_")
    assert set(cells) == {
        "certificates/xsum-bpd-threshold-0.4", "certificates/xsum-oracle-k-16",
        "certificates/xsum-koala-base-hydra-tree-4",
        "drafters/runs/mt_bench-koala_base_hydra_tree_4-fp32-full", f"sampling/xsum/pld-T0-float32-{m}",
        f"sampling/xsum/pld-T0.7-float32-{m}", f"sampling/xsum/pld-T1-float32-{m}", "drafters/replay/xsum-koala",
        "drafters/replay/mt_bench-koala", "oracle/xsum", "speed/mt_bench-s3"}
    for c in plan.cells:
        assert c.rel == c.id and c.grid == str(path.resolve())
        assert c.config.out == (None if c.id == "oracle/xsum" else str(plan.results / c.id)), c.id
        assert c.config.heads_path == str(Path.home() / "medusa-quick")      # ~ expanded, as a shell would
    sampled = [c for c in plan.cells if c.id.startswith("sampling/")]
    assert [c.config.temperature for c in sampled] == [None, 0.7, 1.0]
    assert all(c.options == {"private_greedy": True} for c in sampled)
    assert cells["certificates/xsum-bpd-threshold-0.4"].options == {}


def test_the_machine_placeholder_gives_each_machine_its_own_folder(data, tmp_path):
    """`{machine}` is the fingerprint a run's results are grouped by (CPU, software, threads): the leaderboard grid
    on two machines, or at two thread counts, writes two folders, and the cell says which part names the machine
    (the grid coverage check matches another machine's folder by it)."""
    from bpdbench.hardware.fingerprint import current
    from bpdbench.sweep import grid
    path = tmp_path / "g.toml"
    path.write_text("\n".join([
        "[sweep]", 'results = "res"', "", "[defaults]", 'dtype = "float32"', "",
        "[[speed]]", 'out = "leaderboard-{machine}/{task}"', 'tasks = ["mt_bench"]', "threads = 2", "",
        "[[speed]]", 'out = "one-thread-{machine}/{task}"', 'tasks = ["mt_bench"]', "threads = 1", "",
        "[[speed]]", 'folder = "plain"', 'tasks = ["mt_bench"]']))
    two, one, plain = grid.load(path, data=str(data)).cells
    assert two.machine == current(2).key() and two.id == f"leaderboard-{two.machine}/mt_bench"
    assert one.machine == current(1).key() != two.machine and one.id == f"one-thread-{one.machine}/mt_bench"
    assert plain.machine == "" and plain.id == "plain/mt_bench"

