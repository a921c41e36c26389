"""KenLM rescoring and training. These tests skip when KenLM is missing, unless BPDBENCH_REQUIRE_KENLM is set
(to anything but "" or "0"): then a missing KenLM fails them, so CI cannot pass by skipping."""
from __future__ import annotations

import itertools
import json
import math
import os
import random

import pytest
import torch

from bpdbench.refine.lattice import build_lattice, kbest_paths, pbest_rescored
from bpdbench.models import sha256_file
from bpdbench.refine import ngram
from bpdbench.refine.base import Lattice

REQUIRE = os.environ.get("BPDBENCH_REQUIRE_KENLM", "") not in ("", "0")
try:
    import kenlm  # noqa: F401

    HAVE_MODULE = True
except ImportError:
    HAVE_MODULE = False


def _have_tools() -> bool:
    try:
        ngram.find_kenlm_tool("lmplz")
        ngram.find_kenlm_tool("build_binary")
        return True
    except ngram.KenLMMissing:
        return False


needs_module = pytest.mark.skipif(not HAVE_MODULE and not REQUIRE,
                                  reason="kenlm module missing (make kenlm; BPDBENCH_REQUIRE_KENLM=1 to fail)")
needs_tools = pytest.mark.skipif(not (HAVE_MODULE and _have_tools()) and not REQUIRE,
                                 reason="KenLM tools missing (make kenlm; BPDBENCH_REQUIRE_KENLM=1 to fail)")

# A trigram over the words 1..4 (5 is out of vocabulary). Not normalised; it only needs to be a valid ARPA with
# back-offs at every order so that KenLM states of length 0, 1 and 2 all occur.
ARPA = """\\data\\
ngram 1=7
ngram 2=7
ngram 3=5

\\1-grams:
-1.0\t<unk>\t0
-99\t<s>\t-0.5
-1.2\t</s>\t0
-0.6\t1\t-0.3
-0.7\t2\t-0.2
-0.8\t3\t-0.25
-0.9\t4\t-0.1

\\2-grams:
-0.3\t1 2\t-0.1
-0.4\t2 3\t-0.2
-0.5\t3 1\t0
-0.2\t2 2\t-0.15
-0.6\t<s> 1\t-0.1
-0.35\t4 1\t-0.05
-0.45\t1 1\t-0.1

\\3-grams:
-0.1\t1 2 3
-0.2\t2 2 3
-0.15\t4 1 2
-0.25\t1 1 2
-0.3\t<s> 1 1

\\end\\
"""


@pytest.fixture
def arpa_scorer(tmp_path):
    path = tmp_path / "tiny.arpa"
    path.write_text(ARPA)
    return ngram.KenLMScorer(path)


def kenlm_continuation_logprob(scorer, context, path):
    """Independent reference: KenLM's own full_scores over context + path from the null context, natural log."""
    words = " ".join(map(str, list(context) + list(path)))
    scores = [s[0] for s in scorer.model.full_scores(words, bos=False, eos=False)]
    return sum(scores[len(context):]) * math.log(10)


