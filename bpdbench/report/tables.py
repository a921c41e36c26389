"""`bpdbench tables`: the paper's tables, rendered from result files only (never from stdout).

Reads `results/replay/<task>/replay.csv` (lattice methods on shared greedy trajectories), `results/oracle/<task>/
oracle.csv`, `results/analysis/<task>/{repetition,entropy}.csv` and `results/runs/*/summary.csv`, and writes CSV +
Markdown under `results/tables/`, with the paper's numbers (`../shared/paper/reference_tables.csv`) beside ours, PNGs
where the paper has a figure (plots.py), and the computed hardware-utilization table (hardware.py, from
`results/replay/<task>/replay.jsonl`), the Medusa tree variants from `results/medusa/<task>/replay.csv`, the
per-machine speed leaderboard from `results/speed*/<folder>/` (leaderboard.py, html.py; the wide speed CSVs beside
it), and the float32 certificates from `results/certificates/*/summary.csv`.
Every folder is found and read by load.py, whose `method` column already holds current labels: the readers here
select and pivot.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from .. import paths
from . import load
from .hardware import hardware_table
from .plots import lines_by_task
from ..experiments.summary import to_markdown

if TYPE_CHECKING:
    from .leaderboard import Leaderboard

PAPER_METHOD = {"neural-m": "neural-61m", "oracle:k=16": "oracle-k16"}   # our label -> the paper table's name
LATTICE_METHODS = ["bpd", "neural-m", "ngram4", "16best-0gram", "16best-ngram4", "oracle:k=16"]
CERTIFICATE_COLUMNS = ["task", "method", "dtype", "n_examples", "new_tokens", "block_efficiency", "lossless_rate"]
RETIRED = ("speed.md", "speed_by_category.md")   # mixed machines, commits and models in one table: see leaderboard
TASK_ORDER = ["lambada", "squad", "cnn_dailymail", "samsum", "multi_news", "xsum", "newsroom", "mt_bench"]


def reference_tables() -> pd.DataFrame | None:
    path = paths.REPO.parent / "shared" / "paper" / "reference_tables.csv"
    return pd.read_csv(path) if path.exists() else None


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
    frames = [load.rows(results, kind, name, per_folder=settings).frame for kind in load.kinds(results, "speed")]
    frames = [f for f in frames if not f.empty]
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    return df.round(3) if not df.empty else df


def lattice_table(results: Path) -> pd.DataFrame:
    ours = load.table(results, "replay", "replay.csv")
    if ours.empty:
        return ours
    ours = ours[ours.method.isin(LATTICE_METHODS)]
    ref = reference_tables()
    rows = []
    for (task, method), g in ours.groupby(["task", "method"], sort=False):
        r = g.iloc[-1]
        row = {"task": task, "method": method, "n_examples": int(r.n_examples),
               "block_efficiency": round(float(r.block_efficiency), 3)}
        base = ours[(ours.task == task) & (ours.method == "bpd")]
        if method not in ("bpd", "oracle:k=16") and not base.empty:
            row["relative_change_pct"] = round(100 * (r.block_efficiency / base.block_efficiency.iloc[-1] - 1), 2)
        if ref is not None:
            p = ref[(ref.task == task) & (ref.method == PAPER_METHOD.get(method, method))]
            if not p.empty:
                row["paper_block_efficiency"] = p.block_efficiency.iloc[0]
                row["paper_relative_change_pct"] = p.relative_change_pct.iloc[0]
        rows.append(row)
    df = pd.DataFrame(rows)
    df["_t"] = df.task.map(lambda t: TASK_ORDER.index(t) if t in TASK_ORDER else 99)
    df["_m"] = df.method.map(LATTICE_METHODS.index)
    return df.sort_values(["_t", "_m"]).drop(columns=["_t", "_m"]).reset_index(drop=True)


def lattice_wide(df: pd.DataFrame) -> pd.DataFrame:
    """The paper's layout: one row per task, one column per method ("ours (paper)")."""
    def cell(r) -> str:
        s = f"{r.block_efficiency:.2f}"
        if pd.notna(r.get("relative_change_pct")):
            s += f" ({r.relative_change_pct:+.1f}%)"
        if pd.notna(r.get("paper_block_efficiency")):
            s += f" [paper {r.paper_block_efficiency:.2f}]"
        return s
    wide = df.assign(cell=df.apply(cell, axis=1)).pivot(index="task", columns="method", values="cell")
    wide = wide[[m for m in LATTICE_METHODS if m in wide.columns]]
    order = [t for t in TASK_ORDER if t in wide.index] + [t for t in wide.index if t not in TASK_ORDER]
    return wide.loc[order].reset_index()


