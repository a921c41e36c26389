"""`bpdbench tables`: the paper's tables, rendered from result files only (never from stdout).

Reads `results/replay/<task>/replay.csv` (lattice methods on shared greedy trajectories), `results/oracle/<task>/
oracle.csv`, `results/analysis/<task>/{repetition,entropy}.csv` and `results/runs/*/summary.csv`, and writes CSV +
Markdown under `results/tables/`: the paper's numbers (`../shared/paper/reference_tables.csv`) beside ours in the
paper's task groups and, under every table that reproduces one of the paper's, what it reproduces and how the setups
differ (paper.py); PNGs where the paper has a figure (plots.py); the computed hardware-utilization table
(hardware.py, from `results/replay/<task>/replay.jsonl`); the Medusa tree variants from
`results/medusa/<task>/replay.csv`; the per-machine speed leaderboard from `results/speed*/<folder>/`
(leaderboard.py, html.py; the wide speed CSVs beside it); and the float32 certificates from
`results/certificates/*/summary.csv`.
Every folder is found and read by load.py, whose `method` column already holds current labels: the readers here
select and pivot.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from .. import paths
from . import load, paper
from .hardware import hardware_table
from .paper import TASK_ORDER, lattice_table, lattice_wide  # noqa: F401 (lattice_table: tests read it here)
from .plots import learning_curves, lines_by_task
from ..experiments.summary import to_markdown

if TYPE_CHECKING:
    from .leaderboard import Leaderboard

CERTIFICATE_COLUMNS = ["task", "method", "dtype", "n_examples", "new_tokens", "block_efficiency", "lossless_rate"]
RETIRED = ("speed.md", "speed_by_category.md")   # mixed machines, commits and models in one table: see leaderboard


def speed_table(results: Path, name: str) -> pd.DataFrame:
    """`bpdbench speed` outputs of every results/speed*/ folder, one row per method (and category), with the
    settings, machine and commit that make a speedup comparable: the wide dump behind the per-machine leaderboard."""
    def settings(f: load.ResultFolder, df: pd.DataFrame) -> pd.DataFrame:
        df.insert(0, "task", f.task)
        df.insert(1, "model", f.model)   # e.g. the 1.5B target with the 0.5B as its assistant
        env = f.environment
        return df.assign(max_new_tokens=f.max_new_tokens, repeats=f.repeats, dtype=f.dtype, threads=f.threads,
                         folder=str(f.path.relative_to(results)), cpu=env.get("processor"),
                         fingerprint=env.get("fingerprint"), commit=env.get("git_commit"))
    frames = [load.rows(results, area, name, per_folder=settings).frame for area in load.areas(results, "speed")]
    frames = [f for f in frames if not f.empty]
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    return df.round(3) if not df.empty else df


def build(results: Path | None = None) -> list[Path]:
    from . import leaderboard as lb_lib
    results = results or paths.results_root()
    # every speed folder is read before anything is written: a broken speed.csv (load.read_csv) is refused in one
    # line and leaves the tables as they were, not rewritten with blank speedups
    speed, by_category = speed_table(results, "speed.csv"), speed_table(results, "speed_by_category.csv")
    board = lb_lib.collect(results)
    out = results / "tables"
    out.mkdir(parents=True, exist_ok=True)
    written = []

    def emit(name: str, df: pd.DataFrame, title: str, markdown: bool = True, source: str | None = None) -> None:
        """`source`: the result area whose folders made a table that reproduces the paper's (paper.REPRODUCES);
        the lines naming what it reproduces and how the setups differ go under it."""
        if df.empty:
            return
        df.to_csv(out / f"{name}.csv", index=False)
        written.append(out / f"{name}.csv")
        if markdown:
            lines = paper.notes(name, results, source) if source else []
            (out / f"{name}.md").write_text(f"# {title}\n\n" + to_markdown(df) + "".join(f"\n{x}\n" for x in lines))
            written.append(out / f"{name}.md")

    lat = lattice_table(results)
    emit("top16_lattice", lat, "Block efficiency with the top-16 lattice, ours beside the paper's, in the paper's "
         "task groups (relative_change_pct: against the same side's BPD; ours_vs_paper_pct: ours against the "
         "paper's)", source="replay")
    if not lat.empty:
        emit("top16_lattice_wide", lattice_wide(lat), "Block efficiency with the top-16 lattice, the paper's layout "
             "in its task groups: ours (change vs our BPD), the paper's (change vs its BPD), ours against the "
             "paper's", source="replay")

    def plot(name: str, df: pd.DataFrame, x: str, y: str, xlabel: str, ylabel: str, title: str, **kw) -> None:
        path = lines_by_task(df, x, y, out / f"{name}.png", xlabel, ylabel, title, task_order=TASK_ORDER, **kw)
        written.extend([path] if path else [])

    replayed = load.rows(results, "replay", "replay.csv")
    rep = replayed.frame
    bpd = {lab: m for lab, m in replayed.methods.items() if m.name == "bpd" and not m.auto}
    heads_of = {lab: m.get("heads") for lab, m in bpd.items()}
    if any(heads_of.values()):
        by_h = rep[replayed.where(lambda m: m.label in bpd and m.get("threshold") is None)]
        by_h = by_h.assign(heads=by_h.method.map(lambda m: heads_of[m] or 8))
        emit("efficiency_vs_heads", by_h.pivot_table(index="task", columns="heads", values="block_efficiency")
             .round(3).reset_index(), "Block efficiency vs number of heads (plain BPD, replayed; 8 = all heads)",
             source="replay")
        plot("efficiency_vs_heads", by_h, "heads", "block_efficiency", "heads used (h)", "block efficiency",
             "Block efficiency vs number of heads (plain BPD)")
    if not rep.empty and (rep.method == "medusa").any():
        med = rep[rep.method.isin(["bpd", "16best-0gram", "medusa", "oracle:k=16"])]
        emit("medusa_vs_bpd", med.pivot_table(index="task", columns="method", values="block_efficiency").round(3)
             .reset_index(), "Medusa tree (mc_sim_7b_63, 63 candidates) vs linear BPD, block efficiency (replayed)",
             source="replay")
    trees = load.table(results, "medusa", "replay.csv")   # `bpdbench replay --out results/medusa/<task>`
    if not trees.empty:
        emit("medusa_trees", trees.pivot_table(index="task", columns="method", values="block_efficiency", sort=False)
             .round(3).reset_index(), "Medusa trees vs linear BPD on the same trajectories: mc_sim_7b_63, a tree "
             "built from the heads' measured accuracy (medusa-auto), and mc_sim over a lattice re-ranked by "
             "neural-m (medusa-neural-m); block efficiency, replayed", source="medusa")
    oracle = load.table(results, "oracle", "oracle.csv")
    emit("oracle_vs_k", oracle, "Oracle block efficiency vs k", source="oracle")
    plot("oracle_vs_k", oracle, "k", "block_efficiency", "k (top-k per head)", "oracle block efficiency",
         "Oracle block efficiency vs k", log2_x=True)
    emit("repetition", load.table(results, "analysis", "repetition.csv"),
         "Consecutive repetition in drafts, before/after 2-gram rescoring", source="analysis")
    entropy = load.table(results, "analysis", "entropy.csv")
    emit("entropy", entropy, "Per-head entropy and h_max", source="analysis")
    plot("entropy", entropy, "head", "mean_entropy", "head", "mean entropy (nats)", "Mean entropy per head")
    emit("hardware_utilization", hardware_table(results, task_order=TASK_ORDER),
         "Hardware utilization per generated token: computed from the model config and measured counters "
         "(ratios of sums), not measured with hardware counters", source="replay")
    # The wide dumps stay CSV only (every machine, commit and model in one file); the Markdown is per machine.
    emit("speed", speed, "", markdown=False)
    emit("speed_by_category", by_category, "", markdown=False)
    for name in RETIRED:
        (out / name).unlink(missing_ok=True)
    written.extend(leaderboard_files(results, out, board))
    for folder in load.folders(results, "speed", "speed_by_category.csv"):
        written.extend(_speed_figure(folder, out))
    sampled = sampling_table(results)
    emit("sampling", sampled, "Block efficiency and speedup vs AR at T = 0 (greedy), 0.7 and 1.0 (speculative "
         "sampling); speedup at T > 0 per token against AR sampling of the same examples in the same process "
         "(`bpdbench sweep grids/sampling.toml`, results/sampling/)")
    runs = load.table(results, "runs", "summary.csv")
    if not runs.empty:
        emit("runs", runs.drop(columns=[c for c in ("accepted_per_head",) if c in runs]),
             "Decoding runs (real, certified): quality, block efficiency, losslessness, speed")
    certs = load.table(results, "certificates", "summary.csv")      # grids/certificates.toml
    if not certs.empty:
        emit("certificates", certs[[c for c in CERTIFICATE_COLUMNS if c in certs]], "Float32 certificates, one real "
             "run per method and task (`bpdbench sweep grids/certificates.toml`): lossless_rate must be 1.0")
    from . import drafters
    emit("drafters_training", drafters.training_table(results), "Draft networks (`bpdbench train-network`): "
         "parameters, budget, held-out per-depth top-1/top-16 agreement with the base's greedy continuation")
    curve = drafters.learning_curve(results)
    emit("drafters_learning_curve", curve, "Draft networks: held-out top-1 at depth 1 against the positions the fit "
         "had seen (checkpoints where the training recorded them; `kept`: the weights it kept, its reported numbers)")
    png = learning_curves(curve, out / "drafters_learning_curve.png", "from results/drafters/training/*.json; "
                          "the filled points are the kept weights, what a run drafts with")
    written.extend([png] if png else [])
    rep = drafters.collect_replays(results)
    runs = load.rows(results, "drafters/runs", "summary.csv")
    emit("drafters_block_efficiency", drafters.efficiency_table(rep), "Draft networks vs bpd (Medusa-1 heads), "
         "block efficiency on the same greedy trajectories (replayed)")
    emit("drafters_repetition", drafters.repetition_table(rep), "Adjacent repeated tokens in each method's drafts "
         "(first path per step) vs in the greedy text itself (replayed)")
    emit("drafters_certificates", drafters.certificate_table(runs), "Draft networks, float32 certificates "
         "(`bpdbench run --dtype float32`): lossless_rate must be 1.0")
    from . import results_index          # results/README.md: every folder, who made it, current or superseded
    written.append(results_index.write(results))
    return written


def sampling_table(results: Path) -> pd.DataFrame:
    """results/sampling/<task>/<method>-T<t>/summary.csv -> one row per task and method, a block efficiency and a
    speedup column per temperature (greedy runs: T = 0)."""
    df = load.table(results, "sampling", "summary.csv", depth=2)
    if df.empty:
        return df
    df["T"] = df["temperature"].fillna(0.0) if "temperature" in df else 0.0
    wide = df.pivot_table(index=["task", "method"], columns="T", values=["block_efficiency", "speedup_vs_ar"])
    wide.columns = [f"{'BE' if v == 'block_efficiency' else 'speedup'} T={t:g}" for v, t in wide.columns]
    # quality beside AR sampling's on the same examples (greedy: identical outputs, so AR's is the method's own)
    for m in [c[3:] for c in df.columns if c.startswith("ar_") and c[3:] in df.columns]:
        df[f"ar_{m}"] = df[f"ar_{m}"].fillna(df[m].where(df["T"] == 0))
        q = df.pivot_table(index=["task", "method"], columns="T", values=[m, f"ar_{m}"])
        q.columns = [f"{v.replace('ar_', 'AR ')} T={t:g}" for v, t in q.columns]
        wide = wide.join(q)
    n = df.groupby(["task", "method"]).n_examples.max().rename("n_examples")
    return wide.join(n).round(3).reset_index()


def _speed_figure(folder: load.ResultFolder, out: Path) -> list[Path]:
    """One heatmap per speed run (`speed_by_category_<run>.png`), drawn from its CSV and config.json."""
    from .plots import plot_speed_by_category, speed_caption
    df = folder.read("speed_by_category.csv")
    n = int(df[df.method == "ar"].n_prompts.sum()) if (df.method == "ar").any() else 0
    png = plot_speed_by_category(df, out / f"speed_by_category_{folder.path.name}.png", speed_caption(folder, n))
    return [png] if png else []


def leaderboard_files(results: Path, out: Path, lb: "Leaderboard | None" = None) -> list[Path]:
    """The per-machine leaderboard (report/leaderboard.py): tables/leaderboard.md (the index),
    tables/leaderboard/<fingerprint>.md (the grid's boards) and <fingerprint>-studies.md with a PNG per ranked board
    (report/pages.py), tables/leaderboard.csv (every board's rows, numeric) and the self-contained
    tables/leaderboard.html. `lb`: the leaderboard already collected from `results`."""
    from . import html, leaderboard as lb_lib, pages
    lb = lb if lb is not None else lb_lib.collect(results)
    written = pages.write(lb, out)
    rows = leaderboard_rows(lb)
    if not rows.empty:
        rows.to_csv(out / "leaderboard.csv", index=False)
        written.append(out / "leaderboard.csv")
    return [*written, html.write(lb, out / "leaderboard.html")]


def leaderboard_rows(lb: "Leaderboard") -> pd.DataFrame:
    """Every board's ranked rows with the machine, board and per-position acceptance as numbers (the CSV)."""
    frames = []
    for m in lb.machines:
        for b in [*m.boards, *m.studies]:
            acc = pd.DataFrame([{"method": k, **{f"a_{j + 1}": v for j, v in enumerate(a)}, "acceptance_source": src}
                                for k, (a, src) in b.accept.items()] or None, columns=None if b.accept else ["method"])
            keys = {"fingerprint": m.fingerprint, "cpu": m.processor, "board": b.slug, "task": b.task,
                    "model": b.model, "dtype": b.dtype, "commit": b.runs[0].commit, "study": b.study,
                    "refused": b.refused}
            rank = pd.array([pd.NA] * len(b.rows) if b.refused else range(1, len(b.rows) + 1), dtype="Int64")
            df = b.rows.drop(columns=["run"]).assign(rank=rank).merge(acc, on="method", how="left")
            if len(b.engines):
                df = pd.concat([df, b.engines.drop(columns=["run"]).assign(rank=pd.NA, engine=True)],
                               ignore_index=True)
            frames.append(pd.concat([pd.DataFrame([keys] * len(df)), df], axis=1))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
