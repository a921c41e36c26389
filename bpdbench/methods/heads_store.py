"""Heads for a config: loaded from the cache or a Medusa-1 folder, trained on first use when missing."""
from __future__ import annotations

from pathlib import Path

from .. import paths
from ..artefacts import MINUTES, Need, builder
from ..config import RunConfig
from ..nets.heads import Heads, load as load_heads
from ..artefacts.policy import warn_use


def heads_need(model: str, profile: str) -> Need:
    return Need(f"'{profile}' heads for {model}", f"bpdbench train-heads --profile {profile}", MINUTES.get(profile, 10))


def resolve_heads(cfg: RunConfig, model, tok, log) -> tuple[Heads, dict]:
    """The heads a config names, with their metadata (path, training profile, held-out agreement)."""
    if cfg.heads_profile == "init" and not cfg.heads_path:  # untrained (zero-init) heads: smoke tests, ablations
        heads = Heads(model.config.hidden_size, cfg.heads).to(model.dtype).eval().requires_grad_(False)
        heads.pack(model.lm_head)
        return heads, {"profile": "init"}
    path = Path(cfg.heads_path) if cfg.heads_path else paths.heads_dir(cfg.model, cfg.heads_profile)
    if not (path / "config.json").exists():
        if cfg.heads_path:
            raise FileNotFoundError(f"no heads at {path} (expected config.json + medusa_lm_head.pt); "
                                    f"train them with `bpdbench train-heads`")
        heads_need(cfg.model, cfg.heads_profile).build(
            cfg.auto_train, lambda: builder("heads")(cfg.model, cfg.heads_profile, model, tok, log=log), log, path)
    heads, hcfg = load_heads(path, model.config.hidden_size, model.dtype, str(model.device))
    if cfg.heads > heads.num_heads:
        raise ValueError(f"--heads {cfg.heads} but {path} has only {heads.num_heads} heads")
    heads.pack(model.lm_head)
    training = hcfg.get("bpdbench", {}).get("training", {})
    meta = {"path": str(path), "shortlist": hcfg.get("shortlist"),
            **{k: training[k] for k in ("profile", "recipe", "seconds", "greedy_positions", "gen_dtype",
                                        "heldout", "quality_warning", "seen") if k in training}}
    warn_use(meta.get("quality_warning"), f"heads {path}", log)   # never used silently
    if str(hcfg.get("shortlist", "")).startswith("MISSING"):
        log(f"warning: {hcfg['shortlist']}")
    return heads, meta
