"""The one fit loop every trainer uses, the blockwise heads' (`train-heads`) and every draft network's (`train-network`):
soft-label distillation on a sampled candidate set, a time or step budget with warm-up and a cosine schedule over
the fraction spent, bf16 autocast, optional gradient clipping, validation checkpoints and KOALA's adversarial term.
What differs between trainers is the objective (train/objectives.py) and these settings (FitConfig), not the loop.

Why a CPU-time budget (the drafters'): on a machine shared with other jobs, wall-clock budgets buy a different number
of steps every run (measured: 12% of a core for a 2-thread fit at load 8 on 2 cores), so drafters trained at
different times would not be compared on the same budget. That clock is the process's CPU time (core-seconds: 480
are four minutes of two idle cores); on a busy machine the fit takes longer and does the same work. The report has
both. The heads keep the wall clock and no clipping they were first fitted with (train/heads.RECIPE): changing
either changes the heads behind every committed heads-based result, which would all have to be run again.

Why a saved state (`state`): the benchmark's fits take an hour or more of two cores, longer than a session or a
machine's patience; the loop writes its whole state (weights, optimizer, step, budget spent, checkpoints, random
generators) every RESUME_EVERY core-seconds, and the same call with the same settings continues from it, so a kill
loses at most those minutes. A resumed fit draws the same batches as one that never stopped.

Why sampled candidates: the teacher's top-8 of every prediction in the batch plus random shortlist negatives is the
recipe that gave the blockwise heads the most agreement per CPU second; the other predictions' targets are the hard
negatives.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .objectives import Pred, DistillRows

Log = Callable[[str], None]


@dataclass(frozen=True)
class FitConfig:
    seconds: float | None          # CPU budget of the fit in core-seconds (None: `steps`)
    steps: int
    lr: float
    batch: int                     # base rows (positional families) or sequences (sequential families)
    negatives: int = 512
    greedy_weight: float = 3.0
    bf16: bool = True              # autocast; drafter.py sets it from the machine (emulated bf16 is slower, not faster)
    feature_weight: float = 1.0    # EAGLE's feature regression next to the cross-entropy
    adversarial: float = 0.0       # KOALA: weight of the generator's adversarial loss (0: off)
    seed: int = 0
    clip: float | None = 1.0       # gradient-norm clipping (None: off, the heads' recipe)
    clock: str = "cpu"             # what `seconds` counts: "cpu" (core-seconds) or "wall" (the heads' recipe)
    ramp: bool = False             # a sequential objective's training-time passes grow from 1 to its `unroll`
                                   # over the budget (FitDefaults.ramp)
    device: str = "cpu"            # where the model and each batch's arithmetic run (the data stays on the CPU:
                                   # objectives.py moves each batch across); an accelerator's budget is wall-clock


class Discriminator(nn.Module):
    """KOALA's adversary: tells the base's real final states (whose projection is the teacher) from a draft's."""

    def __init__(self, d: int, width: int = 256):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d, width), nn.SiLU(), nn.Linear(width, 1))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z.float()).squeeze(-1)


def soft_ce(pred: Pred, rows: DistillRows, lm_w: torch.Tensor, shortlist: torch.Tensor, negatives: int,
            g: torch.Generator) -> torch.Tensor:
    """Per prediction: cross-entropy of the teacher's renormalised top-8 against the draft's distribution over the
    batch's candidates. States z [N, d] with targets [N], or packed per head z [h, B, d] with targets [B, h]
    (objectives.Packed: one projection matmul for every head)."""
    ds = rows.ds
    tid = ds.top_ids[pred.target]                                         # [N, 8] or [B, h, 8]
    neg = shortlist[torch.randint(0, len(shortlist), (negatives,), generator=g)]
    cand, inv = torch.unique(torch.cat([tid.flatten(), neg]), return_inverse=True)
    pos = inv[: tid.numel()].view_as(tid)
    dev = pred.z.device
    logits = pred.z @ lm_w[cand.to(lm_w.device)].to(dev, pred.z.dtype).T
    logp = torch.log_softmax(logits.float(), -1)
    if pred.z.dim() == 3:                                                 # [h, B, C] -> [B, h, C], as the targets
        logp = logp.permute(1, 0, 2)
    q = torch.softmax(ds.top_lp[pred.target].to(dev), -1)
    return -(q * logp.gather(-1, pos.to(dev))).sum(-1)


