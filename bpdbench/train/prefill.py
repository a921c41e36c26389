"""Training data at prefill speed: teacher-forced passes over fixed text, as EAGLE trains.

Why: the greedy distillation data (train/distill.py) decodes the base's own continuations one token per forward,
so on a CPU it makes a few tens of thousands of positions in minutes, and the drafters trained on it measure that
budget, not their method. One prefill forward over a chunk of text gives, at every position, the base's hidden
states (the final one and any chosen layers: EAGLE-3's low, middle and high) and its top-8 next-token distribution,
whose argmax is the base's greedy prediction there: a million positions in under an hour of two cores.

What it reads (`PrefillBudget.sources`), interleaved text by text so a smaller budget keeps a mix:
- `train`: the prompts and references of the tasks' train split (tasks.splits(...)["train"]: never a tune or eval
  example), prompt then reference, as one text;
- `corpus`: the general LM corpus (tasks.corpus_files: C4 and WikiText, no task data);
- `greedy`: the base's own greedy continuations where this cache holds them: the sequences of its greedy
  distillation data (train/distill.py; prompts of the train split and C4). Not the greedy *reference* cache
  (experiments/reference.py): that holds the continuations of evaluated examples, which no training may see.

Rows follow DistillData (row j: position j of a chunk, next_ids[j] the text's next token); a row is "greedy" where
that token is the base's argmax, so held-out agreement counts only contexts that are the base's greedy
continuation. Texts are held out whole (every `eval_every`-th text). The data streams to disk in shards of about
`shard_positions` positions, each written atomically with a small record of how far the text stream got, so a
killed build loses at most the shard in flight and a rerun resumes; the finished data is one sealed folder whose
meta.json records what it saw (tasks.seen ids, sources, positions, the model, dtype, layers, seconds).
"""
from __future__ import annotations

import io
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch

from .. import paths
from ..config import environment
from ..engine.types import Layers
from ..store import seal
from ..store.files import write_atomic
from .greedy import POOL_TASKS, base_on, device_for, stop_ids, teacher_topk
from .pacing import resolve_dtype
from .profiles import named, resolve, settings

Log = Callable[[str], None]
SOURCES = ("train", "corpus", "greedy")
MIN_CHUNK = 8           # a text's tail shorter than this is dropped (too little context to learn from)


@dataclass(frozen=True)
class PrefillBudget:
    positions: int                        # stop once this many positions (rows) are stored
    chunk: int = 512                      # tokens per text chunk: one sequence, one row of a forward
    batch: int = 8                        # chunks per forward
    sources: tuple[str, ...] = SOURCES
    layers: tuple[int, ...] | str = ()    # hidden states of these layers kept too; "low-mid-high": EAGLE-3's
    shard_positions: int = 65536
    max_prompt_tokens: int = 1024         # a train-split prompt keeps its end (tasks.encode_prompt)
    dtype: str = "auto"                   # the base's dtype (auto: this machine's fast dtype)
    eval_every: int = 10                  # every 10th text is held out
    shortlist_rank: int = 65536
    seed: int = 0
    name: str = ""
    states: str = "bfloat16"              # stored states: "bfloat16" (half the bytes) or "made" (the forward's dtype)


# bench: about 2 hours of 2 cores for the data and one network's fit (train/network.PROFILES["bench"]). Prefill runs
# at ~434 tokens/s on 2 AVX512-BF16 cores (measured elsewhere); the top-8 over the 152k-row projection costs about
# a quarter more (the projection is 136M of the 0.5B model's 494M weights), so ~340 positions/s: 1,000,000
# positions take ~49 minutes, leaving ~70 minutes (8,400 core-seconds) for the fit. The kept layers (EAGLE-3's three)
# cost memory, not forwards: 1M positions x 4 states x 896 x 2 bytes = 7.2 GB on disk and in memory.
# ci: fp32 and tiny, for tests.
# quick: the data of a quick network that reads chosen layers (train/network.LAYERED_DATA), which the greedy quick
# data does not keep: 65,536 positions, ~3 minutes at ~340 positions/s, 0.5 GB of states.
BUDGETS = named({"prefill-bench": PrefillBudget(1_000_000, layers="low-mid-high"),
                 "prefill-quick": PrefillBudget(65_536, layers="low-mid-high", shard_positions=16_384),
                 "prefill-ci": PrefillBudget(2048, chunk=32, batch=4, shard_positions=256, dtype="float32",
                                             layers="low-mid-high",
                                             max_prompt_tokens=64, shortlist_rank=4096, states="made")})


