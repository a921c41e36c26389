"""One experiment session for every command: validate, select examples, load the model, build methods, describe.

run, replay, oracle, analyze, tune, speed and regress all start here, so they share one example selection, one EOS
set and generation limit, one alpha rule (methods.heads.alpha_for), one greedy reference and one config.json
layout: {"command": the command that made the folder, "config": the RunConfig, "methods": labels, "resolved":
what was resolved, "sweep": the grid and cell that ran it (sweep cells only), "environment": versions, machine,
threads, device, dtype, commit}. Everything that can be checked is checked before the model loads.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

import tasks as task_registry
from .. import models, paths, store, train
from ..artefacts.policy import register
from ..store import seal
from ..config import ConfigError, RunConfig, environment
from ..engine import GREEDY, Acceptance, Drafter, Generation, Limits, OnStep, SpeculativeSampling, generate
from ..methods import Env, Method, MethodError, bind
from ..methods.contract import reads_reference
from .command import Plan
from .reference import GreedyReference

Log = Callable[[str], None]


# The grid and cell a sweep runs (sweep/commands.py sets it around the command it calls): carried beside the commands
# rather than through them, so their signatures stay the CLI's and a command line records nothing extra.
_MADE_BY: ContextVar[dict | None] = ContextVar("made_by", default=None)


@contextlib.contextmanager
def made_by(grid: str, cell: str) -> Iterator[None]:
    """Every config.json written inside records {"sweep": {"grid": grid, "cell": cell}}: the recipe of the result.
    Outside config["config"], so it never decides whether a folder is finished or resumable. `grid_sha256` (the
    file's content, where it is readable) tells two sweeps of one grid path apart: a board takes one sweep."""
    file = next((p for p in (Path(grid), paths.REPO / grid) if p.is_file()), None)
    digest = hashlib.sha256(file.read_bytes()).hexdigest()[:16] if file else None
    token = _MADE_BY.set({"grid": grid, "cell": cell, **({"grid_sha256": digest} if digest else {})})
    try:
        yield
    finally:
        _MADE_BY.reset(token)


@dataclass
class Session:
    cfg: RunConfig
    task: Any
    examples: list
    model: Any
    tok: Any
    limits: Limits
    env: Env
    reference: GreedyReference
    threads: int
    log: Log = print
    extra: dict = field(default_factory=dict)
    command: str | None = None          # the Plan's command, recorded in config.json (store.COMMAND)

    def prompt(self, example) -> list[int]:
        return self.prompt_info(example)[0]

    def prompt_info(self, example) -> tuple[list[int], int | None]:
        """(prompt ids, original token count when the prompt was truncated else None); warns on the first one."""
        ids, n = task_registry.encode_prompt_checked(self.tok, self.task, example, self.cfg.max_prompt_tokens,
                                                     self.answers(example))
        if n <= len(ids):
            return ids, None
        if not self.extra.get("warned_truncation"):
            self.extra["warned_truncation"] = True
            self.log(f"warning: example {example.id}: prompt of {n} tokens truncated to its last "
                     f"{len(ids)} (max_prompt_tokens); recorded per example as prompt_truncated_from")
        return ids, n

    def answers(self, example) -> tuple[str, ...]:
        """The model's own greedy answers to the turns before `example.turn`, as Spec-Bench builds MT-Bench's second
        turn (greedy even at T > 0, so every method's turn 2 asks the same conversation); from the greedy
        reference cache, decoded once per question."""
        out: list[str] = []
        for t in range(example.turn):
            earlier = dataclasses.replace(example, id=task_registry.question_of(example.id, example.turn),
                                          prompt=example.turns[t], turn=t)
            ids = task_registry.encode_prompt_checked(self.tok, self.task, earlier, self.cfg.max_prompt_tokens,
                                                      tuple(out))[0]
            tokens = self.reference.get(ids, self.limits)[0]
            out.append(self.tok.decode([t_ for t_ in tokens if t_ not in self.limits.eos_ids],
                                       skip_special_tokens=True))
        return tuple(out)

    def drafter(self, method: Method) -> Drafter:
        if method.spec.external:
            raise ConfigError(f"{method.label} runs its own engine's loop (transformers, llama.cpp): it can be timed "
                              f"with `bpdbench speed`, "
                              f"not decoded step by step or replayed")
        try:
            return self.build(method)
        except MethodError as e:
            raise ConfigError(str(e)) from None

    def build(self, method: Method) -> Drafter:
        """A method's drafter (MethodError when it cannot be built); also what `Env.build` calls for inner methods.
        A method that did not come through the plan (a command's own fixed drafts) gets the run's options bound."""
        method = bind(method, self.cfg)
        if method.auto:                       # `auto` shape parameters: sized for this machine, then built
            from .autoshape import resolve
            return resolve(self, method)
        return method.spec.build(self.env, method)

    def decode(self, drafter: Drafter, prompt_ids: list[int], acceptance: Acceptance = GREEDY,
               on_step: OnStep | None = None) -> Generation:
        return generate(self.model, drafter, prompt_ids, self.limits, acceptance, on_step=on_step)

    def seed(self, index: int) -> int:
        """Example `index` of the selection (0-based) draws from seed + offset + index: the same example gets the
        same generator whatever --limit, --resume or the method, and distinct examples get distinct ones."""
        return (self.cfg.seed or 0) + self.cfg.offset + index

    def acceptance(self, index: int, rule: str = "exact", seed: int | None = None) -> Acceptance:
        """Greedy acceptance, or at T > 0 a fresh speculative-sampling rule owning the example's generator."""
        if self.cfg.sampling.greedy:
            return GREEDY
        return SpeculativeSampling(self.cfg.sampling, self.seed(index) if seed is None else seed, rule)

    def with_reference(self, drafter: Drafter, prompt_ids: list[int]) -> None:
        """Methods that need the greedy reference (the oracle) get it before the example starts."""
        if reads_reference(drafter):
            if not self.cfg.sampling.greedy:
                raise ConfigError(f"{drafter.name} reads the greedy reference, so it exists for greedy decoding "
                                  f"only; drop --temperature")
            drafter.use_reference(self.reference.get(prompt_ids, self.limits)[0])

    def meta(self, methods: list[Method] | None = None, **extra) -> dict:
        """The config.json of every command."""
        resolved = {"max_new_tokens": self.limits.max_new_tokens, "eos_ids": sorted(self.limits.eos_ids),
                    "n_selected": len(self.examples), "model_id": models.model_id(self.cfg.model),
                    "model_shape": model_shape(self.model),
                    "alpha_file": str(self.cfg.alpha_file or paths.alpha_file()),
                    "greedy_dir": str(self.reference.dir), "heads": self.env.heads_meta,
                    "methods": dict(self.env.resolved)}
        if not self.cfg.sampling.greedy:
            resolved["sampling"] = sampling_meta(self.cfg)
        from .audit import record
        resolved["overlap"] = record(self.cfg, self.examples, resolved)
        from ..hardware.calibration import meta as calibration
        return seal.with_content_hashes(paths.portable_tree({   # relative to the checkout or the cache, the cache's
                                                                # artefacts with their content hash
            **({store.COMMAND: self.command} if self.command else {}), "config": self.cfg.to_dict(),
            "methods": [m.label for m in methods or []], "resolved": resolved,
            "calibration": calibration(self.cfg.model, self.cfg.dtype, str(self.model.device), self.threads),
            **extra, **({"sweep": dict(origin)} if (origin := _MADE_BY.get()) else {}),
            "environment": environment(self.threads, str(self.model.device), self.cfg.dtype)}))


SHAPE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
              "intermediate_size", "vocab_size")


