"""What one draft token of the target's int4 copy costs on this CPU, and two ways of making it cheaper measured:
`python -m bpdbench.experiments.draftcost` (the registered 0.5B model, about 3 minutes on 2 cores).

Why its own measurement: a self-draft's speedup is tokens per step over the cost of a step, and on a CPU where the
verify of a few rows is dear (no AMX) the draft's share of a step decides whether it pays. This prints, for the
numbers docs/methods.md quotes:
- `path`: the one-row path of nets/lean.py (`LeanDecoder._token`) against the general one, interleaved, at two
  context lengths, with the logits compared (equal bit for bit);
- `parts`: the int4 matmuls alone (the bytes the copy must read) and the attention alone, the floor of a token;
- `vocab`: a draft output projection over the N most frequent tokens of the shared corpus (FR-Spec's idea): how
  often the target's argmax falls outside it, the draft's top-1 agreement with the target and the token's cost, on
  the tune split of Spec-Bench and MT-Bench (never the evaluated prompts);
- `rescore`: the int4 projection's top k rescored by the target's own rows (`qdraft:rescore=k`, nets/lean.py
  RescoredHead): how often the target's argmax is among the int4 top k, the agreement on the same tune prompts,
  and a token's cost against the plain one's, interleaved.
"""
from __future__ import annotations

import argparse
import statistics
from types import SimpleNamespace
from typing import Callable, Iterator

import numpy as np
import torch

from .. import models
from ..hardware import timing
from ..methods import selfdraft
from ..methods.qdraft import GROUP, _is_linear
from ..nets.lean import LeanDecoder
from ..nets.quant import QuantLinear, quantized_copy


class ShortlistHead(torch.nn.Module):
    """An int4 output projection over `ids` only; every other token gets -inf (the draft never proposes it)."""

    def __init__(self, weight: torch.Tensor, ids: torch.Tensor):
        super().__init__()
        self.ids, self.vocab = ids, weight.shape[0]
        self.small = QuantLinear(weight[ids], None, 4, GROUP)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x.new_full((*x.shape[:-1], self.vocab), float("-inf"))
        out[..., self.ids] = self.small(x)
        return out


def _medians(fns: dict[str, Callable[[], object]], reps: int, before: Callable[[str], None] | None = None
             ) -> dict[str, float]:
    """Median ms of each function, after one untimed call each, interleaved by the project's one timer."""
    for name, f in fns.items():
        if before is not None:
            before(name)
        f()
    runs = timing.interleaved(fns, reps, before=before)
    return {k: round(1000 * statistics.median(t for t, _ in v), 2) for k, v in runs.items()}


def _rewinder(cache, n: int) -> Callable[..., None]:
    """An untimed `before` for the timer: the last call's token out of the `n`-token cache again, so every timed
    token sees the same context."""
    def back(_: str = "") -> None:
        if cache.get_seq_length() > n:
            cache.crop(n - cache.get_seq_length())
    return back


@torch.inference_mode()
def path(copy, contexts: tuple[int, ...], reps: int) -> None:
    fast, slow = LeanDecoder(copy), LeanDecoder(copy)
    slow.one_row = False
    for n in contexts:
        cache = fast.new_cache()
        fast(torch.randint(100, 20000, (1, n)), past_key_values=cache)
        x = torch.randint(100, 20000, (1, 1))
        back = _rewinder(cache, n)
        a = fast(x, past_key_values=cache).logits
        back()
        b = slow(x, past_key_values=cache).logits
        back()
        ms = _medians({"one-row": lambda: fast(x, past_key_values=cache),
                       "general": lambda: slow(x, past_key_values=cache)}, reps, back)
        print(f"path  context {n}: {ms} ms per int4 token; logits equal: {torch.equal(a, b)}", flush=True)


@torch.inference_mode()
def parts(copy, context: int, reps: int) -> None:
    lean = LeanDecoder(copy)
    cache = lean.new_cache()
    lean(torch.randint(100, 20000, (1, context)), past_key_values=cache)
    cfg = lean.config
    h = torch.randn(1, cfg.hidden_size, dtype=torch.bfloat16)
    hm = torch.randn(1, cfg.intermediate_size, dtype=torch.bfloat16)
    q = torch.randn(1, lean.heads, 1, lean.head_dim, dtype=torch.bfloat16)

    def matmuls() -> None:
        for l in lean.layers:
            l.rows.qkv(h), l.rows.o(h), l.rows.gate_up(h), l.rows.down(hm)
        lean.head(h)

    def attention() -> None:
        for l in lean.layers:
            layer = cache.layers[l.index]
            torch.nn.functional.scaled_dot_product_attention(q, layer.keys, layer.values, enable_gqa=True)

    for name, ms in _medians({"int4 matmuls": matmuls, "attention": attention}, reps).items():
        print(f"parts context {context}: {name} alone {ms:.2f} ms", flush=True)


