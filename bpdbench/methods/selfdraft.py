"""What a draft made from the target itself (qdraft, layerskip) is worth on this machine, measured once.

Why measure: a self-draft pays only if it is both cheap and right, and neither can be assumed. The cost of one draft
token depends on the kernels this CPU has (int4 is 4x fewer bytes but not 4x faster everywhere) and the agreement on
how much the quantization or the skipped layers hurt this model. So every build records, for the result's
config.json (`resolved.<label>.profile`):
- `agreement`: top-1 agreement of the draft with the target, teacher-forced over prompts of the task's **tune**
  split (tasks.splits; never the evaluated examples), the share of positions where both argmaxes are equal;
- `draft_ms`, `target_ms`, `cost_steps`: the median time of one one-token forward with a KV cache of the draft and
  of the target, and their ratio: what one draft token costs in target decode steps.
A profile is cached per machine fingerprint, model, dtype, task and draft (`$BPDBENCH_CACHE/selfdraft/`), so a grid
measures it once. Where the task has no tune split, `agreement` is null and `why` says so.
"""
from __future__ import annotations

import ast
import hashlib
import inspect
import json
import time
from pathlib import Path
from typing import Any, Callable

import torch

from .. import paths
from ..hardware import contention
from ..hardware.fingerprint import current
from ..hardware.timing import StepClock
from ..store import write_atomic
from .base import Method, MethodError, Param
from .env import Env

PROMPTS = 4              # tune prompts teacher-forced for the agreement
PROMPT_TOKENS = 192      # the last tokens of each
TIMED = 12               # one-token forwards timed for the cost

FORWARDS = ("lean", "transformers")
FORWARD = Param("forward", str, "lean: the draft's layers run by one function, q/k/v and gate/up each one matmul "
                "(nets/lean.py; the default); transformers: the library's own forward", choices=FORWARDS)

# Every profile file a measurement read, in order; None for one measured on a busy machine and not cached. An `auto`
# shape measured over a self-draft depends on the profile's numbers, not only on the method's code: its cache records
# the files read while it was measured (`reads_since`) and is measured again when one of them changes.
_READ: list[Path | None] = []


def reads_since(mark: int) -> list[Path | None]:
    """The profile files read since `len(reads_since(0))` was `mark` (None: a busy reading, used but not kept)."""
    return list(_READ[mark:])


def lean_runner(env: Env, model: Any, method: Method, keep: list[int] | None = None) -> Any | None:
    """The lean forward of `model`'s `keep` layers (nets/lean.py), or None for the library's: asked for with
    `forward=transformers`, or a model the lean forward does not know (said in the log, and an error when
    `forward=lean` was spelled out)."""
    from ..nets.lean import LeanDecoder, supported
    if method.get("forward", "lean") != "lean":
        return None
    why = supported(model)
    if why is None:
        return LeanDecoder(model, keep)
    if "forward" in method.params:
        raise MethodError(f"{method.label}: forward=lean cannot run this target ({why}); pass forward=transformers")
    env.log(f"{method.label}: the library's forward (the lean one cannot run this target: {why})")
    return None


def tune_prompts(env: Env) -> tuple[list[list[int]], str]:
    prompts, _, why = split_prompts(env, "tune", PROMPTS)
    return prompts, why


def split_prompts(env: Env, split: str, n: int) -> tuple[list[list[int]], list[str], str]:
    """The last PROMPT_TOKENS tokens of the first `n` prompts of the task's `split`, their example ids, and why
    there are none (a task without data here: fixtures, user prompts)."""
    import tasks
    try:
        task = tasks.get_task(env.cfg.task)
        data = tasks.load_examples(task, Path(env.cfg.data_dir) if env.cfg.data_dir else
                                   tasks.default_data_dir())
        pool = tasks.splits(task, data)[split][:n]
    except Exception as e:            # a task without data here (fixtures, user prompts): say so, measure the rest
        return [], [], f"no {split} split for {env.cfg.task}: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
    if not pool:
        return [], [], f"{env.cfg.task} has no {split} split"
    return ([tasks.encode_prompt(env.tok, task, ex, env.cfg.max_prompt_tokens)[-PROMPT_TOKENS:] for ex in pool],
            [str(ex.id) for ex in pool], "")


@torch.inference_mode()
def greedy_rows(model: Any, prompts: list[list[int]]) -> list[torch.Tensor]:
    """The model's argmax after every position of each prompt (teacher-forced)."""
    return [model(input_ids=torch.tensor([ids])).logits[0].argmax(-1) for ids in prompts]