def path_for(model: str, name: str) -> Path:
    return paths.distill_dir(model, name)


def layers_for(b: PrefillBudget, n_layers: int) -> Layers | None:
    if not b.layers:
        return None
    layers = Layers.low_mid_high(n_layers) if b.layers == "low-mid-high" else Layers(tuple(b.layers))
    layers.check(n_layers)
    return layers


def streams(tok, b: PrefillBudget, model_name: str) -> list[Iterator[tuple[str, str, list[int]]]]:
    """Per source, its texts as (source, what it is, token ids), in one order for a budget."""
    import random

    import tasks

    out = []
    for source in b.sources:
        if source not in SOURCES:
            raise ValueError(f"unknown prefill source '{source}'; valid: {', '.join(SOURCES)}")
        out.append({"train": _train_texts, "corpus": _corpus_texts, "greedy": _greedy_texts}[source](
            tok, b, model_name, random.Random(b.seed), tasks))
    return out


def _train_texts(tok, b, model_name, rng, tasks):
    data_dir = tasks.default_data_dir()
    pools = []
    for name in POOL_TASKS:
        task = tasks.get_task(name)
        try:
            train = tasks.splits(task, tasks.load_examples(task, data_dir))["train"]
        except tasks.DataError:
            continue
        rng.shuffle(train)
        pools.append((task, train))
    for i in range(max((len(p) for _, p in pools), default=0)):
        for task, pool in pools:
            if i < len(pool):
                ex = pool[i]
                ref = ex.reference[0] if isinstance(ex.reference, tuple) else (ex.reference or ex.target or "")
                ids = tasks.encode_prompt(tok, task, ex, b.max_prompt_tokens)
                answer = tok(" " + ref, add_special_tokens=False)["input_ids"] if ref else []
                yield "train", f"{task.name}/{ex.id}", ids + answer


def _corpus_texts(tok, b, model_name, rng, tasks):
    try:
        files = tasks.corpus_files()
    except tasks.DataError:
        return
    for f in files:
        lines = f.read_text().splitlines()
        docs = [json.loads(x)["text"] for x in lines if x.strip()] if f.suffix == ".jsonl" else \
            [p for p in "\n".join(lines).split("\n\n") if p.strip()]
        for i, doc in enumerate(docs):
            yield "corpus", f"{f.name}/{i}", tok(doc, add_special_tokens=False)["input_ids"]


def _greedy_texts(tok, b, model_name, rng, tasks):
    from . import distill
    for budget in distill.BUDGETS:
        where = distill.path_for(model_name, budget)
        if not (where / distill.FILE).exists() or seal.problem(where):
            continue
        ds = distill.load(where)
        for s in range(len(ds.n_prompt)):
            a, z = int(ds.offsets[s]), int(ds.offsets[s + 1])
            yield "greedy", f"{budget}/{s}", ds.next_ids[a:z].tolist()


def chunks(tok, b: PrefillBudget, model_name: str) -> Iterator[tuple[int, str, str, list[int]]]:
    """(text unit, source, what, ids) per chunk of at most `chunk` tokens, the sources taking turns chunk by chunk
    (a long corpus document never crowds out the rest, at any budget). A text's unit is unique across sources; the
    held-out texts are the units divisible by `eval_every`."""
    def cut(j: int, stream) -> Iterator[tuple[int, str, str, list[int]]]:
        for i, (source, what, ids) in enumerate(stream):
            for s in range(0, len(ids), b.chunk):
                if len(ids) - s >= MIN_CHUNK:
                    yield i * len(b.sources) + j, source, what, ids[s: s + b.chunk]

    live = [cut(j, stream) for j, stream in enumerate(streams(tok, b, model_name))]
    while live:
        for stream in list(live):
            item = next(stream, None)
            if item is None:
                live.remove(stream)
            else:
                yield item


