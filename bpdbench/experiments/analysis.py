"""`bpdbench analyze | tune`: repetition and entropy of the heads' drafts, and alpha tuning on the held-out slice.

Both walk greedy trajectories (replay.trajectories) and ask the methods' own drafters for their proposals, so what
is analysed is exactly what decoding would draft.
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import torch

from .. import paths
from ..engine import Counters, DraftContext, ratios
from ..methods import Method
from ..refine import SAW
from .figures import plot_entropy
from ..store import update_json, write_atomic
from .replay import replay_one, trajectories
from .session import Session

ALPHA_GRID = (0.0, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0)


def repetition(drafts: list[list[int]]) -> dict[str, float]:
    """Share of adjacent identical draft tokens (over all adjacent pairs) and mean of each draft's longest run."""
    pairs = same = 0
    runs = []
    for d in drafts:
        pairs += max(len(d) - 1, 0)
        same += sum(x == y for x, y in zip(d, d[1:]))
        best = cur = 1
        for x, y in zip(d, d[1:]):
            cur = cur + 1 if x == y else 1
            best = max(best, cur)
        runs.append(best)
    return {"repeat_share": same / pairs if pairs else float("nan"),
            "mean_max_run": sum(runs) / len(runs) if runs else float("nan"), "n_drafts": len(drafts)}


def h_max(mean_entropy: list[float]) -> int:
    """Last head (1-based) up to which mean entropy rises monotonically (paper's h_max)."""
    h = 1
    while h < len(mean_entropy) and mean_entropy[h] > mean_entropy[h - 1]:
        h += 1
    return h


@torch.inference_mode()
def analyze(s: Session, out: Path, ngram2: Method) -> dict:
    """Consecutive repetition of plain vs 2-gram-rescored drafts (`ngram2`: the plan's), and per-head entropy with
    h_max."""
    out.mkdir(parents=True, exist_ok=True)
    rescored_drafter = s.drafter(ngram2)
    heads, _ = s.env.heads()
    plain, rescored, entropies, n = [], [], [], 0
    for ex, prompt, greedy, hidden in trajectories(s):
        n += 1
        rescored_drafter.reset(prompt)
        for m in range(len(greedy) - 1):
            ctx = DraftContext(prompt + greedy[: m + 1], hidden[m], s.cfg.heads)
            proposal = rescored_drafter.propose(ctx)
            plain.append(proposal.lattice.ids[:, 0].tolist())
            rescored.append(proposal.paths[0])
        logp = torch.log_softmax(heads.logits(hidden, s.cfg.heads, s.model.lm_head).float(), -1)
        entropies.append(-(logp.exp() * logp).sum(-1).cpu())
    ent = torch.cat(entropies)                                        # [positions, h]
    rep = pd.DataFrame([{"task": s.cfg.task, "drafts": "plain", **repetition(plain)},
                        {"task": s.cfg.task, "drafts": "ngram2", **repetition(rescored)}])
    write_atomic(out / "repetition.csv", rep.to_csv(index=False))
    mean = ent.mean(0).tolist()
    ent_df = pd.DataFrame({"task": s.cfg.task, "head": range(1, len(mean) + 1), "mean_entropy": mean,
                           "median_entropy": ent.median(0).values.tolist()})
    ent_df["h_max"] = h_max(mean)
    write_atomic(out / "entropy.csv", ent_df.to_csv(index=False))
    torch.save(ent, out / "entropy.pt")
    plot_entropy(ent, out / "entropy.png", s.cfg.task, h_max(mean), s.cfg, n)
    write_atomic(out / "config.json", json.dumps(s.meta([ngram2]), indent=2, default=str))
    return {"repetition": rep, "entropy": ent_df}


def tune(s: Session, method: Method, grid=ALPHA_GRID) -> dict:
    """Pick alpha maximising replayed block efficiency on the tune split; store it, and the examples it saw, in the
    alpha table (the method has an alpha: `bpdbench tune` checked it when the plan was made)."""
    trajs = [(*t, {}) for t in trajectories(s)]       # one memo per example, shared across the alpha grid
    if not trajs:   # nothing to tune on: refuse rather than store alpha 0.0 as if it had been measured
        raise ValueError(f"{s.cfg.task}: none of the {len(s.examples)} held-out examples has a greedy output of 2+ "
                         f"tokens, so alpha cannot be tuned; raise --max-new-tokens or --limit")
    scores = {}
    for alpha in grid:
        drafter = s.drafter(Method(method.spec, {**method.params, "alpha": alpha}))
        total = Counters()
        for _, prompt, greedy, hidden, memo in trajs:
            total = total.add(replay_one(s, drafter, prompt, greedy, hidden, memo))
        scores[alpha] = ratios(total)["block_efficiency"]
        s.log(f"  alpha {alpha}: block efficiency {scores[alpha]:.4f}")
    best = max(scores, key=lambda a: (scores[a], -a))
    path = Path(s.cfg.alpha_file) if s.cfg.alpha_file else paths.alpha_file()
    key = f"{s.cfg.model}/{s.cfg.task}/{method.name}"
    saw = {"split": "tune", "examples": sorted(str(t[0].id) for t in trajs)}
    update_json(path, lambda table: {**table, key: best, SAW: {**table.get(SAW, {}), key: saw}})
    return {"alpha": best, "scores": scores, "n_examples": len(trajs), "file": str(path)}
