"""`bpdbench train-network NAME --profile quick|full|ci`: train one draft model on the cached distillation data.

Every drafter (Medusa-1 heads, KOALA, Hydra, Hydra++, Amphista, EAGLE: the networks registered in
nets/registry.py, each by its own module) reads the same dataset (train/data.py: the greedy distillation data of
train/distill.py, or teacher-forced prefill data, train/prefill.py; built once per model and budget), fits with the
same loop (train/fit.py: soft-label distillation on a sampled
candidate set, a time budget) and is scored the same way (train/objectives.agreement: held-out per-depth top-1 /
top-16 agreement with the base's greedy continuation, drafting over the shortlist), so differences between them are
the architectures', not their data's or budgets'. The report, written next to the weights, records the data's size
and generation time, the fit's steps and seconds, trainable parameters, threads and the machine's load (the CPU is
shared: a busy machine gets fewer steps out of the same budget).
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
from ..store import seal
from ..config import environment
from ..nets import registry as networks
from ..nets.checkpoint import save
from . import distill, prefill
from .data import data_path, is_prefill, load_data
from .fit import FitConfig, fit, on_device
from .objectives import DistillRows, agreement, objective
from .pacing import quality_warning
from .profiles import name_of, named, resolve, settings

Log = Callable[[str], None]


@dataclass(frozen=True)
class NetworkProfile:
    data: str | distill.Budget | prefill.PrefillBudget   # the training data (train/data.py): a name in
                                   # distill.BUDGETS (greedy, decode speed) or prefill.BUDGETS, or the budget itself
    cpu_seconds: float | None      # fit budget in core-seconds (train/fit.py; None: `steps`)
    steps: int = 0
    depth: int = 5
    shortlist: int = 16384         # drafting vocabulary: the data's most frequent ids
    seed: int = 0
    name: str = ""                 # the drafter's folder and the report's profile (PROFILES: its key)
    device_seconds: float | None = None   # the fit's wall-clock budget on an accelerator (--device cuda), where
                                   # core-seconds count the Python that queues kernels; None: `steps`


# quick: the data (about 250 s of two idle cores, once for every drafter) plus a fit of 480 core-seconds (four
# minutes of two idle cores) stays within 10 minutes; full: 30 minutes of two cores on 3x the data.
# bench: about 2 hours of 2 cores for the first network: its teacher-forced data (train/prefill.BUDGETS
# "prefill-bench": 1M positions at ~340 positions/s, ~49 minutes, shared by every network) plus a fit of 8,400
# core-seconds (70 minutes of two cores); each further network costs its fit only.
# On an accelerator (`make gpu-train`) the same profiles fit for device_seconds of wall clock: bench's 100 s per
# network keep its data and four fits (eagle3, hydra, medusa, BPD heads) within 10 minutes of one GPU.
PROFILES = named({"quick": NetworkProfile("quick", 480.0, device_seconds=30.0),
                  "full": NetworkProfile("full", 3600.0, device_seconds=120.0),
                  "bench": NetworkProfile("prefill-bench", 8400.0, device_seconds=100.0),
                  "ci": NetworkProfile("ci", None, steps=12, depth=3, shortlist=4096)})


# A network that reads chosen layers (NetworkSpec.layers: eagle3) trains on prefill data that keeps them, since the
# greedy distillation data stores final states only: at these profiles, this data instead of the profile's own
# (methods/trained.LAYERED_DATA says the same to the artefact graph; a test holds them equal).
LAYERED_DATA = {"quick": "prefill-quick", "bench": "prefill-bench", "ci": "prefill-ci"}

ADV_WEIGHT = 0.1        # the weight a cache name's -adv suffix stands for
VAL_EVERY = 20          # every 20th training sequence validates (checkpoint selection, train/fit.py)
CURVE_SEQUENCES = 256   # held-out sequences scored at each checkpoint (the learning curve; the end scores them all)


def network_dir(model: str, name: str, profile: str) -> Path:
    return paths.network_dir(model, name, profile)


def check(name: str, profile: str | NetworkProfile, adversarial: float) -> str:
    """The cache name of a trainer request, or a one-line ValueError (before anything loads). A profile given as an
    object is not looked up."""
    net = networks.get(name)                     # one line naming the valid networks
    if isinstance(profile, str) and profile not in PROFILES:
        raise ValueError(f"unknown profile '{profile}'; valid: {', '.join(PROFILES)}")
    if adversarial < 0 or adversarial != adversarial:
        raise ValueError(f"--adversarial must be >= 0, got {adversarial}")
    if isinstance(profile, str):
        data_for(net, PROFILES[profile])          # a layered network at a profile without such data: one line
    if adversarial and not net.adversarial:
        with_term = " or ".join(n for n, spec in networks.networks().items() if spec.adversarial)
        raise ValueError(f"--adversarial is KOALA's term: train {with_term} with it, not {name}")
    return name + ("-adv" if adversarial else "")


def data_for(net: networks.NetworkSpec, p: NetworkProfile) -> NetworkProfile:
    """The profile with the data the network trains on: its own, or, for a network that reads chosen layers and a
    profile of greedy data, the prefill data LAYERED_DATA names (a one-line ValueError where none is named)."""
    if net.layers is None or is_prefill(p.data):
        return p
    if p.name not in LAYERED_DATA:
        raise ValueError(f"{net.name} reads the base's layers, which the '{name_of(p.data)}' data does not keep; "
                         f"train it with --profile {' or '.join(LAYERED_DATA)} (prefill data that keeps them)")
    return replace(p, data=LAYERED_DATA[p.name])


def split_saved(name: str) -> tuple[str, float]:
    """(trainer, adversarial weight) of a cache name: `koala-adv` is koala with KOALA's term at 0.1."""
    return (name[:-4], ADV_WEIGHT) if name.endswith("-adv") else (name, 0.0)