@torch.inference_mode()
def agreement(target: Any | list[torch.Tensor], draft: Any, prompts: list[list[int]]) -> float:
    """Share of positions where the draft's argmax is the target's (`target`: the model or its greedy_rows)."""
    ref = greedy_rows(target, prompts) if not isinstance(target, list) else target
    got = greedy_rows(draft, prompts)
    return sum(int((a == b).sum()) for a, b in zip(ref, got)) / max(sum(len(p) for p in prompts), 1)


@torch.inference_mode()
def step_ms(model: Any, context: int = 64) -> float:
    """Median milliseconds of one one-token forward after a `context`-token prefill (what drafting one token costs)."""
    return StepClock(model, context).tick(TIMED, warm=2).ms()


RETRIES, PAUSE_S = 2, 20.0   # a measurement beside another process: at most 2 more tries, 20 s apart


def cached(env: Env, key: str, what: str, measure: Callable[[], dict], timed: bool = True) -> dict:
    """`measure()`, kept per machine fingerprint, model, dtype, task and `key` (a measurement of this machine).

    A `timed` measurement is this machine's only when nothing else ran beside it: it is metered, taken again (20 s
    later, at most twice) while other processes kept the machine busy, and cached only when it was not. A cached one
    from before the meter, or from a busy machine, is measured again (one had read 1617 ms for a 142 ms step, so a
    4-bit draft looked as dear as the target and `auto` drafted one token)."""
    path = paths.machine_file("selfdraft", current(env.cfg.threads).key(),
                              f"{env.cfg.model.replace('/', '_')}-{env.cfg.dtype}-{env.cfg.task}-{key}.json")
    try:
        kept = json.loads(path.read_text())
        if not timed or ("others_cores" in kept and not contention.is_busy(kept["others_cores"])):
            _READ.append(path)
            return kept
        env.log(f"{what} at {path} was timed on a busy machine or before timings were checked: measuring again")
    except (OSError, ValueError, TypeError):
        pass
    for attempt in range(RETRIES + 1):
        with contention.Meter() as others:
            out = measure()
        busy = others.others_cores if timed else 0.0
        if not contention.is_busy(busy):
            break
        if attempt < RETRIES:
            env.log(f"{what}: {contention.describe(busy)}; measuring again in {PAUSE_S:g} s")
            time.sleep(PAUSE_S)
    if not timed:
        return _keep(env, path, what, out)
    out["others_cores"] = busy
    if contention.is_busy(busy):
        env.log(f"note: {what} measured on a busy machine ({contention.describe(busy)}): used for this run, not "
                f"cached")
        _READ.append(None)
        return out
    return _keep(env, path, what, out)


def _keep(env: Env, path: Path, what: str, out: dict) -> dict:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(out, indent=2) + "\n")
        _READ.append(path)
    except OSError as e:
        env.log(f"note: could not cache the {what} at {path} ({e}); it is measured again next time")
        _READ.append(None)
    return out


def code_tag(draft: Any) -> str:
    """A lean draft's forward code, as a key suffix: its cost is that code's (a shorter one-token path made the int4
    draft 7% cheaper), so a profile measured on other code is measured again, not read. Its docstrings and comments
    are not code: the syntax tree without them is what is hashed."""
    from ..nets import lean
    if not isinstance(draft, lean.LeanDecoder):
        return ""
    tree = ast.parse(inspect.getsource(lean))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and \
                isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
    return "-" + hashlib.sha256(ast.dump(tree).encode()).hexdigest()[:8]


def profile(env: Env, draft: Any, key: str) -> dict:
    """The draft's agreement and cost (`key`: the draft's identity; a lean draft's also names its code)."""
    key += code_tag(draft)
    def measure() -> dict:
        prompts, why = tune_prompts(env)
        out = {"agreement": round(agreement(env.model, draft, prompts), 4) if prompts else None,
               "agreement_positions": sum(len(p) for p in prompts), "split": "tune"}
        if why:
            out["why"] = why
        target_ms, draft_ms = step_ms(env.model), step_ms(draft)      # metered and retried by `cached`
        out.update(draft_ms=round(draft_ms, 2), target_ms=round(target_ms, 2),
                   cost_steps=round(draft_ms / target_ms, 3))
        return out
    return cached(env, key, "self-draft profile", measure)