def lattice_over(vocab, h, k, seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(h, len(vocab), generator=g) * 1.5
    return build_lattice(logits, k, vocab_ids=torch.tensor(vocab))


@needs_module
def test_kenlm_states_hash_and_compare(arpa_scorer):
    a = arpa_scorer.initial_state([4, 1])
    b = arpa_scorer.initial_state([3, 4, 1])  # same last two words
    c = arpa_scorer.initial_state([2, 1])
    assert a == b and hash(a) == hash(b)
    assert a != c
    assert len({a, b, c}) == 2
    # scoring the same token from equal states gives equal next states
    assert arpa_scorer.score(a, 2)[1] == arpa_scorer.score(b, 2)[1]


@needs_module
@pytest.mark.parametrize("h,seed", [(3, 0), (4, 1), (4, 2)])
@pytest.mark.parametrize("context", [[], [4], [3, 4, 1]])
def test_pbest_with_kenlm_matches_brute_force(arpa_scorer, h, seed, context):
    lat = lattice_over([1, 2, 3, 4, 5], h, 3, seed)
    ids, lps = lat.ids.tolist(), lat.logprobs.double().tolist()
    for alpha in (0.5, 2.0):
        want = []
        for cols in itertools.product(range(3), repeat=h):
            path = [ids[i][j] for i, j in enumerate(cols)]
            s = sum(lps[i][j] for i, j in enumerate(cols))
            want.append((s + alpha * kenlm_continuation_logprob(arpa_scorer, context, path), path))
        want.sort(key=lambda e: e[0], reverse=True)
        for p in (1, 16):
            got = pbest_rescored(lat, p, alpha, arpa_scorer, context, beam=10 ** 6)
            assert [g[1] for g in got] == [w[1] for w in want[:p]]
            assert [g[0] for g in got] == pytest.approx([w[0] for w in want[:p]], abs=1e-4)


@needs_module
def test_ngram_rescorer_interface(tmp_path):
    path = tmp_path / "tiny.arpa"
    path.write_text(ARPA)
    lat = lattice_over([1, 2, 3, 4, 5], 4, 5, 3)
    r = ngram.NgramRescorer("16best-3gram", path, alpha=0.8, p=16, k=3)
    r.reset([1])
    drafts = r.refine(lat, [1, 2])
    assert len(drafts) == 16 and all(len(d) == 4 for d in drafts)
    narrowed = Lattice(ids=lat.ids[:, :3], logprobs=lat.logprobs[:, :3])  # k=3 truncation
    want = pbest_rescored(narrowed, 16, 0.8, r.lm, [1, 2], beam=r.beam)
    assert drafts == [w[1] for w in want]
    r0 = ngram.NgramRescorer("0", path, alpha=0.0, p=4, k=3)
    assert r0.refine(lat, [1, 2]) == [w[1] for w in kbest_paths(narrowed, 4)]


def test_missing_tool_is_one_clear_line(tmp_path, monkeypatch):
    monkeypatch.setenv("KENLM_BIN", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(ngram, "REPO_ROOT", tmp_path)
    with pytest.raises(ngram.KenLMMissing) as e:
        ngram.find_kenlm_tool("lmplz")
    msg = str(e.value)
    assert "lmplz" in msg and "make kenlm" in msg and "\n" not in msg


def _tokenize(s: str) -> list[int]:
    """Deterministic, hash-free ids: one per character."""
    return [ord(c) for c in s if not c.isspace()]


@needs_tools
def test_train_ngram_tiny_corpus(tmp_path):
    rng = random.Random(0)
    words = ["ab", "bc", "cad", "dab", "e", "fa"]
    docs = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) for _ in range(60)]
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs[:40]))
    txt = tmp_path / "c.tokens.txt"
    txt.write_text("\n".join(["", *docs[40:], "   ", ""]))
    out = tmp_path / "lm"
    binary = ngram.train_ngram(3, _tokenize, [jsonl, txt], out, memory="50M", discount_fallback=True)
    assert binary == out / "ngram3.bin" and binary.exists()
    meta = json.loads((out / "ngram3.json").read_text())
    assert meta["order"] == 3 and meta["n_lines"] == 60
    assert meta["n_tokens"] == sum(len(_tokenize(d)) for d in docs)
    assert meta["sha256"] == sha256_file(binary) and len(meta["corpus_files"]) == 2
    assert not list(out.glob(".ngram_tmp_*"))  # temporaries removed

    scorer = ngram.KenLMScorer(binary)
    assert scorer.order == 3
    sent = _tokenize("cad ab fa dab")
    st, total = scorer.initial_state([]), 0.0
    for t in sent:
        lp, st = scorer.score(st, t)
        total += lp
    want = scorer.model.score(" ".join(map(str, sent)), bos=False, eos=False)
    assert total / math.log(10) == pytest.approx(want, abs=1e-4)
    assert total < 0
