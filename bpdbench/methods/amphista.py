"""`amphista` (Li et al. 2025): non-autoregressive heads that see each other. Staged adaptation layers adapt the
base's hidden state and merge the base's next token, K Medusa heads turn the result into K head states, and an
auto-embedding block (bidirectional attention across the K head positions) lets each head read the others before
the base's frozen projection on a shortlist: every depth from one pass (bpdbench/drafters/amphista.py). Chain: the
top-1 token per depth; tree (`tree=W`): the W best nodes per depth over the per-depth candidates (Medusa-style,
independent of the path); `refine=` applies the paper's rescorers to the lattice.

Train with `bpdbench train-network amphista --profile quick|full`.
"""
from __future__ import annotations

from .trained import spec

SPECS = [spec("amphista", "Amphista: all heads in one pass, a bidirectional block across the head positions over "
              "adapted (hidden state, next token)", "amphista", "amphista")]
