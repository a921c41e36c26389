"""Train blockwise heads on the frozen base by in-domain self-distillation, on a CPU budget.

Why this recipe (measured on Qwen 0.5B, 2 cores): a full-vocabulary softmax through the 152k-row projection is far
too slow; distilling the base's own distribution over a small candidate set (the teacher's top-8 per position plus
random negatives) gives the best heads per CPU second; and what decides acceptance is agreement with the base's own
*greedy* continuation on task-like prompts, so the training text is the base's batched greedy output on held-out
prompts (disjoint from every evaluated example), with hidden states and teacher logits taken from that same
batched decoding (no second forward). That data is the one cached distillation data every trainer reads
(train/distill.ensure; the heads' budget `heads-<profile>` is derived from their profile), the shortlist comes from
its one ranking, and the fit is the one loop (train/fit.py): the heads differ from the other drafters only in
their objective (objectives.Packed) and the settings of their data and fit (`data_budget`, `fit` below).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import torch

from .. import paths
from ..store import seal
from ..nets.heads import Heads, HeadsInfo, save
from . import distill, objectives
from .fit import FitConfig, on_device
from .fit import fit as fit_loop
from .greedy import base_on, device_for
from .pacing import quality_warning, resolve_dtype
from .data import data_path, load_data
from .profiles import name_of, named, resolve, settings

# How the heads are made (data, shortlist, fit). Results record it through the heads' metadata, and a sweep cell made
# with heads of another recipe is not finished (sweep/commands.py): change it whenever a change here changes the heads.
RECIPE = "heads-fit/1"
FIRST_RECIPE = "heads-fit/1"     # heads (and results) from before the recipe was recorded


@dataclass(frozen=True)
class HeadsProfile:
    n_prompts: int
    gen_tokens: int
    steps: int
    batch_gen: int = 16
    batch_positions: int = 512
    negatives: int = 512
    lr: float = 2e-3
    max_prompt_tokens: int = 256
    shortlist: int = 32768
    num_heads: int = 8
    eval_fraction: float = 0.125
    greedy_weight: float = 3.0     # sampling weight of greedy positions relative to prompt positions
    seed: int = 0
    greedy_positions: int | None = None  # generate until this many greedy positions exist (None: every prompt)
    fit_seconds: float | None = None   # train for this long, cosine schedule over elapsed time (None: `steps`)
    bf16_fit: bool = False             # bf16 autocast in the head fit (~1.8x faster on AVX512-BF16, same agreement;
                                       # with gen_dtype auto, only where auto resolves to bfloat16)
    gen_dtype: str = "auto"            # the base's dtype while generating: auto = this machine's fast dtype
    name: str = ""                     # the heads' folder and the report's profile (PROFILES: its key)
    data: str | None = None            # train on this data instead (train/data.py: e.g. prefill-bench, teacher-forced
                                       # text); None: the profile's own greedy data (`data_budget`)
    clock: str = "wall"                # what `fit_seconds` counts: "wall", or "cpu" (core-seconds, train/fit.py: the
                                       # same fit on a machine shared with other work)
    device_seconds: float | None = None  # the fit's wall seconds on an accelerator (--device cuda); None: `steps`,
                                       # else fit_seconds (train/network.py PROFILES says why bench's is 100)


# Why sizes in greedy positions: acceptance grows steadily with greedy data (head-1 top-1 0.20 -> 0.25 from 8k to 16k
# greedy tokens, measured), and a profile defined by seconds gave useless heads on a CPU that emulates bfloat16 (one
# batch, 401 positions, in 370 s). So quick and full name the data the shipped heads were trained on
# (results/heads/*_report.json): the 370 s quick budget made ~16.1k greedy positions (240 prompts; 14,495 in the
# training split), the 2700 s full budget ~41.4k (672 prompts; 37,266 training), 2.6x quick. Generation runs in the
# machine's fast dtype (auto) and stops at that size; time only stops it past 3x its prediction, loudly
# (train/pacing.py). The fit stays timed (fit_seconds), so a busier machine fits fewer steps on the same data.
# `ci` stays step-counted and fp32 end to end, generation included: bf16 kernels round differently on different CPUs,
# which flipped near-tied greedy tokens in the training continuations, gave other heads on the CI machine and moved
# the regression baseline by up to 0.1 block efficiency. fp32 makes such flips rare, not impossible.
# Quick prompts are cut to 64 tokens: a 64-row batch's prefill of 160-token prompts took as long as its generation on
# 2 AVX2 cores (151 prompt tokens/s against ~110 greedy positions/s), for 32 teacher positions per prompt.
# Batches of 64 rows: a forward over 64 rows costs 2.5 decode steps in bf16 on AVX512-BF16 and ~5.5 in fp32 on AVX2
# (results/calibration/), against 1.14 and ~2.7 for 16 rows, so 64 rows make 1.8-2x the greedy positions per second.
PROFILES = named({
    "quick": HeadsProfile(n_prompts=1024, gen_tokens=128, steps=0, max_prompt_tokens=64, greedy_positions=16000,
                     fit_seconds=150, bf16_fit=True, eval_fraction=0.1, batch_gen=64, device_seconds=30),
    "full": HeadsProfile(n_prompts=4096, gen_tokens=128, steps=0, max_prompt_tokens=192, greedy_positions=42000,
                    fit_seconds=660, bf16_fit=True, eval_fraction=0.1, batch_gen=64, device_seconds=120),
    "ci": HeadsProfile(n_prompts=16, gen_tokens=32, steps=60, batch_gen=8, gen_dtype="float32"),
    # bench: the draft networks' bench data and budget (train/network.py PROFILES["bench"]: 8,400 core-seconds on
    # "prefill-bench", teacher-forced text), so BPD's heads and the networks are compared at one training budget
    "bench": HeadsProfile(n_prompts=0, gen_tokens=0, steps=0, data="prefill-bench", fit_seconds=8400, clock="cpu",
                          bf16_fit=True, device_seconds=100)})


def heads_dir(model: str, profile: str) -> Path:
    return paths.heads_dir(model, profile)


def _targets(data, h: int):
    """Flatten to positions: x [N, d], target ids/logprobs [N, h, k], valid [N, h], generated [N] (greedy part)."""
    xs, tid, tlp, valid, gen = [], [], [], [], []
    for hid, ids, lp, _, n_prompt in data:
        g = hid.shape[0]
        pos = torch.arange(g)
        src = pos[:, None] + 1 + torch.arange(h)[None]           # head i at step t learns step t+1+i's logits
        ok = src < g
        src = src.clamp(max=g - 1)
        xs.append(hid)
        tid.append(ids[src])
        tlp.append(lp[src])
        valid.append(ok)
        gen.append(pos >= n_prompt)
    return torch.cat(xs), torch.cat(tid), torch.cat(tlp), torch.cat(valid), torch.cat(gen)


def _head_logits(w, b, x, proj):
    return objectives.packed_states(w, b, x) @ proj.T              # [h, N, C]


def data_budget(p: HeadsProfile) -> distill.Budget:
    """The heads' distillation data (`heads-<profile>`, cached like every drafter's): generated in the profile's
    dtype, states kept as made (fp32 for ci), every 1/eval_fraction-th sequence held out, ranked to the heads'
    shortlist."""
    return distill.Budget(p.n_prompts, p.gen_tokens, p.greedy_positions, batch=p.batch_gen,
                          max_prompt_tokens=p.max_prompt_tokens, dtype=p.gen_dtype, seed=p.seed,
                          eval_every=max(2, round(1 / p.eval_fraction)), shortlist_rank=p.shortlist,
                          states="made", name=f"heads-{p.name}")


def fit(lm_w: torch.Tensor, ds: distill.DistillData, seqs: list[int], shortlist, p: HeadsProfile, log,
        device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor, dict]:
    """The heads' settings of the one fit loop (train/fit.py) on sequences `seqs` of `ds`: sampled-softmax
    distillation (objectives.Packed: each step scores every head on the union of the batch's teacher top-k ids plus
    random shortlist negatives; the other heads' targets are the hard negatives; per-head candidate sets were 2.5x
    cheaper but lost 0.025 head-1 top-1), greedy rows `greedy_weight` times as likely, steps counted (`steps`) or a
    wall-clock budget (`fit_seconds`), no clipping and no checkpoint selection: the recipe the heads were first
    fitted with (RECIPE). On an accelerator (`device`) the budget is the profile's device_seconds of wall clock, in
    bf16. Returns the packed weights [h, d, d], [h, d] (on the CPU) and the fit's statistics."""
    obj = objectives.Packed(objectives.PackedHeads(ds.d, p.num_heads))
    cfg = FitConfig(p.fit_seconds, p.steps, p.lr, p.batch_positions, negatives=p.negatives,
                    greedy_weight=p.greedy_weight, bf16=p.bf16_fit, seed=p.seed, clip=None, clock=p.clock)
    cfg = on_device(cfg, device, p.device_seconds)
    stats = fit_loop(obj, objectives.DistillRows.of(ds), ds.rows(seqs), lm_w, shortlist, cfg, log)
    return obj.model.w.detach().cpu(), obj.model.b.detach().cpu(), stats


