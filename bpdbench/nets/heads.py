"""Blockwise prediction heads in the Medusa-1 layout.

Head i maps the base model's final hidden state at position t to a distribution over token t+2+i (the base's own
head predicts t+1). Each head is a residual block `x + SiLU(W x + b)` followed by a vocabulary projection. Our
trained heads share the base model's frozen `lm_head` (saving 136M parameters per head on Qwen 0.5B) and draft over a
frequency *shortlist* of the vocabulary: drafting is then a single small batched matmul, while verification keeps
the exact full-vocabulary base head, so decoding stays lossless. Published Medusa-1 checkpoints, which carry their
own projections (`{i}.1.weight`), load through the same class.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .layers import ResBlock  # Medusa's block, shared with the draft networks (same weights layout)

WEIGHTS = "medusa_lm_head.pt"


@dataclass
class HeadsInfo:
    base_model: str
    num_heads: int
    num_layers: int = 1
    shared_lm_head: bool = True
    shortlist_size: int | None = None
    extra: dict = field(default_factory=dict)  # training profile, seconds, agreement report


class Heads(nn.Module):
    def __init__(self, d: int, num_heads: int, num_layers: int = 1, vocab: int | None = None):
        super().__init__()
        self.num_layers = num_layers
        self.blocks = nn.ModuleList(nn.Sequential(*[ResBlock(d) for _ in range(num_layers)]) for _ in range(num_heads))
        # Own projections only for foreign Medusa checkpoints; ours reuse the base lm_head.
        self.proj = nn.ModuleList(nn.Linear(d, vocab, bias=False) for _ in range(num_heads)) if vocab else None
        self.register_buffer("shortlist", None, persistent=False)
        self._packed: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    @property
    def num_heads(self) -> int:
        return len(self.blocks)

    def features(self, hidden: torch.Tensor, n: int | None = None) -> torch.Tensor:
        """[..., d] -> [n, ..., d]: residual-block outputs of the first n heads."""
        return torch.stack([blk(hidden) for blk in list(self.blocks)[: n or self.num_heads]])

    def pack(self, lm_head: nn.Linear) -> None:
        """Precompute stacked weights (and the shortlisted projection) so drafting is two batched matmuls."""
        if self.num_layers != 1 or self.proj is not None:
            self._packed = None
            return
        w = torch.stack([b[0].linear.weight for b in self.blocks])          # [h, d, d]
        bias = torch.stack([b[0].linear.bias for b in self.blocks])         # [h, d]
        proj = lm_head.weight if self.shortlist is None else lm_head.weight[self.shortlist]
        self._packed = (w.to(lm_head.weight.dtype), bias.to(lm_head.weight.dtype), proj.contiguous())

    @torch.no_grad()
    def draft_logits(self, hidden: torch.Tensor, n: int, lm_head: nn.Linear, context: list[int] | None = None
                     ) -> torch.Tensor:
        """hidden [d] at the last decided position -> [n, V'] logits over the draft vocabulary (V' = shortlist).
        `context` is unused here; it lets context-based drafters (test oracles, prompt lookup) share the stage."""
        return self.logits(hidden[None], n, lm_head)[0]

    @torch.no_grad()
    def logits(self, hidden: torch.Tensor, n: int, lm_head: nn.Linear) -> torch.Tensor:
        """hidden [N, d] -> [N, n, V']: all heads at many positions (analysis replays a whole trajectory)."""
        if self._packed is not None:
            w, bias, proj = self._packed
            x = hidden.to(w.dtype)
            z = x[None] + F.silu(torch.einsum("hde,ne->hnd", w[:n], x) + bias[:n, None])
            return (z @ proj.T).transpose(0, 1)
        z = self.features(hidden, n)                                     # [n, N, d]
        if self.proj is not None:
            return torch.stack([self.proj[i](z[i]) for i in range(n)], 1)
        w = lm_head.weight if self.shortlist is None else lm_head.weight[self.shortlist]
        return (z @ w.T).transpose(0, 1)

    def to_token_ids(self, idx: torch.Tensor) -> torch.Tensor:
        return idx if self.shortlist is None else self.shortlist[idx]


def save(heads: Heads, info: HeadsInfo, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    state = {}
    for i, blk in enumerate(heads.blocks):
        for j, rb in enumerate(blk):
            state[f"{i}.{j}.linear.weight"] = rb.linear.weight.detach().float().cpu()
            state[f"{i}.{j}.linear.bias"] = rb.linear.bias.detach().float().cpu()
        if heads.proj is not None:
            state[f"{i}.{heads.num_layers}.weight"] = heads.proj[i].weight.detach().cpu()
    torch.save(state, out / WEIGHTS)
    if heads.shortlist is not None:
        torch.save(heads.shortlist.cpu(), out / "shortlist.pt")
    config = {"medusa_num_heads": info.num_heads, "medusa_num_layers": info.num_layers,
              "base_model_name_or_path": info.base_model, "bpdbench": {
                  "shared_lm_head": heads.proj is None, "shortlist_size": info.shortlist_size, **info.extra}}
    (out / "config.json").write_text(json.dumps(config, indent=2))


class HeadsFileError(FileNotFoundError):
    """A heads artefact that does not match its config: one line naming the file, the field and how to rebuild."""


def _rebuild(path: Path) -> str:
    return f"delete {path} and rebuild it with `bpdbench train-heads` (or pass another --heads-path)"


def read_state(path: Path) -> tuple[dict, dict]:
    """(config.json, weights) of a heads directory, each checked: unreadable or truncated files are named."""
    cfg_file = path / "config.json"
    try:
        config = json.loads(cfg_file.read_text())
        n = int(config["medusa_num_heads"])
        int(config.get("medusa_num_layers", 1))
    except (OSError, ValueError) as e:
        raise HeadsFileError(f"{cfg_file} is unreadable ({type(e).__name__}); {_rebuild(path)}") from None
    except KeyError:
        raise HeadsFileError(f"{cfg_file} has no field medusa_num_heads; {_rebuild(path)}") from None
    if n < 1:
        raise HeadsFileError(f"{cfg_file}: medusa_num_heads is {n}; {_rebuild(path)}")
    weights = path / WEIGHTS
    try:
        if weights.exists():
            state = torch.load(weights, map_location="cpu", weights_only=True)
        else:
            weights = path / "medusa_lm_head.safetensors"
            if not weights.exists():
                raise HeadsFileError(f"{path} has config.json but no {WEIGHTS}; {_rebuild(path)}")
            from safetensors.torch import load_file
            state = load_file(str(weights))
    except HeadsFileError:
        raise
    except Exception as e:  # truncated zip, pickle or safetensors header: name the file, not the parser's words
        raise HeadsFileError(f"{weights} is truncated or corrupt ({type(e).__name__}); {_rebuild(path)}") from None
    if not isinstance(state, dict) or not state:
        raise HeadsFileError(f"{weights} holds no weights; {_rebuild(path)}")
    return config, state


def check(path: Path) -> dict:
    """What a heads directory holds, checked against its config.json without building anything: number of heads,
    shortlist size (None: the full vocabulary) and whether a shortlist the config names is missing."""
    return _inspect(path, *read_state(path))


def _inspect(path: Path, config: dict, state: dict) -> dict:
    n, layers = int(config["medusa_num_heads"]), int(config.get("medusa_num_layers", 1))
    for key in state:
        parts = key.split(".")
        if len(parts) < 3 or not (parts[0].isdigit() and parts[1].isdigit()):
            raise HeadsFileError(f"{path / WEIGHTS}: key {key!r} is not in the Medusa-1 layout; {_rebuild(path)}")
        j = int(parts[1])
        if j > layers or (j == layers and parts[2:] != ["weight"]):
            raise HeadsFileError(f"{path / 'config.json'}: medusa_num_layers is {layers} but the weights hold "
                                 f"{key!r}; {_rebuild(path)}")
    found = len({k.split(".")[0] for k in state})
    if found != n:
        raise HeadsFileError(f"{path / 'config.json'}: medusa_num_heads is {n} but the weights hold {found} heads; "
                             f"{_rebuild(path)}")
    proj = state.get(f"0.{layers}.weight")
    named = (config.get("bpdbench") or {}).get("shortlist_size")
    short = path / "shortlist.pt"
    size, missing = None, False
    if short.exists():
        try:
            size = int(torch.load(short, map_location="cpu", weights_only=True).numel())
        except Exception as e:
            raise HeadsFileError(f"{short} is truncated or corrupt ({type(e).__name__}); {_rebuild(path)}") from None
        if named and size != named:
            raise HeadsFileError(f"{short} holds {size} tokens but config.json bpdbench.shortlist_size is {named}; "
                                 f"{_rebuild(path)}")
    elif named:
        missing = True
    return {"num_heads": n, "num_layers": layers, "shortlist_size": size, "shortlist_missing": missing,
            "shortlist_named": named, "vocab": None if proj is None else int(proj.shape[0])}


def load(path: Path, d: int, dtype: torch.dtype = torch.float32, device: str = "cpu") -> tuple[Heads, dict]:
    """Load our heads or a Medusa-1 checkpoint (`medusa_lm_head.pt` or `.safetensors`). The returned config gains
    `shortlist`: what drafting runs over, so a missing shortlist (full vocabulary, much slower) is recorded."""
    config, state = read_state(path)
    info = _inspect(path, config, state)
    n, layers = info["num_heads"], info["num_layers"]
    vocab = info["vocab"]
    heads = Heads(d, n, layers, vocab)
    mapped = {}
    for key, value in state.items():
        i, j, *rest = key.split(".")
        mapped[f"proj.{i}.weight" if int(j) == layers else f"blocks.{i}.{j}.{'.'.join(rest)}"] = value
    try:
        heads.load_state_dict(mapped)
    except RuntimeError as e:
        first = str(e).splitlines()[1].strip() if len(str(e).splitlines()) > 1 else str(e)
        raise HeadsFileError(f"{path / WEIGHTS} does not fit a model of hidden size {d} ({_one(first)}); "
                             f"{_rebuild(path)}") from None
    if (path / "shortlist.pt").exists():
        heads.shortlist = torch.load(path / "shortlist.pt", weights_only=True)
        config["shortlist"] = f"{info['shortlist_size']} tokens"
    elif info["shortlist_missing"]:
        config["shortlist"] = (f"MISSING: config.json names a {info['shortlist_named']}-token shortlist but "
                               f"{path / 'shortlist.pt'} is absent; drafting over the full vocabulary (slower)")
    else:
        config["shortlist"] = "none (full vocabulary)"
    return heads.to(device=device, dtype=dtype).eval().requires_grad_(False), config


def _one(text: str, limit: int = 120) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
