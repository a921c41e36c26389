"""Trained draft models (bpdbench/drafters: EAGLE, Hydra, Hydra++, Amphista, Medusa/KOALA heads) as drafters.

One entry for every drafter type, so they differ only in the model. A chain is kept as a lattice (top-k per depth), on
which the paper's rescorers apply (`refine=ngram4`, `16best-ngram4`, `medusa`): a parallel model gives all depths
in one call, so its chain is the heads' drafter (methods/lattice.py: LatticeDrafter over the model); a sequential
model conditions each depth on the tokens drafted before it, so its chain is drafted here depth by depth along the
top-1 path, under the same threshold rule and refine code, and stops at the first unsure depth without computing
the later ones. Either chain drafts at most the generation budget left. A tree (`tree=W`) keeps, at every depth,
the W best nodes by cumulative draft log-probability among the children (top-W) of the previous depth's nodes,
every node conditioned on its own path, all nodes of a depth in one batched call (EAGLE-2's expansion with a fixed
width). `tree=dynamic` is EAGLE-2's whole policy (methods/dynamic.py): `topk` frontier nodes expanded with `topk`
children each, for `depth` levels, then the `nodes` best of all generated nodes kept (nodes=auto: the budget
fastest on this machine). Verification is the base's, so any draft is lossless.

Each drafter type's file (eagle.py, hydra.py, amphista.py, koala.py) is a registry entry built by `spec` here,
whose contract (methods/contract.py) every draft network shares: it reads the base's hidden states, its artefact is
the draft network (trained on first use), its preflight checks the folder, type and shape before the model loads,
and `auto` sizes its depth and tree width (`tree=auto`, `depth=auto`) or a dynamic tree's node budget
(`tree=dynamic,nodes=auto`).
"""
from __future__ import annotations

from dataclasses import replace

from pathlib import Path
from typing import Callable

import torch

from .. import refine
from .. import paths
from ..artefacts import Need, builder
from ..config import RunConfig
from ..nets.base import DraftModel, NetworkFileError
from ..nets.checkpoint import load as load_drafter, read_config
from ..nets.registry import networks
from ..engine import DraftContext, Lattice, Proposal
from ..refine import Rescorer
from ..store import seal
from ..artefacts.policy import MINUTES, network_need, warn_use
from .base import ALPHA, K, THRESHOLD, Method, MethodError, MethodSpec, Param, option_default
from .contract import Input, Kind, Reads, Requirement
from .dynamic import BUDGETS, DYNAMIC_NODES, DYNAMIC_TOPK, dynamic_tree, is_dynamic
from .env import Env
from .lattice import LatticeDrafter, ParallelSource, Refined, sure_depths
from .search import Chain, Either, Grid, given, with_values

PROFILES = ("quick", "full", "bench", "ci")
# The training data of a profile whose data is not named as the profile is: bench trains on teacher-forced prefill
# data (train/network.PROFILES; a test holds them equal), which decoding names without importing a trainer.
DATA = {"bench": "prefill-bench"}
# ... and of a network that reads chosen layers (eagle3), which greedy data does not keep (train/network.LAYERED_DATA)
LAYERED_DATA = {"quick": "prefill-quick", "bench": "prefill-bench", "ci": "prefill-ci"}
DEPTH = Param("depth", int, "draft depth (tokens per chain; depths of the tree; auto: the depth fastest on this "
              "machine)", low=1, auto=True)
TREE = Param("tree", int, "tree drafting: keep the W best nodes per depth (0: a chain; auto: the width, and the depth "
             "unless given, fastest on this machine; dynamic: EAGLE-2's tree of nodes=/topk=)", low=0, auto=True,
             words=("dynamic",))
NODES = Param("nodes", int, "tree=dynamic: draft nodes verified per step (auto: the budget fastest on this machine)",
              low=1, high=257, auto=True)
TOPK = Param("topk", int, "tree=dynamic: frontier nodes per depth and children per node", low=1, high=65)
AUTO_WIDTHS = (0, 2, 3, 4, 6, 8)      # tree=auto chooses among these widths (SEARCH below)
REFINE = Param("refine", str, "a rescorer on the chain's top-k lattice (the paper's rescorers)",
               choices=tuple(n for n in refine.RESCORERS if n not in ("none", "medusa-auto", "medusa-neural-m")))
SHORTLIST = Param("shortlist", int, "draft over the N most frequent ids of the training data (default: as trained)",
                  low=1)
PROFILE = Param("profile", str, "training profile of the cached drafter (default: --heads-profile)",
                choices=PROFILES)
