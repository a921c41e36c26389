"""One board's numbers and display tables: speed (end-to-end and decode speedup, ms per token), drafting (#MAT
beside a_1..a_k, block efficiency), training of the trained rows, speedup per Spec-Bench task (or per category in
older folders), and "which drafter" by a paired bootstrap against each runner-up. A refused board (checks.py) shows
its rows unranked, with no verdict.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..experiments.speed import counted
from . import checks, engines, load, replication
from .runs import LETTERS, Board, Run, Table, flags, grid_name, short
from .verdicts import against_best, ci, fit, is_drafter, num, verdict, which_table

POSITIONS = 8                       # a_1..a_8 at most
SUBTASKS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")   # Spec-Bench's 6 tasks
TRAINED = ("bpd", "medusa", "eagle", "eagle3", "hydra", "hydra++", "amphista", "koala")
PREDICTED = "predicted (calibrated forwards + this run's draft time)"
CONVENTIONS = (
    "speedup = sum of AR's median seconds / sum of the method's over its counted prompts (output identical to "
    "greedy, or a certified bfloat16 near-tie), against the AR of its own folder; [95% CI] bootstrap over prompts. "
    "decode speedup: the same with each prompt's prefill call excluded (— where the folder predates the record). "
    "ms/token = 1000 x seconds / new tokens over the counted prompts. "
    f"{PREDICTED} = the speedup the machine's calibrated forward costs predict from the counters, with the drafting "
    "seconds measured in this same run (so it is not independent of the timing it predicts). verified/step = "
    "tokens the base scores per verify forward. step cost = the method's seconds per serial call over AR's. "
    "identical / near-tie / lost = prompts equal to greedy / certified near-ties (counted) / not counted. "
    "(auto: AR) = an `auto` row that priced every shape on the tune split and found none faster than AR on this "
    "machine, so it ran AR's loop; it is never named the drafter to use. A row's label is the spelling it ran: "
    "`hybrid` is followed by the sources and tree size config.json resolved for it.")
DRAFTING = (
    "#MAT = mean accepted tokens per verify step in Spec-Bench's convention: decode steps only (the prefill call "
    "excluded), bonus token included, (new tokens - 1) / (serial calls - 1) over the counted prompts; a_j = verify "
    "steps that accepted draft position j / verify steps, so that a_1 + ... + a_k + 1 = #MAT where a_j come from "
    "this run (source `this run`; a stand-in replay's a_j were counted on another run). Where a prompt ended at "
    "its end-of-sequence token inside a step, the tokens that step accepted after it count in a_j but not in new "
    "tokens, so an older folder's sum can exceed #MAT - 1 by a few hundredths. block efficiency = new "
    "tokens / serial calls of the base model, prefill call included (AR = 1): it reads below #MAT by that one call.")


def ranked(runs: list[Run]) -> pd.DataFrame:
    """speed.csv rows of the board's folders (a method once: the first folder's), ranked by speedup, with what the
    page derives: ms per token, #MAT, the `auto` rows that ran AR."""
    frames, seen = [], set()
    for letter, run in zip(LETTERS, runs):
        s = run.summary[~run.summary.method.isin(seen)]
        seen.update(s.method)
        frames.append(s.assign(run=letter, folder=run.rel))
    df = pd.concat(frames, ignore_index=True)
    for c in ("speedup_ci_low", "speedup_ci_high", "predicted_speedup", "verify_tokens_per_step", "step_cost",
              "block_efficiency", "n_near_tie", "decode_speedup_vs_ar", "decode_speedup_ci_low",
              "decode_speedup_ci_high", "ms_per_token", "mat", "median_spread"):
        if c not in df:
            df[c] = float("nan")
    df["lost"] = df.n_prompts - df.n_counted
    by = {letter: run for letter, run in zip(LETTERS, runs)}
    df["nothing"] = [m in by[x].nothing for m, x in zip(df.method, df.run)]
    if {"seconds", "tokens"} <= set(df.columns):
        df["ms_per_token"] = df.ms_per_token.fillna(1000 * df.seconds / df.tokens.where(df.tokens > 0))
    df["mat"] = [v if pd.notna(v) else mat(by[x], m) for v, m, x in zip(df.mat, df.method, df.run)]
    return df.sort_values("speedup_vs_ar", ascending=False, kind="stable", na_position="last").reset_index(drop=True)


