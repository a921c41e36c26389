"""The lean forward (nets/lean.py) computes what transformers' Qwen2 computes, on the same weights and caches:
prompt and token-by-token logits, the cache it leaves, the kept layers of a layer-skipped view, a copy of the base's
cache, and the fused q/k/v and gate/up matmuls of a quantized copy (nets/quant.joined) against the separate ones."""
from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from bpdbench.engine.cache import SlotCache, draft_view
from bpdbench.methods.layerskip import skipping
from bpdbench.nets.lean import LeanDecoder, supported
from bpdbench.nets.quant import QuantLinear, joined, quantized_copy


def _model(layers: int = 4):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    model = Qwen2ForCausalLM(cfg).eval().requires_grad_(False)
    model.lm_head.weight.mul_(8.0)
    return model


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return _model()


def _decode(m, prompt: list[int], steps: int, cache) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Prompt logits, then the logits of `steps` greedy tokens fed one at a time on `cache`."""
    with torch.inference_mode():
        first = m(input_ids=torch.tensor([prompt]), past_key_values=cache, use_cache=True).logits[0]
        out, t = [], int(first[-1].argmax())
        for _ in range(steps):
            logits = m(input_ids=torch.tensor([[t]]), past_key_values=cache, use_cache=True, logits_to_keep=1).logits
            out.append(logits[0, -1])
            t = int(logits[0, -1].argmax())
    return first, out


@pytest.mark.parametrize("cache", [DynamicCache, SlotCache])
def test_lean_equals_transformers(model, cache):
    prompt = [3, 17, 5, 60, 2, 9, 41, 7]
    want_first, want = _decode(model, prompt, 6, ref := DynamicCache())
    got_first, got = _decode(LeanDecoder(model), prompt, 6, mine := cache())
    torch.testing.assert_close(got_first, want_first, atol=1e-4, rtol=1e-4)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    assert mine.get_seq_length() == ref.get_seq_length() == len(prompt) + 6
    torch.testing.assert_close(mine.layers[2].keys, ref.layers[2].keys, atol=1e-5, rtol=1e-5)


def test_rows_after_a_cache_see_it_causally(model):
    """Several new rows after a cached prefix (a chain's unseen decided tokens): as transformers masks them."""
    prompt = [3, 17, 5, 60, 2, 9, 41, 7, 30, 31]
    with torch.inference_mode():
        ref, mine = DynamicCache(), SlotCache()
        model(input_ids=torch.tensor([prompt[:6]]), past_key_values=ref)
        LeanDecoder(model)(input_ids=torch.tensor([prompt[:6]]), past_key_values=mine)
        want = model(input_ids=torch.tensor([prompt[6:]]), past_key_values=ref).logits
        got = LeanDecoder(model)(input_ids=torch.tensor([prompt[6:]]), past_key_values=mine).logits
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_kept_layers_equal_the_skipping_view(model):
    """A layer-skipped lean draft reads and writes its kept layers' own cache slots, as methods/layerskip.py's view."""
    prompt = [8, 1, 44, 9, 23]
    want_first, want = _decode(skipping(model, {1, 3}), prompt, 4, DynamicCache())
    got_first, got = _decode(LeanDecoder(model, [0, 2]), prompt, 4, DynamicCache())
    torch.testing.assert_close(got_first, want_first, atol=1e-4, rtol=1e-4)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="layer 0"):
        LeanDecoder(model, [1, 2])


def test_drafting_on_a_copy_of_the_base_cache(model):
    """On engine.cache.draft_view of the target's cache, as `cache=base` drafts: the same logits as transformers',
    and the base's cache untouched."""
    prompt = [5, 6, 7, 8, 50, 51]
    with torch.inference_mode():
        base = DynamicCache()
        model(input_ids=torch.tensor([prompt]), past_key_values=base)
        rows = len(prompt) - 1
        want = model(input_ids=torch.tensor([[prompt[-1]]]), past_key_values=draft_view(base, rows, 2)).logits
        got = LeanDecoder(model)(input_ids=torch.tensor([[prompt[-1]]]), past_key_values=draft_view(base, rows, 2))
    torch.testing.assert_close(got.logits, want, atol=1e-4, rtol=1e-4)
    assert base.get_seq_length() == len(prompt)


@pytest.mark.parametrize("bits", [4, 8])
def test_fused_quantized_layers_equal_separate_ones(model, bits):
    """q, k, v (and gate, up) as one matmul on the same rounded weights: the separate outputs side by side, at one
    row (the matrix-vector kernels) and at a prefill's rows (the dense float32 path)."""
    copy = quantized_copy(model, bits, 32, lambda m: isinstance(m, torch.nn.Linear))
    attn, mlp = copy.model.layers[1].self_attn, copy.model.layers[1].mlp
    for parts in ([attn.q_proj, attn.k_proj, attn.v_proj], [mlp.gate_proj, mlp.up_proj]):
        one = joined(parts)
        assert one is not None and one.kernel == parts[0].kernel
        for rows in (1, 80):
            x = torch.randn(rows, 32).bfloat16()
            torch.testing.assert_close(one(x), torch.cat([p(x) for p in parts], -1), atol=2e-2, rtol=2e-2)
    lean = LeanDecoder(copy)
    assert lean.fused == 2 * len(copy.model.layers)
    prompt = [4, 9, 2, 77, 13]
    want_first, want = _decode(copy, prompt, 4, DynamicCache())
    got_first, got = _decode(lean, prompt, 4, SlotCache())
    assert torch.equal(got_first.argmax(-1), want_first.argmax(-1))
    assert [int(a.argmax()) for a in got] == [int(b.argmax()) for b in want]