PATH = Param("path", str, "a drafter folder (bpdbench train-network --out), instead of the cached profile")
# k and alpha shape only the refine= stage, so they are spelled there, not taken from --k and --alpha (which would
# otherwise name themselves in every network's label)
REFINE_K = replace(K, help="lattice width of the refine= stage (default 16)", flag=None)
REFINE_ALPHA = replace(ALPHA, help="the refine= stage's weight of its language model (default: tuned)", flag=None)
COMMON = (DEPTH, TREE, NODES, TOPK, REFINE_K, REFINE, REFINE_ALPHA, THRESHOLD, SHORTLIST, PROFILE, PATH)


class TrainedDrafter(Refined):
    """A draft model's trees, and a sequential model's chains (a parallel model's chain is a LatticeDrafter:
    `drafter_for`). Sequential models keep a per-example session in step with the decided context (fed from
    DraftContext.accepted_hidden for feature models)."""

    def __init__(self, name: str, model: DraftModel, depth: int, tree: int | str = 0, k: int = 1,
                 threshold: float = 0.0, rescorer: Rescorer | None = None, nodes: int = DYNAMIC_NODES,
                 topk: int = DYNAMIC_TOPK):
        if model.drafting == "parallel" and not tree:
            raise ValueError(f"{name}: a parallel model's chain is drafted by LatticeDrafter; use drafter_for")
        self.name, self.model, self.depth, self.tree = name, model, depth, tree
        self.nodes, self.topk = nodes, topk
        self.k, self.threshold, self.rescorer = k, threshold, rescorer
        self.hidden_layers = model.hidden_layers    # the base's layers the loop hands it (engine.Layers), if any
        self.session = None

    def reset(self, prompt_ids: list[int]) -> None:
        self.session = self.model.session() if self.model.drafting == "sequential" else None
        super().reset(prompt_ids)

    @torch.no_grad()
    def propose(self, ctx: DraftContext) -> Proposal:
        if self.session is not None:
            self.session.sync(ctx)                # every step, drafting or not: the cache follows the context
        n = min(self.depth, ctx.budget)
        if n <= 0:
            return Proposal()
        expand = self._expansion(ctx, n)
        if self.tree == "dynamic":
            paths = dynamic_tree(lambda ps, k: self._top(expand, ps, k), n, self.topk, self.nodes)
            return Proposal(paths, probs=[[1.0] * len(p) for p in paths])   # q: point masses on the tree
        if self.tree:
            return Proposal(self._tree(expand, n))
        return self.proposal(self._chain(expand, n), ctx)

    def _expansion(self, ctx: DraftContext, n: int):
        if self.session is not None:
            return self.session.expansion(ctx.tokens[-1])
        return _Parallel(self.model.parallel_logits(ctx.hidden, ctx.tokens[-1], n))

    def _top(self, expand, paths: list[list[int]], k: int) -> tuple[list[list[float]], list[list[int]]]:
        """Per path, the top-k next-token log-probs and ids (the dynamic tree's expansion)."""
        logits = expand.logits(paths).float()
        lp, ix = torch.log_softmax(logits, -1).topk(min(k, logits.shape[-1]))
        return lp.tolist(), self.model.to_token_ids(ix).tolist()

    def _chain(self, expand, n: int) -> Lattice | None:
        """Depth by depth, stopping before the first unsure depth (later depths are never computed)."""
        path, ids, lps = [], [], []
        for _ in range(n):
            lp, ix = torch.log_softmax(expand.logits([path])[0].float(), -1).topk(self.k)
            if sure_depths(lp[:1], self.threshold) == 0:
                break
            tok = self.model.to_token_ids(ix)
            ids.append(tok)
            lps.append(lp)
            path.append(int(tok[0]))
        if not path:
            return None
        return Lattice(torch.stack(ids).cpu(), torch.stack(lps).cpu())

    def _tree(self, expand, n: int) -> list[list[int]]:
        """Paths to every kept node that no other kept node extends, best first."""
        frontier: list[tuple[list[int], float]] = [([], 0.0)]
        kept: list[tuple[list[int], float]] = []
        for _ in range(n):
            lp, ix = torch.log_softmax(expand.logits([p for p, _ in frontier]).float(), -1).topk(self.tree)
            tok = self.model.to_token_ids(ix).tolist()
            children = [(p + [tok[m][j]], s + float(lp[m, j])) for m, (p, s) in enumerate(frontier)
                        for j in range(self.tree)]
            frontier = sorted(children, key=lambda c: -c[1])[: self.tree]
            extended = {tuple(p[:-1]) for p, _ in frontier}
            kept = [(p, s) for p, s in kept if tuple(p) not in extended] + frontier
        return [p for p, _ in sorted(kept, key=lambda c: -c[1])]