def baseline(label: str) -> str:
    """The label whose tokens certify a row (MethodSpec.baseline): "ar" for bpdbench's own loops; another engine's
    rows (llama.cpp on the model's GGUF) are certified against that engine's greedy and shown in their own section,
    never ranked against the drafters."""
    m = load.method(label.split(" [")[0])
    if m is not None:
        return str(getattr(m.spec, "baseline", "ar"))
    return "llamacpp" if label.startswith("llamacpp") else "ar"


def mat(run: Run, method: str) -> float:
    """#MAT from the counted records when speed.csv predates the column: (tokens - 1) / (serial calls - 1)."""
    r = run.records[run.records.method == method]
    r = r[counted(r)] if len(r) else r
    if not len(r) or "serial_calls" not in r or r.serial_calls.isna().any():
        return float("nan")
    steps = float((r.serial_calls - 1).sum())
    return float((r.tokens - 1).sum()) / steps if steps > 0 else float("nan")


def shown(run: Run, label: str, nothing: bool) -> str:
    """The row's label as it ran: `hybrid` (two different methods on different pages) with its resolved sources
    and tree size, the `(auto: AR)` tag wherever a row sized itself to AR."""
    text = label
    r = run.resolved.get(label) or {}
    if label.partition(":")[0] == "hybrid" and r.get("retrieval"):
        text += f" [= {r['retrieval']} + {r.get('model')}, {r.get('nodes')} nodes]"
    return text + (" (auto: AR)" if nothing else "")


def groups(b: Board) -> tuple[str, pd.DataFrame]:
    """Per Spec-Bench task (speed.jsonl `subtask`; `category` in folders that predate it) and method: speedup over
    the counted prompts against the same folder's AR."""
    out, key = [], "category"
    for letter, run in zip(LETTERS, b.runs):
        r = run.records
        k = "subtask" if "subtask" in r and r.subtask.notna().any() else "category"
        if k not in r or r[k].isna().all():
            continue
        key = k
        ar = run.ar.set_index("id").median_s
        r = r[r.method.isin(set(b.rows[b.rows.run == letter].method))].assign(ar_s=lambda d: d.id.map(ar))
        r = r[counted(r) & r.ar_s.notna()]
        for (cat, m), g in r.groupby([k, "method"], sort=False):
            out.append({"group": cat, "method": m, "n": g.get("question", g.id).nunique(),
                        "speedup": g.ar_s.sum() / g.median_s.sum()})
    return key, pd.DataFrame(out, columns=["group", "method", "n", "speedup"])


def units(run: Run, method: str) -> pd.Series:
    """Seconds per question (both MT-Bench turns summed) of a row's counted records, indexed by (subtask, question):
    what the paired bootstrap resamples."""
    r = run.records[run.records.method == method]
    r = r[counted(r)] if len(r) else r
    if not len(r):
        return pd.Series(dtype=float)
    q = r.question if "question" in r else r.id
    s = r.subtask.fillna("").astype(str) if "subtask" in r else pd.Series([""] * len(r), index=r.index)
    return r.median_s.groupby([s.tolist(), q.astype(str).tolist()]).sum()


