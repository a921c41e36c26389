"""`bpdbench train-drafter NAME --profile quick|full|ci`: every drafter trained on the one cached distillation
dataset (train/distill.py), with the base's frozen embeddings and vocabulary projection, and saved with its held-out
per-depth agreement.

Budgets: a profile names the dataset it reads (the same name) and the fit's wall-clock budget. `quick` = the quick
dataset (about 5.5 min to build on 2 idle cores, once for every drafter) + a 4-minute fit, so even a drafter
trained alone, data included, stays within 10 minutes; `full` = the full dataset (about 25 min) + 30 min. `ci` is
step-counted and fp32 (a minute on the real model, identical on every machine).

Names: `medusa` (Medusa-1 heads, the existing recipe of train/heads.py on this data: the fair baseline), `hydra`,
`hydra++` (prefix layer, dropout), `eagle`, `amphista`, `koala-medusa` and `koala-hydra` (KOALA: 3-layer heads with
the adversarial term; `--no-adversarial` trains the ablation, saved as `<name>-noadv`).
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

import torch

from .. import models, paths
from ..config import environment
from . import distill
from .fit import FitConfig, fit
from .objectives import Rows, agreement, objective

Log = Callable[[str], None]
NAMES = ("medusa", "hydra", "hydra++", "eagle", "amphista", "koala-medusa", "koala-hydra")


@dataclass(frozen=True)
class Profile:
    data: str                 # the distillation dataset's budget name
    fit: FitConfig
    depth: int = 5
    shortlist: int = 16384
    unroll: int = 3           # EAGLE: passes of its own features trained (training-time drafting)
    noise: float = 0.0        # EAGLE / Hydra++: feature noise (relative to each row's RMS)


PROFILES = {
    "quick": Profile("quick", FitConfig(seconds=240, steps=0, lr=1e-3, batch=256)),
    "full": Profile("full", FitConfig(seconds=1800, steps=0, lr=1e-3, batch=256)),
    "ci": Profile("ci", FitConfig(seconds=None, steps=30, lr=2e-3, batch=64, bf16=False), depth=4, shortlist=4096),
}
SEQ_BATCH = {"quick": 8, "full": 8, "ci": 4}     # sequences per step for EAGLE / Hydra++


def make_model(name: str, d: int, p: Profile, prof: str):
    from ..drafters.amphista import Amphista
    from ..drafters.eagle import Eagle
    from ..drafters.hydra import Hydra
    from ..heads import Heads
    small = prof == "ci"
    ffn = 256 if small else 2048
    if name == "eagle":
        return Eagle(d, p.depth, ffn=ffn)
    if name == "hydra":
        return Hydra(d, p.depth)
    if name == "hydra++":
        return Hydra(d, p.depth, prefix=True, ffn=ffn, dropout=0.1)
    if name == "koala-hydra":
        return Hydra(d, p.depth, layers=3)
    if name == "amphista":
        return Amphista(d, p.depth, ffn=ffn)
    if name == "koala-medusa":
        return Heads(d, p.depth, num_layers=3)
    raise ValueError(f"unknown drafter '{name}'; valid: {', '.join(NAMES)}")


def out_dir(model_name: str, name: str, profile: str, adversarial: bool = True) -> Path:
    tag = name if adversarial or not name.startswith("koala") else f"{name}-noadv"
    return paths.drafter_dir(model_name, tag, profile)


def train(name: str, model_name: str, profile: str, model=None, tok=None, log: Log = print,
          out: Path | None = None, adversarial: bool = True) -> Path:
    """Build (or reuse) the dataset, fit, measure held-out agreement, save; returns the drafter folder."""
    if name not in NAMES:
        raise ValueError(f"unknown drafter '{name}'; valid: {', '.join(NAMES)}")
    if profile not in PROFILES:
        raise ValueError(f"unknown profile '{profile}'; valid: {', '.join(PROFILES)}")
    p = PROFILES[profile]
    out = out or out_dir(model_name, name, profile, adversarial)
    t0, load0 = time.time(), os.getloadavg()
    budget = distill.BUDGETS[p.data]
    if model is None or model.dtype != getattr(torch, budget.dtype) or model.device.type != "cpu":
        model, tok = models.load(model_name, budget.dtype, "cpu")
    ds = distill.ensure(model_name, p.data, model, tok, log)
    rows = Rows.of(ds)
    train_seqs, eval_seqs = ds.split(False), ds.split(True)
    eos = model.generation_config.eos_token_id
    if name == "medusa":
        return _medusa(model_name, profile, model, ds, train_seqs, eval_seqs, out, t0, log)
    shortlist = ds.shortlist(p.shortlist, set(eos if isinstance(eos, list) else [eos]))
    lm_w = model.lm_head.weight.detach()
    emb = model.get_input_embeddings().weight.detach()
    torch.manual_seed(p.fit.seed)
    drafter = make_model(name, ds.d, p, profile)
    if hasattr(drafter, "bind"):
        drafter.bind(emb, lm_w.float(), shortlist)
    obj = objective(drafter, p.depth, p.unroll, p.noise)
    c = p.fit if adversarial and name.startswith("koala") else replace(p.fit, adversarial=0.0)
    if name.startswith("koala") and adversarial:
        c = replace(c, adversarial=0.1)
    if obj.sequential:
        c = replace(c, batch=SEQ_BATCH[profile])
        pool = train_seqs
    else:
        pool = rows.ds.rows(train_seqs)
    log(f"training {name} ({profile}): {sum(q.numel() for q in drafter.parameters()) / 1e6:.1f}M parameters, "
        f"depth {p.depth}, shortlist {len(shortlist)}, {len(train_seqs)} training sequences, "
        f"{int(rows.greedy.sum())} greedy rows in all")
    stats = fit(obj, rows, pool, lm_w, shortlist, c, log)
    proj = lm_w.float()[shortlist]
    held = agreement(obj, rows, eval_seqs, proj, shortlist)
    report = _report(name, profile, p, c, ds, drafter, stats, held, t0, load0, len(shortlist))
    _save(name, drafter, out, model_name, report, shortlist)
    log(f"{name} saved to {out} in {report['seconds']}s (+ {report['data_seconds']}s for the dataset); held-out "
        f"top-1 per depth {held['top1']}, expected tokens per chain step {held['expected_tokens_per_step']}")
    return out


def _report(name, profile, p, c, ds, drafter, stats, held, t0, load0, n_short) -> dict:
    return {"drafter": name, "profile": profile, "seconds": round(time.time() - t0, 1),
            "data_seconds": ds.meta["seconds"], "data": {k: ds.meta[k] for k in ("budget_name", "sequences", "rows",
                                                                               "greedy_positions", "seconds")},
            "data_path": str(distill.path_for(ds.meta["model"], p.data)),
            "trainable_parameters": sum(q.numel() for q in drafter.parameters()), "depth": p.depth,
            "shortlist_size": n_short, "fit": stats, "heldout": held, "config": {**asdict(p), "fit": asdict(c)},
            "load_average": {"start": [round(x, 2) for x in load0], "end": [round(x, 2) for x in os.getloadavg()]},
            "environment": environment(torch.get_num_threads(), "cpu", "float32")}


def _save(name: str, drafter, out: Path, model_name: str, report: dict, shortlist: torch.Tensor) -> None:
    from ..heads import Heads, HeadsInfo, save as save_heads
    if isinstance(drafter, Heads):            # KOALA's multi-layer Medusa heads stay in the Medusa-1 layout
        drafter.shortlist = shortlist
        save_heads(drafter, HeadsInfo(model_name, drafter.num_heads, drafter.num_layers,
                                      shortlist_size=len(shortlist), extra={"training": report, "name": name}), out)
        (out / "report.json").write_text(json.dumps(report, indent=2))
        return
    from ..drafters.base import save
    save(drafter, out, model_name, report, name)


def _medusa(model_name, profile, model, ds, train_seqs, eval_seqs, out, t0, log) -> Path:
    """Medusa-1 heads by the existing recipe (train/heads.py: sampled-softmax fit of 1-layer heads, 8 heads, 32k
    shortlist, greedy rows 3x as likely), on the cached data and this profile's fit budget: the fair baseline."""
    from ..heads import Heads, HeadsInfo, save as save_heads
    from . import heads as heads_train
    p = PROFILES[profile]
    load0 = os.getloadavg()
    hp = replace(heads_train.PROFILES[profile if profile in heads_train.PROFILES else "quick"],
                 fit_seconds=p.fit.seconds, steps=p.fit.steps, bf16_fit=p.fit.bf16)
    eos = model.generation_config.eos_token_id
    shortlist = ds.shortlist(hp.shortlist, set(eos if isinstance(eos, list) else [eos]))
    train_data, eval_data = ds.sequences(train_seqs), ds.sequences(eval_seqs)
    lm_w = model.lm_head.weight.float()
    x, tid, tlp, valid, gen = heads_train._targets(train_data, hp.num_heads)
    log(f"training medusa ({profile}): {hp.num_heads} heads, {x.shape[0]} positions ({int(gen.sum())} greedy), "
        f"shortlist {len(shortlist)}")
    t_fit = time.time()
    w, b = heads_train.fit(lm_w, x, tid, tlp, valid, shortlist, hp, log, 1.0 + (hp.greedy_weight - 1.0) * gen.float())
    heads = Heads(x.shape[1], hp.num_heads)
    for i, blk in enumerate(heads.blocks):
        blk[0].linear.weight.data.copy_(w[i])
        blk[0].linear.bias.data.copy_(b[i])
    obj = objective(heads, hp.num_heads)
    held = agreement(obj, Rows.of(ds), eval_seqs, lm_w[shortlist], shortlist)
    held["rank"] = heads_train.agreement(lm_w, w, b, eval_data, shortlist, hp.num_heads)["rank"]   # medusa-auto
    stats = {"fit_seconds": round(time.time() - t_fit, 1)}
    report = _report("medusa", profile, replace(p, depth=hp.num_heads, shortlist=hp.shortlist), p.fit, ds, heads,
                     stats, held, t0, load0, len(shortlist))
    report["recipe"] = asdict(hp)
    heads.shortlist = shortlist
    report["heldout"]["top16"] = held["top16"]
    save_heads(heads, HeadsInfo(model_name, hp.num_heads, shortlist_size=len(shortlist),
                                extra={"training": report, "name": "medusa"}), out)
    (out / "report.json").write_text(json.dumps(report, indent=2))
    log(f"medusa saved to {out} in {report['seconds']}s (+ {report['data_seconds']}s for the dataset); held-out "
        f"top-1 per head {held['top1']}, expected tokens per chain step {held['expected_tokens_per_step']}")
    return out