@torch.no_grad()
def agreement(lm_w, w, b, data, shortlist, h: int, greedy: torch.Tensor | None = None) -> dict:
    """Per-head top-1 / top-16 agreement with the base's greedy continuation, drafting over the shortlist. `greedy`:
    the rows scored ([N] bool over `data`'s rows; None: those after each prompt). Teacher-forced text is scored
    where its next token is the base's greedy choice, as the draft networks are (objectives.agreement)."""
    x, tid, _, valid, gen = _targets(data, h)
    gen = gen if greedy is None else greedy
    x, tid, valid = x[gen], tid[gen], valid[gen]
    proj = lm_w[shortlist]
    hit1, hit16, rank = torch.zeros(h), torch.zeros(h), torch.zeros(h, 16)
    for s in range(0, x.shape[0], 256):
        top = shortlist[_head_logits(w, b, x[s:s + 256], proj).topk(16, -1).indices]   # [h, n, 16]
        gold = tid[s:s + 256, :, 0].T[..., None]                                         # [h, n, 1]
        v = valid[s:s + 256].T
        hit1 += ((top[..., :1] == gold).any(-1) & v).sum(-1)
        hit16 += ((top == gold).any(-1) & v).sum(-1)
        rank += ((top == gold) & v[..., None]).sum(1)
    n = valid.sum(0).clamp(min=1)
    return {"top1": [round(float(v), 4) for v in hit1 / n], "top16": [round(float(v), 4) for v in hit16 / n],
            "rank": [[round(float(v), 4) for v in row] for row in rank / n[:, None]],   # accuracy[head][rank]
            "positions": int(valid.sum(0)[0])}