def train(name: str, profile: str | NetworkProfile, model_name: str, model=None, tok=None, log: Log = print,
          out: Path | None = None, adversarial: float = 0.0, lr: float | None = None,
          device: str | None = None) -> Path:
    """Train, score on the held-out sequences, save (config.json, weights, shortlist, rank, report.json).
    `profile`: a name in PROFILES, or a NetworkProfile used as given (its name names the folder and the report's profile;
    its data, a budget name or a distill.Budget); `lr`: the family's learning rate unless given; `device`: where
    missing distillation data is made and the fit runs (the profile's core-seconds on the CPU, its device_seconds
    of wall clock elsewhere: fit_config). The weights are saved from the CPU, the same artefact either way."""
    name, asked = split_saved(name)
    adversarial = adversarial or asked
    saved = check(name, profile, adversarial)
    net = networks.get(name)
    p = data_for(net, resolve(profile, PROFILES))
    seal.check_writable(out or network_dir(model_name, saved, p.name))   # read-only: one line now, not after
    fam = replace(net.defaults, lr=net.defaults.lr if lr is None else lr)
    data = name_of(p.data)
    load0 = os.getloadavg()[0]
    ds = load_data(model_name, p.data, model, tok, log, device, layers=net.layers is not None)
    t0 = time.time()
    torch.manual_seed(p.seed)
    embed, lm_w = _base_weights(model_name, model)
    shortlist = ds.shortlist(p.shortlist)             # EOS ranks first in the data's ranking
    drafter = net.build(ds.d, p.depth, int(ds.meta.get("base_layers") or 0))
    drafter.emb = embed                               # stays on the CPU: objectives._emb moves each batch's rows
    drafter.emb_scale = _emb_scale(ds, embed)
    n_params = drafter.n_params()
    obj = objective(net.objective, drafter, p.depth, fam.unroll, fam.noise, fam.decay)
    rows = DistillRows.of(ds, drafter.hidden_layers)
    train_seqs, held = ds.split(held_out=False), ds.split(held_out=True)
    val = train_seqs[::VAL_EVERY]                   # checkpoint selection only; never the reported held-out
    train_seqs = [q for i, q in enumerate(train_seqs) if i % VAL_EVERY]
    pool = train_seqs if obj.sequential else ds.rows(train_seqs)
    cfg = fit_config(p, fam, adversarial, device)
    proj = lm_w[shortlist].float().to(cfg.device)
    log(f"training {saved} ({n_params / 1e6:.1f}M trainable parameters, depth {p.depth}) on '{data}' data: "
        f"{len(train_seqs)} sequences, {int(rows.greedy.sum())} greedy rows in all, shortlist {len(shortlist)}, "
        f"{torch.get_num_threads()} threads, load {load0:.1f}")
    score = lambda: agreement(obj, rows, val, proj, shortlist, topk=1)["expected_tokens_per_step"]  # noqa: E731
    curve_seqs = held[:CURVE_SEQUENCES]
    monitor = lambda: {"heldout_top1": agreement(obj, rows, curve_seqs, proj, shortlist, topk=1)["top1"]}  # noqa: E731
    final = out or network_dir(model_name, saved, p.name)
    state = final.with_name(final.name + ".fit-state.pt")    # an interrupted fit resumes from it (train/fit.py)
    key = {"network": saved, "model": model_name, "profile": settings(p) | {"data": data},
           "data": {k: ds.meta.get(k) for k in ("positions", "sequences", "seconds")}, "lr": fam.lr}
    stats = fit(obj, rows, pool, lm_w, shortlist, cfg, log, validate=score if val else None,
                monitor=monitor if curve_seqs else None, state=state, state_key=key)
    drafter.eval()
    heldout = agreement(obj, rows, held, proj, shortlist)
    drafter.to("cpu")
    seconds = time.time() - t0
    report = {"drafter": drafter.type_name, "name": saved, "profile": p.name, "model": model_name,
              "trainable_parameters": n_params, "emb_scale": drafter.emb_scale, "shortlist": len(shortlist),
              "depth": p.depth,
              "seconds": round(seconds, 1), "data_seconds": ds.meta.get("seconds"),
              "positions": int(ds.meta.get("positions") or ds.meta.get("rows") or 0),
              "seconds_with_data": round(seconds + float(ds.meta.get("seconds") or 0), 1),
              "heldout": heldout, "fit": stats, "fit_config": asdict(cfg),
              "profile_config": settings(p) | {"data": data},
              "family": asdict(fam) | {"adversarial": adversarial, "objective": net.objective},
              "data": {k: ds.meta.get(k) for k in ("budget_name", "sequences", "rows", "greedy_positions",
                                                     "generation_seconds", "kind", "positions", "sources")}
              | {"path": str(data_path(model_name, data)), "heldout_sequences": len(held),
                 "train_sequences": len(train_seqs), "validation_sequences": len(val)},
              "load_average": {"start": round(load0, 2), "end": round(os.getloadavg()[0], 2)},
              "environment": environment(torch.get_num_threads(), cfg.device, "float32"),
              "seen": distill.seen_of(ds.meta),
              # what one fit sample is, in positions (the learning curve's x: samples seen times this)
              "positions_per_sample": round(len(ds.rows(train_seqs)) / max(len(train_seqs), 1), 2)
              if obj.sequential else 1}
    report["data"].update({k: ds.meta[k] for k in ("dtype", "truncated_by_time", "quality_warning") if k in ds.meta})
    warning = quality_warning(saved, (heldout.get("top1") or [None])[0], ds.meta.get("quality_warning"))
    if warning:
        report["quality_warning"] = warning
    drafter.shortlist = shortlist
    drafter.emb = None
    out = final
    # sealed and renamed into place whole, or not at all; its report.json reaches results/ only through a grid's
    # [[train]] block (sweep/trainings.py), since only result commands write there
    with seal.building(out, log, folder=True) as tmp:
        save(drafter, tmp, model_name, report, saved, ds.rank)
    state.unlink(missing_ok=True)
    log(f"{saved} saved to {out} in {report['seconds']}s (+{ds.meta.get('seconds')}s for the shared data); "
        f"held-out top-1 per depth {heldout['top1']}, expected tokens per chain step "
        f"{heldout['expected_tokens_per_step']}")
    if warning:
        log(f"WARNING: {warning}; recorded in {out / 'report.json'} and every run that uses this drafter")
    return out


