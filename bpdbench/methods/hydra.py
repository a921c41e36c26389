"""`hydra` and `hydra++` (Ankner et al. 2024, zankner/Hydra): sequentially dependent draft heads. Head i drafts
from concat(h_t, embeddings of the base's next token and the i draft tokens before it) through an MLP (first block
(i+2)·d -> d, then residual blocks) and the base's frozen projection on a shortlist; a tree is expanded one head at a
time, every node's children coming from the head conditioned on that node's path. Hydra++ adds a decoder "prefix"
layer over the base's hidden states (its own KV cache, in step with the decided tokens) whose output replaces h_t,
and trains with the teacher's soft labels and dropout (bpdbench/drafters/hydra.py).

Published (zankner/Hydra): Medusa's 63-node `mc_sim_7b_63` tree (`hydra_choices`), 4 heads, each node's children
from the head conditioned on its path. Here `hydra` is a chain of the trained depth (5 heads) and the trees are
`tree=W` and `tree=dynamic` (EAGLE-2's policy at its published 59 nodes and top-10, over 5 levels since there are 5
heads); the published fixed tree is not offered, and every committed `hydra` result is a chain under that label
(docs/methods.md, Published configurations).

Train with `bpdbench train-network hydra|hydra++ --profile quick|full`.
"""
from __future__ import annotations

from .trained import spec

SPECS = [spec("hydra", "Hydra heads: head i sees h_t and the embeddings of the path drafted so far; chain or tree "
              "(tree=W) expanded head by head", "hydra", "hydra"),
         spec("hydra++", "Hydra++: Hydra heads behind a decoder prefix layer over the base's features (own KV cache), "
              "distilled with soft labels and dropout", "hydra++", "hydra")]
