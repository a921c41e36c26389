"""`eagle`: an EAGLE-style draft layer (Li et al. 2024): one small decoder layer over fc(concat(feature, token
embedding)), autoregressive over its own predicted features, with its own KV cache of the base's real features kept
in step with the decided tokens, ending in the base's frozen projection cut to the drafting shortlist
(bpdbench/drafters/eagle.py). The reference point for the heads that see each other.

`eagle` drafts a chain of `depth` tokens (default: the trained depth; up to 16, it is autoregressive), or a tree
(`tree=W`); `refine=` applies the paper's rescorers to the chain's top-k lattice. `tree=dynamic` is EAGLE-2's tree at
its published shape: 59 draft nodes, top-10, 6 draft levels (the trained depth is 5, and EAGLE drafts past it).
The plain spelling stays a chain, not EAGLE-1's fixed 25-node tree nor EAGLE-2's: every committed `eagle` result
is a chain under that label (docs/methods.md, Published configurations). Train it with
`bpdbench train-network eagle --profile quick|full`.

`eagle3`: the EAGLE-3-style layer (nets/eagle3.py: fused low, middle and high layer features, trained on its own
drafts over 7 passes), drafting with the same parameters and code; `bpdbench train-network eagle3 --profile
quick|bench` trains it on teacher-forced prefill data that keeps those layers. Its plain spelling is a chain too.
"""
from __future__ import annotations

from dataclasses import replace

from .base import Method
from .dynamic import DYNAMIC_LEVELS
from .env import Env
from .trained import spec

_SPEC = spec("eagle", "EAGLE-style draft layer over the base's features (own KV cache), chain or tree (tree=W), "
             "base projection on a shortlist", "eagle", "eagle", longest=16)   # autoregressive: past its trained depth


_SPEC3 = spec("eagle3", "EAGLE-3-style draft layer over the fused low, middle and high layers (own KV cache), "
              "trained on its own drafts; chain or tree (tree=W), base projection on a shortlist", "eagle3", "eagle3",
              longest=16)


def _levels(plain):
    """EAGLE-2's published tree has one level more than our drafters' trained depth; they are autoregressive, so a
    dynamic tree drafts EAGLE-2's levels unless `depth=` says otherwise (the label stays as spelled)."""
    def build(env: Env, method: Method):
        if method.get("tree") == "dynamic" and "depth" not in method.params:
            method = Method(method.spec, {**method.params, "depth": DYNAMIC_LEVELS}, method.label)
        return plain.build(env, method)
    return build


SPECS = [replace(_SPEC, build=_levels(_SPEC)), replace(_SPEC3, build=_levels(_SPEC3))]