class _Parallel:
    """Expansion of a parallel model: every node of depth d gets depth d's logits, whatever its path."""

    def __init__(self, logits: torch.Tensor):
        self.all = logits                          # [n, S]

    def logits(self, paths: list[list[int]]) -> torch.Tensor:
        return self.all[len(paths[0])].expand(len(paths), -1)


def profile_of(method: Method, cfg: RunConfig) -> str:
    return method.get("profile") or (cfg.heads_profile if cfg.heads_profile in PROFILES else "quick")


def folder(method: Method, cfg: RunConfig, trained_name: str) -> Path:
    return Path(method.get("path")) if method.get("path") else paths.network_dir(cfg.model, trained_name,
                                                                                 profile_of(method, cfg))


def resolve(env: Env, method: Method, trained_name: str, drafter_type: str) -> tuple[DraftModel, dict]:
    """The drafter a method names: loaded (once per session and shortlist), or trained on first use."""
    where = folder(method, env.cfg, trained_name)
    profile = profile_of(method, env.cfg)
    key = ("drafter", str(where), method.get("shortlist"))
    cache = env.cache
    if key in cache:
        return cache[key]
    if not (where / "config.json").exists():
        if method.get("path"):
            raise MethodError(f"{method.label}: no drafter at {where}; train one with `bpdbench train-network "
                              f"{trained_name} --out {where}`")
        drafter_need(method, env.cfg.model, trained_name, profile).build(
            env.cfg.auto_train, lambda: builder("network")(trained_name, profile, env.cfg.model, env.model, env.tok, env.log),
            env.log, where, MethodError)
    why = seal.problem(where)            # sealed when trained: a changed or missing file is never loaded silently
    if why:
        raise MethodError(f"{method.label}: {why}; delete {where} and it is trained again on next use (or run "
                          f"`bpdbench train-network {trained_name}`)")
    try:
        config = read_config(where)
        if config["drafter"] != drafter_type:
            raise MethodError(f"{method.label}: {where} holds a {config['drafter']} drafter, not {drafter_type}")
        base = env.model
        model, config = load_drafter(where, base.model.embed_tokens.weight, base.lm_head.weight, base.dtype,
                                     method.get("shortlist"))
    except NetworkFileError as e:
        raise MethodError(f"{method.label}: {e}") from None
    model = model.to(base.device)
    warn_use((config.get("training") or {}).get("quality_warning"), f"drafter {where}", env.log)  # never silently
    cache[key] = (model, config)
    return model, config


def _check_shape(method: Method, cfg: RunConfig, drafter_type: str, depth: int, width: int | None,
                 longest: int | None = None) -> None:
    """`longest`: the deepest chain the drafter drafts when it differs from its trained depth (EAGLE is
    autoregressive over its own features and drafts past it)."""
    limit = longest or depth
    if method.concrete("depth", depth) > limit:
        raise MethodError(f"{method.label}: depth={method.get('depth')} but this {drafter_type} drafter drafts at "
                          f"most {limit}")
    tree, stage = method.get("tree", 0), method.get("refine")
    if tree and stage:
        raise MethodError(f"{method.label}: refine= works on a chain's lattice; drop tree= or refine=")
    k = method.get("k", option_default("k")) if stage else 1
    if tree != "dynamic" and any(n in method.params for n in ("nodes", "topk")):
        raise MethodError(f"{method.label}: nodes=/topk= shape a dynamic tree; add tree=dynamic")
    if tree == "dynamic":
        if method.get("depth") == "auto":
            raise MethodError(f"{method.label}: depth=auto does not apply to tree=dynamic; give depth=N or drop it")
        tree = method.get("topk", DYNAMIC_TOPK)
    tree = 0 if tree == "auto" else tree                  # auto tries only widths the shortlist holds
    if width and max(k, tree) > width:
        raise MethodError(f"{method.label}: k/tree {max(k, tree)} exceeds the drafting shortlist ({width} ids); "
                          f"pass a smaller one")