def check_clock(c: FitConfig) -> None:
    """An accelerator's fit is budgeted in wall seconds: the process's CPU time there counts the Python that queues
    its kernels, not the work (a one-line ValueError before anything trains)."""
    if c.device != "cpu" and c.seconds and c.clock != "wall":
        raise ValueError(f"a fit on {c.device} counts wall seconds, not clock '{c.clock}'; give its profile's "
                         f"accelerator budget (device_seconds) with clock='wall'")


def on_device(c: FitConfig, device: str, device_seconds: float | None) -> FitConfig:
    """A CPU recipe moved to an accelerator, one rule for every trained thing: its budget becomes the profile's
    wall seconds there (a counted-steps recipe stays counted), in bf16 autocast, which every GPU the fit supports
    runs natively; on the CPU the recipe is returned as it is."""
    if device == "cpu":
        return c
    return replace(c, seconds=device_seconds if c.seconds else None, bf16=True, clock="wall", device=device)


def work_clock() -> float:
    """Core-seconds of work so far: the process's CPU time, all threads together."""
    return time.process_time()


CLOCKS = {"cpu": work_clock, "wall": time.time}
RESUME_EVERY = 300.0     # core-seconds of fit between two saved states (five minutes of two cores)


def _load_state(state: Path | None, key: dict, log: Log) -> dict | None:
    """The saved state of an interrupted fit with these settings, or None (a state of other settings is set aside
    with a line, then overwritten)."""
    if state is None or not state.is_file():
        return None
    try:
        saved = torch.load(state, weights_only=False, map_location="cpu")   # load_state_dict puts it in place
    except Exception as e:              # noqa: BLE001 -- a torn file from a kill mid-write: start afresh
        log(f"  the saved fit state {state} is unreadable ({type(e).__name__}); starting afresh")
        return None
    if saved.get("key") != key:
        log(f"  the saved fit state {state} was made with other settings; starting afresh")
        return None
    return saved


def _save_state(state: Path, snapshot: dict) -> None:
    tmp = state.with_name(state.name + ".tmp")
    state.parent.mkdir(parents=True, exist_ok=True)
    torch.save(snapshot, tmp)
    os.replace(tmp, state)


