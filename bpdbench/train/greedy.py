"""The base's batched greedy continuations of the held-out prompt pool: what every trainer learns from.

Why one module: the distillation data of every drafter (train/distill.py), the heads' data (the same function with
the heads' budget) and the model history of hierarchy drafting (train/history.py) are all the base's greedy output
on prompts that no evaluated example shares; one pool and one batched decoder mean they differ only in how much
they keep, never in how it was made.
"""
from __future__ import annotations

import json
import random
import time

import torch

from ..hardware.timing import synchronize

TOPK_TEACHER = 8


POOL_TASKS = ("xsum", "cnn_dailymail", "samsum", "squad", "spec_bench", "mt_bench", "lambada")


def prompt_pool(tok, n: int, max_tokens: int, seed: int, gen_tokens: int) -> list[tuple[list[int], int]]:
    """(prompt ids, generation length) from the train splits of the tasks plus C4 text, interleaved for
    diversity. Each task's prompts are continued for at most its own default length (a summary stops long before
    128 tokens; generating past EOS is wasted work)."""
    import tasks

    out = []
    for task, item, cap in _pool_items(n, seed, gen_tokens, bool(getattr(tok, "chat_template", None))):
        if task is not None:
            out.append((tasks.encode_prompt(tok, task, item, max_tokens), cap))
        elif isinstance(item, tuple):                   # (index, C4 text): a chat request built from it
            out.append((_chat_prompt(tok, item[1], item[0]), cap))
        else:
            out.append((tok(" ".join(item.split()[:120]), add_special_tokens=False)["input_ids"], cap))
    return out


def seen(n: int, seed: int, chat: bool = True) -> dict | None:
    """What an artefact built from `prompt_pool(n, seed)` saw: the task example ids by task (all from the train
    split), their count and a hash, so a result can state its overlap with the artefact's data (experiments/audit).
    None where no task data is here to say it."""
    import tasks

    ids: dict[str, list[str]] = {}
    try:
        items = _pool_items(n, seed, 1, chat)
    except RuntimeError:
        return None
    for task, item, _ in items:
        if task is not None:
            ids.setdefault(task.name, []).append(item.id)
    return tasks.seen(ids, "train")


def _pool_items(n: int, seed: int, gen_tokens: int, chat: bool) -> list[tuple]:
    """(task or None, example | C4 text | (chat index, C4 text), generation length), interleaved and cut to n: one order for
    the prompts and for the record of what they were."""
    import tasks

    data_dir = tasks.default_data_dir()
    sources: list[list[tuple]] = []
    for name in POOL_TASKS:
        task = tasks.get_task(name)
        try:
            held = tasks.split(task, tasks.load_examples(task, data_dir))[1]
        except tasks.DataError:
            continue
        random.Random(seed).shuffle(held)
        cap = min(gen_tokens, task.max_new_tokens)
        sources.append([(task, ex, cap) for ex in held[:n]])
    corpus = (data_dir / "corpus" / "c4_en_validation_2k.jsonl") if data_dir else None
    if corpus and corpus.exists():
        docs = [json.loads(line)["text"] for line in corpus.read_text().splitlines()]
        sources.append([(None, d, gen_tokens) for d in docs[:n]])
        if chat:
            sources.append([(None, (i, d), gen_tokens) for i, d in enumerate(docs[::-1][:n])])
    if not sources:
        raise RuntimeError("no prompts for head training: task data not found (set --data-dir or BPDBENCH_DATA)")
    longest = max(map(len, sources))
    pool = [p for group in zip(*[s + [None] * (longest - len(s)) for s in sources]) for p in group if p]
    return pool[:n]


CHAT_TEMPLATES = ("Write a short blog post inspired by this: {}", "Explain this to a friend in a few paragraphs: {}",
                  "Give me practical advice on this topic: {}", "Write an email to a colleague about this: {}",
                  "What are the pros and cons here? {}", "Write a short story that begins like this: {}",
                  "Answer as an expert would: {}", "Discuss the main points of this text: {}")


def _chat_prompt(tok, doc: str, i: int) -> list[int]:
    """Chat-style requests built from C4 text (never task data): the task pool holds only ~56 held-out chat
    questions, and heads trained without open-ended chat answers accept far less on MT-Bench than on summaries."""
    text = CHAT_TEMPLATES[i % len(CHAT_TEMPLATES)].format(" ".join(doc.split()[:40]))
    return tok.apply_chat_template([{"role": "user", "content": text}], tokenize=True, add_generation_prompt=True,
                                   return_dict=False)


def device_for(device: str | None, model=None) -> str:
    """Where the greedy continuations are generated: `device` when given (`--device`), else where the caller's model
    already is (a run's first-use training generates where the run decodes), else the CPU."""
    from ..models import resolve_device
    return resolve_device(device or (str(model.device) if model is not None else "cpu"))


def base_on(model_name: str, dtype: str, device: str, model=None, tok=None):
    """(model, tok) in `dtype` on `device`: the caller's when it already is, else loaded."""
    if model is None or model.dtype != getattr(torch, dtype) or model.device.type != torch.device(device).type:
        from .. import models
        model, tok = models.load(model_name, dtype, device)
    return model, tok


def stop_ids(model) -> torch.Tensor:
    """The model's EOS ids, as `greedy_batch`'s `stop` (a model without EOS generates to its caps)."""
    eos = model.generation_config.eos_token_id
    return torch.tensor(sorted(set(eos if isinstance(eos, list) else [eos] if eos is not None else [])),
                        dtype=torch.long)


