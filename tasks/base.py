"""Task contract: every task adapter is one small module that registers a `Task`.

A task turns data files into `Example`s (prompt + reference) and scores one decoded output. The decoding engine
never looks inside a task; the runner only calls `load_examples`, `split`, `select`, and `task.score`.
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable


class DataError(RuntimeError):
    """A missing or malformed dataset; the message is one line naming the file and the layout to supply."""


@dataclass(frozen=True)
class Example:
    id: str
    prompt: str                       # user message (chat tasks) or raw text to continue (completion tasks)
    reference: str | tuple[str, ...] | None = None
    target: str | None = None         # teacher-forced continuation to score (LAMBADA target word), else None
    category: str | None = None       # e.g. MT-Bench / Spec-Bench category
    turns: tuple[str, ...] = ()       # all user turns of a multi-turn chat prompt (turns[0] == prompt)
    unit: str | None = None           # examples sharing a unit (SQuAD article) land on the same side of the split
    turn: int = 0                     # which of `turns` this example asks (0: the first); see `with_turns`


@dataclass(frozen=True)
class Task:
    name: str
    group: str                        # LM | QA | S-SUM | L-SUM | CHAT (paper's grouping)
    chat: bool                        # wrap the prompt in the model's chat template when it has one
    files: tuple[str, ...]            # paths under the data dir, tried in order
    layout: str                       # one-line field layout, used in error messages
    parse: Callable[[dict], Example]  # one JSON record -> Example
    score: Callable[[Example, str], dict[str, float]] = field(default=lambda ex, out: {})
    metrics: tuple[str, ...] = ()     # names of the keys `score` returns (summary columns)
    hf: tuple[str, str | None, str] | None = None  # (dataset path, config, split) for Hub fallback
    # True -> example belongs to the held-out slice. The int is the example's index, or the index of its `unit`
    # in order of first appearance when the example has one. None -> default rule `index % 10 == 9`.
    heldout_key: Callable[[int, Example], bool] | None = None
    max_new_tokens: int = 128         # sensible default generation length for this task
    tune_fraction: float = 0.08       # this tail of each tune group's non-train examples is the tune split
    # The groups whose tails make the tune split (None: the whole task is one group); see `splits`.
    tune_group: Callable[[Example], str] | None = None
    note: str = ""                    # extra one-line hint for the missing-data error (e.g. licensing)


def default_data_dir() -> Path | None:
    """$BPDBENCH_DATA, else the shared data checkout next to the repo, so a fresh clone works without flags."""
    env = os.environ.get("BPDBENCH_DATA")
    if env:
        return Path(env)
    shared = Path(__file__).resolve().parents[2] / "shared" / "data"
    return shared if shared.is_dir() else None


def corpus_files(data_dir: Path | None = None) -> list[Path]:
    """The general LM-training corpus (C4 + WikiText) for rescorers; it holds no evaluated task data."""
    data_dir = data_dir or default_data_dir()
    corpus = data_dir / "corpus" if data_dir else None
    files = sorted(corpus.glob("*.jsonl")) + sorted(corpus.glob("*.txt")) if corpus and corpus.is_dir() else []
    if not files:
        raise DataError(f"no LM-training corpus; expected {corpus or '<data_dir>/corpus'}/*.jsonl (field text) or "
                        f"*.txt; set --data-dir or BPDBENCH_DATA, or pass --corpus FILE")
    return files


def _one_line(text: str, limit: int = 160) -> str:
    """Errors must stay one line so CLI output and logs remain greppable."""
    text = re.sub(r"\s+", " ", str(text)).strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _parse_file(task: Task, path: Path) -> list[Example]:
    """Examples of one JSONL file. Ids must be unique (resume works by id: a duplicate would make a later --resume
    skip an example it never decoded) and prompts non-empty (an empty prompt decodes silently into nothing)."""
    examples: list[Example] = []
    first_line: dict[str, int] = {}
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            where = f"{task.name}: {path}:{lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise DataError(f"{where}: not UTF-8 (byte {raw[err.start]:#04x} at column {err.start + 1}); "
                                f"re-save the file as UTF-8") from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{where}: not valid JSON ({_one_line(err.msg)}); expected {task.layout}") from None
            if not isinstance(record, dict):
                raise DataError(f"{where}: expected a JSON object; expected {task.layout}")
            try:
                ex = task.parse(record)
            except KeyError as err:
                raise DataError(f"{where}: missing field {err.args[0]!r}; expected {task.layout}") from None
            except (TypeError, ValueError, IndexError, AttributeError) as err:
                raise DataError(f"{where}: bad record ({_one_line(err)}); expected {task.layout}") from None
            if ex.id in first_line:
                raise DataError(f"{task.name}: {path}: id {_one_line(ex.id, 60)!r} appears on lines "
                                f"{first_line[ex.id]} and {lineno}; ids must be unique (results resume by id)")
            if not ex.prompt.strip():
                raise DataError(f"{where}: example {_one_line(ex.id, 60)!r} has an empty prompt; give it text or "
                                f"remove the line")
            first_line[ex.id] = lineno
            examples.append(ex)
    if not examples:
        raise DataError(f"{task.name}: {path} holds no examples; expected {task.layout}")
    return examples


def _load_hub(task: Task) -> tuple[list[Example] | None, str]:
    """Best-effort Hub fallback; returns (examples or None, reason it was not used) and never raises."""
    if task.hf is None:
        return None, ""
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        return None, " (Hub fallback skipped: HF_HUB_OFFLINE=1)"
    path, config, split_name = task.hf
    try:
        import datasets

        rows = datasets.load_dataset(path, config, split=split_name)
        examples = [task.parse({"id": str(i), **dict(row)}) for i, row in enumerate(rows)]
    except Exception as err:  # any failure (network, missing package, schema) -> the one-line file error
        return None, f" (Hub fallback {path} failed: {type(err).__name__})"
    return examples, ""


def load_examples(task: Task, data_dir: Path | None, data_file: Path | None = None) -> list[Example]:
    """Read a task's JSONL; a missing or malformed file raises a one-line `DataError` telling the user what to supply."""
    if data_file is not None:
        data_file = Path(data_file)
        if data_file.is_dir():
            raise DataError(f"{task.name}: --data-file {data_file} is a directory; pass the JSONL file in it, or "
                            f"the directory as --data-dir ({task.layout})")
        if not data_file.is_file():
            raise DataError(f"{task.name}: data file not found: {data_file} ({task.layout})")
        return _parse_file(task, data_file)
    if not task.files:
        raise DataError(f"{task.name}: pass --data-file PATH ({task.layout})")
    root = Path(data_dir) if data_dir is not None else None
    if root is not None:
        for rel in task.files:
            if (root / rel).is_file():
                return _parse_file(task, root / rel)
    examples, hub_reason = _load_hub(task)
    if examples:
        return examples
    expected = f"{root}/{task.files[0]}" if root is not None else f"<data-dir>/{task.files[0]}"
    note = f" {task.note};" if task.note else ""
    raise DataError(f"{task.name}: no data file;{note} expected {expected} ({task.layout}); "
                    f"set --data-dir or BPDBENCH_DATA{hub_reason}")


