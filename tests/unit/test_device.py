"""The engine on each device a session has: greedy equals greedy computed by hand, a perfect drafter accepts
everything, a wrong one nothing, a tree verify keeps the output, and every device gives the CPU's tokens.

Why a test of its own: CI and most sessions have CPUs only, so nothing else would notice a host tensor meeting a
device tensor in the verify step. `make gpu-check` runs it with BPDBENCH_TEST_DEVICES=cpu,cuda on a machine with a
GPU; elsewhere it runs on the CPU and skips the devices the machine lacks."""
from __future__ import annotations

import os

import pytest
import torch

from bpdbench.engine import Limits, generate, ratios
from bpdbench.methods.lattice import HeadsSource, LatticeDrafter
from tests.conftest import make_tiny_model
from tests.unit.test_decoding import PROMPT, ScriptedHeads
from tests.unit.test_tree import ManyDrafts

DEVICES = [d.strip() for d in os.environ.get("BPDBENCH_TEST_DEVICES", "cpu").split(",") if d.strip()]


def _model(device: str):
    if device.startswith("cuda") and not torch.cuda.is_available():
        pytest.skip(f"{device}: torch {torch.__version__} sees no CUDA device")
    return make_tiny_model().to(device)


def _decode(model, n: int, heads=None, n_heads: int = 0, rescorer=None):
    drafter = None if heads is None else LatticeDrafter("device", HeadsSource(heads, model.lm_head), n_heads,
                                                         k=2 if rescorer else 1, rescorer=rescorer)
    return generate(model, drafter, list(PROMPT), Limits(n, frozenset()))


class DeviceHeads(ScriptedHeads):
    """ScriptedHeads whose logits live where the model does (a drafter's tensors meet the verify step there)."""

    def draft_logits(self, hidden, n, lm_head, context=None):
        return super().draft_logits(hidden, n, lm_head, context).to(hidden.device)


@pytest.mark.parametrize("device", DEVICES)
def test_greedy_and_both_extremes_on_the_device(device):
    model = _model(device)
    ref = _decode(model, 24).tokens
    ids = list(PROMPT)
    with torch.no_grad():
        for _ in range(24):
            ids.append(int(model(torch.tensor([ids], device=device)).logits[0, -1].argmax()))
    assert ref == ids[len(PROMPT):]
    perfect = _decode(model, 24, DeviceHeads(ref, len(PROMPT), 96, shift=0, n=4), 4)
    wrong = _decode(model, 24, DeviceHeads(ref, len(PROMPT), 96, shift=1, n=4), 4)
    assert perfect.tokens == ref and wrong.tokens == ref
    assert ratios(perfect.counters)["block_efficiency"] >= 4 and wrong.counters.accepted == 0
    tree = _decode(model, 24, DeviceHeads(ref, len(PROMPT), 96, shift=0, n=4), 4, ManyDrafts())   # 3 paths, 1 forward
    assert tree.tokens == ref and ratios(tree.counters)["block_efficiency"] > 3


@pytest.mark.parametrize("device", DEVICES)
def test_a_tree_verifys_inputs_are_made_on_the_device(device):
    if device.startswith("cuda") and not torch.cuda.is_available():
        pytest.skip(f"{device}: torch {torch.__version__} sees no CUDA device")
    from bpdbench.engine.tree import build_tree, model_inputs, tree_buffers
    tree = build_tree(1, [[2, 3], [2, 4], [5]])
    kw = model_inputs(tree, 7, device)
    assert {v.device.type for v in kw.values()} == {torch.device(device).type}
    assert tree_buffers(tree, device)[0] is tree_buffers(build_tree(1, [[2, 3], [2, 4], [5]]), device)[0]


@pytest.mark.parametrize("device", [d for d in DEVICES if d != "cpu"] or ["none"])
def test_the_device_gives_the_cpus_tokens(device):
    if device == "none":
        pytest.skip("no device but the CPU in BPDBENCH_TEST_DEVICES (make gpu-check sets cpu,cuda)")
    cpu = _decode(_model("cpu"), 32).tokens
    assert _decode(_model(device), 32).tokens == cpu