def check(method: Method, cfg: RunConfig, trained_name: str, drafter_type: str, longest: int | None = None) -> None:
    """Everything about a drafter method that can be checked before the model loads (its spec's preflight)."""
    where = folder(method, cfg, trained_name)
    net, profile = network_of(trained_name), profile_of(method, cfg)
    if net is not None and net.layers is not None and not method.get("path") and profile not in LAYERED_DATA:
        raise MethodError(f"{method.label}: {trained_name} reads the base's layers, which the '{profile}' training "
                          f"data does not keep; use profile={' or profile='.join(LAYERED_DATA)}")
    if not (where / "config.json").exists():
        _check_shape(method, cfg, drafter_type, 16, None)
        if method.get("path"):
            raise MethodError(f"{method.label}: no drafter at {where} (no config.json); train one with "
                              f"`bpdbench train-network {trained_name} --out {where}`")
        drafter_need(method, cfg.model, trained_name, profile_of(method, cfg)).check(cfg.auto_train, MethodError)
        return
    config = read_config(where)
    if config["drafter"] != drafter_type:
        raise MethodError(f"{method.label}: {where} holds a {config['drafter']} drafter, not {drafter_type}")
    if method.get("shortlist") and not (where / "rank.pt").exists():
        raise MethodError(f"{method.label}: {where} has no rank.pt, so shortlist= cannot resize its vocabulary")
    width = method.get("shortlist") or config.get("shortlist_size")
    _check_shape(method, cfg, drafter_type, int(config["depth"]), width, longest)


def drafter_for(name: str, model: DraftModel, depth: int, tree: int | str = 0, k: int = 1, threshold: float = 0.0,
                rescorer: Rescorer | None = None, nodes: int = DYNAMIC_NODES, topk: int = DYNAMIC_TOPK
                ) -> LatticeDrafter | TrainedDrafter:
    """The drafter of a draft model in a given shape: a parallel model's chain is a lattice like the heads' (cut to
    the budget, as every draft network's draft is), anything else a TrainedDrafter."""
    if model.drafting == "parallel" and not tree:
        return LatticeDrafter(name, ParallelSource(model), depth, k, threshold, rescorer, budgeted=True)
    return TrainedDrafter(name, model, depth, tree, k, threshold, rescorer, nodes, topk)


def build(env: Env, method: Method, trained_name: str, drafter_type: str, longest: int | None = None
          ) -> LatticeDrafter | TrainedDrafter:
    model, config = resolve(env, method, trained_name, drafter_type)
    _check_shape(method, env.cfg, drafter_type, model.depth, len(model.proj), longest)
    depth = method.get("depth", model.depth)
    tree, stage = method.get("tree", 0), method.get("refine")
    k = method.get("k", option_default("k")) if stage else 1     # --draft-threshold where not spelled (bind)
    threshold = method.option("threshold")           # one rule for every head-type drafter
    rescorer, alpha, source = None, None, "n/a"
    if stage:
        from ..artefacts.rescorers import ensure
        from .heads import alpha_for, alpha_table
        spec = refine.get_rescorer(stage)
        alpha, source = alpha_for(env, method, spec)
        ensure(spec, env.cfg, env.tok, env.log)
        rescorer = refine.build(spec, env.cfg.model, alpha, k, str(env.model.device), env.log, dtype=env.cfg.dtype)
    training = config.get("training") or {}
    env.resolved[method.label] = {"drafter": drafter_type, "name": config.get("name"), "path": str(folder(
        method, env.cfg, trained_name)), "depth": depth, "tree": tree, "k": k, "threshold": threshold,
        "refine": stage, "alpha": alpha, "alpha_source": source, **(alpha_table(env, spec, source) if stage else {}),
        "shortlist": len(model.proj),
        "trainable_parameters": config.get("trainable_parameters"), "profile": training.get("profile"),
        "heldout": training.get("heldout"), "seen": training.get("seen")}
    if training.get("quality_warning"):
        env.resolved[method.label]["quality_warning"] = training["quality_warning"]
    if tree == "dynamic":
        env.resolved[method.label].update(nodes=method.concrete("nodes", DYNAMIC_NODES),
                                          topk=method.get("topk", DYNAMIC_TOPK))
    return drafter_for(method.label, model, depth, tree, k, threshold, rescorer,
                       method.concrete("nodes", DYNAMIC_NODES), method.get("topk", DYNAMIC_TOPK))


class _Defaults:
    """A method spelled without parameters (what `bpdbench methods` checks readiness for)."""

    def get(self, name: str, default=None):
        return default


def needs_of(trained_name) -> Callable[[str, RunConfig], list[Requirement]]:
    """`needs` of an entry drafting with a draft network: whether the default spelling's folder is there."""
    name_of = trained_name if callable(trained_name) else (lambda m: trained_name)

    def needs(model: str, cfg: RunConfig) -> list[Requirement]:
        m = _Defaults()
        where, profile = folder(m, cfg.replace(model=model), name_of(m)), profile_of(m, cfg)
        return [Requirement(f"{name_of(m)} drafter ({profile})", (where / "config.json").exists(), "network", where,
                            MINUTES.get(profile))]
    return needs