@torch.inference_mode()
def forward(model, batch: list[list[int]], layers: Layers | None) -> list[dict]:
    """One teacher-forced forward over right-padded chunks: per chunk its rows (every position but the last)."""
    width = max(map(len, batch))
    ids = torch.tensor([c + [0] * (width - len(c)) for c in batch], device=model.device)
    mask = torch.tensor([[1] * len(c) + [0] * (width - len(c)) for c in batch], device=model.device)
    kwargs = {"output_hidden_states": list(layers.indices)} if layers else {}
    out = model.model(input_ids=ids, attention_mask=mask, **kwargs)
    rows = []
    for r, c in enumerate(batch):
        n = len(c) - 1
        hid = out.last_hidden_state[r, :n]
        lp, top = teacher_topk(model, hid)
        row = {"hidden": hid.cpu(), "next_ids": torch.tensor(c[1:]), "top_ids": top, "top_lp": lp,
               "positions": torch.arange(n)}
        if layers:
            row["layers"] = torch.stack([out.hidden_states[i][r, :n] for i in layers.indices], 1).cpu()
        rows.append(row)
    return rows


def _write_shard(partial: Path, index: int, seqs: list[dict], record: dict, dtype: torch.dtype) -> None:
    """The shard's tensors, then its record (a shard counts only once its record exists): both atomic."""
    state = {k: torch.cat([s[k] for s in seqs]) for k in ("hidden", "next_ids", "top_ids", "top_lp", "positions")}
    state["hidden"] = state["hidden"].to(dtype)
    if "layers" in seqs[0]:
        state["layers"] = torch.cat([s["layers"] for s in seqs]).to(dtype)
    state["lengths"] = torch.tensor([len(s["next_ids"]) for s in seqs])
    state["units"] = torch.tensor([s["unit"] for s in seqs])
    buf = io.BytesIO()
    torch.save(state, buf)
    write_atomic(partial / f"shard-{index:05d}.pt", buf.getvalue())
    write_atomic(partial / f"shard-{index:05d}.json", json.dumps(record))


def _records(partial: Path) -> list[dict]:
    """The finished shards' records, in order (a shard without its record was in flight: written again)."""
    out = []
    for i in range(10**6):
        f = partial / f"shard-{i:05d}.json"
        if not f.exists() or not (partial / f"shard-{i:05d}.pt").exists():
            break
        out.append(json.loads(f.read_text()))
    return out


def _settings(b: PrefillBudget, model_name: str, dtype: str) -> dict:
    """What a partial build must match to be resumed, as its JSON reads back (tuples become lists)."""
    return json.loads(json.dumps({"model": model_name, "budget": settings(b), "dtype": dtype}))


