"""Train blockwise heads on the frozen base by in-domain self-distillation, on a CPU budget.

Why this recipe (measured on Qwen 0.5B, 2 cores): a full-vocabulary softmax through the 152k-row projection is far
too slow; distilling the base's own distribution over a small candidate set (the teacher's top-8 per position plus
random negatives) gives the best heads per CPU second; and what decides acceptance is agreement with the base's own
*greedy* continuation on task-like prompts, so the training text is the base's batched greedy output on held-out
prompts (disjoint from every evaluated example), with hidden states and teacher logits taken from that same
`generate` call (no second forward).
"""
from __future__ import annotations

import json
import math
import random
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from . import models
from .heads import Heads, HeadsInfo, save

TOPK_TEACHER = 8


@dataclass(frozen=True)
class Profile:
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


PROFILES = {"quick": Profile(n_prompts=128, gen_tokens=64, steps=250, max_prompt_tokens=192),
            "full": Profile(n_prompts=768, gen_tokens=96, steps=1500),
            "ci": Profile(n_prompts=16, gen_tokens=32, steps=60, batch_gen=8)}


def heads_dir(model: str, profile: str) -> Path:
    return models.cache_root() / "heads" / f"{model.replace('/', '_')}-{profile}"


def prompt_pool(tok, n: int, max_tokens: int, seed: int) -> list[list[int]]:
    """Held-out slices of the chat/summarization/QA tasks plus C4 text, interleaved for diversity."""
    import tasks
    from .runner import encode_prompt

    data_dir = tasks.default_data_dir()
    sources: list[list[list[int]]] = []
    for name in ("xsum", "cnn_dailymail", "samsum", "squad", "spec_bench", "lambada"):
        task = tasks.get_task(name)
        try:
            held = tasks.split(task, tasks.load_examples(task, data_dir))[1]
        except tasks.DataError:
            continue
        random.Random(seed).shuffle(held)
        sources.append([encode_prompt(tok, task, ex, max_tokens) for ex in held[:n]])
    corpus = (data_dir / "corpus" / "c4_en_validation_2k.jsonl") if data_dir else None
    if corpus and corpus.exists():
        docs = [json.loads(line)["text"] for line in corpus.read_text().splitlines()[:n]]
        sources.append([tok(" ".join(d.split()[:120]), add_special_tokens=False)["input_ids"] for d in docs])
    if not sources:
        raise RuntimeError("no prompts for head training: task data not found (set --data-dir or BPDBENCH_DATA)")
    pool = [p for group in zip(*[s + [None] * (n - len(s)) for s in sources]) for p in group if p]
    return pool[:n]


@torch.inference_mode()
def self_distill(model, tok, prompts: list[list[int]], gen: int, batch: int, log: Callable[[str], None]):
    """Batched greedy generation. Per sequence: (hidden [P+G, d], teacher top-k ids [P+G, k] / logprobs, generated
    ids [G], P): the prompt's own positions (teacher = the base's distribution over the real text, nearly free since
    the prefill computed their hidden states) followed by the G greedy positions (teacher = the greedy choice)."""
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    eos = model.generation_config.eos_token_id
    data = []
    t0 = time.time()
    prompts = sorted(prompts, key=len)  # batches of similar length waste little compute on padding
    for s in range(0, len(prompts), batch):
        chunk = prompts[s: s + batch]
        width = max(map(len, chunk))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=gen, do_sample=False,
                             output_hidden_states=True, output_logits=True, return_dict_in_generate=True,
                             pad_token_id=pad, eos_token_id=eos, temperature=None, top_p=None, top_k=None)
        hid = torch.stack([h[-1][:, -1, :] for h in out.hidden_states], 1).float()   # [B, G, d]
        logp = torch.log_softmax(torch.stack(out.logits, 1).float(), -1)           # [B, G, V]
        top_lp, top_ids = logp.topk(TOPK_TEACHER, -1)
        prompt_hid = out.hidden_states[0][-1][:, :-1]                               # [B, W-1, d]
        p_lp, p_ids = _teacher_topk(model, prompt_hid)
        new = out.sequences[:, width:]
        stop = set(eos if isinstance(eos, list) else [eos])
        for b in range(len(chunk)):
            seq = new[b].tolist()
            n = next((j + 1 for j, t in enumerate(seq) if t in stop), len(seq))  # garbage after EOS
            lo = width - len(chunk[b])                    # left padding
            data.append((torch.cat([prompt_hid[b, lo:].float(), hid[b, :n]]),
                         torch.cat([p_ids[b, lo:], top_ids[b, :n]]), torch.cat([p_lp[b, lo:], top_lp[b, :n]]),
                         new[b, :n], width - 1 - lo))
        log(f"  self-distillation: {s + len(chunk)}/{len(prompts)} prompts, {time.time() - t0:.0f}s")
    return data


