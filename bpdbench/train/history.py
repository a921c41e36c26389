"""The model's own greedy history: greedy continuations of the target on held-out prompts, for `hierarchy`'s
model-history database (Hierarchy Drafting's "S" level) and `cascade`'s bigram table when asked.

Why greedy continuations: lossless greedy decoding keeps exactly the tokens the model would write greedily, so
n-grams of its own greedy output predict what it writes far better than text written by people. Hierarchy
Drafting's `scripts/construct_model_DB.py` generates with the target (greedy, 1024 tokens) on OASST prompts and
keeps the 100k most frequent 5-grams. Here the prompts are the pool the heads are trained on (`greedy.prompt_pool`:
held-out slices of the tasks plus C4 text, disjoint from every evaluated example by the tasks' split rule), the
generation is `greedy.greedy_batch` (no vocabulary projection over the prompt), and the budget is a named profile.
`greedy_continuations` is the one place continuations come from, so a cached distillation dataset can replace it.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import torch

from .. import paths
from ..store import seal
from ..artefacts.history import MINUTES, PROFILES, HistoryProfile, history_file, load  # noqa: F401
from .pacing import FILL, Pacer, predict_seconds, resolve_dtype

Log = Callable[[str], None]


@torch.inference_mode()
def greedy_continuations(model, tok, p: HistoryProfile, log: Log, pacer: Pacer | None = None,
                         prompts: list[tuple[list[int], int]] | None = None) -> tuple[list[list[int]], dict]:
    """(continuations, where they came from): batched greedy decoding of `prompt_pool`, each cut after its EOS."""
    from .greedy import batches, greedy_batch, kept, left_padded, prompt_pool, stop_ids

    if prompts is None:
        prompts = prompt_pool(tok, p.n_prompts, p.max_prompt_tokens, p.seed, p.gen_tokens)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    stop = stop_ids(model)
    chunks = batches(prompts, p.batch)                # as distill.generate: little padding, few finished rows
    out: list[list[int]] = []
    t0, used = time.time(), 0
    for i, chunk in enumerate(chunks):
        ids, mask = left_padded(chunk, pad)
        new = greedy_batch(model, ids, mask, max(g for _, g in chunk), stop, torch.tensor([g for _, g in chunk]))[-1]
        for b, (_, cap) in enumerate(chunk):
            seq = new[b, :cap].tolist()
            out.append(seq[:kept(seq, stop)])
        used += len(chunk)
        if i == 0 and pacer is not None:
            pacer.batch_done(sum(map(len, out)), len(chunks))
        log(f"  history: {i + 1}/{len(chunks)} batches, {sum(map(len, out))} tokens, {time.time() - t0:.0f}s")
    source = {"kind": "greedy continuations", "prompts": "train.heads.prompt_pool (held-out task slices + C4)",
              "prompts_used": used, "dtype": str(model.dtype).replace("torch.", ""),
              "seconds": round(time.time() - t0, 1)}
    if pacer is not None:
        source.update(expected_seconds=None if pacer.predicted is None else round(pacer.predicted, 1),
                      expected_from=pacer.source)
    return out, source


def build(model_name: str, profile: str, model=None, tok=None, log: Log = print, out: Path | None = None,
          device: str | None = None) -> Path:
    """Generate the history of a profile and cache it (one JSON: the continuations and how they were made).
    `device`: where the base generates (greedy.device_for)."""
    if profile not in PROFILES:
        raise ValueError(f"unknown history profile '{profile}'; valid: {', '.join(PROFILES)}")
    p = PROFILES[profile]
    path = Path(out) if out else history_file(model_name, profile)
    seal.check_writable(path)                         # a read-only place is one line now, not after generating
    from .greedy import base_on, device_for, prompt_pool, seen
    device = device_for(device, model)
    dtype, why = resolve_dtype(p.dtype, log, device)
    model, tok = base_on(model_name, dtype, device, model, tok)
    prompts = prompt_pool(tok, p.n_prompts, p.max_prompt_tokens, p.seed, p.gen_tokens)
    expected = sum(g for _, g in prompts) * FILL          # greedy positions, roughly (EOS ends many rows early)
    pacer = Pacer(f"'{profile}' model history", None, log,
                  predict_seconds(model_name, dtype, int(expected), p.batch, prompts, device))
    log(f"model history '{profile}' for {model_name} (about {MINUTES[profile]} min on 2 idle cores with native "
        f"bfloat16)")
    log(pacer.header(p.batch, dtype, why, size=f"{len(prompts)} prompts x up to {p.gen_tokens} greedy tokens"))
    seqs, source = greedy_continuations(model, tok, p, log, pacer, prompts)
    source.update(dtype_reason=why, device=device)
    record = {"model": model_name, "profile": profile, "settings": asdict(p), "source": source,
              "sequences": len(seqs), "tokens": sum(map(len, seqs)), "continuations": seqs,
              "seen": seen(p.n_prompts, p.seed, bool(getattr(tok, "chat_template", None)))}
    with seal.building(path, log) as tmp:             # whole and sealed, or the earlier file untouched
        tmp.write_text(json.dumps(record))
    log(f"model history saved to {path}: {record['sequences']} continuations, {record['tokens']} tokens, "
        f"{source['seconds']}s")
    return path
