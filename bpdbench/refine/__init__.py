"""Registry of draft rescorers (the refine stage). One entry per name; `none` is plain BPD.

A spec says how a rescorer scores paths (`scorer`), how many drafts it returns (`p`) and its default interpolation weight;
artefacts (KenLM binaries, small neural LMs) live in the cache, one directory per (rescorer, target model).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from ..store import read_json
from .base import Lattice, Rescorer


@dataclass(frozen=True)
class RescorerSpec:
    name: str
    description: str
    scorer: str               # none | kbest | tree | ngram | neural | hf: how paths are scored
    p: int = 1                # drafts verified per step
    order: int = 0            # n-gram order
    size: str = ""            # neural size (for a tree: the local rescorer that re-ranks candidates first)
    tree: str = "mc_sim_7b_63"  # tree kinds: Medusa's default, or "auto" (built from the heads' measured accuracy)
    default_alpha: float = 0.0

    @property
    def interpolates(self) -> bool:
        """Whether an alpha weighs a language model against the heads (tuned per task)."""
        return self.scorer in ("ngram", "neural", "hf") or (self.scorer == "tree" and bool(self.size))


RESCORERS: dict[str, RescorerSpec] = {s.name: s for s in (
    RescorerSpec("none", "plain BPD: the heads' top-1 draft", "none"),
    RescorerSpec("ngram2", "global 2-gram rescoring, 1-best path (KenLM)", "ngram", order=2, default_alpha=0.5),
    RescorerSpec("ngram4", "global 4-gram rescoring, 1-best path (KenLM)", "ngram", order=4, default_alpha=0.5),
    RescorerSpec("16best-0gram", "16 best paths by head scores, verified in one forward", "kbest", p=16),
    RescorerSpec("16best-ngram4", "16 best paths under heads + 4-gram, verified in one forward", "ngram", p=16,
                 order=4, default_alpha=0.5),
    RescorerSpec("medusa", "Medusa tree (mc_sim_7b_63, 63 nodes) over the top-10 lattice, one tree-masked forward; "
                 "tree=auto sizes it to this machine, tree=dynamic grows an EAGLE-2 tree per step",
                 "tree", p=63),
    RescorerSpec("medusa-auto", "Medusa tree of 63 nodes built from the heads' held-out per-rank accuracy "
                 "(Medusa's greedy tree search, independent heads)", "tree", p=63, tree="auto"),
    RescorerSpec("medusa-neural-m", "Medusa tree (mc_sim_7b_63) over the lattice re-ranked by local neural-m "
                 "rescoring (its pick at each position becomes rank 0)", "tree", p=63, size="m", default_alpha=0.5),
    RescorerSpec("neural-s", "local rescoring with a small neural LM (~2% of target compute)", "neural", size="s",
                 default_alpha=0.5),
    RescorerSpec("neural-m", "local rescoring with a small neural LM (~4% of target compute)", "neural", size="m",
                 default_alpha=0.5),
    RescorerSpec("neural-l", "local rescoring with a small neural LM (~6% of target compute)", "neural", size="l",
                 default_alpha=0.5),
)}


def get_rescorer(name: str) -> RescorerSpec:
    if name.startswith("hf:") and len(name) > 3:
        return RescorerSpec(name, f"local rescoring with the same-tokenizer model {name[3:]}", "hf", default_alpha=0.5)
    if name not in RESCORERS:
        raise ValueError(f"unknown rescorer '{name}'; valid: {', '.join(RESCORERS)}, hf:<model>")
    return RESCORERS[name]


def artefact_dir(spec: RescorerSpec | str, model_name: str) -> Path:
    """Cache folder of a rescorer's artefact; `spec` may be the tag itself (ngram4, neural-m)."""
    from bpdbench.paths import rescorer_dir
    if isinstance(spec, str):
        return rescorer_dir(spec, model_name)
    tag = f"ngram{spec.order}" if spec.scorer == "ngram" else f"neural-{spec.size}"
    return rescorer_dir(tag, model_name)


SAW = "_saw"    # the alpha table's record of what each alpha was tuned on: {key: {"split", "examples"}}


def alpha_table(path: Path) -> dict:
    """The tuned-alpha table at `path` ({} when there is none yet), checked: every command that may read it checks
    it before its model loads (experiments/plan.py), so a corrupt table is one line naming the file, not a JSON
    error after loading, or an alpha that is no number."""
    path = Path(path)
    if not path.exists():
        return {}
    fix = "fix or delete that file (`bpdbench tune` writes its entries again), or pass another --alpha-file"
    table = read_json(path, "--alpha-file", "tuned-alpha table", "results/alpha.json", fix)
    if not isinstance(table, dict) or not isinstance(table.get(SAW, {}), dict):
        raise ValueError(f"tuned-alpha table {path} holds no {{\"model/task/rescorer\": alpha}} object; {fix}")
    for key, alpha in table.items():
        if not key.startswith("_") and (isinstance(alpha, bool) or not isinstance(alpha, (int, float))
                                        or not math.isfinite(alpha) or alpha < 0):
            raise ValueError(f"tuned-alpha table {path}: {key} is {alpha!r}, not a number >= 0; {fix}")
    return table


