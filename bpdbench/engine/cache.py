"""The base model's KV cache: grown by concatenation (transformers' `DynamicLayer`), or preallocated and written by
position (`SlotLayer`), chosen per device type by `SLOT_DEVICES`.

Why both: `DynamicLayer` appends with `torch.cat`, a new tensor and a copy of the whole cache per layer and step,
which on an accelerator was expected to cost a verify step more than writing its new rows. `SlotLayer` keeps one
buffer per layer and exposes the filled prefix as a view (`keys`, `values`), so the rest of the engine (tree
compaction writes into `keys`, `crop` shortens the view, `get_seq_length` reads its shape) works on it unchanged;
growing past the buffer doubles it (one copy), so the capacity hint saves that copy but is never needed.

Measured, it does not pay yet, so no device uses it by default: on an NVIDIA H200 (torch 2.11 + CUDA 13, bfloat16,
the 0.5B model's shapes) AR decoding took 15.4 / 16.8 / 16.0 ms per token with slots against 14.7 / 16.5 / 15.3 with
concatenation at contexts 128 / 1024 / 4096, and 18.0 / 19.4 against 16.8 / 16.1 at 128 / 1024 on a second machine
(`make gpu-check`, experiments/devicecheck.py, median of 5). A step of this model there is bound by the host
launching ~24 layers' kernels, not by the GPU (its kernels ran 2.2 ms of a profiled 30 ms step), so the copy saved
is invisible and the extra views per layer cost host time. What pays there is a captured step: transformers' own
generate took 20.2 ms per token eagerly and 3.6 with its static cache compiled into CUDA graphs (devicecheck
`--parts hf`). A preallocated cache is what such a graph needs (fixed addresses), and `make gpu-check` measures
both caches on every GPU session, so the default can follow the numbers.
`tests/unit/test_cache.py` checks that both give the same tokens, trees and crops included.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

SLOT_DEVICES: tuple[str, ...] = ()     # device types whose decoding writes a preallocated cache by position
MIN_CAPACITY = 256


class SlotLayer(DynamicLayer):
    """One layer's keys and values in a preallocated buffer; `keys` / `values` are views of its first rows."""

    def __init__(self, capacity: int = MIN_CAPACITY):
        super().__init__()
        self.capacity = max(int(capacity), 1)
        self.key_buffer: torch.Tensor | None = None
        self.value_buffer: torch.Tensor | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.key_buffer = self._allocate(key_states, max(self.capacity, key_states.shape[-2]))
        self.value_buffer = self._allocate(value_states, max(self.capacity, value_states.shape[-2]))
        self.keys, self.values = self.key_buffer[..., :0, :], self.value_buffer[..., :0, :]
        self.is_initialized = True

    @staticmethod
    def _allocate(like: torch.Tensor, rows: int) -> torch.Tensor:
        return like.new_empty((*like.shape[:-2], rows, like.shape[-1]))

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, n = self.keys.shape[-2], key_states.shape[-2]
        if start + n > self.key_buffer.shape[-2]:
            self._grow(start + n)
        self.key_buffer[..., start: start + n, :].copy_(key_states)
        self.value_buffer[..., start: start + n, :].copy_(value_states)
        self.keys = self.key_buffer[..., : start + n, :]
        self.values = self.value_buffer[..., : start + n, :]
        return self.keys, self.values

    def _grow(self, rows: int) -> None:
        """Double (at least to `rows`), keeping the filled prefix: the rare step that outgrows the hint."""
        filled = self.keys.shape[-2]
        size = max(rows, 2 * self.key_buffer.shape[-2])
        for name in ("key_buffer", "value_buffer"):
            old = getattr(self, name)
            new = self._allocate(old, size)
            new[..., :filled, :] = old[..., :filled, :]
            setattr(self, name, new)
        self.keys, self.values = self.key_buffer[..., :filled, :], self.value_buffer[..., :filled, :]

    def reset(self) -> None:
        self.key_buffer = self.value_buffer = None
        super().reset()


class SlotCache(DynamicCache):
    """A `DynamicCache` whose layers are `SlotLayer`s of `capacity` rows (prompt + new tokens + the widest tree)."""

    def __init__(self, capacity: int = MIN_CAPACITY):
        super().__init__()
        self.capacity = max(int(capacity), MIN_CAPACITY)
        self.layer_class_to_replicate = self._layer

    def _layer(self) -> SlotLayer:
        return SlotLayer(self.capacity)


CacheFactory = Callable[[Any, int], DynamicCache]     # (device, capacity) -> the base model's cache


def uses_slots(device) -> bool:
    return torch.device(device).type in SLOT_DEVICES


def new_cache(device, capacity: int = MIN_CAPACITY) -> DynamicCache:
    """The base model's cache for decoding on `device` (see the module's docstring for which and why)."""
    return SlotCache(capacity) if uses_slots(device) else DynamicCache()


def draft_view(cache: DynamicCache, rows: int, room: int, dtype: torch.dtype | None = None) -> DynamicCache:
    """A cache holding the first `rows` positions of the base's `cache`, with `room` more preallocated: a drafter
    that shares the base's keys and values extends this one and the base's stays as the verify left it. One copy
    per layer per proposal (a `DynamicLayer` view would be copied again by every draft token's `torch.cat`), in the
    drafter's `dtype` (a bfloat16 quantized copy of a float32 target)."""
    view = DynamicCache()
    view.layers = []
    for layer in cache.layers:
        own = SlotLayer(rows + room)
        if layer.is_initialized and rows:
            own.update(layer.keys[..., :rows, :].to(dtype), layer.values[..., :rows, :].to(dtype))
        view.layers.append(own)
    return view
