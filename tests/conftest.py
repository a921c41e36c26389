"""Shared fixtures: tiny random models for decoding logic (fast, fp32, deterministic)."""
from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def make_tiny_model(vocab: int = 96, seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=False)
    model = Qwen2ForCausalLM(cfg).eval().requires_grad_(False)
    # Sharpen the output so greedy continuations are varied rather than one repeated token.
    model.lm_head.weight.mul_(8.0)
    return model


@pytest.fixture(scope="session")
def tiny_model():
    torch.set_num_threads(1)
    return make_tiny_model()
