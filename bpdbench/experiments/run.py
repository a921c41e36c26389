"""`bpdbench run`: examples -> decode with one method -> certify against greedy -> score -> append, one at a time.

At T > 0 (`--temperature`) the output is a draw, so the per-example greedy certificate does not apply: each example
is decoded with the speculative-sampling rule and its own generator (seed + offset + index), and AR *sampling* of
the same example (same warpers, same seed) is timed in the same process for a per-token speedup. Records and the
summary say `certificate: statistical (bpdbench certify ...)`, the command whose two-sample test covers the method;
no lossless_rate is reported.
"""
from __future__ import annotations

from typing import Callable

import torch

from ..methods import Method
from ..paths import portable_tree
from ..store import EXAMPLES, PROMPT_HASH, OutputLock, ResultWriter, precheck_run, read_examples, seal
from .summary import summarize, write_summary
from .certificate import EXACT, LostExamples, certify_output
from .examples import prompt_sha256
from .reference import first_divergence
from .command import Plan
from .session import Log, Session, certify_command
from .timing import timed


@torch.inference_mode()
def target_nll(model, prompt_ids: list[int], target_ids: list[int]) -> tuple[float, int]:
    """Teacher-forced negative log-likelihood of the reference continuation (LAMBADA perplexity)."""
    ids = torch.tensor([prompt_ids + target_ids], device=model.device)
    logits = model(ids).logits[0, len(prompt_ids) - 1: -1].float()
    nll = torch.nn.functional.cross_entropy(logits, torch.tensor(target_ids, device=model.device), reduction="sum")
    return float(nll), len(target_ids)


def decode(s: Session, plan: Plan, lock: OutputLock, log: Log, progress: Callable[[dict], None] | None) -> dict:
    """Decode, certify, append one record per example, then the summary (the folder's lock is held: execute)."""
    cfg, method, out = plan.cfg, plan.method, plan.out
    drafter = s.drafter(method)
    meta = s.meta([method])
    heads_meta = meta["resolved"].get("heads")       # path, training, shortlist state: kept, not overwritten
    meta["resolved"].update(method=method.label,
                            **seal.with_content_hashes(portable_tree(s.env.resolved.get(method.label, {}))))
    meta["resolved"]["heads_files"] = heads_meta
    if not cfg.sampling.greedy:
        meta["resolved"]["sampling"]["certificate"] = f"statistical ({certify_command(cfg, method.label)})"
    with ResultWriter(out, meta, plan.resume, log, lock) as writer:
        row = _decode_all(s, method, drafter, writer, progress, meta)
        write_summary(out, row)
    return row


def precheck(plan: Plan) -> None:
    """Inside the lock, before the model loads: a folder of other settings is refused, not mixed."""
    precheck_run(plan.out, plan.cfg.to_dict(), plan.resume)


def refuse_lost(plan: Plan, row: dict, log: Log) -> None:
    """After every record and the summary are written: an example that diverged from greedy beyond numerical noise
    fails the command (LostExamples)."""
    if row.get("n_lost"):
        lost = [r["id"] for r in read_examples(plan.out / EXAMPLES) if r.get("certificate") == "lost"]
        raise LostExamples(f"{row['n_lost']} example(s) lost: output differs from greedy beyond numerical noise "
                           f"({', '.join(lost[:5])}); see certificate_reason in {plan.out / EXAMPLES}")