def tuned_alpha(table: Path, task: str, rescorer: str, model_name: str) -> float | None:
    """The alpha `bpdbench tune` stored for (model, task, rescorer) in `table`, if any."""
    return alpha_table(table).get(f"{model_name}/{task}/{rescorer}")


def tuned_on(table: Path, task: str, rescorer: str, model_name: str) -> dict:
    """What a result states of an alpha read from `table` (resolved.<method>.alpha_table): the file, the split it
    was tuned on and, as an artefact's `seen` record that `bpdbench audit` counts, the examples. An entry written
    before tables recorded this says split null: nothing lists what it was tuned on."""
    try:
        saw = (json.loads(table.read_text()).get(SAW) or {}).get(f"{model_name}/{task}/{rescorer}")
    except (OSError, ValueError):
        saw = None
    return {"file": str(table), "split": saw.get("split") if saw else None,
            "seen": {"ids": {task: list(saw.get("examples", []))}} if saw else None}


def tuned_on_tune_split(table: dict, key: str) -> bool:
    """An alpha counts as tuned only if the table records that `tune` picked it on the tune split: entries from
    before the splits (picked on the held-out slice, the trainers' prompt pool) are tuned again by the sweep."""
    return key in table and (table.get(SAW) or {}).get(key, {}).get("split") == "tune"


def build(spec: RescorerSpec, model_name: str, alpha: float | None, k: int, device: str = "cpu",
          log=print, heads_meta: dict | None = None, dtype: str = "float32") -> Rescorer | None:
    """Instantiate a rescorer; a missing artefact is a one-line error naming the command that makes it.
    `heads_meta`: the heads' training report (artefacts.heads.resolve_heads), which `medusa-auto` builds its tree from.
    `dtype`: the run's dtype, which neural rescorers follow. Why: their batch-1 forwards are bound by reading the
    weights, so bf16 halves their cost (neural-s 16.7 -> 11.5 ms per step, measured); the choice of draft is a
    heuristic and verification stays exact, so output is lossless either way, and float32 runs stay float32."""
    alpha = spec.default_alpha if alpha is None else alpha
    if spec.scorer == "none":
        return None
    if spec.scorer == "kbest":
        from .kbest import KBestRescorer
        return KBestRescorer(spec.name, p=spec.p)
    if spec.scorer == "tree":
        from .medusa import MedusaTree, RescoredTree, tree_from_report
        choices = None
        if spec.tree == "auto":
            choices = tree_from_report(heads_meta, spec.name)
            log(f"{spec.name}: {len(choices)}-node tree from the heads' held-out accuracy, depth "
                f"{max(map(len, choices))}")
        tree = MedusaTree(spec.name, choices)
        if not spec.size:
            return tree
        local = build(RESCORERS[f"neural-{spec.size}"], model_name, alpha, k, device, log, dtype=dtype)
        return RescoredTree(spec.name, tree, local)
    if spec.scorer == "ngram":
        from .ngram import NgramRescorer
        path = artefact_dir(spec, model_name) / f"ngram{spec.order}.bin"
        if not path.exists():
            raise FileNotFoundError(f"rescorer '{spec.name}' needs a {spec.order}-gram for {model_name}: run "
                                    f"`bpdbench train-rescorer ngram --order {spec.order} --model {model_name}`")
        return NgramRescorer(spec.name, path, alpha=alpha, p=spec.p, k=k)
    if spec.scorer == "neural":
        from .neural import NeuralRescorer
        path = artefact_dir(spec, model_name)
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"rescorer '{spec.name}' is not trained for {model_name}: run "
                                    f"`bpdbench train-rescorer neural --size {spec.size} --model {model_name}`")
        return NeuralRescorer(spec.name, path, alpha=alpha, k=k, device=device, dtype=dtype)
    if spec.scorer == "hf":
        from bpdbench import models
        from .neural import NeuralRescorer
        lm, _ = models.load(spec.name[3:], "bfloat16", device)
        return NeuralRescorer(spec.name, lm, alpha=alpha, k=k, device=device)
    raise ValueError(f"rescorer {spec.name}: no builder for scorer '{spec.scorer}'")


__all__ = ["Lattice", "Rescorer", "RESCORERS", "RescorerSpec", "get_rescorer", "build", "tuned_alpha"]