def build(model_name: str, budget: str | PrefillBudget, model=None, tok=None, log: Log = print,
          out: Path | None = None, device: str | None = None) -> Path:
    """Stream the data to shards (resuming those a killed build finished), then seal it as one folder."""
    b = resolve(budget, BUDGETS)
    out = out or path_for(model_name, b.name)
    seal.check_writable(out)                    # a read-only place is one line now, not after the forwards
    partial = out.with_name(out.name + ".partial")
    device = device_for(device, model)
    dtype, why = resolve_dtype(b.dtype, log, device)
    model, tok = base_on(model_name, dtype, device, model, tok)
    n_layers = int(model.config.num_hidden_layers)
    layers = layers_for(b, n_layers)
    keep = torch.bfloat16 if b.states == "bfloat16" or dtype == "bfloat16" else torch.float32
    with seal.build_lock(partial, log):
        wanted = _settings(b, model_name, dtype)
        if (partial / "settings.json").exists() and json.loads((partial / "settings.json").read_text()) != wanted:
            log(f"the partial '{b.name}' data at {partial} was made with other settings: starting it again")
            shutil.rmtree(partial)
        partial.mkdir(parents=True, exist_ok=True)
        write_atomic(partial / "settings.json", json.dumps(wanted))
        records = _records(partial)
        positions = sum(r["positions"] for r in records)
        start = records[-1]["next_chunk"] if records else 0
        if records:
            log(f"resuming the '{b.name}' data: {len(records)} shards, {positions} positions already made")
        log(f"prefill data '{b.name}' for {model_name}: {b.positions} positions in chunks of {b.chunk} tokens from "
            f"{', '.join(b.sources)}, {dtype} ({why}), layers {list(layers.indices) if layers else 'final only'}")
        stream = chunks(tok, b, model_name)
        for _ in range(start):
            next(stream, None)
        index, consumed, seqs, record, t0 = len(records), start, [], _new_record(), time.time()
        while positions + record["positions"] < b.positions:
            batch = []
            while len(batch) < b.batch and positions + record["positions"] + sum(len(c) - 1 for *_, c in batch) \
                    < b.positions:
                item = next(stream, None)
                if item is None:
                    break
                consumed += 1
                left = b.positions - positions - record["positions"] - sum(len(c) - 1 for *_, c in batch)
                batch.append((*item[:3], item[3][: left + 1]))        # the budget's last chunk is cut to fit
            if not batch:
                log(f"  the sources ran out at {positions + record['positions']} positions")
                break
            for (unit, source, what, _), row in zip(batch, forward(model, [c for *_, c in batch], layers)):
                seqs.append(row | {"unit": unit})
                _count(record, source, what, len(row["next_ids"]))
            if record["positions"] >= b.shard_positions:
                record.update(next_chunk=consumed, seconds=round(time.time() - t0, 1))
                _write_shard(partial, index, seqs, record, keep)
                positions += record["positions"]
                log(f"  shard {index}: {positions} positions, {time.time() - t0:.0f}s")
                index, seqs, record, t0 = index + 1, [], _new_record(), time.time()
        if seqs:
            record.update(next_chunk=consumed, seconds=round(time.time() - t0, 1))
            _write_shard(partial, index, seqs, record, keep)
        _finish(partial, out, b, model_name, model, dtype, why, layers, n_layers, device, log)
    shutil.rmtree(partial, ignore_errors=True)
    return out


def _new_record() -> dict:
    return {"positions": 0, "sequences": 0, "sources": {}, "train_ids": {}}


def _count(record: dict, source: str, what: str, rows: int) -> None:
    record["positions"] += rows
    record["sequences"] += 1
    record["sources"][source] = record["sources"].get(source, 0) + rows
    if source == "train":
        task, ex = what.split("/", 1)
        record["train_ids"].setdefault(task, [])
        if ex not in record["train_ids"][task]:
            record["train_ids"][task].append(ex)
    elif source == "greedy":
        record.setdefault("greedy_data", [])
        if what.split("/")[0] not in record["greedy_data"]:
            record["greedy_data"].append(what.split("/")[0])


