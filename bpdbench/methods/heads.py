"""Blockwise parallel decoding and the paper's draft refinements: heads draft a top-k lattice, a rescorer picks paths.

`bpd` verifies the heads' top-1 path (Stern et al.). Every refinement of the paper is the same drafter
(methods/lattice.py: LatticeDrafter over the heads) with a rescorer from `refine/` (n-gram and neural rescoring,
p-best paths, Medusa trees), so they share the drafting code, the draft threshold and the heads, and differ only in
the refine stage. The heads draft all their depths whatever the generation budget left (the loop clips the paths).

Speculative sampling (T > 0): q is a point mass. The lattice is a deterministic function of the context (the base's
hidden state and, for rescorers, the decided tokens), and every rescorer picks paths deterministically from it, so a
proposed token x has q = delta_x; the sampling rule accepts it with probability r(x) and otherwise removes it from
the residual r (several paths or a Medusa tree: tried in proposal order, engine/sampling.py).
"""
from __future__ import annotations

from pathlib import Path

from .. import refine
from .. import paths
from ..config import RunConfig
from dataclasses import replace

from .base import ALPHA, HEADS, K, THRESHOLD, Method, MethodError, MethodSpec, Param
from .contract import RUN_HEADS, Input, Kind, Reads, Requirement
from .dynamic import BUDGETS, is_dynamic
from .env import Env
from .lattice import HeadsSource, LatticeDrafter
from .search import Chain, Either, RankTree


def alpha_for(env: Env, method: Method, spec: refine.RescorerSpec) -> tuple[float | None, str]:
    """One precedence rule for every command: the method's alpha (alpha=, or --alpha bound into it), then the tuned
    table, then the rescorer's default."""
    if not spec.interpolates:
        return None, "n/a"
    if method.get("alpha") is not None:
        return method.params["alpha"], "method parameter"
    table = _alpha_file(env)
    tuned = refine.tuned_alpha(table, env.cfg.task, spec.name, env.cfg.model)
    if tuned is not None:
        return tuned, str(table)
    return spec.default_alpha, "default (not tuned)"


def _alpha_file(env: Env) -> Path:
    return Path(env.cfg.alpha_file) if env.cfg.alpha_file else paths.alpha_file()


def alpha_table(env: Env, spec: refine.RescorerSpec, source: str) -> dict:
    """`alpha_table`, what the tuned alpha saw (refine.tuned_on), where the alpha came from the table."""
    table = _alpha_file(env)
    if source != str(table):
        return {}
    return {"alpha_table": refine.tuned_on(table, env.cfg.task, spec.name, env.cfg.model)}


def build(env: Env, method: Method, rescorer: str = "none") -> LatticeDrafter:
    n = method.option("heads")               # --heads, --k and --draft-threshold where not spelled (bind)
    heads, meta = env.heads(n)
    if method.get("tree") == "auto":
        rescorer = "medusa-auto"
    if n > heads.num_heads:
        raise MethodError(f"{method.label}: heads={n} but the heads have only {heads.num_heads}")
    takes_k = method.takes("k")
    k = method.option("k") if takes_k else 1      # bpd takes no k: it drafts the top-1 path
    width = len(heads.shortlist) if heads.shortlist is not None else env.model.lm_head.out_features
    if heads.proj is not None:
        width = heads.proj[0].out_features
    if k > width and takes_k:
        raise MethodError(f"{method.label}: k={k} exceeds the heads' drafting vocabulary of {width} tokens "
                          f"(shortlist); pass --k {width} or less")
    threshold = method.option("threshold")
    if rescorer == "hf" and not method.get("model"):
        raise MethodError(f"{method.label}: name the rescoring model, e.g. hf-lm:model=qwen2.5-coder-0.5b")
    spec = refine.get_rescorer(f"hf:{method.get('model')}" if rescorer == "hf" else rescorer)
    alpha, source = alpha_for(env, method, spec)
    from ..artefacts.rescorers import ensure
    ensure(spec, env.cfg, env.tok, env.log)
    stage = refine.build(spec, env.cfg.model, alpha, k, str(env.model.device), env.log, heads_meta=meta,
                             dtype=env.cfg.dtype)
    k = k if stage is not None else 1      # plain BPD drafts the top-1 path: no wider lattice to compute
    env.resolved[method.label] = {"n_heads": n, "k": k, "threshold": threshold, "rescorer": spec.name, "p": spec.p,
                                  "alpha": alpha, "alpha_source": source, **alpha_table(env, spec, source)}
    if method.get("tree") == "dynamic":             # EAGLE-2's rerank over the lattice replaces the fixed tree
        from .dynamic import LatticeTree
        from .dynamic import DYNAMIC_NODES
        stage = LatticeTree(method.concrete("nodes", DYNAMIC_NODES))
        env.resolved[method.label].update(tree="dynamic", nodes=stage.nodes)
    elif isinstance(method.get("nodes"), int) and stage is not None:    # medusa:nodes=N: the tree's first N nodes
        tree, nodes = getattr(stage, "tree", stage), method.params["nodes"]
        if spec.tree == "auto":           # Medusa's greedy search stopped at N nodes (its list is sorted by depth)
            from ..refine.medusa import tree_from_report
            tree.use(tree_from_report(meta, spec.name, nodes))
        else:                             # mc_sim_7b_63 is listed best first
            tree.use(tree.choices[:nodes])
        env.resolved[method.label].update(nodes=tree.p)
    return LatticeDrafter(method.label, HeadsSource(heads, env.model.lm_head), n, k, threshold, stage)


