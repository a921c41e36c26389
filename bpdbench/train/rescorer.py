"""Train the small neural rescoring LMs (rescorers/neural.py) on general text, on a wall-clock CPU budget.

Why this recipe: the paper trains its rescorers on C4 and found in-domain training no better, so we use the shared
C4 sample plus WikiText-2 (never task data). The corpus is small (~1.4M target tokens), and a 15-minute CPU run
sees about one epoch or less: no dropout, random contiguous windows, AdamW with a cosine schedule driven by
*elapsed time* (the budget, not a step count, is what is fixed). Held-out = 5% of documents, so perplexity
measures new text.
"""
from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path
from typing import Callable

import torch

from .. import models, paths
from ..store import seal
from ..artefacts.corpus import (CORPUS_FILES, corpus_cache, corpus_documents, default_corpus_files,  # noqa: F401
                               tokenized_corpus)

def neural_dir(size: str, model_name: str) -> Path:
    return paths.rescorer_dir(f"neural-{size}", model_name)


def split_documents(docs: list[list[int]], frac: float = 0.05,
                    seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    """Deterministic document-level split: (train, held-out); at least one held-out document when there are two."""
    order = list(range(len(docs)))
    random.Random(seed).shuffle(order)
    n_held = max(1, round(frac * len(docs))) if len(docs) > 1 else 0
    held = set(order[:n_held])
    return [d for i, d in enumerate(docs) if i not in held], [d for i, d in enumerate(docs) if i in held]


def to_stream(docs: list[list[int]], sep_id: int | None) -> torch.Tensor:
    """Concatenate documents (separated by the target's EOS when known, as the target sees document ends)."""
    out: list[int] = []
    for d in docs:
        out.extend(d)
        if sep_id is not None:
            out.append(sep_id)
    return torch.tensor(out, dtype=torch.long)


def train_lm(lm, ids: torch.Tensor, seconds: float, *, batch: int = 8, lr: float = 1e-3, warmup: int = 30,
             max_steps: int | None = None, seed: int = 0, bf16: bool = True,
             log: Callable[[str], None] = print) -> dict:
    """AdamW on random windows of `ids` until `seconds` (or `max_steps`); lr: linear warmup, cosine in time to 10%.

    `bf16`: CPU autocast (fp32 master weights and loss): ~1.4x more tokens per second on this AVX512-BF16 CPU,
    which matters more than bf16 rounding when the budget, not the data, limits training."""
    T = lm.cfg.max_len
    warmup = min(warmup, max(1, max_steps // 10)) if max_steps else warmup
    if len(ids) < T + 2:
        raise ValueError(f"training stream has {len(ids)} tokens, need > {T + 1}")
    inp, tgt = lm.cols(ids), lm.targets(ids)
    decay = [p for n, p in lm.named_parameters() if p.dim() == 2 and not n.startswith("emb")]
    rest = [p for n, p in lm.named_parameters() if not (p.dim() == 2 and not n.startswith("emb"))]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95))
    g = torch.Generator().manual_seed(seed)
    lm.train()
    t0, last_log, step, losses = time.time(), time.time(), 0, []
    while True:
        elapsed = time.time() - t0
        progress = max(elapsed / seconds if seconds > 0 else 1.0, step / max_steps if max_steps else 0.0)
        if progress >= 1.0:
            break
        cur = lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
        for group in opt.param_groups:
            group["lr"] = cur
        off = torch.randint(0, len(ids) - T - 1, (batch,), generator=g)
        idx = off[:, None] + torch.arange(T)[None]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = lm.loss(inp[idx], tgt[idx + 1])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(lm.parameters(), 1.0)
        opt.step()
        losses.append(float(loss.detach()))
        step += 1
        if time.time() - last_log > 30:
            last_log = time.time()
            log(f"  step {step}: loss {sum(losses[-20:]) / len(losses[-20:]):.3f}, lr {cur:.2e}, "
                f"{step * batch * T / (time.time() - t0):.0f} tok/s, {time.time() - t0:.0f}s")
    lm.eval()
    return {"steps": step, "tokens_seen": step * batch * T, "seconds": round(time.time() - t0, 1), "losses": losses}


@torch.no_grad()
def evaluate(lm, ids: torch.Tensor, max_tokens: int = 32768, batch: int = 8, bf16: bool = True) -> tuple[float, int]:
    """Mean next-token loss (nats) over non-overlapping windows; targets outside the shortlist are skipped."""
    T = lm.cfg.max_len
    ids = ids[: max_tokens + 1]
    n = (len(ids) - 1) // T
    if n == 0:
        raise ValueError(f"held-out stream has {len(ids)} tokens, need > {T}")
    x, y = lm.cols(ids[: n * T]).view(n, T), lm.targets(ids[1: n * T + 1]).view(n, T)
    total, count = 0.0, 0
    lm.eval()
    for s in range(0, n, batch):
        c = int((y[s:s + batch] != -100).sum())
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            total += float(lm.loss(x[s:s + batch], y[s:s + batch])) * c
        count += c
    return total / max(count, 1), count


def target_macs(hf_config: dict) -> int:
    """MACs/token of a Llama/Qwen-style target from its HF config.json (GQA projections, SwiGLU, untied head)."""
    d, L, f = hf_config["hidden_size"], hf_config["num_hidden_layers"], hf_config["intermediate_size"]
    heads = hf_config["num_attention_heads"]
    kv = hf_config.get("num_key_value_heads", heads) * (d // heads)
    return L * (2 * d * d + 2 * d * kv + 3 * d * f) + hf_config["vocab_size"] * d


def _load_shortlist(model_name: str) -> torch.Tensor:
    path = paths.heads_dir(model_name, "quick") / "shortlist.pt"
    if not path.exists():
        raise FileNotFoundError(f"no vocabulary shortlist at {path}: "
                                f"run `bpdbench train-heads --model {model_name}` first")
    return torch.load(path, weights_only=True)


def _target_tokenizer(model_name: str):
    from transformers import AutoTokenizer

    src = paths.dense_model_dir(model_name, "bfloat16") if model_name in models.MODELS else Path(model_name)
    if model_name in models.MODELS and not (src / "config.json").exists():
        models.load(model_name, "bfloat16")  # builds the offline safetensors + tokenizer cache once
    tok = AutoTokenizer.from_pretrained(str(src))
    tok.model_max_length = 1 << 30  # whole documents; silences the "sequence longer than" warning
    return tok, src


def train_neural(size: str, model_name: str = models.DEFAULT_MODEL, shortlist: torch.Tensor | None = None,
                 out: Path | None = None, minutes: float = 15, log: Callable[[str], None] = print, *,
                 tokenize: Callable[[str], list[int]] | None = None, corpus_files: list[Path] | None = None,
                 sep_id: int | None = None, batch: int = 8, lr: float = 1e-3, max_steps: int | None = None,
                 eval_tokens: int = 32768, seed: int = 0, bf16: bool = True) -> Path:
    """Train a size-`size` rescoring LM for `minutes` of wall clock and save it (with report.json) to `out`.

    Tests inject `tokenize`/`corpus_files`/`sep_id`; the CLI path uses the target's own tokenizer and its EOS as
    the document separator. Held-out evaluation (capped at `eval_tokens`) runs after the budget.
    """
    from ..nets.small_lm import QWEN_05B_MACS, SmallLM, make_config, save_lm

    out = Path(out) if out is not None else neural_dir(size, model_name)
    if shortlist is None:
        shortlist = _load_shortlist(model_name)
    cfg = make_config(size, len(shortlist))
    t_macs = QWEN_05B_MACS if model_name == models.DEFAULT_MODEL else None
    cache = None
    if tokenize is None:
        tok, src = _target_tokenizer(model_name)
        tokenize = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
        sep_id = tok.eos_token_id if sep_id is None else sep_id
        cache = corpus_cache(model_name)
        if (Path(src) / "config.json").exists():
            t_macs = target_macs(json.loads((Path(src) / "config.json").read_text()))
    if corpus_files is None:
        corpus_files = default_corpus_files()
    docs = tokenized_corpus([Path(f) for f in corpus_files], tokenize, cache, log)
    train_docs, held_docs = split_documents(docs, 0.05, seed)
    train_ids, held_ids = to_stream(train_docs, sep_id), to_stream(held_docs, sep_id)
    torch.manual_seed(seed)
    lm = SmallLM(cfg, shortlist)
    macs = cfg.macs_per_token()
    log(f"neural-{size}: {lm.num_params() / 1e6:.2f}M params, {macs / 1e6:.2f}M MACs/token"
        + (f" ({100 * macs / t_macs:.2f}% of target)" if t_macs else "")
        + f"; {len(train_ids)} train / {len(held_ids)} held-out tokens; {minutes:g} min budget")
    stats = train_lm(lm, train_ids, minutes * 60, batch=batch, lr=lr, max_steps=max_steps, seed=seed, bf16=bf16,
                     log=log)
    loss, n_eval = evaluate(lm, held_ids, eval_tokens, bf16=bf16)
    coverage = float((lm.targets(train_ids) != -100).float().mean())
    report = {
        "size": size, "model": model_name, "params": lm.num_params(), "macs_per_token": macs,
        "target_macs_per_token": t_macs, "pct_target_compute": round(100 * macs / t_macs, 3) if t_macs else None,
        "config": cfg.__dict__, "train_tokens": len(train_ids), "shortlist_coverage": round(coverage, 5),
        "steps": stats["steps"], "tokens_seen": stats["tokens_seen"], "seconds": stats["seconds"],
        "final_train_loss": round(sum(stats["losses"][-20:]) / max(1, len(stats["losses"][-20:])), 4),
        "heldout_tokens": n_eval, "heldout_loss": round(loss, 4), "heldout_ppl": round(math.exp(loss), 2),
        "batch": batch, "seq_len": cfg.max_len, "lr": lr, "bf16_autocast": bf16, "seed": seed,
        "corpus_files": [str(f) for f in corpus_files],
    }
    with seal.building(out, log, folder=True) as tmp:    # sealed and renamed into place whole, or not at all
        save_lm(lm, tmp)
        (tmp / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    log(f"neural-{size}: {stats['steps']} steps, {stats['tokens_seen']} tokens in {stats['seconds']:.0f}s; "
        f"held-out loss {loss:.3f} (ppl {math.exp(loss):.1f}) -> {out}")
    return out


def train_cli(kind: str, model: str, order: int, size: str, minutes: float, corpus: list[str] | None, memory: str,
              discount_fallback: bool, log: Callable[[str], None]) -> Path:
    """`bpdbench train-rescorer`: a KenLM n-gram over the target's token ids, or a small neural LM."""
    from tasks import corpus_files
    files = [Path(c) for c in corpus] if corpus else corpus_files()
    if kind == "ngram":
        from ..refine.ngram import train_ngram
        tok = models.load_tokenizer(model)
        return train_ngram(order, lambda s: tok(s, add_special_tokens=False)["input_ids"], files,
                           paths.rescorer_dir(f"ngram{order}", model), memory=memory,
                           discount_fallback=discount_fallback)
    if kind == "neural":
        return train_neural(size, model, minutes=minutes, log=log)
    raise ValueError(f"unknown rescorer kind '{kind}'; valid: ngram, neural")
