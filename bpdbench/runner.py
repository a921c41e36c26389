"""`bpdbench run`: examples -> decode -> certify against greedy -> score -> append result, one example at a time."""
from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Callable

import torch

import rescorers
import tasks as task_registry
from . import decoding, models
from .config import RunConfig, environment
from .heads import Heads
from .results import ResultWriter, summarize, write_summary

Log = Callable[[str], None]


def setup_torch(cfg: RunConfig) -> int:
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    return torch.get_num_threads()


def encode_prompt(tok, task, example, max_prompt_tokens: int) -> list[int]:
    """Chat template for chat tasks when the tokenizer has one; keep the *end* of over-long prompts."""
    if task.chat and getattr(tok, "chat_template", None):
        text = tok.apply_chat_template([{"role": "user", "content": example.prompt}], tokenize=False,
                                       add_generation_prompt=True)
    else:
        text = example.prompt
    ids = tok(text, add_special_tokens=False)["input_ids"]
    return ids[-max_prompt_tokens:]


def eos_ids(model, tok) -> set[int]:
    ids = model.generation_config.eos_token_id
    ids = set(ids if isinstance(ids, list) else [ids] if ids is not None else [])
    if tok.eos_token_id is not None:
        ids.add(tok.eos_token_id)
    return ids


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


class GreedyReference:
    """Plain greedy outputs keyed by a content hash (model, dtype, device, versions, prompt, limits).

    The certificate compares every BPD output with greedy decoding of the same model and prompt; caching lets an
    `ar` run serve later `bpd` runs, and a miss is computed in the same run (and also gives the AR time)."""

    def __init__(self, model, model_name: str, dtype: str, device: str):
        self.model, self.key_base = model, json.dumps(
            [models.model_id(model_name), dtype, device, torch.__version__, _tf_version()])
        self.dir = Path(os.environ.get("BPDBENCH_GREEDY_DIR") or models.cache_root() / "greedy")

    def _path(self, prompt_ids: list[int], max_new: int, eos: set[int]) -> Path:
        h = hashlib.sha256(json.dumps([self.key_base, prompt_ids, max_new, sorted(eos)]).encode()).hexdigest()
        return self.dir / f"{h[:32]}.json"

    def get(self, prompt_ids: list[int], max_new: int, eos: set[int]) -> tuple[list[int], float | None]:
        path = self._path(prompt_ids, max_new, eos)
        if path.exists():
            return json.loads(path.read_text())["tokens"], None
        t0 = time.perf_counter()
        gen = decoding.generate(self.model, prompt_ids, max_new, eos)
        seconds = time.perf_counter() - t0
        self.put(prompt_ids, max_new, eos, gen.tokens, seconds)
        return gen.tokens, seconds

    def put(self, prompt_ids, max_new, eos, tokens: list[int], seconds: float) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self._path(prompt_ids, max_new, eos)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"tokens": tokens, "seconds": seconds}))
        tmp.rename(path)


def _tf_version() -> str:
    import transformers
    return transformers.__version__


@torch.inference_mode()
def target_nll(model, prompt_ids: list[int], target_ids: list[int]) -> tuple[float, int]:
    """Teacher-forced negative log-likelihood of the reference continuation (LAMBADA perplexity)."""
    ids = torch.tensor([prompt_ids + target_ids], device=model.device)
    logits = model(ids).logits[0, len(prompt_ids) - 1: -1].float()
    nll = torch.nn.functional.cross_entropy(logits, torch.tensor(target_ids, device=model.device), reduction="sum")
    return float(nll), len(target_ids)


def resolve_heads(cfg: RunConfig, model, tok, log: Log) -> Heads | None:
    if cfg.method == "ar":
        return None
    from . import train_heads
    from .heads import load as load_heads

    if cfg.heads_profile == "init" and not cfg.heads_path:  # untrained (zero-init) heads: smoke tests, ablations
        heads = Heads(model.config.hidden_size, cfg.heads).to(model.dtype).eval().requires_grad_(False)
        heads.pack(model.lm_head)
        return heads
    path = Path(cfg.heads_path) if cfg.heads_path else train_heads.heads_dir(cfg.model, cfg.heads_profile)
    if not (path / "config.json").exists():
        if cfg.heads_path:
            raise FileNotFoundError(f"no heads at {path} (expected config.json + medusa_lm_head.pt); "
                                    f"train them with `bpdbench train-heads`")
        log(f"no '{cfg.heads_profile}' heads cached for {cfg.model}: training them now (bpdbench train-heads "
            f"--profile {cfg.heads_profile}) into {path}")
        train_heads.train(cfg.model, cfg.heads_profile, model, tok, log=log)
    heads, hcfg = load_heads(path, model.config.hidden_size, model.dtype, str(model.device))
    if cfg.heads > heads.num_heads:
        raise ValueError(f"--heads {cfg.heads} but {path} has only {heads.num_heads} heads")
    heads.pack(model.lm_head)
    training = hcfg.get("bpdbench", {}).get("training", {})
    heads.meta = {"path": str(path), **{k: training[k] for k in ("profile", "seconds", "greedy_positions",
                                                                  "heldout") if k in training}}
    return heads