def _needs_heads(model: str, cfg: RunConfig) -> list[Requirement]:
    path = Path(cfg.heads_path) if cfg.heads_path else paths.heads_dir(model, cfg.heads_profile)
    ok = cfg.heads_profile == "init" or (path / "config.json").exists()
    return [Requirement(f"heads ({cfg.heads_profile})", ok, "heads", path)]


def _needs(rescorer: str):
    def needs(model: str, cfg: RunConfig) -> list[Requirement]:
        from ..artefacts.rescorers import ready
        return _needs_heads(model, cfg) + ready(refine.RESCORERS[rescorer], model)
    return needs


def _rescorer_tags(method: Method, cfg: RunConfig) -> list[str]:
    """The refine stage's artefacts (an n-gram or neural LM), by tag."""
    from ..artefacts.rescorers import ready
    spec = refine.RESCORERS.get("medusa-auto" if method.get("tree") == "auto" else method.name)
    return [r.what for r in ready(spec, cfg.model)] if spec is not None else []


# The contract of every heads method: the lattice is drafted from the base's hidden state; the run's heads and the
# refine stage's artefact are read.
TAKES = frozenset({Input.HIDDEN})
READS = (RUN_HEADS, Reads(Kind.RESCORER, _rescorer_tags))
# single-draft methods verify heads + 1 tokens a step, so heads=auto is the chain length fastest on this machine:
# one replay with every head, each shorter chain a prefix of it
HEADS_AUTO = replace(HEADS, help="use the first N heads (auto: the count fastest on this machine)", auto=True)
HEADS_SEARCH = Chain("heads", longest=lambda env, method: env.heads()[0].num_heads)
# medusa:nodes=auto: the tree of every size from per-rank acceptance of one replay of the full tree (at most 64
# nodes); tree=dynamic,nodes=auto: one replay per node budget
MEDUSA_SEARCH = Either(is_dynamic, BUDGETS, RankTree("nodes", 64))
SPECS = [MethodSpec("bpd", "blockwise parallel decoding: the heads' top-1 draft, verified in one forward",
                    lambda env, m: build(env, m), (HEADS_AUTO, THRESHOLD), _needs_heads, inputs=TAKES,
                    artefacts=READS, shapes=HEADS_SEARCH)]
TREE = Param("tree", str, "the Medusa tree: mc_sim_7b_63, auto (built from the heads' held-out accuracy), or dynamic "
             "(the nodes= best lattice paths by summed head log-probs, per step)", choices=("mc_sim_7b_63", "auto",
                                                                                             "dynamic"))
NODES = Param("nodes", int, "tree nodes verified per step: the tree's first N nodes (tree=dynamic: 59, EAGLE-2's; "
              "auto: the size and tree fastest on this machine, from per-rank acceptance on held-out examples)", low=1,
              auto=True)
for _r in refine.RESCORERS.values():
    if _r.scorer == "none" or _r.name == "medusa-auto":     # medusa-auto is medusa:tree=auto
        continue
    _heads = HEADS_AUTO if _r.p == 1 else HEADS
    _params = (_heads, THRESHOLD, K, ALPHA) if _r.interpolates else (_heads, THRESHOLD, K)
    _params = (TREE, NODES) + _params if _r.name == "medusa" else _params
    _search = MEDUSA_SEARCH if _r.name == "medusa" else HEADS_SEARCH if _heads.auto else None
    SPECS.append(MethodSpec(_r.name, _r.description, lambda env, m, r=_r.name: build(env, m, r), _params,
                            _needs(_r.name), inputs=TAKES, artefacts=READS, shapes=_search))
SPECS.append(MethodSpec("hf-lm", "local rescoring with any same-tokenizer HF model (model=<registered name, folder "
                        "or Hub id>)", lambda env, m: build(env, m, "hf"),
                        (Param("model", str, "the rescoring model"), HEADS_AUTO, THRESHOLD, K, ALPHA), _needs_heads,
                        inputs=TAKES, artefacts=READS, shapes=HEADS_SEARCH))
