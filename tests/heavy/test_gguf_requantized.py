"""`qdraft:runtime=gguf,quant=q4_0` on the real model's file: llama.cpp's requantized copy (the whole 0.5B file is
read and rewritten: 8 s on 2 cores of an AMX Xeon, more on a slow runner). Skipped without llama.cpp unless
BPDBENCH_REQUIRE_LLAMACPP=1."""
from __future__ import annotations

from bpdbench import models
from bpdbench.nets import llamacpp


def test_a_requantized_copy_is_made_once_drafts_and_says_what_it_is(llamacpp_runtime, tmp_path):
    """`quant=q4_0`: llama.cpp requantizes the registered file once into the cache (the second call reuses it, and
    no temporary file is left), and the copy drafts the target's text: a smaller file whose top-1 agrees with the
    file it came from on most positions of a greedy continuation."""
    import torch
    source = models.gguf_path(models.MODELS[models.DEFAULT_MODEL])
    copy = llamacpp.requantized(source, "q4_0", tmp_path, threads=2)
    assert copy.stat().st_size < source.stat().st_size and "q4_0" in copy.name
    mtime = copy.stat().st_mtime_ns
    assert llamacpp.requantized(source, "q4_0", tmp_path, threads=2) == copy and copy.stat().st_mtime_ns == mtime
    assert [p.name for p in tmp_path.iterdir()] == [copy.name]
    assert llamacpp.requantized(source, "file", tmp_path, threads=2) == source
    tok = models.load_tokenizer(models.DEFAULT_MODEL)
    ids = torch.tensor([tok("The quick brown fox jumps over the lazy dog. " * 6)["input_ids"]])
    tops = []
    for path in (source, copy):
        lm = llamacpp.LlamaCppLM(path, threads=2)
        tops.append(lm(ids).logits[0].argmax(-1))
        lm.close()
    assert (tops[0] == tops[1]).float().mean() > 0.6
