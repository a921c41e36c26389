"""`bpdbench run`: examples -> decode with one method -> certify against greedy -> score -> append, one at a time."""
from __future__ import annotations

from typing import Callable

import torch

from ..config import RunConfig
from ..report.results import ResultWriter, summarize, write_summary
from .reference import first_divergence
from .timing import timed
from .session import Log, open_session, out_dir, resolve_method


@torch.inference_mode()
def target_nll(model, prompt_ids: list[int], target_ids: list[int]) -> tuple[float, int]:
    """Teacher-forced negative log-likelihood of the reference continuation (LAMBADA perplexity)."""
    ids = torch.tensor([prompt_ids + target_ids], device=model.device)
    logits = model(ids).logits[0, len(prompt_ids) - 1: -1].float()
    nll = torch.nn.functional.cross_entropy(logits, torch.tensor(target_ids, device=model.device), reduction="sum")
    return float(nll), len(target_ids)


def run(cfg: RunConfig, log: Log = print, progress: Callable[[dict], None] | None = None) -> dict:
    method = resolve_method(cfg.validate())
    out = out_dir(cfg)
    s = open_session(cfg, log, methods=[method])
    drafter = s.drafter(method)
    meta = s.meta([method])
    meta["resolved"].update(method=method.label, **s.env.resolved.get(method.label, {}))
    writer = ResultWriter(out, meta, cfg.resume)
    done = writer.done_ids()
    todo = [ex for ex in s.examples if ex.id not in done]
    if done:
        log(f"resuming {out}: {len(done)} done, {len(todo)} to go")
    is_ar = method.label == "ar"
    for ex in todo:
        prompt_ids = s.prompt(ex)
        if not is_ar:
            s.with_reference(drafter, prompt_ids)
        seconds, gen = timed(lambda: s.decode(drafter, prompt_ids), s.model.device)
        record = {"id": ex.id, "category": ex.category, "prompt_tokens": len(prompt_ids), "seconds": seconds,
                  **gen.counters.to_dict()}
        if is_ar:
            s.reference.put(prompt_ids, s.limits, gen.tokens, seconds)
            record.update(lossless=True, first_divergence=None, ref_seconds=seconds)
        elif cfg.check_lossless:
            ref_tokens, ref_seconds = s.reference.get(prompt_ids, s.limits)
            div = first_divergence(gen.tokens, ref_tokens)
            record.update(lossless=div is None, first_divergence=div, ref_seconds=ref_seconds)
            if div is not None:
                why = ("a near-tie that a block forward and a 1-token forward round differently"
                       if cfg.dtype != "float32" else "in float32 this is a bug: please report it")
                log(f"example {ex.id}: output diverges from greedy at token {div} ({cfg.dtype}: {why})")
        text = s.tok.decode(gen.tokens, skip_special_tokens=True)
        record.update(output=text, output_ids=gen.tokens, quality=s.task.score(ex, text))
        if ex.target:
            record["target_nll"] = target_nll(s.model, prompt_ids,
                                              s.tok(ex.target, add_special_tokens=False)["input_ids"])
        writer.append(record)
        if progress:
            progress(record)
    row = summarize(writer.records, meta, s.task.metrics)
    write_summary(out, row)
    return row
