"""What each draft network predicts from the cached distillation data, for training and for held-out agreement.

Every objective turns a sample of the data into predicted states z [N, d] (the projection input), the dataset rows
whose teacher distribution each must match, and the depth (1 = the token after the base's next token). The fit loop
(train/fit.py) is shared: soft-label cross-entropy against the teacher's top-8, on a sampled candidate set. A
network's record (nets/registry.NetworkSpec) names its objective; OBJECTIVES below resolves the name, so no code
here asks which class a model is.

Indexing: row r is position t of a sequence; its hidden state produced next_ids[r] = x_{t+1} (the base's next
token, known when drafting; in teacher-forced text, the text's token); depth d drafts x_{t+1+d}, whose teacher is
row r + d and whose greedy token is the base's argmax there (top_ids[r + d, 0]: next_ids[r + d] in generated data). Sequential families are trained with teacher-forced draft tokens (acceptance only ever reaches a
depth whose earlier tokens were right); EAGLE also feeds its own predicted features back, depth by depth
(drafters.eagle.Eagle.unrolled), as drafting does.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .distill import DistillData


@dataclass
class DistillRows:
    """The data, flattened for sampling: per row its sequence's end, whether it is a greedy row, the features a
    model reads there (the final states, or the states of the layers it declares) and the base's greedy token."""
    ds: DistillData
    end: torch.Tensor       # [N] first row after this row's sequence
    greedy: torch.Tensor    # [N] bool
    feats: torch.Tensor | None = None   # [N, d] or [N, k, d] (None: ds.hidden)
    gold: torch.Tensor | None = None    # [N] the base's argmax there (None: top_ids[:, 0])

    def __post_init__(self) -> None:
        self.feats = self.ds.hidden if self.feats is None else self.feats
        self.gold = self.ds.top_ids[:, 0] if self.gold is None else self.gold

    @classmethod
    def of(cls, ds: DistillData, layers=None) -> "DistillRows":
        """`layers`: the model's declared layers (engine.Layers; None: it reads the final states)."""
        lengths = ds.offsets[1:] - ds.offsets[:-1]
        end = torch.repeat_interleave(ds.offsets[1:], lengths)
        return cls(ds, end, ds.greedy_mask(), None if layers is None else ds.layer_states(layers))


@dataclass
class Pred:
    z: torch.Tensor          # [N, d] predicted states (projected by the base's head)
    target: torch.Tensor     # [N] teacher rows
    depth: torch.Tensor      # [N] 1-based
    extra: torch.Tensor | None = None   # an additional loss term (EAGLE's feature regression)
    fake: torch.Tensor | None = None    # states the adversarial discriminator judges (KOALA)
    weight: torch.Tensor | None = None  # per-prediction loss weight (None: the mean, or greedy-weighted if sequential)


def base_rows(rows: DistillRows, pool: torch.Tensor, n: int, weight: float, g: torch.Generator) -> torch.Tensor:
    """n rows from `pool` with at least one target after them, greedy rows `weight` times as likely."""
    ok = pool[rows.end[pool] > pool + 1]
    w = 1.0 + (weight - 1.0) * rows.greedy[ok].float()
    return ok[torch.multinomial(w, n, replacement=True, generator=g)]


def _valid(rows: DistillRows, r: torch.Tensor, depth: int) -> torch.Tensor:
    """[n, depth] bool: depth d target row r + d lies inside r's sequence."""
    return (r[:, None] + torch.arange(1, depth + 1)[None]) < rows.end[r][:, None]


def _greedy_chain(rows: DistillRows, first: torch.Tensor, depth: int) -> torch.Tensor:
    """[..., depth] bool: depth p's context (rows first .. first + p - 1) is the base's greedy continuation, so
    agreement there is agreement with greedy decoding (always so in generated data; in teacher-forced text only
    where the text agrees with the base)."""
    idx = (first[..., None] + torch.arange(depth)).clamp(max=len(rows.end) - 1)
    return torch.cumprod(rows.greedy[idx].long(), -1).bool()


def _emb(model, ids: torch.Tensor) -> torch.Tensor:
    """The base's frozen embeddings of `ids`, in float32 (the trainable weights' dtype; autocast casts per op), at
    the hidden states' scale (DraftModel.emb_scale), on the model's device."""
    return model.emb[ids.to(model.emb.device)].to(_device(model)).float() * model.emb_scale


def _device(model: nn.Module) -> torch.device:
    """Where the model runs (train/fit.py puts it there): the data stays on the CPU, and each batch's inputs cross
    here, so the batch draws and the cache's tensors never have to live on an accelerator."""
    return next(model.parameters()).device


