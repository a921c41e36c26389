"""The draft models' save format (see base.py's module doc): one folder per draft network, its type named in
`config.json` and rebuilt from it. Apart from base.py because reading a folder needs every drafter type, and each
type needs base.py: the types come from the network registry (nets/registry.py), which each network's module fills.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from .base import WEIGHTS, DraftModel, NetworkFileError


def types() -> dict[str, type]:
    """Checkpoint type -> class: every registered network's (nets/registry.py)."""
    from .registry import types as registered
    return registered()


def save(model: DraftModel, out: Path, base_model: str, report: dict, name: str | None = None,
         rank: torch.Tensor | None = None) -> None:
    """Weights, shortlist, rank, config.json and report.json, written to a temporary folder renamed into place (a
    killed save leaves the old folder or none, never half of one)."""
    import shutil
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    info = {"drafter": model.type_name, "name": name or model.type_name, "base_model": base_model, "d": model.d,
            "depth": model.depth, "shortlist_size": None if model.shortlist is None else len(model.shortlist),
            "dims": model.dims(), "emb_scale": model.emb_scale, "trainable_parameters": model.n_params(),
            "training": report}
    if model.type_name == "medusa":
        from .heads import HeadsInfo, save as save_heads
        heads = model.heads
        heads.shortlist = model.shortlist
        save_heads(heads, HeadsInfo(base_model, model.depth, model.layers, shortlist_size=info["shortlist_size"],
                                    extra={k: v for k, v in info.items() if k not in ("base_model", "d")}), tmp)
    else:
        torch.save({k: v.detach().float().cpu() for k, v in model.state_dict().items()}, tmp / WEIGHTS)
        if model.shortlist is not None:
            torch.save(model.shortlist.cpu(), tmp / "shortlist.pt")
        (tmp / "config.json").write_text(json.dumps(info, indent=2))
    if rank is not None:
        torch.save(rank.cpu(), tmp / "rank.pt")
    (tmp / "report.json").write_text(json.dumps(report, indent=2))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def _rebuild(path: Path, name: str) -> str:
    return f"delete {path} and rebuild it with `bpdbench train-network {name}`"


def read_config(path: Path) -> dict:
    """config.json of a drafter folder in either layout, as {"drafter": type, "name", "depth", ...}."""
    cfg_file = path / "config.json"
    try:
        config = json.loads(cfg_file.read_text())
    except FileNotFoundError:
        raise NetworkFileError(f"no drafter at {path} (no config.json); train one with `bpdbench train-network "
                               f"NAME`") from None
    except (OSError, ValueError) as e:
        raise NetworkFileError(f"{cfg_file} is unreadable ({type(e).__name__}); {_rebuild(path, 'NAME')}") from None
    if not isinstance(config, dict):
        raise NetworkFileError(f"{cfg_file} is not a JSON object; {_rebuild(path, 'NAME')}")
    if "medusa_num_heads" in config:
        ours = config.get("bpdbench") or {}
        return {**ours, "drafter": "medusa", "name": ours.get("name", "medusa"), "layout": "medusa-1",
                "depth": config["medusa_num_heads"], "base_model": config.get("base_model_name_or_path")}
    if config.get("drafter") not in types():
        raise NetworkFileError(f"{cfg_file}: drafter type {config.get('drafter')!r} is not one of "
                               f"{', '.join(types())} (or a Medusa-1 folder); {_rebuild(path, 'NAME')}")
    return config