def describe(b: Board) -> str:
    """The board's heading and caption (machine, flags, cores/threads, model, dtype, torch, commit, n, AR's ms per
    token); returns the short title every table of the board carries."""
    run, env, ar = b.runs[0], b.runs[0].env, b.runs[0].ar
    key = "subtask" if "subtask" in ar and ar.subtask.notna().any() else "category"
    cats = list(dict.fromkeys(ar[key].dropna())) if key in ar else []
    noun = "task" if key == "subtask" else "category"
    plural = "tasks" if key == "subtask" else "categories"
    n = ar.question.nunique() if "question" in ar else len(ar)
    what = f"{cats[0]}" if len(cats) == 1 else f"{len(cats)} {plural}" if cats else "no categories"
    if cats:              # the prompts counted per group, not the planned number (`--limit` takes fewer)
        counts = (ar.groupby(key).question.nunique() if "question" in ar else ar[key].value_counts())
        lo, hi = int(counts.min()), int(counts.max())
        what = f"{lo if lo == hi else f'{lo}-{hi}'} per {noun}, {what}"
    planned = (run.folder.config.get("resolved") or {}).get("n_selected")
    drawn = [str(x) for x in ((run.folder.config.get("draw") or {}).get("ids") or [])]
    if drawn:             # the board's committed draw: the questions it must hold
        done = set((ar.question if "question" in ar else ar.id).astype(str))
        have, planned = len(done & set(drawn)), len(drawn)
    else:                 # older folders: the examples the run selected
        have = len(ar)
    b.partial = bool(planned and have < planned)
    if b.partial:         # a long run (the leaderboard) is accumulated and rendered as it goes
        what += f"; PARTIAL: {have} of the {planned} planned prompts measured so far"
    experiments = ", ".join(dict.fromkeys(r.rel.split("/")[0] for r in b.runs))
    r = b.rows[b.rows.method == "ar"]
    ms = f" · AR {r.ms_per_token.iloc[0]:.1f} ms/token" if len(r) and pd.notna(r.ms_per_token.iloc[0]) else ""
    b.heading = f"{b.task} · {b.model} · {b.dtype} · {n} prompts ({what}){ms} · {experiments}"
    b.caption = (f"{env['processor']} ({flags(env)}), {env.get('cpu_count')} cores, {run.folder.threads} thread"
                 f"{'' if run.folder.threads == 1 else 's'} · "
                 f"{b.model} · {b.dtype} · torch {env['versions']['torch']} · commit {short(run.commit)} · "
                 f"sweep {grid_name(run.sweep.get('grid'))} · n = {n} prompts ({what}), "
                 f"{int(ar.tokens.sum()) if len(ar) else 0} new tokens (≤ {run.folder.max_new_tokens} per prompt), "
                 f"median of {run.folder.repeats} repeats")
    return f"{b.task} · {b.model} · {b.dtype} · {env['processor']}"