def fit(obj, rows: DistillRows, pool, lm_w: torch.Tensor, shortlist: torch.Tensor, c: FitConfig, log: Log,
        validate: Callable[[], float] | None = None, checkpoints: int = 8,
        monitor: Callable[[], dict] | None = None, state: Path | None = None, state_key: dict | None = None,
        every: float | None = None) -> dict:
    """Train obj.model in place; returns what the report records (steps, seconds, last losses).

    `validate` (higher is better, on sequences the fit never trains on) is called at `checkpoints` evenly spaced
    points of the budget and at the end, and the best weights are kept. Why: on a few tens of thousands of greedy
    tokens every draft network overfits (the blockwise heads reach 0.96 top-1 on their training rows, 0.31 held out), so the
    last step need not be the best one. Validation runs inside the budget. `monitor`: what else each checkpoint
    records (the learning curve: held-out top-1 per depth), never used to choose weights. `state`: where the fit's
    state is saved every `every` core-seconds (RESUME_EVERY) and resumed from when `state_key` (with the FitConfig) matches; the
    caller removes it once the result is saved."""
    check_clock(c)
    dev = torch.device(c.device)
    model = obj.model.to(dev).train()
    g = torch.Generator().manual_seed(c.seed)           # draws batches on the CPU, where the data is
    torch.manual_seed(c.seed)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=c.lr, weight_decay=0.0)
    disc = Discriminator(model.d if hasattr(model, "d") else lm_w.shape[1]).to(dev) if c.adversarial else None
    opt_d = torch.optim.AdamW(disc.parameters(), lr=c.lr) if disc is not None else None
    lm_b = (lm_w.bfloat16() if c.bf16 else lm_w.float()).to(dev)
    clock = CLOCKS[c.clock]
    passes = getattr(obj, "unroll", 1)      # the training-time passes the ramp grows to
    key = {"fit": asdict(c), **(state_key or {})}
    step, stats, spent, work_spent, wall_spent = 0, {}, 0.0, 0.0, 0.0
    curve: list[dict] = []
    best: tuple[float, dict] | None = None
    saved = _load_state(state, key, log)
    if saved is not None:
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        if disc is not None:
            disc.load_state_dict(saved["disc"])
            opt_d.load_state_dict(saved["opt_d"])
        g.set_state(saved["g"])
        torch.set_rng_state(saved["torch"])
        if dev.type == "cuda" and saved.get("cuda") is not None:
            torch.cuda.set_rng_state(saved["cuda"], dev)
        step, stats, curve, best = saved["step"], saved["stats"], saved["curve"], saved["best"]
        spent, work_spent, wall_spent = saved["spent"], saved["work_spent"], saved["wall_spent"]
        log(f"  resuming the fit from {state} at step {step} ({work_spent:.0f} CPU-seconds done)")
    t0, w0, c0 = time.time() - wall_spent, work_clock() - work_spent, clock() - spent
    last_save, every = work_clock(), RESUME_EVERY if every is None else every

    def snapshot() -> dict:
        return {"key": key, "model": model.state_dict(), "opt": opt.state_dict(),
                **({"disc": disc.state_dict(), "opt_d": opt_d.state_dict()} if disc is not None else {}),
                "g": g.get_state(), "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state(dev) if dev.type == "cuda" else None, "step": step, "stats": stats,
                "curve": curve,
                "best": best, "spent": clock() - c0, "work_spent": work_clock() - w0, "wall_spent": time.time() - t0}

    def check(done: float) -> None:
        nonlocal best
        model.eval()
        score = validate()
        model.train()
        entry = {"step": step, "budget_done": round(min(done, 1.0), 3), "score": round(score, 4),
                 "samples_seen": step * c.batch, "seconds": round(time.time() - t0, 1),
                 "cpu_seconds": round(work_clock() - w0, 1)}
        curve.append(entry | (monitor() if monitor is not None else {}))
        if best is None or score > best[0]:
            best = (score, {k: v.detach().clone() for k, v in model.state_dict().items()})
        log(f"  validation at step {step}: {score:.4f}")

    while True:
        if state is not None and step and work_clock() - last_save >= every:
            _save_state(state, snapshot())      # before this step's draws: a resume repeats exactly what follows
            last_save = work_clock()
        done = (clock() - c0) / c.seconds if c.seconds else step / max(c.steps, 1)
        if validate is not None and checkpoints and step and done * checkpoints >= len(curve) + 1 and done < 1:
            check(done)
        if done >= 1:
            break
        lr = c.lr * min(1.0, (step + 1) / 20) * 0.5 * (1 + math.cos(math.pi * done))
        for group in opt.param_groups + (opt_d.param_groups if opt_d else []):
            group["lr"] = lr
        if c.ramp:
            obj.unroll = min(passes, 1 + int(passes * done))
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=c.bf16):
            pred = obj.batch(rows, pool, c.batch, c.greedy_weight, g)
            ce = soft_ce(pred, rows, lm_b, shortlist, c.negatives, g)
        w = pred.weight
        if w is None and obj.sequential:
            w = 1.0 + (c.greedy_weight - 1.0) * rows.greedy[pred.target].float()
        w = None if w is None else w.to(ce.device)
        loss = ce.mean() if w is None else (ce * w).sum() / w.sum()
        stats = {"ce": float(loss.detach())}
        if pred.extra is not None:
            loss = loss + c.feature_weight * pred.extra
            stats["feature"] = float(pred.extra.detach())
        if disc is not None:
            real = rows.ds.hidden[pred.target].to(dev).float()
            one, zero = torch.ones(len(real), device=dev), torch.zeros(len(real), device=dev)
            d_loss = (F.binary_cross_entropy_with_logits(disc(real), one)
                      + F.binary_cross_entropy_with_logits(disc(pred.fake.detach()), zero))
            opt_d.zero_grad()
            d_loss.backward()
            opt_d.step()
            adv = F.binary_cross_entropy_with_logits(disc(pred.fake), one)
            loss = loss + c.adversarial * adv
            stats.update(discriminator=float(d_loss.detach()), adversarial=float(adv.detach()))
        opt.zero_grad()
        loss.backward()
        if c.clip is not None:
            torch.nn.utils.clip_grad_norm_(params, c.clip)
        opt.step()
        if step % 25 == 0:
            log(f"  step {step} " + " ".join(f"{k} {v:.3f}" for k, v in stats.items())
                + f" ({work_clock() - w0:.0f}s of CPU, {time.time() - t0:.0f}s wall)")
        step += 1
    out = {"steps": step, "final": {k: round(v, 4) for k, v in stats.items()}}
    if validate is not None:
        check(1.0)
        model.load_state_dict(best[1])
        kept = max(curve, key=lambda r: r["score"])
        out.update(validation=curve, kept_step=kept["step"], kept_score=kept["score"])
        log(f"  kept the weights of step {kept['step']} (validation {kept['score']:.4f})")
    model.eval()
    log(f"  {step} steps in {work_clock() - w0:.0f} CPU-seconds, {time.time() - t0:.0f}s wall")
    return {**out, "fit_seconds": round(time.time() - t0, 1), "fit_cpu_seconds": round(work_clock() - w0, 1)}
