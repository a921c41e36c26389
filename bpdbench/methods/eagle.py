"""`eagle`: an EAGLE-style draft layer (Li et al. 2024): one small decoder layer over fc(concat(feature, token
embedding)), autoregressive over its own predicted features, with its own KV cache of the base's real features kept
in step with the decided tokens, ending in the base's frozen projection cut to the drafting shortlist
(bpdbench/drafters/eagle.py). The reference point for the heads that see each other.

`eagle` drafts a chain of `depth` tokens (default: the trained depth; up to 16, it is autoregressive), or a tree
(`tree=W`); `refine=` applies the paper's refiners to the chain's top-k lattice. Train it with
`bpdbench train-drafter eagle --profile quick|full`.
"""
from __future__ import annotations

from .trained import spec

SPECS = [spec("eagle", "EAGLE-style draft layer over the base's features (own KV cache), chain or tree (tree=W), "
              "base projection on a shortlist", "eagle", "eagle")]