def build(results: Path | None = None) -> list[Path]:
    results = results or paths.results_root()
    out = results / "tables"
    out.mkdir(parents=True, exist_ok=True)
    written = []

    def emit(name: str, df: pd.DataFrame, title: str, markdown: bool = True) -> None:
        if df.empty:
            return
        df.to_csv(out / f"{name}.csv", index=False)
        written.append(out / f"{name}.csv")
        if markdown:
            (out / f"{name}.md").write_text(f"# {title}\n\n" + to_markdown(df))
            written.append(out / f"{name}.md")

    lat = lattice_table(results)
    emit("top16_lattice", lat, "Block efficiency with the top-16 lattice (ours vs paper)")
    if not lat.empty:
        emit("top16_lattice_wide", lattice_wide(lat), "Block efficiency, paper layout: ours (rel. change) [paper]")

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
             .round(3).reset_index(), "Block efficiency vs number of heads (plain BPD, replayed; 8 = all heads)")
        plot("efficiency_vs_heads", by_h, "heads", "block_efficiency", "heads used (h)", "block efficiency",
             "Block efficiency vs number of heads (plain BPD)")
    if not rep.empty and (rep.method == "medusa").any():
        med = rep[rep.method.isin(["bpd", "16best-0gram", "medusa", "oracle:k=16"])]
        emit("medusa_vs_bpd", med.pivot_table(index="task", columns="method", values="block_efficiency").round(3)
             .reset_index(), "Medusa tree (mc_sim_7b_63, 63 candidates) vs linear BPD, block efficiency (replayed)")
    trees = load.table(results, "medusa", "replay.csv")   # `bpdbench replay --out results/medusa/<task>`
    if not trees.empty:
        emit("medusa_trees", trees.pivot_table(index="task", columns="method", values="block_efficiency", sort=False)
             .round(3).reset_index(), "Medusa trees vs linear BPD on the same trajectories: mc_sim_7b_63, a tree "
             "built from the heads' measured accuracy (medusa-auto), and mc_sim over a lattice re-ranked by "
             "neural-m (medusa-neural-m); block efficiency, replayed")
    oracle = load.table(results, "oracle", "oracle.csv")
    emit("oracle_vs_k", oracle, "Oracle block efficiency vs k")
    plot("oracle_vs_k", oracle, "k", "block_efficiency", "k (top-k per head)", "oracle block efficiency",
         "Oracle block efficiency vs k", log2_x=True)
    emit("repetition", load.table(results, "analysis", "repetition.csv"),
         "Consecutive repetition in drafts, before/after 2-gram rescoring")
    entropy = load.table(results, "analysis", "entropy.csv")
    emit("entropy", entropy, "Per-head entropy and h_max")
    plot("entropy", entropy, "head", "mean_entropy", "head", "mean entropy (nats)", "Mean entropy per head")
    emit("hardware_utilization", hardware_table(results, task_order=TASK_ORDER),
         "Hardware utilization per generated token: computed from the model config and measured counters "
         "(ratios of sums), not measured with hardware counters")
    # The wide dumps stay CSV only (every machine, commit and model in one file); the Markdown is per machine.
    emit("speed", speed_table(results, "speed.csv"), "", markdown=False)
    emit("speed_by_category", speed_table(results, "speed_by_category.csv"), "", markdown=False)
    for name in RETIRED:
        (out / name).unlink(missing_ok=True)
    written.extend(leaderboard_files(results, out))
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