SPLITS = ("train", "tune", "eval")


def splits(task: Task, examples: list[Example]) -> dict[str, list[Example]]:
    """Every example in exactly one split, so no artefact is ever measured on what it was fitted or tuned on.

    - train: the held-out rule (`heldout_key`, default `index % 10 == 9`; SQuAD by article), unchanged since the
      first heads, so every trained artefact (heads, drafters, model history, distillation data) keeps its data.
    - tune: the last `tune_fraction` (at least one example, whole units) of what train leaves, per tune group
      (`tune_group`; default the whole task). Why the tail: runs select from the front (`--limit`,
      `--per-category`), so no committed selection moves, which a tail per MT-Bench category (10 questions) would
      break; why 8%: MT-Bench's tail (6 of its 72 non-train questions) then stays inside its last category's
      last 6, so `--per-category 3` still selects only eval examples there. Spec-Bench's groups are its MT-Bench block (the same 80 questions as mt_bench, so they fall in the
      same split in both tasks) and each of its other categories. `tune` picks alpha and `auto` sizes drafts here.
    - eval: the rest, in file order: what runs select from.
    """
    rule = task.heldout_key or (lambda index, ex: index % 10 == 9)
    unit_index: dict[str, int] = {}
    out: dict[str, list[Example]] = {name: [] for name in SPLITS}
    rest: dict[str, list[Example]] = {}
    group = task.tune_group or (lambda ex: "")
    for i, ex in enumerate(examples):
        index = i if ex.unit is None else unit_index.setdefault(ex.unit, len(unit_index))
        if rule(index, ex):
            out["train"].append(ex)
        else:
            rest.setdefault(group(ex), []).append(ex)
    tune = {id(ex) for part in rest.values() for ex in _tail(part, task.tune_fraction)}
    train = {id(ex) for ex in out["train"]}
    for ex in examples:
        if id(ex) in tune:
            out["tune"].append(ex)
        elif id(ex) not in train:
            out["eval"].append(ex)
    return out


def _tail(group: list[Example], fraction: float) -> list[Example]:
    """The last `fraction` of `group` (at least one example when fraction > 0), whole units (a unit's examples are
    contiguous); nothing when that would leave the group with nothing to evaluate."""
    if fraction <= 0:
        return []
    want = max(1, math.ceil(fraction * len(group)))
    taken: list[Example] = []
    for ex in reversed(group):
        if len(taken) >= want and (ex.unit is None or ex.unit != taken[-1].unit):
            break
        taken.append(ex)
    return [] if len(taken) >= len(group) else taken[::-1]


