"""The preallocated cache gives the concatenating cache's tokens: chains, trees (compaction writes into its views),
crops, growth past its capacity and the prefill memo's deep copy. Run on the CPU by making the CPU a slot device, so
CI checks what only a GPU session would otherwise exercise."""
from __future__ import annotations

import copy

import pytest
import torch
from transformers import DynamicCache

from bpdbench.engine import cache as kv
from bpdbench.engine import loop
from tests.unit.test_device import DeviceHeads, _decode
from tests.conftest import make_tiny_model
from tests.unit.test_decoding import PROMPT
from tests.unit.test_tree import ManyDrafts


@pytest.fixture
def slots_on_cpu(monkeypatch):
    monkeypatch.setattr(kv, "SLOT_DEVICES", ("cpu",))
    made = []

    def counting(device, capacity=kv.MIN_CAPACITY):
        made.append(c := kv.new_cache(device, capacity))
        return c
    monkeypatch.setattr(loop, "new_cache", counting)
    return made


def test_each_device_type_gets_the_cache_its_measurements_chose(monkeypatch):
    assert type(kv.new_cache("cpu")) is DynamicCache and type(kv.new_cache("cuda")) is DynamicCache
    monkeypatch.setattr(kv, "SLOT_DEVICES", ("cuda",))
    assert isinstance(kv.new_cache("cuda", 10), kv.SlotCache) and kv.uses_slots("cuda:0")
    assert kv.new_cache("cuda", 10).capacity == kv.MIN_CAPACITY and not kv.uses_slots("cpu")


def test_slots_give_the_dynamic_caches_tokens(slots_on_cpu):
    model = make_tiny_model()
    ref = _decode(model, 24).tokens
    assert slots_on_cpu and all(isinstance(c, kv.SlotCache) for c in slots_on_cpu)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(kv, "SLOT_DEVICES", ())
        assert _decode(make_tiny_model(), 24).tokens == ref
    assert type(slots_on_cpu[-1]) is DynamicCache
    heads = lambda shift: DeviceHeads(ref, len(PROMPT), 96, shift=shift, n=4)  # noqa: E731
    assert _decode(model, 24, heads(0), 4).tokens == ref
    assert _decode(model, 24, heads(1), 4).tokens == ref
    tree = _decode(model, 24, heads(0), 4, ManyDrafts())       # compaction gathers kept rows inside the views
    assert tree.tokens == ref and tree.counters.accepted > 0


def test_a_layer_grows_past_its_capacity_keeping_its_rows():
    layer = kv.SlotLayer(capacity=2)
    rows = [torch.randn(1, 2, n, 4) for n in (1, 3, 2)]
    for r in rows:
        keys, values = layer.update(r, -r)
    want = torch.cat(rows, dim=-2)
    assert torch.equal(keys, want) and torch.equal(values, -want) and layer.key_buffer.shape[-2] >= 6
    layer.crop(-2)
    assert layer.get_seq_length() == 4 and layer.keys.data_ptr() == layer.key_buffer.data_ptr()
    keys, _ = layer.update(rows[0], rows[0])
    assert torch.equal(keys, torch.cat([want[..., :4, :], rows[0]], dim=-2))


def test_a_deep_copy_is_independent_and_still_writes_its_own_buffer():
    cache = kv.SlotCache(8)
    cache.update(torch.ones(1, 2, 3, 4), torch.ones(1, 2, 3, 4), 0)
    twin = copy.deepcopy(cache)
    twin.update(torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 4), 0)
    assert cache.get_seq_length() == 3 and twin.get_seq_length() == 4
    layer = twin.layers[0]
    assert layer.keys.data_ptr() == layer.key_buffer.data_ptr() and float(layer.keys[..., 3, :].sum()) == 0


def test_generate_takes_a_cache_factory_in_place_of_the_devices_choice():
    """How a measurement compares two kinds of cache on one device (experiments/devicecheck.py): no patching."""
    from bpdbench.engine import Limits, generate
    model, made = make_tiny_model(), []

    def slots(device, capacity):
        made.append((str(device), capacity))
        return kv.SlotCache(capacity)
    ref = generate(model, None, list(PROMPT), Limits(12, frozenset())).tokens
    assert generate(model, None, list(PROMPT), Limits(12, frozenset()), cache=slots).tokens == ref
    assert made == [("cpu", len(PROMPT) + 12 + loop.TREE_ROWS)]
    from bpdbench.experiments.devicecheck import decode
    assert decode(model, kv.SlotCache, list(PROMPT), 12)[0] == decode(model, lambda c: DynamicCache(), list(PROMPT),
                                                                        12)[0] == ref