def model_shape(model) -> dict:
    """The numbers of the model's config the byte and FLOP counts need (report/hardware.py), recorded so a table
    reads them from the result alone: a local model folder is recorded as `<outside>/<name>` and may not exist on
    the machine that renders the tables."""
    cfg = getattr(model, "config", None)
    return {k: getattr(cfg, k) for k in SHAPE_KEYS if getattr(cfg, k, None) is not None} if cfg is not None else {}


def certify_command(cfg: RunConfig, method: str) -> str:
    """The command whose result certifies `method` at these sampling settings (what a T > 0 run records)."""
    p = cfg.sampling
    opts = f" --top-p {p.top_p:g}" if p.top_p is not None and p.top_p < 1 else ""
    opts += f" --top-k {p.top_k}" if p.top_k else ""
    return (f"bpdbench certify --method {method} --temperature {p.temperature:g}{opts} --model {cfg.model} "
            f"--dtype {cfg.dtype}")


def sampling_meta(cfg: RunConfig) -> dict:
    """What a sampled result records: p's warpers, the seed rule, the acceptance rule and which certificate applies
    (the per-example greedy comparison does not: outputs are draws)."""
    p = cfg.sampling
    return {"temperature": p.temperature, "top_p": p.top_p, "top_k": p.top_k, "seed": p.seed or 0,
            "warpers": [type(w).__name__ for w in p.warpers()], "seeds": "seed + offset + example index",
            "acceptance": "speculative sampling (engine/sampling.py): Leviathan + recursive rejection over trees",
            "certificate": f"statistical ({certify_command(cfg, cfg.method)})"}


def eos_ids(model, tok) -> frozenset[int]:
    ids = model.generation_config.eos_token_id
    ids = set(ids if isinstance(ids, list) else [ids] if ids is not None else [])
    if tok.eos_token_id is not None:
        ids.add(tok.eos_token_id)
    return frozenset(ids)


def register_builders() -> None:
    """Every builder a first use or a sweep's artefact task calls (artefacts/policy.py): the trainers', and building a
    method once, which opens a session and so is only this layer's to offer. Every session and every sweep worker
    calls it before anything may build."""
    train.register_builders()
    register("first use", build_method_once)


def build_method_once(cfg: RunConfig, method: Method, need: str, log: Log = print) -> None:
    """Build `need` through one first use of `method` on a one-example session (the graph checked it is missing).
    The Plan is made here, not by `prepare`: a first use happens inside a command whose inputs were checked."""
    from .examples import select_examples
    log(f"{need} for {cfg.model}: building it through {method.label}'s first use")
    one = cfg.replace(limit=1, resume=False, out=None).validate()
    plan = Plan(one, "replay", (method,), tuple(select_examples(one, "eval", None)), None)
    open_session(plan, log).drafter(method)


def open_session(plan: Plan, log: Log = print) -> Session:
    """Load the model for a prepared plan (experiments/plan.py: validated, parsed and selected before this; the
    folder's command and prompts checked by experiments/execute.py)."""
    register_builders()
    cfg = plan.cfg
    task = task_registry.get_task(cfg.task)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    threads = torch.get_num_threads()
    model, tok = models.load(cfg.model, cfg.dtype, cfg.device)
    limits = Limits(cfg.max_new_tokens or task.max_new_tokens, eos_ids(model, tok))
    env = Env(model, tok, cfg, limits, log)
    greedy = Path(cfg.greedy_dir) if cfg.greedy_dir else paths.greedy_dir()
    reference = GreedyReference(model, models.model_id(cfg.model), cfg.dtype, str(model.device), greedy, log)
    session = Session(cfg, task, list(plan.examples), model, tok, limits, env, reference, threads, log,
                      command=plan.command)
    env.builder = session.build
    return session