def split(task: Task, examples: list[Example]) -> tuple[list[Example], list[Example]]:
    """(eval, train): kept for callers that want the two sides trainers and runs see (see `splits`)."""
    s = splits(task, examples)
    return s["eval"], s["train"]


def split_of(task: Task, examples: list[Example]) -> dict[str, str]:
    """Example id -> its split, for audits of what a result evaluated."""
    return {ex.id: name for name, group in splits(task, examples).items() for ex in group}


def seen(ids: dict[str, list[str]], split_name: str = "train") -> dict:
    """What an artefact saw, as every artefact records it: example ids by task, their split, count and a hash, so
    a result can state its overlap with the artefact's data (bpdbench/experiments/audit.py reads this shape)."""
    import hashlib

    flat = sorted(f"{t}/{i}" for t, group in ids.items() for i in group)
    return {"split": split_name, "ids": {t: sorted(g) for t, g in ids.items()}, "n": len(flat),
            "sha256": hashlib.sha256("\n".join(flat).encode()).hexdigest()[:16]}


def select(examples: list[Example], offset: int = 0, limit: int | None = None) -> list[Example]:
    """Deterministic contiguous slice, so runs with the same offset/limit compare the same examples."""
    if offset < 0 or (limit is not None and limit < 0):
        raise ValueError(f"offset and limit must be >= 0 (got offset={offset}, limit={limit})")
    return examples[offset:] if limit is None else examples[offset:offset + limit]


TURN_SUFFIX = "-t"       # the id of turn t (1-based) of question q is f"{q}-t{t}" for t >= 2


def with_turns(examples: list[Example], turns: int | None) -> list[Example]:
    """Each multi-turn question followed by its later turns (up to `turns` in all), as Spec-Bench decodes MT-Bench:
    turn t asks turns[t-1] after the model's own answers to the turns before it (`encode_prompt_checked`'s
    `answers`). A later turn is its own example, id "<question>-t<t>", so it is timed, certified and resumed like
    any prompt; `question_of` maps it back to the unit the statistics resample."""
    if not turns or turns <= 1:
        return list(examples)
    out: list[Example] = []
    for ex in examples:
        out.append(ex)
        out += [Example(id=f"{ex.id}{TURN_SUFFIX}{t + 1}", prompt=ex.turns[t], reference=None, category=ex.category,
                        turns=ex.turns, unit=ex.unit, turn=t) for t in range(1, min(turns, len(ex.turns)))]
    return out


def question_of(example_id: str, turn: int) -> str:
    """The question a turn belongs to (the id itself for a first turn)."""
    return example_id.rsplit(TURN_SUFFIX, 1)[0] if turn else example_id


def _template(tok, task: Task, text: str, history: tuple[tuple[str, str], ...] = ()) -> str:
    """The prompt text: the chat template over earlier (question, answer) turns and this question, else raw text."""
    if task.chat and getattr(tok, "chat_template", None):
        messages = [m for q, a in history for m in ({"role": "user", "content": q},
                                                      {"role": "assistant", "content": a})]
        return tok.apply_chat_template(messages + [{"role": "user", "content": text}], tokenize=False,
                                       add_generation_prompt=True)
    return "".join(q + a for q, a in history) + text


def encode_prompt_checked(tok, task: Task, example: Example, max_prompt_tokens: int,
                          answers: tuple[str, ...] = ()) -> tuple[list[int], int]:
    """(token ids, length before truncation). An over-long prompt keeps the *end* of its text (the question); in a
    chat template the user message is cut, not the template, so the chat header and generation prompt survive.
    The caller records the original length, so a truncation is never silent. A later turn (`example.turn` > 0)
    needs the model's `answers` to the turns before it; its conversation is kept whole or cut from the front."""
    if len(answers) != example.turn:
        raise ValueError(f"example {example.id} is turn {example.turn + 1}: it needs the {example.turn} earlier "
                         f"answer(s), got {len(answers)}")
    history = tuple(zip(example.turns[:example.turn], answers))
    ids = tok(_template(tok, task, example.prompt, history), add_special_tokens=False)["input_ids"]
    if len(ids) <= max_prompt_tokens:
        return ids, len(ids)
    if task.chat and getattr(tok, "chat_template", None) and not history:
        content = tok(example.prompt, add_special_tokens=False)["input_ids"]
        keep = max_prompt_tokens - (len(ids) - len(content))
        if keep > 0:
            cut = tok(_template(tok, task, tok.decode(content[-keep:])), add_special_tokens=False)["input_ids"]
            if len(cut) <= max_prompt_tokens:
                return cut, len(ids)
    return ids[-max_prompt_tokens:], len(ids)


def encode_prompt(tok, task: Task, example: Example, max_prompt_tokens: int) -> list[int]:
    """Token ids of an example's prompt (see encode_prompt_checked)."""
    return encode_prompt_checked(tok, task, example, max_prompt_tokens)[0]
