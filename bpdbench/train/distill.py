"""One distillation dataset per model and budget, built once and cached: what every drafter trainer learns from.

Why one cached dataset: generating the base's greedy continuations is most of a drafter's training cost on a CPU
(370 of the 518 s of the quick blockwise heads), and draft networks compared on different data are not compared fairly. The
blockwise heads (`train-heads`) read it too, with budgets of their own (`heads-<profile>`, train/heads.py). So
`bpdbench distill-data --budget quick` runs the base once, batched and greedy, on held-out prompts (the prompt pool
of train/heads.py: held-out task slices, C4 text, chat requests from C4; never an evaluated example) and stores, per
position, what any drafter needs: the base's final hidden state (bf16, half the bytes), the token that position
produced, its absolute position, and the base's top-8 log-probabilities there (the soft labels). Rows are grouped
in sequences (the last `prompt_positions` positions of the prompt, then the greedy continuation), so sequential
drafters (EAGLE, Hydra++'s prefix layer) can run over contiguous features. A budget names its size: generation
stops at a number of greedy positions, in the machine's fast dtype (auto), so the same budget means the same data
size on a quiet, a busy or a slow machine. Time only stops it as a failure: past 3x the expected time (said before
it starts) it stops with a `WARNING:`, and meta.json records `truncated_by_time: true` and a `quality_warning`.
"""
from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from .. import paths
from ..store import seal
from ..config import environment
from .greedy import (seen, base_on, batches, device_for, greedy_batch, kept, left_padded, prompt_pool, stop_ids,
                     teacher_topk)
from .pacing import Pacer, data_warning, predict_from_batch, predict_seconds, resolve_dtype
from .profiles import name_of, named, resolve, settings

Log = Callable[[str], None]
FILE = "data.pt"


@dataclass(frozen=True)
class Budget:
    n_prompts: int
    gen_tokens: int                  # most greedy tokens per prompt (tasks cap it at their own length)
    greedy_positions: int | None     # stop starting batches once this many greedy positions exist (None: all)
    batch: int = 32
    max_prompt_tokens: int = 160
    prompt_positions: int = 32       # prompt rows kept per sequence (teacher = the base on real text)
    dtype: str = "auto"              # the base's dtype while generating (auto: this machine's fast dtype)
    eval_every: int = 10             # every 10th sequence is held out (per-depth agreement)
    shortlist_rank: int = 65536      # how many token ids the frequency ranking keeps
    seed: int = 0
    name: str = ""                   # the data's folder and meta.json's budget_name (BUDGETS: its key)
    states: str = "bfloat16"         # stored hidden states: "bfloat16" (half the bytes) or "made" (the generation's
                                     # dtype: the heads' budgets, whose ci heads fit on fp32 states)


# Batches of 32 make 1.7x the greedy tokens per second of 16 on 2 cores (bf16 GEMMs; measured 143 vs 83 tokens/s),
# so quick holds 28k greedy positions (the quick blockwise heads had 17k, made in 370 s) in about 250 s on idle cores
# with native bfloat16; full 3.2x that. The size is the definition; the expected time is said first
# (train/pacing.py), and only past 3x of it does generation stop, with a warning the data records.
# ci: fp32 and tiny, every prompt, identical on every machine (see train/heads.py on bf16 flips).
# Quick prompts are cut to 64 tokens in batches of 64 rows (finished rows leave the batch): on 2 AVX2 cores in float32
# the prefill of 160-token prompts cost as much as the generation (151 prompt tokens/s, ~110 greedy positions/s).
BUDGETS = named({"quick": Budget(1024, 128, 28000, batch=64, max_prompt_tokens=64),
                 "full": Budget(4096, 128, 90000, max_prompt_tokens=192),
                 "ci": Budget(16, 32, None, batch=8, dtype="float32")})


