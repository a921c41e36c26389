"""The shortlisted output projection `python -m bpdbench.experiments.draftcost` measures (FR-Spec's draft
vocabulary): the kept tokens' logits are the int4 projection's rows for them, every other token is never proposed."""
from __future__ import annotations

import torch

from bpdbench.experiments.draftcost import ShortlistHead
from bpdbench.nets.quant import QuantLinear


def test_a_shortlisted_head_scores_its_tokens_and_rules_out_the_rest():
    torch.manual_seed(0)
    weight = torch.randn(64, 32)
    ids = torch.tensor([1, 5, 9, 40, 63])
    head = ShortlistHead(weight, ids)
    x = torch.randn(2, 3, 32).bfloat16()
    out = head(x)
    assert out.shape == (2, 3, 64)
    torch.testing.assert_close(out[..., ids], QuantLinear(weight[ids], None, 4, 32)(x))
    rest = torch.ones(64, dtype=torch.bool)
    rest[ids] = False
    assert torch.isneginf(out[..., rest]).all()
    assert set(out.argmax(-1).flatten().tolist()) <= set(ids.tolist())