def train(model_name: str, profile: str | HeadsProfile, model=None, tok=None, log: Callable[[str], None] = print,
          out: Path | None = None, device: str | None = None) -> Path:
    """Train heads with a named profile and save them (Medusa-1 layout) with their agreement report. `profile`: a
    name in PROFILES, or a HeadsProfile used as given (its name names the folder and the report's profile); `device`:
    where the base generates the greedy continuations (greedy.device_for) and the fit runs (`fit`)."""
    p = resolve(profile, PROFILES)
    name = p.name
    out = out or heads_dir(model_name, name)
    seal.check_writable(out)                    # a read-only place is one line now, not after the training
    t0 = time.time()
    torch.manual_seed(p.seed)
    device = device_for(device, model)
    dtype, _ = resolve_dtype(p.gen_dtype, log, device)
    if p.gen_dtype == "auto" and resolve_dtype("auto", log)[0] != "bfloat16":
        p = replace(p, bf16_fit=False)          # bf16 autocast is only faster where bfloat16 is native (the CPU's)
    model, tok = base_on(model_name, dtype, device, model, tok)   # the fast dtype generates; heads fit in fp32
    budget = p.data or data_budget(p)
    log(f"training '{name}' heads for {model_name} on the '{name_of(budget)}' distillation data")
    ds = load_data(model_name, budget, model, tok, log, device, layers=False)
    train_seqs, held = ds.split(held_out=False), ds.split(held_out=True)
    shortlist = ds.shortlist(p.shortlist)       # sorted: the heads' drafting vocabulary
    lm_w = model.lm_head.weight.float().cpu()
    rows = ds.rows(train_seqs)
    greedy = int(ds.greedy_mask()[rows].sum())
    log(f"  {len(rows)} training positions ({greedy} greedy), shortlist {len(shortlist)}")
    w, b, stats = fit(lm_w, ds, train_seqs, shortlist, p, log, device)
    meta = ds.meta
    report = {"profile": name, "recipe": RECIPE, "prompts_used": meta["sequences"], "train_positions": len(rows),
              "greedy_positions": greedy,
              "seconds": round(time.time() - t0, 1),
              "heldout": agreement(lm_w, w, b, ds.sequences(held), shortlist, p.num_heads,
                                   ds.greedy_mask()[ds.rows(held)]), "fit": stats,
              **settings(p),
              "gen_dtype": meta["dtype"], "gen_dtype_reason": meta["dtype_reason"], "gen_device": meta["environment"]["device"],
              "fit_device": device,
              "generated_greedy_positions": meta["greedy_positions"],
              "truncated_by_time": meta.get("truncated_by_time", False),
              "expected_generation_seconds": meta.get("expected_generation_seconds"),
              "expected_from": meta.get("expected_from"),
              "data": {"path": str(data_path(model_name, budget)), "seconds": meta["seconds"],
                       "name": name_of(budget), "kind": meta.get("kind", "greedy"),
                       "positions": meta.get("positions", meta.get("rows")), "sources": meta.get("sources")},
              "seen": distill.seen_of(meta)}
    warning = quality_warning(f"'{name}' heads", (report["heldout"]["top1"] or [None])[0],
                              meta.get("quality_warning"))
    if warning:
        report["quality_warning"] = warning
    heads = Heads(ds.d, p.num_heads)
    for i, blk in enumerate(heads.blocks):
        blk[0].linear.weight.data.copy_(w[i])
        blk[0].linear.bias.data.copy_(b[i])
    heads.shortlist = shortlist
    with seal.building(out, log, folder=True) as tmp:    # sealed and renamed into place whole, or not at all
        save(heads, HeadsInfo(model_name, p.num_heads, shortlist_size=len(shortlist), extra={"training": report}),
             tmp)
        (tmp / "report.json").write_text(json.dumps(report, indent=2))
    log(f"heads saved to {out} in {report['seconds']}s; held-out top-1 per head {report['heldout']['top1']}")
    if warning:
        log(f"WARNING: {warning}; recorded in {out / 'report.json'} and every run that uses these heads")
    return out