def _teacher_topk(model, hidden: torch.Tensor, chunk: int = 512) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k log-probs of the base head at many positions, in chunks (a [N, 152k] matrix at once is too big)."""
    flat = hidden.reshape(-1, hidden.shape[-1])
    lps, ids = [], []
    for s in range(0, flat.shape[0], chunk):
        lp, ix = torch.log_softmax(model.lm_head(flat[s:s + chunk]).float(), -1).topk(TOPK_TEACHER, -1)
        lps.append(lp)
        ids.append(ix)
    shape = (*hidden.shape[:-1], TOPK_TEACHER)
    return torch.cat(lps).reshape(shape), torch.cat(ids).reshape(shape)


def build_shortlist(tok, data, size: int, data_dir: Path | None, extra: set[int]) -> torch.Tensor:
    """Most frequent ids in the base's own outputs (weighted up) and the corpus; drafting happens over these."""
    counts: Counter[int] = Counter()
    for _, _, _, seq, _ in data:
        counts.update({t: 1000 for t in seq.tolist()})
    corpus = (data_dir / "corpus" / "c4_en_validation_2k.jsonl") if data_dir else None
    if corpus and corpus.exists():
        for line in corpus.read_text().splitlines():
            counts.update(tok(json.loads(line)["text"], add_special_tokens=False)["input_ids"])
    for t in extra:
        counts[t] += 10**9
    ids = [t for t, _ in counts.most_common(size)]
    return torch.tensor(sorted(ids), dtype=torch.long)


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
    z = x[None] + F.silu(torch.einsum("hde,ne->hnd", w, x) + b[:, None])
    return z @ proj.T                                             # [h, N, C]


def fit(lm_w: torch.Tensor, x, tid, tlp, valid, shortlist, p: Profile, log, weights: torch.Tensor | None = None
        ) -> tuple[torch.Tensor, torch.Tensor]:
    h, d = tid.shape[1], x.shape[1]
    g = torch.Generator().manual_seed(p.seed)
    w = torch.zeros(h, d, d, requires_grad=True)
    b = torch.zeros(h, d, requires_grad=True)
    opt = torch.optim.AdamW([w, b], lr=p.lr, weight_decay=0.0)
    warm_cosine = lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * s / p.steps))  # noqa: E731
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warm_cosine)
    t0 = time.time()
    for step in range(p.steps):
        if weights is None:
            idx = torch.randint(0, x.shape[0], (min(p.batch_positions, x.shape[0]),), generator=g)
        else:
            idx = torch.multinomial(weights, p.batch_positions, replacement=True, generator=g)
        neg = shortlist[torch.randint(0, len(shortlist), (p.negatives,), generator=g)]
        cand, inv = torch.unique(torch.cat([tid[idx].flatten(), neg]), return_inverse=True)
        pos = inv[: tid[idx].numel()].view(*tid[idx].shape)      # [B, h, k] columns of the targets in cand
        logp = torch.log_softmax(_head_logits(w, b, x[idx], lm_w[cand]), -1)  # [h, B, C]
        q = torch.softmax(tlp[idx], -1)                           # teacher top-k renormalised
        ce = -(q * logp.permute(1, 0, 2).gather(-1, pos)).sum(-1)  # [B, h]
        loss = (ce * valid[idx]).sum() / valid[idx].sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step % 50 == 0 or step == p.steps - 1:
            log(f"  step {step}/{p.steps} loss {loss.item():.3f} ({time.time() - t0:.0f}s)")
    return w.detach(), b.detach()