def network_names(trained_name) -> Callable[[Method, RunConfig], list[str]]:
    """The draft network a spelling reads, as the graph keys it (`<saved name>-<profile>`, its cache folder's
    tail): none for a folder the spelling names (`path=`), which nothing here builds."""
    name_of = trained_name if callable(trained_name) else (lambda m: trained_name)
    return lambda m, cfg: [] if m.get("path") else [f"{name_of(m)}-{profile_of(m, cfg)}"]


def network(trained_name) -> Reads:
    """The artefact of a method that drafts with a trained network (`trained_name`, or a function of the spelling
    naming it): that network, which the graph trains before the cells reading it, from distillation data it builds
    first, apart."""
    return Reads(Kind.NETWORK, network_names(trained_name), data_of)


def data_of(method: Method, cfg: RunConfig) -> str | None:
    """The distillation budget the drafter's first use trains it on: a network profile's data budget bears the
    profile's name, or DATA's (train/network.PROFILES; a test holds them equal). None for a given folder (`path=`)."""
    if method.get("path"):
        return None
    profile, net = profile_of(method, cfg), network_of(method.name)
    table = LAYERED_DATA if net is not None and net.layers is not None else DATA
    return table.get(profile, DATA.get(profile, profile))


def model_of(drafter: LatticeDrafter | TrainedDrafter) -> DraftModel:
    """The draft model a built drafter drafts with (a parallel model's chain is a LatticeDrafter over it)."""
    return drafter.model if isinstance(drafter, TrainedDrafter) else drafter.source.model


def _chain_model(env: Env, method: Method) -> DraftModel:
    """The drafter of the spelling without its `auto` values, built as a chain: its trained depth and shortlist."""
    plain = given(method)
    return model_of(plain.spec.build(env, with_values(plain, tree=0)))


def _sequential(drafter) -> bool:
    """A sequential model's drafting time grows with the draft (one call per depth)."""
    return isinstance(drafter, TrainedDrafter) and drafter.model.drafting == "sequential"


# `auto`: tree=dynamic,nodes=auto replays each node budget; otherwise a chain or fixed-width tree whose depth is the
# length (chosen when auto or not given; replayed at the trained depth) and whose width is replayed per value the
# shortlist holds (tree=auto).
SEARCH = Either(is_dynamic, BUDGETS, Chain(
    "depth", longest=lambda env, m: m.concrete("depth", _chain_model(env, m).depth),
    grid=Grid("tree", lambda env, m: tuple(w for w in AUTO_WIDTHS if w <= len(_chain_model(env, m).proj)), default=0),
    chosen=lambda m: "depth" in m.auto or m.get("depth") is None, drafts_per_token=_sequential))


def network_of(trained_name: str):
    """The network record (nets/registry.NetworkSpec) of a trainer or cache name (koala-adv is koala's)."""
    return networks().get(trained_name.removesuffix("-adv"))


def inputs_of(trained_name: str) -> frozenset[Input]:
    """What a draft network takes from the loop: the final hidden states, and the states of chosen layers when its
    record declares them."""
    net = network_of(trained_name)
    return frozenset({Input.HIDDEN} | ({Input.LAYERS} if net is not None and net.layers is not None else set()))


def spec(name: str, description: str, trained_name, drafter_type=None, extra: tuple[Param, ...] = (),
         longest: int | None = None) -> MethodSpec:
    """A registry entry. `trained_name` (the trainer's name, i.e. the cache folder) and `drafter_type` (the drafter
    type it must hold; default: its network record's checkpoint type) are strings or functions of the method
    (koala:base=hydra -> koala-hydra, a hydra drafter); `longest`: the deepest chain when it is not the trained
    depth (EAGLE's 16)."""
    name_of = trained_name if callable(trained_name) else (lambda m: trained_name)
    type_of = drafter_type if callable(drafter_type) else \
        (lambda m: drafter_type or network_of(name_of(m)).type_name)
    description += "; tree=dynamic grows an EAGLE-2 tree each step (nodes, topk, depth)"
    return MethodSpec(name, description, lambda env, m: build(env, m, name_of(m), type_of(m), longest),
                      extra + COMMON, needs_of(trained_name), inputs=lambda m: inputs_of(name_of(m)),
                      artefacts=(network(trained_name),),
                      preflight=lambda m, cfg: check(m, cfg, name_of(m), type_of(m), longest), shapes=SEARCH)


def drafter_need(method: Method, model: str, trained_name: str, profile: str) -> Need:
    return network_need(model, trained_name, profile, method.label)