def _finish(partial: Path, out: Path, b: PrefillBudget, model_name: str, model, dtype: str, why: str,
            layers: Layers | None, n_layers: int, device: str, log: Log) -> None:
    """Rank the vocabulary, record what the shards saw, and seal shards + rank + meta.json as one folder."""
    import tasks

    from . import distill
    records = _records(partial)
    counts = torch.zeros(int(model.lm_head.weight.shape[0]), dtype=torch.long)
    greedy = 0
    for i in range(len(records)):
        shard = torch.load(partial / f"shard-{i:05d}.pt", map_location="cpu", weights_only=True, mmap=True)
        top = shard["top_ids"][:, 0]
        counts += torch.bincount(top, minlength=len(counts))
        greedy += int((shard["next_ids"] == top).sum())
    for t in stop_ids(model).tolist():
        counts[t] = counts.max() + 1                                  # EOS ranks first
    rank = counts.argsort(descending=True)[: b.shortlist_rank]
    ids: dict[str, set] = {}
    for r in records:
        for task, group in r["train_ids"].items():
            ids.setdefault(task, set()).update(group)
    for name in sorted({g for r in records for g in r.get("greedy_data", [])}):
        seen_there = distill.seen_of(distill.load(distill.path_for(model_name, name)).meta) or {}
        for task, group in (seen_there.get("ids") or {}).items():
            ids.setdefault(task, set()).update(group)
    sources: dict[str, int] = {}
    for r in records:
        for k, v in r["sources"].items():
            sources[k] = sources.get(k, 0) + v
    positions = sum(r["positions"] for r in records)
    meta = {"kind": "prefill", "model": model_name, "budget": settings(b), "budget_name": b.name,
            "shards": len(records), "positions": positions, "rows": positions,
            "sequences": sum(r["sequences"] for r in records), "greedy_positions": greedy,
            "sources": sources, "greedy_data": sorted({g for r in records for g in r.get("greedy_data", [])}),
            "seconds": round(sum(r["seconds"] for r in records), 1),
            "generation_seconds": round(sum(r["seconds"] for r in records), 1),
            "dtype": dtype, "dtype_reason": why,
            "hidden_dtype": "bfloat16" if b.states == "bfloat16" or dtype == "bfloat16" else "float32",
            "layers": list(layers.indices) if layers else [], "base_layers": n_layers,
            "environment": environment(torch.get_num_threads(), device, dtype),
            "seen": tasks.seen({t: sorted(g) for t, g in ids.items()}, "train")}
    with seal.building(out, log, folder=True) as tmp:
        for i in range(len(records)):
            shutil.move(str(partial / f"shard-{i:05d}.pt"), tmp / f"shard-{i:05d}.pt")
        torch.save(rank, tmp / "rank.pt")
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
    log(f"prefill data saved to {out}: {positions} positions ({greedy} where the text is the base's greedy choice) "
        f"in {meta['seconds']}s, sources {sources}")


def load(path: Path, layers: bool = True):
    """The sealed data as DistillData (shards concatenated); `layers=False` leaves the chosen layers' states on disk
    (a network that reads the final state only: 5 GB of the bench data's 7). Shards are mapped, not read, so the rows are in memory
    once (the concatenation), not twice: the bench data's states are 7 GB, and a second copy put a fit beside
    anything else over 24 GB."""
    from .distill import DistillData
    why = seal.problem(path)
    if why:
        raise seal.ArtefactDamaged(f"{why}; delete {path} and build it again (`bpdbench distill-data --profile "
                                   f"{path.name}`)")
    meta = json.loads((path / "meta.json").read_text())
    shards = [torch.load(path / f"shard-{i:05d}.pt", map_location="cpu", weights_only=True, mmap=True)
              for i in range(meta["shards"])]
    cat = {k: torch.cat([s[k] for s in shards]) for k in ("hidden", "next_ids", "top_ids", "top_lp", "positions",
                                                          "lengths", "units")}
    lengths = cat.pop("lengths")
    return DistillData(hidden=cat["hidden"], next_ids=cat["next_ids"], top_ids=cat["top_ids"], top_lp=cat["top_lp"],
                       positions=cat["positions"],
                       offsets=torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]),
                       n_prompt=torch.zeros(len(lengths), dtype=torch.long),
                       rank=torch.load(path / "rank.pt", weights_only=True), meta=meta,
                       layers=torch.cat([s["layers"] for s in shards]) if meta["layers"] and layers else None,
                       greedy=cat["next_ids"] == cat["top_ids"][:, 0], units=cat["units"])


def ensure(model_name: str, budget: str | PrefillBudget, model=None, tok=None, log: Log = print,
           device: str | None = None, layers: bool = True):
    """The cached data, built (or its build resumed) first when missing or made with other settings."""
    b = resolve(budget, BUDGETS)
    path = path_for(model_name, b.name)
    if (path / "meta.json").exists() and not seal.problem(path):
        if json.loads((path / "meta.json").read_text())["budget"] == json.loads(json.dumps(settings(b))):
            return load(path, layers)
        log(f"the cached '{b.name}' data was made with another budget: building it again")
    build(model_name, b, model, tok, log, device=device)
    return load(path, layers)