@dataclass
class DistillData:
    """Flat rows grouped in sequences. Row r is position `positions[r]` of its sequence: `hidden[r]` is the base's
    final state there, `next_ids[r]` the token it produced (real text in the prompt rows, the greedy choice after),
    `top_ids/top_lp[r]` the base's top-8 next-token distribution there."""
    hidden: torch.Tensor         # [N, d] bfloat16
    next_ids: torch.Tensor       # [N] int64
    top_ids: torch.Tensor        # [N, 8] int64
    top_lp: torch.Tensor         # [N, 8] float32
    positions: torch.Tensor      # [N] int64
    offsets: torch.Tensor        # [S + 1] int64: sequence s is rows offsets[s]:offsets[s+1]
    n_prompt: torch.Tensor       # [S] int64: prompt rows at the start of each sequence
    rank: torch.Tensor           # token ids, most frequent first (shortlists are its prefixes)
    meta: dict
    layers: torch.Tensor | None = None   # [N, k, d] the states of layers meta["layers"] (prefill data, when asked)
    greedy: torch.Tensor | None = None   # [N] bool: rows whose next token is the base's greedy choice (prefill data;
                                         # None: the rows after each sequence's prompt, as generated)
    units: torch.Tensor | None = None    # [S] the text each sequence was cut from (prefill data: held out whole)

    @property
    def d(self) -> int:
        return int(self.hidden.shape[1])

    def split(self, held_out: bool) -> list[int]:
        every = int(self.meta["budget"]["eval_every"])
        unit = (lambda s: int(self.units[s])) if self.units is not None else (lambda s: s)
        return [s for s in range(len(self.n_prompt)) if (unit(s) % every == 0) == held_out]

    def greedy_mask(self) -> torch.Tensor:
        """[N] bool: rows of the greedy continuation (what acceptance is measured on)."""
        if self.greedy is not None:
            return self.greedy
        mask = torch.zeros(self.hidden.shape[0], dtype=torch.bool)
        for s in range(len(self.n_prompt)):
            mask[int(self.offsets[s] + self.n_prompt[s]): int(self.offsets[s + 1])] = True
        return mask

    def layer_states(self, layers) -> torch.Tensor:
        """[N, k, d]: the states of a model's declared layers (engine.Layers), in its order; a one-line error when
        the data holds other layers or none (build prefill data with them: train/prefill.py)."""
        have = list(self.meta.get("layers") or [])
        missing = [i for i in layers.indices if i not in have]
        if self.layers is None or missing:
            raise ValueError(f"the drafter reads the hidden states of layers {list(layers.indices)} but the "
                             f"'{self.meta.get('budget_name')}' data holds {have or 'none'}; train it on prefill data "
                             f"that keeps them (train/prefill.py: PrefillBudget.layers)")
        pick = [have.index(i) for i in layers.indices]
        if pick == list(range(len(have))):
            return self.layers     # all of them, in order: no [N, k, d] copy (5 GB for the bench data)
        return self.layers[:, pick]

    def rows(self, seqs: list[int]) -> torch.Tensor:
        return torch.cat([torch.arange(int(self.offsets[s]), int(self.offsets[s + 1])) for s in seqs])

    def shortlist(self, size: int, extra: set[int] = frozenset()) -> torch.Tensor:
        """The `size` most frequent ids (plus `extra`, e.g. EOS), sorted: the drafting vocabulary."""
        ids = set(self.rank[:size].tolist()) | set(extra)
        return torch.tensor(sorted(ids), dtype=torch.long)

    def sequences(self, seqs: list[int]) -> list[tuple]:
        """The (hidden, teacher ids, teacher logprobs, greedy ids, prompt rows) tuples train/heads.py fits on."""
        out = []
        for s in seqs:
            a, b, k = int(self.offsets[s]), int(self.offsets[s + 1]), int(self.n_prompt[s])
            out.append((self.hidden[a:b].float(), self.top_ids[a:b], self.top_lp[a:b], self.next_ids[a + k:b], k))
        return out


def path_for(model: str, budget: str) -> Path:
    return paths.distill_dir(model, budget)


def load(path: Path) -> DistillData:
    if not (path / FILE).exists():
        raise FileNotFoundError(f"no distillation data at {path}; build it with `bpdbench distill-data`")
    why = seal.problem(path)
    if why:
        raise seal.ArtefactDamaged(f"{why}; delete {path} and rerun `bpdbench distill-data` (or let the next "
                                   f"training build it)")
    try:
        state = torch.load(path / FILE, map_location="cpu", weights_only=True)
        meta = json.loads((path / "meta.json").read_text())
    except Exception as e:  # truncated zip or json: name the file, not the parser's words
        raise FileNotFoundError(f"{path} is truncated or corrupt ({type(e).__name__}); delete it and rerun "
                                f"`bpdbench distill-data`") from None
    return DistillData(**state, meta=meta)


def ensure(model_name: str, budget: str | Budget, model=None, tok=None, log: Log = print,
           device: str | None = None) -> DistillData:
    """The cached dataset, built first when missing (every trainer calls this, so the data is made once). `budget`: a
    name in BUDGETS or a Budget (its name names the folder); `device`: where a missing one is generated."""
    path = path_for(model_name, name_of(budget))
    if _stale(path, budget) is None:        # read without writing anything (not even a lock file)
        return load(path)
    with seal.build_lock(path, log):        # a process building it now: wait for it, then read what it built
        why = _stale(path, budget)
        if why is None:
            return load(path)
        if why:
            log(why)
        build(model_name, budget, model, tok, log, device=device)
    return load(path)