def _tune_sets(model, tok, prompts: int, part: str) -> Iterator[tuple[str, list[list[int]], list[torch.Tensor]]]:
    """(benchmark, its first tune prompts, the target's argmax after each of their positions) for Spec-Bench and
    MT-Bench: never the evaluated prompts."""
    for task in ("spec_bench", "mt_bench"):
        env = SimpleNamespace(cfg=SimpleNamespace(task=task, data_dir=None, max_prompt_tokens=2048), tok=tok)
        ids, _, why = selfdraft.split_prompts(env, "tune", prompts)
        if why:
            print(f"{part} {task}: {why}")
            continue
        yield task, ids, selfdraft.greedy_rows(model, ids)


@torch.inference_mode()
def vocab(name: str, model, tok, copy, sizes: tuple[int, ...], prompts: int) -> None:
    from ..artefacts.suffix import SuffixIndex, corpus_file
    tokens = SuffixIndex.load(corpus_file(name)).tokens          # the corpus as SAM's index holds it
    counts = np.bincount(tokens[tokens >= 0], minlength=model.lm_head.weight.shape[0])
    order = np.argsort(-counts, kind="stable")
    print(f"vocab corpus: {int(counts.sum())} tokens, {int((counts > 0).sum())} distinct ids", flush=True)
    for task, ids, ref in _tune_sets(model, tok, prompts, "vocab"):
        every = torch.cat(ref)
        full = LeanDecoder(copy)
        print(f"vocab {task} ({len(ids)} tune prompts, {len(every)} positions): full vocabulary agreement "
              f"{selfdraft.agreement(ref, full, ids):.4f}, {selfdraft.step_ms(full, 512):.2f} ms", flush=True)
        for n in sizes:
            short = LeanDecoder(copy)
            short.head = ShortlistHead(model.lm_head.weight, torch.tensor(np.sort(order[:n]), dtype=torch.long))
            covered = torch.isin(every, short.head.ids).float().mean().item()
            print(f"vocab {task} top {n}: argmax covered {covered:.4f}, agreement "
                  f"{selfdraft.agreement(ref, short, ids):.4f}, {selfdraft.step_ms(short, 512):.2f} ms", flush=True)


@torch.inference_mode()
def rescore(model, tok, copy, ks: tuple[int, ...], prompts: int, reps: int) -> None:
    plain = LeanDecoder(copy)
    head = model.get_output_embeddings()
    drafts = {k: plain.rescoring(head.weight, head.bias, k) for k in ks}
    for task, ids, ref in _tune_sets(model, tok, prompts, "rescore"):
        n = sum(len(r) for r in ref)
        covered = dict.fromkeys(ks, 0)
        for p, want in zip(ids, ref):                   # is the target's argmax among the int4 projection's top k?
            top = plain(torch.tensor([p])).logits[0].topk(max(ks), -1).indices
            for k in ks:
                covered[k] += int((top[:, :k] == want[:, None]).any(-1).sum())
        got = {"int4 head": selfdraft.agreement(ref, plain, ids)}
        got.update({f"top {k} rescored": selfdraft.agreement(ref, d, ids) for k, d in drafts.items()})
        print(f"rescore {task} ({len(ids)} tune prompts, {n} positions): target's argmax in the int4 top k "
              f"{ {k: round(c / n, 4) for k, c in covered.items()} }; agreement "
              f"{ {k: round(v, 4) for k, v in got.items()} }", flush=True)
    cache = plain.new_cache()
    plain(torch.randint(100, 20000, (1, 700)), past_key_values=cache)
    x = torch.randint(100, 20000, (1, 1))
    back = _rewinder(cache, 700)
    fns = {"int4 head": lambda: plain(x, past_key_values=cache)}
    fns.update({f"top {k} rescored": (lambda d=d: d(x, past_key_values=cache)) for k, d in drafts.items()})
    print(f"rescore context 700: {_medians(fns, reps, back)} ms per int4 token", flush=True)


def main() -> None:
    from ..hardware.fingerprint import current
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen2.5-coder-0.5b")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--parts", default="path,parts,vocab,rescore")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    model, tok = models.load(a.model, a.dtype)
    fp = current(a.threads)
    print(f"{fp.cpu} ({' '.join(fp.flags)}), "
          f"fingerprint {fp.key()}, {model.dtype}, {a.threads} threads, torch {torch.__version__}", flush=True)
    copy = quantized_copy(model, 4, GROUP, _is_linear)
    want = a.parts.split(",")
    if "path" in want:
        path(copy, (150, 700), 150)
    if "parts" in want:
        parts(copy, 700, 40)
    if "vocab" in want:
        vocab(a.model, model, tok, copy, (16384, 32768, 65536), 8)
    if "rescore" in want:
        rescore(model, tok, copy, (2, 4, 8, 16), 8, 150)


if __name__ == "__main__":
    main()
