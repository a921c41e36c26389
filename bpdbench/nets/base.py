"""What every trained draft model shares: the base's frozen vocabulary projection restricted to a shortlist, the
base's frozen token embeddings, the save format, and the two drafting interfaces the methods use.

Save format (store.py reads and writes it; a folder): `config.json` = {"drafter": type, "name": the trainer's name, "base_model", "d", "depth",
"shortlist_size", the type's dimensions under "dims", "trainable_parameters", "training": the trainer's report};
`drafter.pt` = the trainable weights only (never the base's projection or embeddings); `shortlist.pt` = the drafting
vocabulary (sorted token ids); `rank.pt` = the data's token ids by frequency (a drafting shortlist of another size is
a prefix of it); `report.json` = the training report again (per-depth held-out agreement, seconds, parameters).
Medusa-1 heads (and KOALA's multi-layer ones) are saved in the Medusa-1 layout instead (`medusa_lm_head.pt`,
`medusa_num_heads`, our fields under "bpdbench"), so heads methods read them too; `load` reads both layouts, and
published Medusa-1 checkpoints, as before.

Drafting interfaces: a *sequential* model (EAGLE, Hydra, Hydra++) keeps a per-example `session()` in step with the
decided tokens (`sync(ctx)` pushes the base's hidden states of newly decided positions) and opens an expansion per
proposal, whose `logits(paths)` gives next-token logits after each draft path (all of one length), batched, so
chains and trees are expanded one depth at a time, each node conditioned on its own path. A *parallel* model
(Medusa/KOALA heads, Amphista) gives every depth's logits in one call (`parallel_logits`), a lattice.
"""
from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from ..engine.types import Layers

WEIGHTS = "drafter.pt"


class NetworkFileError(FileNotFoundError):
    """A drafter folder that cannot be used: one line naming the file and how to rebuild it."""


class Expansion(Protocol):
    def logits(self, paths: list[list[int]]) -> torch.Tensor:
        """[len(paths), S] next-token logits over the shortlist after each path (draft tokens after the bonus)."""


class DraftModel(nn.Module):
    drafting = "sequential"        # or "parallel": every depth from one state
    type_name = ""
    # The base's layers it reads beside the final state (engine.Layers; None: the final state only). A model that
    # declares them gets DraftContext.accepted_layers when drafting and the data's `layers` when training.
    hidden_layers: Layers | None = None

    def __init__(self, d: int, depth: int):
        super().__init__()
        self.d, self.depth = d, depth
        self.register_buffer("shortlist", None, persistent=False)
        self.register_buffer("proj", None, persistent=False)
        self.emb: torch.Tensor | None = None
        # The base's token embeddings are ~370x smaller than its final hidden states (RMS 0.017 vs 6.2 on Qwen2.5
        # 0.5B); concatenated raw, Adam moves both columns of a layer alike and the token barely counts for
        # hundreds of steps. One constant, measured on the training data and saved, brings them to the same scale.
        self.emb_scale = 1.0

    def dims(self) -> dict:
        """Constructor arguments beyond d and depth (saved under config.json "dims")."""
        return {}

    def bind(self, embed: torch.Tensor, lm_head: torch.Tensor, shortlist: torch.Tensor | None) -> "DraftModel":
        """Attach the base's frozen embeddings [V, d] and projection [V, d] (the latter cut to the shortlist once,
        contiguous, so drafting reads S rows, not V)."""
        self.shortlist = shortlist
        self.emb = embed.detach()          # a plain tensor: a Parameter would register as the drafter's own
        self.proj = (lm_head if shortlist is None else lm_head[shortlist.to(lm_head.device)]).contiguous()
        return self

    def project(self, z: torch.Tensor) -> torch.Tensor:
        return z.to(self.proj.dtype) @ self.proj.T

    def embed(self, ids) -> torch.Tensor:
        ids = torch.as_tensor(ids, dtype=torch.long, device=self.emb.device)
        return (self.emb[ids].float() * self.emb_scale).to(self.proj.dtype)

    def to_token_ids(self, idx: torch.Tensor) -> torch.Tensor:
        return idx if self.shortlist is None else self.shortlist.to(idx.device)[idx]

    def n_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


def new_rows(rows: int, ctx) -> tuple[torch.Tensor, list[int]]:
    """The base's hidden states of the positions a feature session has not seen, with the tokens they produced:
    `ctx.accepted_hidden` [m, d] are positions rows..rows+m-1, which produced ctx.tokens[rows+1 : rows+m+1].
    Checked, since a session out of step with the context drafts from the wrong features without failing."""
    fresh = ctx.accepted_hidden
    if fresh is None or rows + fresh.shape[0] != len(ctx.tokens) - 1:
        got = "none" if fresh is None else f"{fresh.shape[0]} rows after {rows}"
        raise ValueError(f"a feature drafter needs the base's hidden states of every decided position "
                         f"(DraftContext.accepted_hidden; replay: teacher_forced(..., with_prompt=True)); got {got} "
                         f"for a context of {len(ctx.tokens)} tokens")
    return fresh, ctx.tokens[rows + 1:]