def _stale(path: Path, budget: str | Budget) -> str | None:
    """Why the cached data at `path` must be built (again): "" when there is none, a line to say when it is
    damaged or was made with another budget; None when it can be read as it is."""
    if not (path / FILE).exists():
        return ""
    if why := seal.problem(path):
        return f"warning: {why}: building it again"
    if not isinstance(budget, str) and (changed := _changed(path, budget)):
        return (f"the cached '{name_of(budget)}' data was made with another budget ({', '.join(changed)}): "
                f"building it again")
    return None


def _changed(path: Path, budget: Budget) -> list[str]:
    """The settings of a budget given as an object (the heads' budgets, derived from their profile, and variants)
    that differ from those the cached data at `path` records; a setting it does not record is taken as unchanged
    (data from before the setting existed). Why: a heads profile changed under the same name would otherwise fit on
    the old data without a word. A name asks for whatever data is cached under it."""
    try:
        recorded = json.loads((path / "meta.json").read_text())["budget"]
    except (OSError, ValueError, KeyError):
        return ["unreadable meta.json"]
    wanted = settings(budget)
    return [k for k, v in wanted.items() if k in recorded and recorded[k] != v]


def seen_of(meta: dict) -> dict | None:
    """What the data's prompts were (train/greedy.seen): recorded since the splits were; derived from the budget's
    prompt count and seed for data cached before (the pool is a function of those and the data)."""
    if meta.get("seen"):
        return meta["seen"]
    b = meta.get("budget") or {}
    return seen(int(b["n_prompts"]), int(b.get("seed", 0))) if "n_prompts" in b else None


def build(model_name: str, budget: str | Budget, model=None, tok=None, log: Log = print, out: Path | None = None,
          device: str | None = None) -> Path:
    """Generate, rank the vocabulary, and write `data.pt` + `meta.json` atomically (a killed build leaves none).
    `budget`: a name in BUDGETS, or a Budget used as given (its name names the folder and is recorded); `device`:
    where the base generates (greedy.device_for), recorded in the data's environment."""
    import tasks

    b = resolve(budget, BUDGETS)
    name = b.name
    out = out or path_for(model_name, name)
    seal.check_writable(out)                    # a read-only place is one line now, not after generating
    t0 = time.time()
    torch.manual_seed(b.seed)
    device = device_for(device, model)
    dtype, why = resolve_dtype(b.dtype, log, device)
    model, tok = base_on(model_name, dtype, device, model, tok)
    prompts = prompt_pool(tok, b.n_prompts, b.max_prompt_tokens, b.seed, b.gen_tokens)
    pacer = Pacer(f"'{name}' distillation data", b.greedy_positions, log,
                  predict_seconds(model_name, dtype, b.greedy_positions, b.batch, prompts, device)
                  if b.greedy_positions else None)
    log(f"distillation data '{name}' for {model_name}: up to {len(prompts)} prompts")
    log(pacer.header(b.batch, dtype, why))
    seqs = generate(model, tok, prompts, b, log, pacer)
    gen_seconds = time.time() - t0
    state = pack(seqs, torch.bfloat16 if b.states == "bfloat16" else None)
    train = [s for i, s in enumerate(seqs) if i % b.eval_every]
    state["rank"] = rank_tokens(tok, train, b.shortlist_rank, tasks.default_data_dir(), set(stop_ids(model).tolist()))
    n_greedy = sum(len(s["next_ids"]) - s["n_prompt"] for s in seqs)
    meta = {"model": model_name, "budget": settings(b), "budget_name": name, "sequences": len(seqs),
            "rows": int(state["hidden"].shape[0]), "greedy_positions": n_greedy,
            "generation_seconds": round(gen_seconds, 1), "seconds": round(time.time() - t0, 1),
            "dtype": dtype, "dtype_reason": why, "truncated_by_time": pacer.truncated_by_time,
            "expected_generation_seconds": None if pacer.predicted is None else round(pacer.predicted, 1),
            "expected_from": pacer.source,
            "hidden_dtype": str(state["hidden"].dtype).removeprefix("torch."),
            "environment": environment(torch.get_num_threads(), device, dtype),
            "seen": seen(b.n_prompts, b.seed, bool(getattr(tok, "chat_template", None)))}
    warning = data_warning(f"the '{name}' distillation data", n_greedy, b.greedy_positions,
                           pacer.truncated_by_time)
    if warning:
        meta["quality_warning"] = warning
    with seal.building(out, log, folder=True) as tmp:      # sealed and renamed into place whole, or not at all
        torch.save(state, tmp / FILE)
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
    log(f"distillation data saved to {out}: {len(seqs)} sequences, {meta['rows']} rows ({n_greedy} greedy) in "
        f"{meta['seconds']}s")
    if warning:
        log(f"WARNING: {warning}; recorded in {out / 'meta.json'} and the report of every drafter trained on it")
    return out