def load(path: Path, embed: torch.Tensor, lm_head: torch.Tensor, dtype: torch.dtype = torch.float32,
         shortlist_size: int | None = None) -> tuple[DraftModel, dict]:
    """A drafter folder (either layout) -> (bound model in eval mode, config). Every file is checked and named when
    wrong. `shortlist_size`: draft over the data's `shortlist_size` most frequent ids instead of the saved
    shortlist (needs rank.pt); the projection is the base's, so any size is valid, only agreement changes."""
    config = read_config(path)
    name = config.get("name", config["drafter"])
    if config.get("layout") == "medusa-1":
        from .heads import HeadsFileError, load as load_heads
        from .medusa import MedusaHeads
        try:
            heads, hcfg = load_heads(path, embed.shape[1], dtype)
        except HeadsFileError as e:
            raise NetworkFileError(str(e)) from None
        model, shortlist = MedusaHeads.from_heads(heads), heads.shortlist
        config["shortlist"] = hcfg.get("shortlist")
    else:
        model, shortlist = _load_own(path, config, name, embed.shape[1])
        model.emb_scale = float(config.get("emb_scale", 1.0))
    if shortlist_size is not None:
        shortlist = _prefix(path, name, shortlist_size, shortlist)
    model = model.to(dtype).eval().requires_grad_(False)
    config["drafting_shortlist"] = None if shortlist is None else len(shortlist)
    return model.bind(embed, lm_head.to(dtype), shortlist), config


def _load_own(path: Path, config: dict, name: str, d: int) -> tuple[DraftModel, torch.Tensor | None]:
    cls = types()[config["drafter"]]
    try:
        model = cls(int(config["d"]), int(config["depth"]), **config.get("dims", {}))
    except (KeyError, TypeError, ValueError) as e:
        raise NetworkFileError(f"{path / 'config.json'} does not describe a {config['drafter']} drafter "
                               f"({type(e).__name__}: {e}); {_rebuild(path, name)}") from None
    if model.d != d:
        raise NetworkFileError(f"{path / 'config.json'}: d={model.d} but the base model's hidden size is {d}; "
                               f"{_rebuild(path, name)}")
    try:
        state = torch.load(path / WEIGHTS, map_location="cpu", weights_only=True)
        model.load_state_dict(state)
    except FileNotFoundError:
        raise NetworkFileError(f"{path} has config.json but no {WEIGHTS}; {_rebuild(path, name)}") from None
    except Exception as e:  # truncated zip, pickle, or weights of another shape
        raise NetworkFileError(f"{path / WEIGHTS} is truncated, corrupt or of other dimensions "
                               f"({type(e).__name__}); {_rebuild(path, name)}") from None
    shortlist = None
    if (path / "shortlist.pt").exists():
        shortlist = _tensor(path / "shortlist.pt", path, name)
        if config.get("shortlist_size") and len(shortlist) != config["shortlist_size"]:
            raise NetworkFileError(f"{path / 'shortlist.pt'} holds {len(shortlist)} tokens but config.json "
                                   f"says {config['shortlist_size']}; {_rebuild(path, name)}")
    elif config.get("shortlist_size"):
        raise NetworkFileError(f"{path / 'shortlist.pt'} is missing (config.json names a "
                               f"{config['shortlist_size']}-token shortlist); {_rebuild(path, name)}")
    return model, shortlist


def _tensor(file: Path, path: Path, name: str) -> torch.Tensor:
    try:
        return torch.load(file, map_location="cpu", weights_only=True)
    except Exception as e:
        raise NetworkFileError(f"{file} is truncated or corrupt ({type(e).__name__}); {_rebuild(path, name)}") \
            from None


def _prefix(path: Path, name: str, size: int, saved: torch.Tensor | None) -> torch.Tensor:
    """The `size` most frequent ids of the drafter's data (EOS ranks first), plus any saved-shortlist id the
    ranking does not hold."""
    if not (path / "rank.pt").exists():
        raise NetworkFileError(f"{path} has no rank.pt, so its drafting shortlist cannot be resized; drop the "
                               f"shortlist= parameter or {_rebuild(path, name)}")
    rank = _tensor(path / "rank.pt", path, name)
    if size > len(rank):
        raise NetworkFileError(f"shortlist={size} but {path / 'rank.pt'} ranks only {len(rank)} token ids; pass "
                               f"shortlist={len(rank)} or less")
    ids = set(rank[:size].tolist())
    if saved is not None:
        ids |= set(saved.tolist()) - set(rank.tolist())
    return torch.tensor(sorted(ids), dtype=torch.long)