@torch.no_grad()
def agreement(lm_w, w, b, data, shortlist, h: int) -> dict:
    """Per-head top-1 / top-16 agreement with the base's greedy continuation, drafting over the shortlist."""
    x, tid, _, valid, gen = _targets(data, h)
    x, tid, valid = x[gen], tid[gen], valid[gen]
    proj = lm_w[shortlist]
    hit1, hit16 = torch.zeros(h), torch.zeros(h)
    for s in range(0, x.shape[0], 256):
        top = shortlist[_head_logits(w, b, x[s:s + 256], proj).topk(16, -1).indices]   # [h, n, 16]
        gold = tid[s:s + 256, :, 0].T[..., None]                                         # [h, n, 1]
        v = valid[s:s + 256].T
        hit1 += ((top[..., :1] == gold).any(-1) & v).sum(-1)
        hit16 += ((top == gold).any(-1) & v).sum(-1)
    n = valid.sum(0).clamp(min=1)
    return {"top1": [round(float(v), 4) for v in hit1 / n], "top16": [round(float(v), 4) for v in hit16 / n],
            "positions": int(valid.sum(0)[0])}


def train(model_name: str, profile: str, model=None, tok=None, log: Callable[[str], None] = print,
          out: Path | None = None) -> Path:
    """Train heads with a named profile and save them (Medusa-1 layout) with their agreement report."""
    import tasks

    p = PROFILES[profile]
    out = out or heads_dir(model_name, profile)
    t0 = time.time()
    torch.manual_seed(p.seed)
    if model is None or model.dtype != torch.bfloat16 or model.device.type != "cpu":
        model, tok = models.load(model_name, "bfloat16", "cpu")  # bf16 is 2-4x faster on CPU; heads train in fp32
    prompts = prompt_pool(tok, p.n_prompts, p.max_prompt_tokens, p.seed)
    log(f"training '{profile}' heads for {model_name}: {len(prompts)} prompts x {p.gen_tokens} greedy tokens")
    data = self_distill(model, tok, prompts, p.gen_tokens, p.batch_gen, log)
    every = max(2, round(1 / p.eval_fraction))  # held-out sequences spread over all prompt lengths and sources
    train_data = [d for i, d in enumerate(data) if i % every]
    eval_data = data[::every]
    eos = model.generation_config.eos_token_id
    shortlist = build_shortlist(tok, train_data, p.shortlist, tasks.default_data_dir(),
                                set(eos if isinstance(eos, list) else [eos]))
    lm_w = model.lm_head.weight.float()
    x, tid, tlp, valid, gen = _targets(train_data, p.num_heads)
    log(f"  {x.shape[0]} training positions ({int(gen.sum())} greedy), shortlist {len(shortlist)}")
    weights = 1.0 + (p.greedy_weight - 1.0) * gen.float()  # the greedy part is what acceptance is measured on
    w, b = fit(lm_w, x, tid, tlp, valid, shortlist, p, log, weights)
    report = {"profile": profile, "train_positions": int(x.shape[0]), "greedy_positions": int(gen.sum()),
              "seconds": round(time.time() - t0, 1),
              "heldout": agreement(lm_w, w, b, eval_data, shortlist, p.num_heads), **asdict(p)}
    heads = Heads(x.shape[1], p.num_heads)
    for i, blk in enumerate(heads.blocks):
        blk[0].linear.weight.data.copy_(w[i])
        blk[0].linear.bias.data.copy_(b[i])
    heads.shortlist = shortlist
    save(heads, HeadsInfo(model_name, p.num_heads, shortlist_size=len(shortlist), extra={"training": report}), out)
    (out / "report.json").write_text(json.dumps(report, indent=2))
    log(f"heads saved to {out} in {report['seconds']}s; held-out top-1 per head {report['heldout']['top1']}")
    return out