@torch.inference_mode()
def generate(model, tok, prompts: list[tuple[list[int], int]], b: Budget, log: Log, pacer: Pacer | None = None
             ) -> list[dict]:
    """Batched greedy continuations in pool order (windows of 4 batches sorted by length, so little padding), until
    the budget's greedy positions exist (or the pacer's safety cap stops it, loudly)."""
    pacer = pacer or Pacer("distillation data", b.greedy_positions, log)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    stop = stop_ids(model)
    chunks = batches(prompts, b.batch)
    seqs: list[dict] = []
    t0, n_greedy = time.time(), 0
    for i, chunk in enumerate(chunks):
        if pacer.done(n_greedy, len(chunks) - i):
            log(f"  stopped after {i} batches: {n_greedy} greedy positions, {time.time() - t0:.0f}s")
            break
        ids, mask = left_padded(chunk, pad)
        width = ids.shape[1]
        clock: dict = {}
        prompt_hid, hid, top_lp, top_ids, new = greedy_batch(model, ids, mask, max(g for _, g in chunk), stop,
                                                             torch.tensor([g for _, g in chunk]), clock)
        keep = min(b.prompt_positions, width - 1)
        p_lp, p_ids = teacher_topk(model, prompt_hid[:, width - 1 - keep:])
        for r, (p, cap) in enumerate(chunk):
            seq = new[r, :cap].tolist()
            n = kept(seq, stop)
            k = min(keep, len(p) - 1)                    # this prompt's own positions (no left padding)
            seqs.append({"hidden": torch.cat([prompt_hid[r, width - 1 - k:], hid[r, :n].to(prompt_hid.dtype)]),
                         "next_ids": torch.tensor(p[len(p) - k:] + seq[:n]),
                         "top_ids": torch.cat([p_ids[r, keep - k:], top_ids[r, :n]]),
                         "top_lp": torch.cat([p_lp[r, keep - k:], top_lp[r, :n]]),
                         "positions": torch.arange(len(p) - 1 - k, len(p) - 1 + n), "n_prompt": k})
            n_greedy += n
        if i == 0:
            pacer.batch_done(n_greedy, len(chunks), predict_from_batch(clock, b.greedy_positions, b.batch, prompts)
                             if b.greedy_positions else None)
        log(f"  {i + 1}/{len(chunks)} batches, {n_greedy} greedy positions, {time.time() - t0:.0f}s")
    return seqs


def pack(seqs: list[dict], hidden_dtype: torch.dtype | None = torch.bfloat16) -> dict:
    """generate's sequences as DistillData's flat rows (hidden states in `hidden_dtype`; None: as made)."""
    lengths = torch.tensor([len(s["next_ids"]) for s in seqs])
    hidden = torch.cat([s["hidden"] for s in seqs])
    return {"hidden": hidden if hidden_dtype is None else hidden.to(hidden_dtype),
            "next_ids": torch.cat([s["next_ids"] for s in seqs]).long(),
            "top_ids": torch.cat([s["top_ids"] for s in seqs]).long(),
            "top_lp": torch.cat([s["top_lp"] for s in seqs]).float(),
            "positions": torch.cat([s["positions"] for s in seqs]).long(),
            "offsets": torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]),
            "n_prompt": torch.tensor([s["n_prompt"] for s in seqs], dtype=torch.long)}


def rank_tokens(tok, seqs: list[dict], size: int, data_dir: Path | None, extra: set[int]) -> torch.Tensor:
    """Token ids by frequency: the base's own greedy outputs weighted far above the C4 corpus (what the drafts must
    hit), EOS first. Every drafting shortlist is a prefix of it (the heads' sorted, the drafters' in rank order)."""
    counts: Counter[int] = Counter()
    for s in seqs:
        counts.update({t: 1000 for t in s["next_ids"][s["n_prompt"]:].tolist()})
    corpus = (data_dir / "corpus" / "c4_en_validation_2k.jsonl") if data_dir else None
    if corpus and corpus.exists():
        for line in corpus.read_text().splitlines():
            counts.update(tok(json.loads(line)["text"], add_special_tokens=False)["input_ids"])
    for t in extra:
        counts[t] += 10**12
    return torch.tensor([t for t, _ in counts.most_common(size)], dtype=torch.long)
