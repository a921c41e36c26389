"""Heads for a config: loaded from the cache or a Medusa-1 folder, trained on first use when missing.

Heads trained here are sealed (store/seal.py: the sha256 of each file, written last): a folder whose files
changed since they were trained is refused in one line naming the file and the fix, before a wrong weight can draft.
Training them again unasked would cost minutes, so a damaged folder is not rebuilt behind the user's back; heads
from before seals, or a Medusa checkpoint of another project, carry none and load as they are."""
from __future__ import annotations

from pathlib import Path

from .. import paths
from ..config import RunConfig
from ..nets.heads import Heads, load as load_heads
from ..store import seal
from .policy import MINUTES, Need, builder, warn_use


def heads_need(model: str, profile: str) -> Need:
    return Need(f"'{profile}' heads for {model}", f"bpdbench train-heads --profile {profile}", MINUTES.get(profile, 10))


# The heads profiles that train on shared data rather than their own `heads-<profile>` greedy data (train/heads.py:
# HeadsProfile.data), said here for the artefact graph, which never imports training; a test holds them equal.
HEADS_DATA = {"bench": "prefill-bench"}


def heads_data(profile: str) -> str:
    """The training data a heads profile reads: a distillation folder's budget name."""
    return HEADS_DATA.get(profile, f"heads-{profile}")


INIT_HEADS = 8     # untrained heads made when no method says how many it uses


def resolve_heads(cfg: RunConfig, model, tok, log, count: int | None = None) -> tuple[Heads, dict]:
    """The heads a config names, with their metadata (path, training profile, held-out agreement). `count`: the
    heads the asking method uses (each method checks its own count against what was loaded)."""
    if cfg.heads_profile == "init" and not cfg.heads_path:  # untrained (zero-init) heads: smoke tests, ablations
        heads = Heads(model.config.hidden_size, count or INIT_HEADS).to(model.dtype).eval().requires_grad_(False)
        heads.pack(model.lm_head)
        return heads, {"profile": "init"}
    path = Path(cfg.heads_path) if cfg.heads_path else paths.heads_dir(cfg.model, cfg.heads_profile)
    if not (path / "config.json").exists() and not seal.sealed(path):
        if cfg.heads_path:
            raise FileNotFoundError(f"no heads at {path} (expected config.json + medusa_lm_head.pt); "
                                    f"train them with `bpdbench train-heads`")
        need = heads_need(cfg.model, cfg.heads_profile)
        with seal.build_lock(path, log):           # another process may be training them: wait, then load them
            if not (path / "config.json").exists():
                need.build(cfg.auto_train, lambda: builder("heads")(cfg.model, cfg.heads_profile, model, tok,
                                                                    log=log), log, path)
    check_seal(path, None if cfg.heads_path else cfg.heads_profile)
    heads, hcfg = load_heads(path, model.config.hidden_size, model.dtype, str(model.device))
    if count and count > heads.num_heads:
        raise ValueError(f"heads={count} (--heads {count}, or a method's heads=) but {path} has only "
                         f"{heads.num_heads} heads")
    heads.pack(model.lm_head)
    training = hcfg.get("bpdbench", {}).get("training", {})
    meta = {"path": str(path), "shortlist": hcfg.get("shortlist"),
            **{k: training[k] for k in ("profile", "recipe", "seconds", "greedy_positions", "gen_dtype",
                                        "heldout", "quality_warning", "seen") if k in training}}
    warn_use(meta.get("quality_warning"), f"heads {path}", log)   # never used silently
    if str(hcfg.get("shortlist", "")).startswith("MISSING"):
        log(f"warning: {hcfg['shortlist']}")
    return heads, meta


def check_seal(path: Path, profile: str | None) -> None:
    """Refuse heads whose files differ from those sealed when they were trained, in one line naming the file and
    the fix (`profile`: heads of the cache, rebuilt on next use once deleted; None: a folder the user named)."""
    why = seal.problem(path)
    if why is None:
        return
    fix = (f"delete {path} and they are trained again on next use (or run `bpdbench train-heads --profile "
           f"{profile}`)" if profile else f"delete {path} and train them again with `bpdbench train-heads --out "
           f"{path}`, or pass another --heads-path")
    raise seal.ArtefactDamaged(f"heads {path}: {why}; {fix}")
