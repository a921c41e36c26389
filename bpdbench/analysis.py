"""`bpdbench oracle | analyze | replay | tune`: lattice analyses over greedy trajectories (see replay.py).

Each command writes per-example JSONL plus an aggregate CSV (ratios of summed counters), and PNGs are drawn from
the CSV. Greedy trajectories come from the same content-hashed cache as the losslessness certificate.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import pandas as pd
import torch

import rescorers
import tasks as task_registry
from . import models, replay, runner
from .config import RunConfig, environment
from .metrics import Counters, ratios
from .results import resumable

KS = (1, 2, 4, 8, 16)


@dataclass
class Context:
    cfg: RunConfig
    model: object
    tok: object
    heads: object
    meta: dict


def prepare(cfg: RunConfig, log=print, heldout: bool = False) -> tuple[Context, list]:
    cfg = cfg.validate()
    threads = runner.setup_torch(cfg)
    task = task_registry.get_task(cfg.task)
    examples = runner.select_examples(cfg, task, heldout)
    model, tok = models.load(cfg.model, cfg.dtype, cfg.device)
    heads = runner.resolve_heads(cfg.replace(method="bpd"), model, tok, log)
    meta = {"config": cfg.to_dict(), "environment": environment(threads, str(model.device), cfg.dtype),
            "slice": "heldout" if heldout else "eval", "heads": getattr(heads, "meta", None),
            "rescorer_dtype": cfg.dtype}  # neural rescorers follow the run's dtype (rescorers.build)
    return Context(cfg, model, tok, heads, meta), examples


def trajectories(ctx: Context, examples, k_max: int = 16, skip: frozenset = frozenset()
                 ) -> Iterator[tuple[object, replay.Trajectory]]:
    task = task_registry.get_task(ctx.cfg.task)
    max_new = ctx.cfg.max_new_tokens or task.max_new_tokens
    eos = runner.eos_ids(ctx.model, ctx.tok)
    ref = runner.GreedyReference(ctx.model, ctx.cfg.model, ctx.cfg.dtype, str(ctx.model.device))
    for ex in examples:
        if ex.id in skip:
            continue
        prompt = runner.encode_prompt(ctx.tok, task, ex, ctx.cfg.max_prompt_tokens)
        greedy, _ = ref.get(prompt, max_new, eos)
        if len(greedy) >= 2:
            yield ex, replay.trajectory(ctx.model, ctx.heads, prompt, greedy, ctx.cfg.heads, k_max)


def choosers(ctx: Context, names: list[str], alphas: dict[str, float] | None = None, log=print
             ) -> dict[str, tuple[Callable, int]]:
    """name -> (draft rule, lattice width) for replay: `bpd`, `bpd-h<N>` (first N heads), any rescorer name;
    oracle-k<K> entries are handled by the caller."""
    out = {}
    for name in names:
        if name in ("bpd", "none"):
            out[name] = (replay.top1, 1)
            continue
        if name.startswith("bpd-h"):            # plain BPD with only the first N heads (efficiency vs h)
            n = int(name[len("bpd-h"):])
            out[name] = (lambda lat, ctx, n=n: [lat.ids[:n, 0].tolist()], 1)
            continue
        spec = rescorers.get_rescorer(name)
        alpha = (alphas or {}).get(name)
        if alpha is None:
            alpha = rescorers.tuned_alpha(ctx.cfg.task, name, ctx.cfg.model)
        r = rescorers.build(spec, ctx.cfg.model, alpha, ctx.cfg.k, str(ctx.model.device), log,
                            heads_meta=ctx.meta.get("heads"), dtype=ctx.cfg.dtype)
        out[name] = (_stateful(r), ctx.cfg.k)
    return out


def _stateful(r):
    """Replay feeds contexts of one example in order; reset the rescorer when a new example starts."""
    last = {"prompt": None}

    def choose(lattice, context):
        if last["prompt"] is None or context[: len(last["prompt"])] != last["prompt"]:
            last["prompt"] = list(context)
            r.reset(list(context))
        return r.refine(lattice, context)
    return choose


RESUME_IGNORES = ("limit", "threads", "out", "resume")   # a resumed run may ask for more examples, on other threads


def replay_methods(ctx: Context, examples, methods: list[str], out: Path, log=print, resume: bool = False
                   ) -> pd.DataFrame:
    """Block efficiency of each method on the same trajectories (`oracle-k16` etc. allowed as method names).
    Records are appended per example; with `resume`, examples already in `out` are kept and not replayed again."""
    out.mkdir(parents=True, exist_ok=True)
    meta = {**ctx.meta, "methods": list(methods)}
    key = lambda m: {"config": m.get("config", {}), "heads": m.get("heads"), "methods": m.get("methods")}  # noqa: E731
    ids = {ex.id for ex in examples}
    done = [r for r in resumable(out, "replay.jsonl", meta, key, resume, ignore=RESUME_IGNORES) if r["id"] in ids]
    if done:
        log(f"resuming: {len(done)} examples already replayed in {out}")
    (out / "config.json").write_text(json.dumps(meta, indent=2, default=str))
    (out / "replay.jsonl").write_text("".join(json.dumps(r) + "\n" for r in done))
    rules = choosers(ctx, [m for m in methods if not m.startswith("oracle-k")], log=log)
    totals = {m: Counters() for m in methods}
    for r in done:
        totals = {m: totals[m].add(Counters.from_dict(r[m])) for m in methods}
    n_examples = len(done)
    with open(out / "replay.jsonl", "a") as f:
        for ex, traj in trajectories(ctx, examples, skip=frozenset(r["id"] for r in done)):
            n_examples += 1
            rec = {"id": ex.id, "new_tokens": len(traj.greedy)}
            for m in methods:
                c = replay.oracle(traj, int(m[len("oracle-k"):])) if m.startswith("oracle-k") else \
                    replay.simulate(traj, rules[m][0], rules[m][1])
                totals[m] = totals[m].add(c)
                rec[m] = c.to_dict()
            f.write(json.dumps(rec) + "\n")
            f.flush()
    rows = []
    base = ratios(totals[methods[0]])["block_efficiency"]
    for m in methods:
        r = ratios(totals[m])
        rows.append({"task": ctx.cfg.task, "method": m, "n_examples": n_examples,
                     "new_tokens": totals[m].new_tokens, "serial_calls": totals[m].serial_calls,
                     "block_efficiency": r["block_efficiency"],
                     "relative_change_pct": 100 * (r["block_efficiency"] / base - 1)})
    df = pd.DataFrame(rows)
    df.to_csv(out / "replay.csv", index=False)
    return df


def oracle_table(ctx: Context, examples, out: Path, ks=KS, resume: bool = False, log=print) -> pd.DataFrame:
    df = replay_methods(ctx, examples, ["bpd"] + [f"oracle-k{k}" for k in ks], out, log=log, resume=resume)
    df = df[df.method != "bpd"].assign(k=[int(m[len("oracle-k"):]) for m in df.method[df.method != "bpd"]])
    df["relative_gain_pct"] = 100 * (df.block_efficiency / df.block_efficiency.iloc[0] - 1)
    df.to_csv(out / "oracle.csv", index=False)
    _plot_oracle(df, out / "oracle.png", ctx.cfg.task)
    return df


def _plot_oracle(df: pd.DataFrame, path: Path, task: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(1, 2, figsize=(9, 3.4))
    ax[0].plot(df.k, df.block_efficiency, "o-")
    ax[0].set(xscale="log", xlabel="k (top-k per head)", ylabel="oracle block efficiency", title=task)
    ax[1].plot(df.k, df.relative_gain_pct, "o-", color="C1")
    ax[1].set(xscale="log", xlabel="k", ylabel="gain vs k=1 (%)")
    for a in ax:
        a.set_xticks(list(df.k), [str(k) for k in df.k])
        a.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def analyze(ctx: Context, examples, out: Path, log=print) -> dict:
    """Consecutive repetition of plain vs 2-gram-rescored drafts, and per-head entropy with h_max."""
    out.mkdir(parents=True, exist_ok=True)
    rescore = choosers(ctx, ["ngram2"], log=log)["ngram2"][0]
    plain, rescored, entropies = [], [], []
    for ex, traj in trajectories(ctx, examples):
        for m in range(len(traj.greedy) - 1):
            lat = traj.lattice(m, ctx.cfg.k)
            plain.append(lat.ids[:, 0].tolist())
            rescored.append(rescore(lat, traj.prompt + traj.greedy[: m + 1])[0])
        entropies.append(traj.entropy)
    ent = torch.cat(entropies)                                        # [positions, h]
    rep = pd.DataFrame([{"task": ctx.cfg.task, "drafts": "plain", **replay.repetition(plain)},
                        {"task": ctx.cfg.task, "drafts": "ngram2", **replay.repetition(rescored)}])
    rep.to_csv(out / "repetition.csv", index=False)
    mean = ent.mean(0).tolist()
    ent_df = pd.DataFrame({"task": ctx.cfg.task, "head": range(1, len(mean) + 1), "mean_entropy": mean,
                           "median_entropy": ent.median(0).values.tolist()})
    ent_df["h_max"] = replay.h_max(mean)
    ent_df.to_csv(out / "entropy.csv", index=False)
    torch.save(ent, out / "entropy.pt")
    _plot_entropy(ent, out / "entropy.png", ctx.cfg.task, replay.h_max(mean))
    (out / "config.json").write_text(json.dumps(ctx.meta, indent=2, default=str))
    return {"repetition": rep, "entropy": ent_df}


def _plot_entropy(ent: torch.Tensor, path: Path, task: str, hmax: int) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.4))
    ax.boxplot([ent[:, i].numpy() for i in range(ent.shape[1])], showfliers=False)
    ax.plot(range(1, ent.shape[1] + 1), ent.mean(0).numpy(), "o-", label="mean")
    ax.axvline(hmax, ls="--", color="gray", label=f"h_max = {hmax}")
    ax.set(xlabel="head", ylabel="entropy (nats)", title=f"{task}: per-head entropy")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def tune(ctx: Context, examples, rescorer: str, grid=(0.0, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0), log=print) -> dict:
    """Pick alpha maximising replayed block efficiency on the held-out slice; store it in results/alpha.json."""
    trajs = list(trajectories(ctx, examples))
    scores = {}
    for alpha in grid:
        rule, k = choosers(ctx, [rescorer], {rescorer: alpha}, log)[rescorer]
        total = Counters()
        for _, traj in trajs:
            total = total.add(replay.simulate(traj, rule, k))
        scores[alpha] = ratios(total)["block_efficiency"]
        log(f"  alpha {alpha}: block efficiency {scores[alpha]:.4f}")
    best = max(scores, key=lambda a: (scores[a], -a))
    path = rescorers.ALPHA_FILE
    table = json.loads(path.read_text()) if path.exists() else {}
    table[f"{ctx.cfg.model}/{ctx.cfg.task}/{rescorer}"] = best
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(sorted(table.items())), indent=2) + "\n")
    return {"alpha": best, "scores": scores, "n_examples": len(trajs)}