def batches(prompts: list[tuple[list[int], int]], batch: int) -> list[list[tuple[list[int], int]]]:
    """Batches in pool order, in windows of 4 batches sorted by (length cap, prompt length), so a batch wastes
    little on padding or on finished rows while the pool's order still decides what a smaller budget keeps."""
    out = []
    for w in range(0, len(prompts), 4 * batch):
        window = sorted(prompts[w: w + 4 * batch], key=lambda pg: (pg[1], len(pg[0])))
        out += [window[s: s + batch] for s in range(0, len(window), batch)]
    return out


def left_padded(chunk: list[tuple[list[int], int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask) of a batch's prompts, left-padded to the longest."""
    width = max(len(p) for p, _ in chunk)
    return (torch.tensor([[pad] * (width - len(p)) + p for p, _ in chunk]),
            torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in chunk]))


def kept(seq: list[int], stop: torch.Tensor) -> int:
    """How many generated tokens count: up to and including the first EOS (what follows it is garbage)."""
    stops = set(stop.tolist())
    return next((j + 1 for j, t in enumerate(seq) if t in stops), len(seq))


def greedy_batch(model, ids: torch.Tensor, mask: torch.Tensor, max_new: int, stop: torch.Tensor,
                 caps: torch.Tensor | None = None, clock: dict | None = None):
    """Left-padded batched greedy decoding with a KV cache, computing the vocabulary projection only where it is
    needed. Why not `generate`: it projects every prompt position onto the 152k vocabulary, which on a CPU costs
    more than the prefill itself (12 s vs 7 s for 16 x 160 tokens), and that dominated head-training time.
    Rows that reached EOS or their own cap (`caps`) leave the batch (their cache rows too): a CPU forward costs in
    proportion to its rows, and a finished row's tokens are thrown away. Outputs are [B, steps, ...] in the input's
    row order; a row's entries after it finished are zeros (callers cut at EOS / cap). `clock` receives the
    prefill's seconds and prompt tokens and the decode steps' seconds and count (the pacer's first-batch rates).
    It decodes on the model's device and returns CPU tensors (the data is kept and saved on the CPU)."""
    from transformers import DynamicCache

    t0 = time.perf_counter()
    dev = model.device
    ids, mask, stop = ids.to(dev), mask.to(dev), stop.to(dev)
    cache = DynamicCache()
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    out = model.model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True)
    prompt_hid = out.last_hidden_state[:, :-1]                   # [B, W-1, d] positions with a known next token
    h = out.last_hidden_state[:, -1]
    synchronize(dev)                                             # the pacer's prefill rate, not the launch time's
    t1 = time.perf_counter()
    n_rows = ids.shape[0]
    caps = torch.full((n_rows,), max_new, device=dev) if caps is None else caps.to(dev).clamp(max=max_new)
    rows = torch.arange(n_rows, device=dev)                      # input row of each live row
    hs = torch.zeros(n_rows, max_new, h.shape[-1], device=dev)
    lps = torch.zeros(n_rows, max_new, TOPK_TEACHER, device=dev)
    tops = torch.zeros(n_rows, max_new, TOPK_TEACHER, dtype=torch.long, device=dev)
    pos = pos[:, -1:]
    steps = 0
    for step in range(max_new):
        lp, top = torch.log_softmax(model.lm_head(h).float(), -1).topk(TOPK_TEACHER, -1)
        nxt = top[:, 0]
        hs[rows, step], lps[rows, step], tops[rows, step] = h.float(), lp, top
        steps = step + 1
        done = torch.isin(nxt, stop) | (caps[rows] <= step + 1)
        if bool(done.all()):
            break
        if int(done.sum()) * 8 >= len(rows):                     # compact: fewer rows, fewer FLOPs per step
            live = (~done).nonzero().squeeze(1)
            cache.batch_select_indices(live)
            rows, h, nxt, mask, pos = rows[live], h[live], nxt[live], mask[live], pos[live]
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
        pos = pos + 1
        h = model.model(input_ids=nxt[:, None], attention_mask=mask, position_ids=pos, past_key_values=cache,
                        use_cache=True).last_hidden_state[:, -1]
    if clock is not None:
        clock.update(prefill_s=t1 - t0, prompt_tokens=int(ids.numel()), steps=steps,
                     decode_s=time.perf_counter() - t1)
    tops = tops[:, :steps].cpu()
    return prompt_hid.cpu(), hs[:, :steps].cpu(), lps[:, :steps].cpu(), tops, tops[:, :, 0]


def teacher_topk(model, hidden: torch.Tensor, chunk: int = 512) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k log-probs of the base head at many positions, in chunks (a [N, 152k] matrix at once is too big), on the
    model's device; CPU tensors back."""
    flat = hidden.reshape(-1, hidden.shape[-1])
    lps, ids = [], []
    for s in range(0, flat.shape[0], chunk):
        lp, ix = torch.log_softmax(model.lm_head(flat[s:s + chunk].to(model.device)).float(), -1).topk(TOPK_TEACHER,
                                                                                                      -1)
        lps.append(lp.cpu())
        ids.append(ix.cpu())
    shape = (*hidden.shape[:-1], TOPK_TEACHER)
    return torch.cat(lps).reshape(shape), torch.cat(ids).reshape(shape)
