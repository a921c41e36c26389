"""The linear-layer kernel choice: oneDNN's packed linear must compute what torch's does, row by row the same
whatever the number of rows (what lets a verify forward equal the decode step), and be chosen only when faster."""
from __future__ import annotations

import pytest
import torch

from bpdbench.hardware import kernels
from bpdbench.hardware.fingerprint import Fingerprint

onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")


@onednn
def test_packed_linear_equals_torch_and_is_batch_invariant():
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 300).requires_grad_(False)
    fast = kernels.PackedLinear(lin)
    x = torch.randn(3, 17, 64)
    with torch.inference_mode():
        assert torch.allclose(fast(x), lin(x), atol=1e-5)
        rows = x.reshape(-1, 64)
        one_by_one = torch.cat([fast(rows[i:i + 1]) for i in range(rows.shape[0])])
        assert torch.equal(one_by_one, fast(rows))


@onednn
def test_packed_linear_falls_back_when_gradients_flow():
    lin = torch.nn.Linear(8, 5).requires_grad_(False)
    fast = kernels.PackedLinear(lin)
    x = torch.randn(4, 8, requires_grad=True)
    fast(x).sum().backward()
    assert x.grad is not None and torch.allclose(x.grad, lin.weight.sum(0).expand(4, 8))


@onednn
def test_apply_swaps_every_linear_and_keeps_outputs(tiny_model):
    import copy
    model = copy.deepcopy(tiny_model)
    ids = torch.tensor([[1, 5, 9, 3, 7]])
    with torch.inference_mode():
        before = model(ids).logits
        kernels.apply(model, "onednn")
        after = model(ids).logits
    assert kernels.backend_of(model) == "onednn" and kernels.backend_of(tiny_model) == "torch"
    assert not any(type(m) is torch.nn.Linear for m in model.modules())
    assert torch.allclose(before, after, atol=1e-4)
    assert model.lm_head.weight is not None                    # readers of the weight still see it


def _fp(gpu=None):
    return Fingerprint("cpu", ("avx2",), 2, 2, "t", "tr", "x86_64", gpu, "8.0" if gpu else None)


def test_decide_keeps_torch_unless_clearly_faster_and_equal():
    assert kernels.decide(_fp(), "float32", (0.5, 1e-6)).backend == "onednn"
    assert kernels.decide(_fp(), "float32", (0.95, 1e-6)).backend == "torch"
    assert kernels.decide(_fp(), "float32", (0.5, 1e-1)).backend == "torch"     # not the same numbers
    assert kernels.decide(_fp(), "float32", None).backend == "torch"
    assert kernels.decide(_fp("H100"), "bfloat16", (0.5, 0.0)).backend == "torch"


def test_override_and_bad_value(monkeypatch):
    monkeypatch.setenv(kernels.ENV, "torch")
    assert kernels.choose("float32").backend == "torch"
    monkeypatch.setenv(kernels.ENV, "fast")
    with pytest.raises(ValueError, match="torch, onednn, auto"):
        kernels.choose("float32")


def test_cache_names_carry_the_kernel():
    from bpdbench.hardware import calibration
    v = calibration.VERSION
    assert calibration.cache_path("m", "float32", "cpu", 2, "onednn").name == f"m-float32-cpu-onednn-v{v}.json"
    assert calibration.cache_path("m", "float32", "cpu", 2, "torch").name == f"m-float32-cpu-v{v}.json"