def leaderboard_files(results: Path, out: Path) -> list[Path]:
    """The per-machine leaderboard (report/leaderboard.py): tables/leaderboard.md (the index),
    tables/leaderboard/<fingerprint>.md with a PNG per board, tables/leaderboard.csv (every board's rows, numeric)
    and the self-contained tables/leaderboard.html."""
    from . import html, leaderboard as lb_lib
    lb = lb_lib.collect(results)
    pages = out / "leaderboard"
    pages.mkdir(exist_ok=True)
    for old in [*pages.glob("*.md"), *pages.glob("*.png")]:       # pages of machines no longer in the results
        old.unlink()
    written: list[Path] = []
    for m in lb.machines:
        text = [f"# Leaderboard: {m.processor}, fingerprint {m.fingerprint}", "",
                f"CPU flags: {' '.join(m.flags)}; {m.cores} cores. One board per benchmark, model, dtype and protocol, "
                "from one commit; rows ranked by speedup. [All machines](../leaderboard.md)", "",
                "## Which drafter on this machine", "", *(f"- {b.verdict}" for b in m.boards), ""]
        for b in m.boards:
            text += [f"## {b.heading}", "", b.caption, ""]
            if b.figure():
                png = pages / f"{m.fingerprint}-{b.slug}.png"
                png.write_bytes(b.figure())
                written.append(png)
                text += [f"![speedup over AR, {b.heading}]({png.name})", ""]
            for t in b.tables:
                text += [f"### {t.title}", "", to_markdown(t.frame), t.note, ""]
        path = pages / f"{m.fingerprint}.md"
        path.write_text("\n".join(text))
        written.append(path)
    index = html.machines(lb)
    index["machine"] = index.machine.map(lambda fp: f"[{fp}](leaderboard/{fp}.md)")
    text = ["# Leaderboard: one page per machine", "",
            "Rendered from results/speed*/ by `bpdbench tables`; the same tables, sortable, with figures: "
            "[leaderboard.html](leaderboard.html). A table never mixes machines (CPU fingerprint), models, dtypes, "
            "commits or protocols. The wide dumps of every folder are speed.csv and speed_by_category.csv.", "",
            to_markdown(index) if not index.empty else "No speed folder records its machine.", ""]
    if lb.left_out:
        text += ["## Left out", "", to_markdown(pd.DataFrame(lb.left_out, columns=["folder", "why"])), ""]
    (out / "leaderboard.md").write_text("\n".join(text))
    rows = leaderboard_rows(lb)
    if not rows.empty:
        rows.to_csv(out / "leaderboard.csv", index=False)
        written.append(out / "leaderboard.csv")
    return [*written, out / "leaderboard.md", html.write(lb, out / "leaderboard.html")]


def leaderboard_rows(lb: "Leaderboard") -> pd.DataFrame:
    """Every board's ranked rows with the machine, board and per-position acceptance as numbers (the CSV)."""
    frames = []
    for m in lb.machines:
        for b in m.boards:
            acc = pd.DataFrame([{"method": k, **{f"a_{j + 1}": v for j, v in enumerate(a)}, "acceptance_source": src}
                                for k, (a, src) in b.accept.items()] or None, columns=None if b.accept else ["method"])
            keys = {"fingerprint": m.fingerprint, "cpu": m.processor, "board": b.slug, "task": b.task,
                    "model": b.model, "dtype": b.dtype, "commit": b.runs[0].commit}
            df = b.rows.drop(columns=["run"]).assign(rank=range(1, len(b.rows) + 1)).merge(acc, on="method",
                                                                                               how="left")
            frames.append(pd.concat([pd.DataFrame([keys] * len(df)), df], axis=1))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