@pytest.mark.parametrize("bits", [4, 8])
def test_a_draft_token_s_short_path_computes_the_block_s_numbers(model, bits):
    """A quantized copy's one-row path (`_token`) against the general one (`_block`), token by token on the base's
    cache copy and on its own, the kept layers of a skipping view included: the same logits and keys, bit for bit
    (it drops calls, not arithmetic)."""
    copy = quantized_copy(model, bits, 32, lambda m: isinstance(m, torch.nn.Linear))
    prompt = [4, 9, 2, 77, 13, 5]
    for keep in (None, [0, 2, 3]):
        fast = LeanDecoder(copy, keep)
        slow = LeanDecoder(copy, keep)
        slow.one_row = False
        assert fast.one_row
        for make in (SlotCache, DynamicCache):
            got_first, got = _decode(fast, prompt, 5, mine := make())
            want_first, want = _decode(slow, prompt, 5, ref := make())
            assert torch.equal(got_first, want_first)
            assert all(torch.equal(a, b) for a, b in zip(got, want))
            assert torch.equal(mine.layers[2].keys, ref.layers[2].keys)
            assert torch.equal(mine.layers[3].values, ref.layers[3].values)
    assert not LeanDecoder(model).one_row            # the target's own (dense, unfused) layers: the general path


def test_a_rescored_head_scores_its_top_k_with_the_target_s_rows(model):
    """`rescoring`: at every position the int4 projection's top k hold the target's rows times the draft's hidden
    state (float32), every other token the int4 score, and where the target's choice is among the k the draft makes it;
    with k = the vocabulary the draft's logits are the target's projection of its hidden state. At one row (the short
    path) and over a prompt's rows."""
    copy = quantized_copy(model, 4, 32, lambda m: isinstance(m, torch.nn.Linear))
    lean, w = LeanDecoder(copy), model.lm_head.weight
    seen: list[torch.Tensor] = []
    lean.head = _Seen(copy.lm_head, seen)
    k = 5
    rescored = lean.rescoring(w, None, k)
    everything = lean.rescoring(w, None, 10**6)
    assert everything.head.k == w.shape[0]
    prompt = [4, 9, 2, 77, 13, 5]
    for rows in (prompt, prompt[:1]):
        seen.clear()
        with torch.inference_mode():
            own = lean(torch.tensor([rows])).logits[0].float()
            got = rescored(torch.tensor([rows])).logits[0]
            full = everything(torch.tensor([rows])).logits[0]
        h = seen[0].reshape(-1, w.shape[1]).float()
        exact = h @ w.float().T
        top = own.topk(k, -1).indices
        assert got.dtype == torch.float32
        torch.testing.assert_close(got.gather(1, top), exact.gather(1, top))
        rest = torch.ones_like(got, dtype=torch.bool).scatter_(1, top, False)
        assert torch.equal(got[rest], own[rest])
        torch.testing.assert_close(full, exact)
        found = (top == exact.argmax(-1, keepdim=True)).any(-1)       # where the target's choice is in the top k,
        assert found.any() and torch.equal(got.argmax(-1)[found], exact.argmax(-1)[found])   # the draft makes it


class _Seen(torch.nn.Module):
    """A projection that keeps what it was given (the draft's final hidden states)."""

    def __init__(self, head, seen: list):
        super().__init__()
        self.head, self.seen = head, seen

    def forward(self, x):
        self.seen.append(x.detach().clone())
        return self.head(x)


def test_layers_that_cannot_share_a_kernel_stay_apart(model):
    copy = quantized_copy(model, 8, 32, lambda m: isinstance(m, torch.nn.Linear))
    other = quantized_copy(model, 4, 32, lambda m: isinstance(m, torch.nn.Linear))
    attn = copy.model.layers[0].self_attn
    assert joined([attn.q_proj, other.model.layers[0].self_attn.k_proj]) is None
    scaled = QuantLinear(torch.randn(16, 32), None, 8, in_scale=torch.rand(32) + 0.5)
    assert joined([attn.q_proj, scaled]) is None


def test_unknown_decoders_are_refused_by_name(model):
    assert supported(model) is None
    assert "not a transformers decoder" in supported(torch.nn.Linear(2, 2))
    model.config.model_type, old = "gpt_neox", model.config.model_type
    try:
        with pytest.raises(ValueError, match="gpt_neox"):
            LeanDecoder(model)
    finally:
        model.config.model_type = old

