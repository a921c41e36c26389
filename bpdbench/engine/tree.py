"""Verify many drafts in one forward: a token trie, its attention mask, greedy acceptance and KV compaction.

p drafts that share prefixes are merged into a trie rooted at the base's next token; each node attends to the KV
cache and to its ancestors only (a 4D boolean mask with tree position ids, passed to the unmodified transformers
model). A node is accepted when its token equals the base's greedy choice at its parent, so one forward scores every
path. A single draft is a chain, for which the mask is plain causal and compaction is a crop.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Tree:
    tokens: list[int]        # node 0 is the root (the base's next token, certain)
    parents: list[int]       # parent node index, -1 for the root
    depths: list[int]        # root = 0
    paths: list[list[int]]   # per draft: its node indices, root excluded
    scored: tuple[int, ...] = ()   # scored-only nodes (Proposal.scored): after every draft node, never on a path

    @property
    def is_chain(self) -> bool:
        return is_chain(self.parents)

    @property
    def inner(self) -> list[int]:
        return inner_nodes(self.parents)


def is_chain(parents: list[int]) -> bool:
    return all(p == i - 1 for i, p in enumerate(parents))


def inner_nodes(parents: list[int]) -> list[int]:
    """Nodes with at least one child, ascending: the only nodes whose greedy choice the acceptance walk compares
    against (a leaf's is needed only when the walk ends on it, as the bonus token)."""
    return sorted({p for p in parents if p >= 0})


def build_tree(root: int, drafts: list[list[int]], scored: list[list[int]] | None = None) -> Tree:
    """The trie of `drafts` under `root`; `scored` paths form a second trie under the root, after every draft node,
    never merged with the drafts' (a scored-only node must not become a candidate, nor a draft node lose its
    index), so a proposal with scored paths verifies the same draft nodes at the same indices as without."""
    tokens, parents, depths, paths = [root], [-1], [0], []
    for group, out in ((drafts, paths), (scored or [], None)):
        children: dict[tuple[int, int], int] = {}
        for draft in group:
            node, path = 0, []
            for tok in draft:
                key = (node, tok)
                if key not in children:
                    children[key] = len(tokens)
                    tokens.append(tok)
                    parents.append(node)
                    depths.append(depths[node] + 1)
                node = children[key]
                path.append(node)
            if out is not None:
                out.append(path)
        if out is not None:
            first_scored = len(tokens)
    return Tree(tokens, parents, depths, paths, tuple(range(first_scored, len(tokens))))


_BUFFERS: dict[tuple[tuple[int, ...], str], tuple[torch.Tensor, torch.Tensor]] = {}
_BUFFERS_MAX = 256


def ancestors_mask(tree: Tree) -> torch.Tensor:
    """[n, n] bool: node i may attend to node j iff j is i or an ancestor of i. Built with one indexed write per
    depth level (not one per ancestor pair)."""
    n = len(tree.parents)
    parents = torch.tensor(tree.parents, dtype=torch.long)
    mask = torch.eye(n, dtype=torch.bool)
    rows, anc = torch.arange(n), parents.clone()
    while True:
        alive = anc >= 0
        if not bool(alive.any()):
            break
        mask[rows[alive], anc[alive]] = True
        anc = torch.where(alive, parents[anc.clamp(min=0)], anc)
    return mask


def tree_buffers(tree: Tree, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(ancestors mask [n, n], depths [n]) on `device`, kept per topology and device: a fixed tree (Medusa's,
    `tree=4`, a dynamic tree's usual shapes) has the same parents every step, so a verify step on an accelerator
    copies only the node tokens to it, never the mask."""
    key = (tuple(tree.parents), str(device))
    bufs = _BUFFERS.get(key)
    if bufs is None:
        bufs = (ancestors_mask(tree).to(device), torch.tensor(tree.depths, dtype=torch.long).to(device))
        if len(_BUFFERS) >= _BUFFERS_MAX:
            _BUFFERS.pop(next(iter(_BUFFERS)))
        _BUFFERS[key] = bufs
    return bufs


def model_inputs(tree: Tree, past: int, device) -> dict:
    """Keyword arguments for `model.model(...)`: ids, and for real trees a 4D mask and tree position ids. The mask
    is made where the model is: the cached part is filled there (no [n, past] host tensor per step) and the tree
    part copied from the per-topology buffer."""
    ids = torch.tensor([tree.tokens], device=device)
    if tree.is_chain:
        return {"input_ids": ids}
    n = len(tree.tokens)
    anc, depths = tree_buffers(tree, device)
    mask = torch.ones(1, 1, n, past + n, dtype=torch.bool, device=device)
    mask[0, 0, :, past:] = anc
    return {"input_ids": ids, "attention_mask": mask, "position_ids": (depths + past)[None]}


def accept(tree: Tree, greedy: list[int]) -> tuple[int, int]:
    """(best draft, accepted length): the longest path whose every node equals the greedy choice at its parent.
    Ties go to the earlier (better-ranked) draft."""
    best, best_a = 0, -1
    for d, path in enumerate(tree.paths):
        a = 0
        while a < len(path) and tree.tokens[path[a]] == greedy[tree.parents[path[a]]]:
            a += 1
        if a > best_a:
            best, best_a = d, a
    return best, max(best_a, 0)


def compact_cache(cache, past: int, n_nodes: int, keep: list[int]) -> None:
    """Keep the cache entries of `keep` (node indices, root first, in path order), drop the other tree nodes: the
    kept rows are gathered into the slots right after `past` and the rest cropped, so the cache before `past` is
    never copied (a full `torch.cat` per step cost a copy of the whole cache on every tree step)."""
    if keep == list(range(len(keep))):
        cache.crop(-(n_nodes - len(keep))) if n_nodes > len(keep) else None
        return
    layers = _layers(cache)
    index = torch.tensor([past + k for k in keep], device=layers[0].keys.device)     # one host-to-device copy
    for layer in layers:
        for name in ("keys", "values"):
            t = getattr(layer, name)
            rows = t.index_select(-2, index)                          # read before the slots are overwritten
            t[..., past: past + len(keep), :] = rows
    cache.crop(-(n_nodes - len(keep)))


def _layers(cache):
    if hasattr(cache, "layers"):  # transformers >= 4.56: one object per layer with .keys / .values
        return cache.layers
    raise NotImplementedError("tree verification needs a transformers Cache with per-layer .keys/.values (>= 4.56)")