def fit_config(p: NetworkProfile, fam, adversarial: float, device: str | None) -> FitConfig:
    """The fit's settings on `device` (None: the CPU): core-seconds and the CPU's fast dtype there, wall seconds
    and bf16 autocast on an accelerator."""
    dev = models.resolve_device(device or "cpu")
    from ..hardware.dtype import choose as fast_dtype
    bf16 = dev != "cpu" or fast_dtype().dtype == "bfloat16"      # a GPU fit never probes the CPU's dtype
    cfg = FitConfig(p.cpu_seconds, p.steps, fam.lr, fam.batch, bf16=bf16, feature_weight=fam.feature_weight,
                    adversarial=adversarial, seed=p.seed, ramp=fam.ramp, clock="cpu")
    return on_device(cfg, dev, p.device_seconds)


def _emb_scale(ds: distill.DistillData, embed: torch.Tensor) -> float:
    """RMS of the base's hidden states over RMS of the embeddings of the tokens they produced (data rows)."""
    rows = torch.arange(0, ds.hidden.shape[0], max(1, ds.hidden.shape[0] // 4096))
    h = ds.hidden[rows].float().pow(2).mean(-1).sqrt().mean()
    e = embed[ds.next_ids[rows]].float().pow(2).mean(-1).sqrt().mean()
    return round(float(h / e), 3) if float(e) > 0 else 1.0


def _base_weights(model_name: str, model) -> tuple[torch.Tensor, torch.Tensor]:
    """The base's frozen token embeddings and projection (bf16 copies are enough: inputs and candidate rows are cast
    per batch), without keeping a second model around."""
    if model is None:
        model, _ = models.load(model_name, "auto", "cpu")     # cast to bf16 below whatever it loads in
    embed = model.model.embed_tokens.weight.detach().to("cpu", torch.bfloat16)
    lm_w = model.lm_head.weight.detach().to("cpu", torch.bfloat16)
    return embed, lm_w


def read_report(path: Path) -> dict:
    return json.loads((path / "report.json").read_text())