def _decode_all(s: Session, method: Method, drafter, writer: ResultWriter, progress, meta: dict) -> dict:
    cfg, log = s.cfg, s.log
    done = writer.done_ids()
    todo = [ex for ex in s.examples if ex.id not in done]
    if done:
        log(f"resuming {writer.out}: {len(done)} done, {len(todo)} to go")
    is_ar = method.label == "ar"
    resolved = s.env.resolved.get(method.label, {})
    width = resolved.get("width") or resolved.get("n_heads") or cfg.heads   # draft tokens verified per step
    index = {ex.id: i for i, ex in enumerate(s.examples)}
    for ex in todo:
        prompt_ids, full = s.prompt_info(ex)
        if not is_ar:
            s.with_reference(drafter, prompt_ids)
        acceptance = s.acceptance(index[ex.id])
        seconds, gen = timed(lambda: s.decode(drafter, prompt_ids, acceptance), s.model.device)
        record = {"id": ex.id, PROMPT_HASH: prompt_sha256(ex), "category": ex.category,
                  "prompt_tokens": len(prompt_ids), "prompt_truncated_from": full, "seconds": seconds,
                  **gen.counters.to_dict()}
        if not cfg.sampling.greedy:
            record.update(_sampled(s, method, ex, index[ex.id], prompt_ids, acceptance, seconds, is_ar))
        elif is_ar:
            s.reference.put(prompt_ids, s.limits, gen.tokens, seconds)
            record.update(lossless=True, first_divergence=None, ref_seconds=seconds, **EXACT.to_record())
        elif cfg.check_lossless:
            record.update(_certified(s, ex.id, prompt_ids, gen.tokens, width))
        text = s.tok.decode(gen.tokens, skip_special_tokens=True)
        record.update(output=text, output_ids=gen.tokens, quality=s.task.score(ex, text))
        if ex.target:
            record["target_nll"] = target_nll(s.model, prompt_ids,
                                              s.tok(ex.target, add_special_tokens=False)["input_ids"])
        writer.append(record)
        if progress:
            progress(record)
    return summarize(writer.records, meta, s.task.metrics)


def _sampled(s: Session, method: Method, ex, index: int, prompt_ids: list[int], acceptance, seconds: float,
             is_ar: bool) -> dict:
    """A sampled example: its seed, the mean per-position acceptance probability where the drafter reported q,
    and (methods other than ar) AR sampling of the same example timed here, for a like-for-like speed ratio, with
    its quality: an exact sampler's quality differs from AR sampling's only by sampling noise."""
    rec = {"seed": s.seed(index), "lossless": None, "first_divergence": None, "certificate": "statistical",
           "certificate_reason": certify_command(s.cfg, method.label),
           "alpha_sum": sum(acceptance.alphas), "alpha_n": len(acceptance.alphas)}
    if is_ar:
        rec.update(ref_seconds=seconds, ref_new_tokens=None)
    else:
        ar = s.acceptance(index)
        ref_seconds, ref = timed(lambda: s.decode(None, prompt_ids, ar), s.model.device)
        rec.update(ref_seconds=ref_seconds, ref_new_tokens=len(ref.tokens),
                   ref_quality=s.task.score(ex, s.tok.decode(ref.tokens, skip_special_tokens=True)))
    return rec


def _certified(s: Session, ex_id: str, prompt_ids: list[int], tokens: list[int], width: int) -> dict:
    """Compare with greedy and certify the divergence; a reference that greedy decoding no longer reproduces is
    recomputed (with a warning naming its file) and the example certified again."""
    ref_tokens, ref_seconds = s.reference.get(prompt_ids, s.limits)
    cert = certify_output(s.model, prompt_ids, tokens, ref_tokens, s.cfg.dtype, width)
    if not cert.reference_ok and ref_seconds is None:
        log_path = s.reference.path(prompt_ids, s.limits)
        s.log(f"warning: greedy reference {log_path} disagrees with greedy decoding ({cert.reason}); recomputed")
        ref_tokens, ref_seconds = s.reference.recompute(prompt_ids, s.limits)
        cert = certify_output(s.model, prompt_ids, tokens, ref_tokens, s.cfg.dtype, width)
    div = first_divergence(tokens, ref_tokens)
    if cert.certificate == "near_tie":
        s.log(f"example {ex_id}: diverges from greedy at token {div}: near-tie ({cert.reason})")
    elif cert.certificate == "lost":
        s.log(f"LOST example {ex_id}: diverges from greedy at token {div}: {cert.reason}")
    rec = cert.to_record()
    rec["certificate_reason"] = rec.pop("reason")
    return {"lossless": div is None, "first_divergence": div, "ref_seconds": ref_seconds, **rec}