def _alpha(cfg: RunConfig, spec) -> tuple[float | None, str]:
    """--alpha wins; else the value `bpdbench tune` stored for this task; else the rescorer's default."""
    if not spec.interpolates:
        return None, "n/a"
    if cfg.alpha is not None:
        return cfg.alpha, "--alpha"
    tuned = rescorers.tuned_alpha(cfg.task, spec.name, cfg.model)
    if tuned is not None:
        return tuned, str(rescorers.ALPHA_FILE)
    return spec.default_alpha, "default (not tuned)"


def select_examples(cfg: RunConfig, task, heldout: bool = False) -> list:
    """The examples a config names: the task's eval slice (or its held-out slice), then --offset/--limit."""
    data_dir = Path(cfg.data_dir) if cfg.data_dir else task_registry.default_data_dir()
    examples = task_registry.load_examples(task, data_dir, Path(cfg.data_file) if cfg.data_file else None)
    evaluated, held = task_registry.split(task, examples)
    return task_registry.select(held if heldout else evaluated, cfg.offset, cfg.limit)


def run(cfg: RunConfig, log: Log = print, progress=None) -> dict:
    cfg = cfg.validate()
    threads = setup_torch(cfg)
    task = task_registry.get_task(cfg.task)
    examples = select_examples(cfg, task)
    model, tok = models.load(cfg.model, cfg.dtype, cfg.device)
    heads = resolve_heads(cfg, model, tok, log)
    spec = rescorers.get_rescorer(cfg.rescorer)
    alpha, alpha_source = _alpha(cfg, spec)
    rescorer = None if heads is None else rescorers.build(spec, cfg.model, alpha, cfg.k, str(model.device), log,
                                                          heads_meta=getattr(heads, "meta", None), dtype=cfg.dtype)
    max_new = cfg.max_new_tokens or task.max_new_tokens
    eos = eos_ids(model, tok)
    meta = {"config": cfg.to_dict(), "resolved": {"max_new_tokens": max_new, "eos_ids": sorted(eos),
            "n_selected": len(examples), "model_id": models.model_id(cfg.model), "rescorer": spec.name,
            "alpha": alpha, "alpha_source": alpha_source, "k": cfg.k if rescorer else 1, "p": spec.p,
            "heads": getattr(heads, "meta", None)},
            "environment": environment(threads, str(model.device), cfg.dtype)}
    out = cfg.out_dir()
    writer = ResultWriter(out, meta, cfg.resume)
    done = writer.done_ids()
    reference = GreedyReference(model, cfg.model, cfg.dtype, str(model.device))
    todo = [ex for ex in examples if ex.id not in done]
    if done:
        log(f"resuming {out}: {len(done)} done, {len(todo)} to go")
    for ex in todo:
        prompt_ids = encode_prompt(tok, task, ex, cfg.max_prompt_tokens)
        t0 = time.perf_counter()
        gen = decoding.generate(model, prompt_ids, max_new, eos, heads=heads, n_heads=cfg.heads, rescorer=rescorer,
                                k=cfg.k, threshold=cfg.draft_threshold)
        seconds = time.perf_counter() - t0
        record = {"id": ex.id, "category": ex.category, "prompt_tokens": len(prompt_ids), "seconds": seconds,
                  **gen.counters.to_dict()}
        if cfg.method == "ar":
            reference.put(prompt_ids, max_new, eos, gen.tokens, seconds)
            record.update(lossless=True, first_divergence=None, ref_seconds=seconds)
        elif cfg.check_lossless:
            ref_tokens, ref_seconds = reference.get(prompt_ids, max_new, eos)
            div = first_divergence(gen.tokens, ref_tokens)
            record.update(lossless=div is None, first_divergence=div, ref_seconds=ref_seconds)
            if div is not None:
                why = ("a near-tie that a block forward and a 1-token forward round differently"
                       if cfg.dtype != "float32" else "in float32 this is a bug: please report it")
                log(f"example {ex.id}: output diverges from greedy at token {div} ({cfg.dtype}: {why})")
        text = tok.decode(gen.tokens, skip_special_tokens=True)
        record.update(output=text, output_ids=gen.tokens, quality=task.score(ex, text))
        if ex.target:
            record["target_nll"] = target_nll(model, prompt_ids, tok(ex.target, add_special_tokens=False)["input_ids"])
        writer.append(record)
        if progress:
            progress(record)
    row = summarize(writer.records, meta, task.metrics)
    write_summary(out, row)
    return row