def fill(b: Board, sources: load.StandIns, training: dict) -> None:
    """The board's numbers, heading, caption, checks, verdict and display tables."""
    every = ranked(b.runs)
    other = every.method.map(baseline) != "ar"
    b.rows, b.engines = every[~other].reset_index(drop=True), every[other].reset_index(drop=True)
    r = b.rows
    title, tid = describe(b), f"{b.fingerprint}-{b.slug}"
    today = not b.study and any(checks.today_protocol(x.records) for x in b.runs)
    b.refused, b.noise = checks.noise_floor(r, today)
    by = {letter: run for letter, run in zip(LETTERS, b.runs)}
    labels = [shown(by[x], m, n) for m, n, x in zip(r.method, r.nothing, r.run)]
    speed = pd.DataFrame({
        "#": range(1, len(r) + 1) if not b.refused else ["—"] * len(r), "method": labels,
        "speedup [95% CI]": [ci(*x) for x in zip(r.speedup_vs_ar, r.speedup_ci_low, r.speedup_ci_high)],
        "decode speedup": [ci(*x) if pd.notna(x[0]) else "—" for x in zip(
            r.decode_speedup_vs_ar, r.decode_speedup_ci_low, r.decode_speedup_ci_high)],
        "ms/token": r.ms_per_token.map(lambda v: num(v, 1)), PREDICTED: r.predicted_speedup.map(num),
        "verified/step": r.verify_tokens_per_step.map(lambda v: num(v, 1)), "step cost": r.step_cost.map(num),
        "identical": r.n_identical, "near-tie": r.n_near_tie.fillna(0).astype(int), "lost": r.lost})
    if len(b.runs) > 1:
        speed["run"] = r.run
    folders = "; ".join(f"{LETTERS[i]} = {x.rel}" for i, x in enumerate(b.runs))
    left = "".join(f" Left out: {rel}: {why}." for rel, why in b.left_out)
    order = "not ranked (refused)" if b.refused else "ranked by speedup"
    b.tables = [Table(f"{tid}-speed", f"Speed, {order}: {title}", speed,
                      f"{CONVENTIONS} Folders: {folders} (each row against its own folder's AR).{left}")]
    if len(b.engines):
        e = b.engines
        b.tables.append(Table(f"{tid}-engines", f"Engines a CPU user would pick instead: {title}", pd.DataFrame({
            "method": e.method, "certified against": e.method.map(baseline),
            "ms/token": e.ms_per_token.map(lambda v: num(v, 1)),
            "speedup over bpdbench's AR [95% CI]": [ci(*x) for x in zip(e.speedup_vs_ar, e.speedup_ci_low,
                                                                          e.speedup_ci_high)],
            "identical": e.n_identical, "near-tie": e.n_near_tie.fillna(0).astype(int), "lost": e.lost}),
            "Another engine's rows, timed on the same prompts and machine: their outputs are certified against that "
            "engine's own greedy (its numerics differ from bpdbench's), so they are not ranked with the drafters; "
            "compare them by ms per token."))
    curves = engines.verify_curves([x.folder.path for x in b.runs])
    if len(curves):
        a = curves.attrs
        b.tables.append(Table(f"{tid}-verify-curves", f"Verify cost: one forward over n tokens, each engine in its "
                              f"own decode steps: {title}", pd.DataFrame({
                                  "n": curves.n, "bpdbench (steps)": curves.bpdbench_steps.map(num),
                                  "llama.cpp (steps)": curves.llamacpp_steps.map(num)}),
                              f"bpdbench: {a.get('bpdbench_dtype', '?')}, 1 step = "
                              f"{num(a.get('bpdbench_step_ms', float('nan')), 1)} ms; llama.cpp "
                              f"{a.get('llamacpp_version', '?')} on {a.get('llamacpp_file', '?')}, 1 step = "
                              f"{num(a.get('llamacpp_step_ms', float('nan')), 1)} ms; every row's logits, at a "
                              f"context of {a.get('context', '?')} tokens (config.json verify_curves of "
                              f"{a.get('folder', '?')})."))
    b.accept = acceptance(b, sources)
    depth = min(POSITIONS, max([1, *(len(a) for a, _ in b.accept.values())]))
    drafting = pd.DataFrame([{"method": lab, "#MAT": num(v), "block efficiency": num(e),
                              **{f"a_{j + 1}": num(a[j], 3) if j < len(a) else "" if a or j else "n/a"
                                 for j in range(depth)}, "source": src}
                             for lab, m, v, e in zip(labels, r.method, r.mat, r.block_efficiency) if m in b.accept
                             for a, src in [b.accept[m]]])
    b.tables.append(Table(f"{tid}-accept", f"Drafting: #MAT, acceptance per draft position, block efficiency: "
                          f"{title}", drafting, DRAFTING))
    trained = trained_rows(b, training, labels)
    if not trained.empty:
        b.tables.append(Table(f"{tid}-training", f"Training of the trained rows: {title}", trained,
                              "greedy positions = the base model's greedy tokens the heads or draft network were "
                              "fitted on; held-out top-1 at depth 1 = how often its first draft token is the base "
                              "model's greedy token on held-out text (config.json resolved heads/drafter record, or "
                              "the drafter's training report where the run did not record it); — where neither did."))
    key, cat = groups(b)
    if cat.group.nunique() >= 2:
        names = [c for c in SUBTASKS if c in set(cat.group)] + [c for c in dict.fromkeys(cat.group)
                                                              if c not in SUBTASKS]
        counts = cat.groupby("group", sort=False).n.max()
        grid = cat.pivot(index="method", columns="group", values="speedup")
        grid = grid.reindex([m for m in r.method if m in grid.index])[names].map(num)
        grid["overall"] = r.set_index("method").speedup_vs_ar.reindex(grid.index).map(num)
        grid = grid.reset_index().rename_axis(columns=None)
        parts = fit(grid)
        noun = "task" if key == "subtask" else "category"
        for i, part in enumerate(parts, 1):
            k = f" ({i}/{len(parts)})" if len(parts) > 1 else ""
            b.tables.append(Table(f"{tid}-category-{i}", f"Speedup by {noun}{k}: {title}", part,
                                  f"Per {noun}: sum of AR's median seconds / the method's over its counted prompts of "
                                  f"that {noun} (speed.jsonl); prompts per {noun}: "
                                  f"{', '.join(f'{c} {n}' for c, n in counts.items())}."))
    for run in b.runs:
        again = replication.table(run.folder.path)
        if again is not None and len(again):
            b.tables.append(Table(f"{tid}-replication", f"Replication on a disjoint draw: {title}", again,
                                  f"The board's rows timed again, each against its own AR, on a second draw of "
                                  f"prompts disjoint from the board's ({replication.partner(run.folder.path).name}); "
                                  f"replicated = the replication's speedup lies within the board's 95% interval."))
    if b.refused:
        b.verdict = f"**{b.heading}**: {b.refused}"
        return
    pool = r.assign(label=labels)[~r.nothing].rename(columns={"speedup_vs_ar": "speedup", "speedup_ci_low": "lo",
                                                              "speedup_ci_high": "hi"})
    top = against_best(pool, {m: units(by[x], m) for m, x in zip(pool.method, pool.run)})
    named = dict(zip(pool.method, pool.label))
    top = [{**t, "method": named.get(t["method"], t["method"])} for t in top]
    b.verdict = f"**{b.heading}**: {verdict(top)}"
    if len(top) > 1:
        b.tables.append(Table(f"{tid}-which", f"Which drafter: the best against each runner-up: {title}",
                              which_table(top), "seconds / best's = the runner-up's summed seconds over the best's, "
                              "on the prompts (questions) both counted; [95% CI] paired bootstrap over those prompts, "
                              "resampled together for both rows (stratified by Spec-Bench task where recorded). "
                              "separated: the interval excludes 1."))