class Positional:
    """Networks drafting from one position (Medusa/KOALA heads, Hydra, Amphista): a batch is a sample of rows. The
    model gives `teacher_states(features [n, d] (or [n, k, d]: declared layers), embeddings [n, D, d] of x_{t+1}
    and the true tokens after it) -> [n, D, d]`."""
    sequential = False

    def __init__(self, model, depth: int):
        self.model, self.depth = model, depth

    def predict(self, rows: DistillRows, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """States [n, depth, d] for base rows r, and validity [n, depth]."""
        ds, D, m = rows.ds, self.depth, self.model
        valid = _valid(rows, r, D)
        idx = (r[:, None] + torch.arange(D)[None]).clamp(max=ds.hidden.shape[0] - 1)
        return m.teacher_states(rows.feats[r].to(_device(m)).float(), _emb(m, ds.next_ids[idx])), valid

    def batch(self, rows: DistillRows, pool: torch.Tensor, n: int, weight: float, g: torch.Generator) -> Pred:
        r = base_rows(rows, pool, n, weight, g)
        z, valid = self.predict(rows, r)
        target = r[:, None] + torch.arange(1, self.depth + 1)[None]
        depth = torch.arange(1, self.depth + 1)[None].expand_as(target)
        zv = z[valid.to(z.device)]
        return Pred(zv, target[valid], depth[valid], fake=zv)

    def evaluate(self, rows: DistillRows, seqs: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """States [n, depth, d], gold token ids [n, depth], validity, at every greedy row of `seqs`."""
        r = rows.ds.rows(seqs)
        r = r[rows.greedy[r]]
        out = [self.predict(rows, r[s:s + 256]) for s in range(0, max(len(r), 1), 256)]
        z, valid = torch.cat([o[0] for o in out]), torch.cat([o[1] for o in out])
        gold_rows = (r[:, None] + torch.arange(1, self.depth + 1)[None]).clamp(max=len(rows.end) - 1)
        return z, rows.gold[gold_rows], valid & _greedy_chain(rows, r, self.depth)


class PackedHeads(nn.Module):
    """Medusa-1 heads held as one [h, d, d] weight, the form they are fitted in: every head's residual block in one
    einsum. nets/heads.Heads is the same network in the Medusa-1 layout it is saved and decoded in."""

    def __init__(self, d: int, h: int):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(h, d, d))     # zero: every head starts as the identity (Medusa's init)
        self.b = nn.Parameter(torch.zeros(h, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return packed_states(self.w, self.b, x)


def packed_states(w: torch.Tensor, b: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """x [n, d] -> [h, n, d]: each head's state z = x + SiLU(W x + b), for weights packed as w [h, d, d], b [h, d]
    (the fit's and the heads' held-out agreement's one formula)."""
    return x[None] + F.silu(torch.einsum("hde,ne->hnd", w, x) + b[:, None])


class Packed:
    """The blockwise heads' objective (`train-heads`): a batch is a sample of rows, greedy rows `weight` times as likely,
    and every head predicts from each, its targets (depth 1..h) packed [B, h] so that one projection matmul and one
    candidate set serve all heads; a target past the sequence's end carries weight 0 (its teacher ids still join
    the candidate set). Why not Positional on nets/medusa.MedusaHeads: this packed form is what the heads were first
    fitted with (train/heads.RECIPE), and it draws rows from every position, not only those with a target after."""
    sequential = False

    def __init__(self, model: PackedHeads):
        self.model, self.depth = model, int(model.w.shape[0])

    def batch(self, rows: DistillRows, pool: torch.Tensor, n: int, weight: float, g: torch.Generator) -> Pred:
        w = 1.0 + (weight - 1.0) * rows.greedy[pool].float()
        r = pool[torch.multinomial(w, n, replacement=True, generator=g)]
        end = rows.end[r][:, None]
        target = r[:, None] + 1 + torch.arange(self.depth)[None]
        valid = target < end
        z = self.model(rows.ds.hidden[r].to(_device(self.model)).float())
        return Pred(z, torch.minimum(target, end - 1), (target - r[:, None]), weight=valid)


class Sequential:
    """Networks that run over contiguous features (EAGLE: `Unrolled`; Hydra++'s prefix layer: `Prefixed`): a batch
    is whole sequences. `shifted`: the depth-p state at row j predicts row j + 1 from the context ending at row
    j - p + 1 (EAGLE's passes), rather than row j + p from row j."""
    sequential = True
    shifted = False

    def __init__(self, model, depth: int, unroll: int = 1, noise: float = 0.0, decay: float = 1.0):
        self.model, self.depth, self.unroll, self.noise, self.decay = model, depth, unroll, noise, decay

    def window(self, rows: DistillRows, seqs: list[int]):
        ds = rows.ds
        lens = [int(ds.offsets[s + 1] - ds.offsets[s]) for s in seqs]
        n = max(lens)
        idx = torch.full((len(seqs), n), -1, dtype=torch.long)
        for b, s in enumerate(seqs):
            idx[b, : lens[b]] = torch.arange(int(ds.offsets[s]), int(ds.offsets[s + 1]))
        valid = idx >= 0
        safe = idx.clamp(min=0)
        return safe, valid

    def states(self, rows: DistillRows, safe: torch.Tensor, valid: torch.Tensor, train: bool) -> list[torch.Tensor]:
        """Per depth p (1..D) the states [B, n, d] at every row (row j's depth-p state drafts x_{t+1+p} from the
        context ending at row j - p + 1 for EAGLE; for Hydra++ all depths come from the same row)."""
        raise NotImplementedError

    def features(self, rows: DistillRows, safe: torch.Tensor, train: bool) -> torch.Tensor:
        """The model's input features at rows `safe`, with the training noise (relative to their RMS) when set."""
        feat = rows.feats[safe].to(_device(self.model)).float()
        if train and self.noise:
            feat = feat + self.noise * feat.pow(2).mean(-1, keepdim=True).sqrt() * torch.randn_like(feat)
        return feat

    def _targets(self, rows: DistillRows, safe, valid, p: int, eagle: bool):
        """DistillRows whose teacher the depth-p state at each row must match, and where that is defined."""
        if eagle:   # the depth-p state at row j predicts row j + 1, from the context ending at row j - p + 1
            target = safe + 1
            ok = valid & (torch.arange(safe.shape[1])[None] >= p - 1) & (target < rows.end[safe])
        else:
            target = safe + p
            ok = valid & (target < rows.end[safe])
        return target.clamp(max=len(rows.end) - 1), ok

    def batch(self, rows: DistillRows, pool_seqs: list[int], n: int, weight: float, g: torch.Generator) -> Pred:
        """n sequences of about one length (a random run of the pool sorted by length: little padding)."""
        ds = rows.ds
        order = sorted(pool_seqs, key=lambda s: int(ds.offsets[s + 1] - ds.offsets[s]))
        first = int(torch.randint(0, max(1, len(order) - n + 1), (1,), generator=g))
        safe, valid = self.window(rows, order[first: first + n])
        eagle = self.shifted
        zs = self.states(rows, safe, valid, train=True)
        preds, extra = [], []
        for p, z in enumerate(zs, 1):
            target, ok = self._targets(rows, safe, valid, p, eagle)
            kept = z[ok.to(z.device)]
            preds.append((kept, target[ok], torch.full((int(ok.sum()),), p)))
            if eagle:
                real = rows.ds.hidden[target[ok]].to(z.device).float()
                extra.append(torch.nn.functional.smooth_l1_loss(kept.float(), real))
        z = torch.cat([a for a, _, _ in preds])
        target, depth = torch.cat([b for _, b, _ in preds]), torch.cat([c for _, _, c in preds])
        # EAGLE-3 weights pass p's loss decay^(p-1); the greedy weighting the fit applies otherwise stays
        w = None if self.decay == 1.0 else \
            (1.0 + (weight - 1.0) * rows.greedy[target].float()) * self.decay ** (depth - 1).float()
        return Pred(z, target, depth, torch.stack(extra).mean() if extra else None, fake=z, weight=w)

    def evaluate(self, rows: DistillRows, seqs: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Like Positional.evaluate: states [n, depth, d] from the greedy rows as the base row (depth 1's row)."""
        eagle = self.shifted
        zs_all, gold_all, ok_all = [], [], []
        for s in range(0, len(seqs), 16):
            safe, valid = self.window(rows, seqs[s:s + 16])
            zs = self.states(rows, safe, valid, train=False)
            base = valid & rows.greedy[safe]
            chain = _greedy_chain(rows, safe, self.depth)             # [B, n, depth]
            n = safe.shape[1]
            z_rows, gold, ok = [], [], []
            for p in range(1, self.depth + 1):
                if eagle:     # depth p from base row j sits at row j + p - 1 of pass p
                    shift = p - 1
                    zp = torch.cat([zs[p - 1][:, shift:], zs[p - 1][:, :shift]], 1)
                else:
                    zp = zs[p - 1]
                tgt = (safe + p).clamp(max=len(rows.end) - 1)
                z_rows.append(zp)
                gold.append(rows.gold[tgt])
                ok.append(base & chain[..., p - 1] & (torch.arange(n)[None] + p < valid.sum(1, keepdim=True)))
            keep = base
            zs_all.append(torch.stack(z_rows, 2)[keep.to(zs[0].device)])
            gold_all.append(torch.stack(gold, 2)[keep])
            ok_all.append(torch.stack(ok, 2)[keep])
        return torch.cat(zs_all), torch.cat(gold_all), torch.cat(ok_all)


class Unrolled(Sequential):
    """EAGLE: the draft layer over real features, then its own predicted features fed back pass by pass
    (`unrolled`), with the feature regression beside the cross-entropy."""
    shifted = True

    def states(self, rows: DistillRows, safe: torch.Tensor, valid: torch.Tensor, train: bool) -> list[torch.Tensor]:
        ds, m, dev = rows.ds, self.model, _device(self.model)
        return m.unrolled(self.features(rows, safe, train), _emb(m, ds.next_ids[safe]), ds.positions[safe].to(dev),
                          valid.to(dev), self.unroll if train else self.depth)


class Prefixed(Sequential):
    """Hydra++: a decoder prefix layer over the features, then every head from the same row."""

    def states(self, rows: DistillRows, safe: torch.Tensor, valid: torch.Tensor, train: bool) -> list[torch.Tensor]:
        from ..nets.layers import causal_mask
        ds, m, D, dev = rows.ds, self.model, self.depth, _device(self.model)
        base = m.prefix(self.features(rows, safe, train), ds.positions[safe].to(dev), causal_mask(valid.to(dev)))
        idx = (safe[..., None] + torch.arange(D)).clamp(max=ds.hidden.shape[0] - 1)
        embs = _emb(m, ds.next_ids[idx])                  # [B, n, D, d]
        return [m.head(i, base, embs[..., : i + 1, :]) for i in range(D)]


# The objectives a network names (nets/registry.NetworkSpec.objective): the training half of its record.
OBJECTIVES = {"positional": lambda model, depth, unroll, noise: Positional(model, depth),
              "unrolled": Unrolled, "prefix": Prefixed}


def objective(name: str, model, depth: int, unroll: int = 1, noise: float = 0.0, decay: float = 1.0):
    """The objective a network's record names, over its model; a one-line error for a name none registered.
    `decay` (FitDefaults.decay) weights a sequential objective's passes; a positional one has none to weight."""
    if name not in OBJECTIVES:
        raise ValueError(f"unknown training objective '{name}'; valid: {', '.join(OBJECTIVES)} (register a new one "
                         f"in bpdbench.train.objectives.OBJECTIVES)")
    obj = OBJECTIVES[name](model, depth, unroll, noise)
    if decay != 1.0:
        if not obj.sequential:
            raise ValueError(f"the '{name}' objective trains no passes, so decay={decay} weights nothing; drop it")
        obj.decay = decay
    return obj


@torch.no_grad()
def agreement(obj, rows: DistillRows, seqs: list[int], proj: torch.Tensor, shortlist: torch.Tensor | None,
              topk: int = 16) -> dict:
    """Held-out per-depth top-1 / top-k agreement with the base's greedy continuation, drafting over the shortlist,
    each depth given the true tokens before it; `chain`: the share of positions whose first d drafts are all right
    (so 1 + sum(chain) is the expected tokens per step of a chain drafter of that depth)."""
    z, gold, ok = obj.evaluate(rows, seqs) if seqs else (None, None, None)
    if z is None or z.shape[0] == 0:            # no greedy row to score (teacher-forced text the base disagrees with)
        zero = [0.0] * obj.depth
        return {"top1": zero, f"top{topk}": zero, "chain": zero, "expected_tokens_per_step": 1.0, "positions": 0}
    # In chunks of rows: the full profile's held-out logits at once are 14k rows x 5 depths x 16k ids = 4.6 GB, and
    # two trainers side by side were killed for memory on a 24 GB machine.
    top = torch.cat([(c.to(proj.device, proj.dtype) @ proj.T).topk(topk, -1).indices.cpu() for c in z.split(1024)])
    top = shortlist[top] if shortlist is not None else top
    hit1 = (top[..., 0] == gold) & ok
    hitk = (top == gold[..., None]).any(-1) & ok
    n = ok.sum(0).clamp(min=1)
    run = torch.cumprod(hit1.float() * ok.float(), -1)
    all_ok = ok[:, 0]
    return {"top1": [round(float(v), 4) for v in hit1.sum(0) / n],
            f"top{topk}": [round(float(v), 4) for v in hitk.sum(0) / n],
            "chain": [round(float(v), 4) for v in run[all_ok].mean(0)],
            "expected_tokens_per_step": round(1 + float(run[all_ok].sum(-1).mean()), 4),
            "positions": int(all_ok.sum())}