def trained_rows(b: Board, training: dict, labels: list[str]) -> pd.DataFrame:
    """Every trained row (heads, draft networks) with its training data and held-out top-1 at depth 1."""
    out = []
    for lab, m, x in zip(labels, b.rows.method, b.rows.run):
        parsed = load.method(m.split(" [")[0])
        name = parsed.name if parsed is not None else m.partition(":")[0]
        if name not in TRAINED:
            continue
        run = b.runs[LETTERS.index(x)]
        rec = run.resolved.get(m) or {}
        if rec.get("heldout") or rec.get("drafter"):
            held, src = rec.get("heldout") or {}, "config.json resolved.methods"
            positions = rec.get("greedy_positions") or (rec.get("data") or {}).get("greedy_positions")
            if positions is None:
                positions = training.get((rec.get("name") or name, rec.get("profile")))
                src += " + " + ("drafters/training report" if positions is not None else "no training data record")
        else:
            h = run.folder.heads_info
            held, positions, src = h.get("heldout") or {}, h.get("greedy_positions"), "config.json resolved.heads"
        top1 = (held.get("top1") or [None])[0]
        out.append({"method": lab, "greedy positions": "—" if positions is None else f"{int(positions):,}",
                    "held-out top-1 (depth 1)": "—" if top1 is None else f"{top1:.3f}", "from": src})
    return pd.DataFrame(out)


def training_reports(results: Path) -> dict:
    """(drafter name, profile) -> greedy positions, from results/drafters/training/*.json."""
    return {(r.get("name"), r.get("profile")): (r.get("data") or {}).get("greedy_positions")
            for r in load.reports(results, "drafters/training") if (r.get("data") or {}).get("greedy_positions")}


def acceptance(b: Board, sources: load.StandIns) -> dict[str, tuple[list[float], str]]:
    """a_1..a_POSITIONS per drafter of the board: the speed run's own counts, else a stand-in folder's, else []."""
    out: dict[str, tuple[list[float], str]] = {}
    for m, letter in zip(b.rows.method, b.rows.run):
        if not is_drafter(m):
            continue
        run = b.runs[LETTERS.index(letter)]
        mine = run.records[run.records.method == m]
        got = load.summed_acceptance(mine[counted(mine)].to_dict("records")) if len(mine) else None
        found = (*got, "this run") if got else sources.find(run.folder, m)
        if found and found[0]:
            steps, acc, src = found
            out[m] = ([a / steps for a in acc[:POSITIONS]], src)
        else:
            out[m] = ([], "n/a")
    return out
