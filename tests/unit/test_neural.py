"""Local neural rescoring: the small LM (cache = full scoring, training, save/load) and the greedy rescorer."""
from __future__ import annotations

import json

import pytest
import torch

from bpdbench.train.rescorer import train_lm, train_neural
from bpdbench.refine.base import Lattice
from bpdbench.nets.small_lm import KVCache, SmallLM, SmallLMConfig, load_lm, make_config, save_lm
from bpdbench.refine.neural import NeuralRescorer

SHORTLIST = torch.arange(0, 200, 2)  # even ids only: odd ids are "outside the shortlist"


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models: thread sync costs more than it saves, and the suite must not fight other jobs for cores."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def tiny_lm(seed: int = 0, max_len: int = 64) -> SmallLM:
    torch.manual_seed(seed)
    cfg = SmallLMConfig(d_model=32, n_layers=2, n_heads=2, d_ff=64, shortlist_size=len(SHORTLIST), max_len=max_len)
    lm = SmallLM(cfg, SHORTLIST).eval()
    with torch.no_grad():
        lm.emb.weight.mul_(20.0)  # sharper random LM: distinct preferences among candidates
    return lm


def random_lattice(h: int, k: int, seed: int) -> Lattice:
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([SHORTLIST[torch.randperm(len(SHORTLIST), generator=g)[:k]] for _ in range(h)])
    lp = torch.log_softmax(torch.randn(h, k, generator=g), -1).sort(-1, descending=True).values
    return Lattice(ids=ids, logprobs=lp)


def reference_refine(lm: SmallLM, lattice: Lattice, window: list[int], alpha: float) -> list[int]:
    """Naive local rescoring: full recompute, normalised log-probs over the shortlist at every position."""
    draft: list[int] = []
    for i in range(lattice.ids.shape[0]):
        x = lm.cols(torch.tensor([window + draft]))
        logp = torch.log_softmax(lm.logits(lm(x))[0, -1].float(), -1)
        score = lattice.logprobs[i] + alpha * logp[lm.cols(lattice.ids[i])]
        draft.append(int(lattice.ids[i, int(score.argmax())]))
    return draft


def test_sizes_scale_with_target_compute():
    pct = [make_config(s, 32768).macs_per_token() / 493_961_216 for s in ("s", "m", "l")]
    assert [round(100 * p) for p in pct] == [2, 4, 6]


def test_incremental_scoring_equals_full_sequence():
    lm = tiny_lm()
    ids = torch.randint(0, 220, (1, 40), generator=torch.Generator().manual_seed(1))  # includes <unk> ids
    with torch.no_grad():
        full = lm(lm.cols(ids))
        cache = KVCache(lm.cfg, 64, torch.device("cpu"), torch.float32)
        parts = [lm(lm.cols(ids[:, a:b]), cache) for a, b in ((0, 17), (17, 18), (18, 30), (30, 31), (31, 40))]
    assert cache.length == 40
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-5, rtol=1e-5)


def test_training_lowers_loss_on_repetitive_stream():
    lm = tiny_lm()
    pattern = [4, 10, 22, 8, 30, 16, 2, 44, 6]
    stream = torch.tensor(pattern * 120)
    stats = train_lm(lm, stream, seconds=60, batch=8, lr=5e-3, warmup=5, max_steps=30, log=lambda m: None)
    assert stats["steps"] == 30
    first, last = sum(stats["losses"][:5]) / 5, sum(stats["losses"][-5:]) / 5
    assert last < 0.3 * first


def test_alpha_zero_is_top1_path():
    r = NeuralRescorer("neural", tiny_lm(), alpha=0.0, k=16)
    r.reset([1, 2, 3])
    for seed in range(3):
        lat = random_lattice(8, 16, seed)
        assert r.refine(lat, [2, 4, 6, 8, 10 + 2 * seed]) == [lat.ids[:, 0].tolist()]


def test_large_alpha_picks_lm_preferred_candidate():
    lm = tiny_lm()
    context = [6, 8, 10, 12]
    with torch.no_grad():
        logp = lm.logits(lm(lm.cols(torch.tensor([context]))))[0, -1]
    favourite = int(SHORTLIST[int(logp.argmax())])
    others = [int(t) for t in SHORTLIST if int(t) != favourite][:15]
    ids = torch.tensor([others + [favourite]] + [list(range(0, 32, 2))] * 3)  # LM favourite has the worst head score
    lp = torch.linspace(-1, -6, 16).expand(4, 16).clone()
    lat = Lattice(ids=ids, logprobs=lp)
    r = NeuralRescorer("neural", lm, alpha=1e4, k=16)
    r.reset(context)
    draft = r.refine(lat, context)[0]
    assert draft[0] == favourite
    assert draft == reference_refine(lm, lat, context, 1e4)


@pytest.mark.parametrize("alpha", [0.3, 1.0, 5.0])
def test_matches_naive_local_rescoring(alpha):
    lm = tiny_lm()
    r = NeuralRescorer("neural", lm, alpha=alpha, k=12)
    ctx = [0, 2, 5, 8, 12]  # 5: out of shortlist, read as <unk>
    for step in range(5):
        lat = random_lattice(6, 16, 10 + step)
        short = Lattice(ids=lat.ids[:, :12], logprobs=lat.logprobs[:, :12])
        assert r.refine(lat, ctx) == [reference_refine(lm, short, ctx, alpha)]
        ctx = ctx + [int(t) for t in lat.ids[: 1 + step % 3, 0]] + [14]


def test_cache_reused_across_calls_and_reset():
    r = NeuralRescorer("neural", tiny_lm(), alpha=1.0, k=16)
    h, ctx = 8, list(range(0, 40, 2))
    r.reset(ctx)
    r.refine(random_lattice(h, 16, 0), ctx)
    assert r.ctx_tokens == len(ctx) and 1 <= r.forwards <= h
    ctx2 = ctx + [50, 52, 54]
    r.refine(random_lattice(h, 16, 1), ctx2)
    assert r.ctx_tokens == len(ctx2) and r.forwards <= 2 * h  # only the 3 new tokens were encoded
    assert r.state.length() == len(ctx2)  # draft rolled back
    r.reset(ctx2)
    r.refine(random_lattice(h, 16, 2), ctx2)
    assert r.ctx_tokens == 2 * len(ctx2)  # reset drops the cache
    r.refine(random_lattice(h, 16, 3), [4] + ctx2)  # not an extension: recompute
    assert r.ctx_tokens == 3 * len(ctx2) + 1


def test_one_forward_per_step_when_lm_agrees():
    r = NeuralRescorer("neural", tiny_lm(), alpha=0.0, k=16)
    ctx = [2, 4, 6]
    for step in range(4):
        r.refine(random_lattice(8, 16, step), ctx)
        ctx = ctx + [8, 10]
    assert r.forwards == 4 and r.ctx_tokens == len(ctx) - 2


def test_window_stays_bounded_and_matches_reference():
    lm = tiny_lm(max_len=32)
    r = NeuralRescorer("neural", lm, alpha=2.0, k=16)
    ctx: list[int] = [2]
    for step in range(30):
        lat = random_lattice(4, 16, step)
        out = r.refine(lat, ctx)
        assert r.state.length() <= 32 - 3 and r._window == ctx[-len(r._window):]
        assert out == [reference_refine(lm, lat, r._window, 2.0)]
        ctx = ctx + [2 * (step % 50), 2 * ((step * 7) % 50)]
    assert len(r._window) < len(ctx) - 2


def test_save_load_roundtrip(tmp_path):
    lm = tiny_lm(seed=3)
    save_lm(lm, tmp_path / "lm")
    back = load_lm(tmp_path / "lm")
    assert back.cfg == lm.cfg and torch.equal(back.shortlist, SHORTLIST)
    x = lm.cols(torch.tensor([[0, 2, 3, 40, 198, 500]]))
    with torch.no_grad():
        torch.testing.assert_close(back(x), lm(x))
    lat = random_lattice(5, 16, 7)
    a = NeuralRescorer("n", lm, alpha=1.0).refine(lat, [2, 4])
    assert NeuralRescorer("n", tmp_path / "lm", alpha=1.0).refine(lat, [2, 4]) == a


def test_train_neural_end_to_end(tmp_path):
    corpus = tmp_path / "c.jsonl"
    pattern = "4 10 22 8 30 16 2 44 6 7"  # 7 is outside the shortlist: an ignored target
    corpus.write_text("".join(json.dumps({"text": " ".join([pattern] * 30)}) + "\n" for _ in range(40)))
    out = train_neural("tiny", "toy", shortlist=SHORTLIST, out=tmp_path / "neural", minutes=1, log=lambda m: None,
                       tokenize=lambda s: [int(w) for w in s.split()], corpus_files=[corpus], sep_id=0,
                       batch=8, lr=5e-3, max_steps=30)
    rep = json.loads((out / "report.json").read_text())
    assert rep["steps"] == 30 and rep["heldout_ppl"] < 10.0 and rep["shortlist_coverage"] < 1.0
    assert rep["params"] == load_lm(out).num_params()


def test_missing_shortlist_is_one_line_error(tmp_path, monkeypatch):
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="bpdbench train-heads"):
        train_neural("s", minutes=0)


def test_hf_causal_lm_backend_matches_naive_rescoring():
    """A Hugging Face LM over the target's vocabulary (the registry's `hf:<model>` rescorers) takes the same path."""
    from conftest import make_tiny_model

    model = make_tiny_model(vocab=96, seed=1)
    r = NeuralRescorer("hf", model, alpha=1.5, k=8, max_len=32)
    ctx, g = [3, 7, 11], torch.Generator().manual_seed(5)
    for step in range(20):
        ids = torch.stack([torch.randperm(96, generator=g)[:8] for _ in range(4)])
        lat = Lattice(ids=ids, logprobs=torch.randn(4, 8, generator=g).sort(-1, descending=True).values)
        out = r.refine(lat, ctx)
        assert r.state.length() <= 32 - 3 and r._window == ctx[-len(r._window):]
        draft: list[int] = []
        for i in range(4):  # naive: full forward over the window the rescorer holds + draft so far
            with torch.no_grad():
                logp = torch.log_softmax(model(torch.tensor([r._window + draft])).logits[0, -1], -1)
            draft.append(int(ids[i, int((lat.logprobs[i] + 1.5 * logp[ids[i]]).argmax())]))
        assert out == [draft]
        ctx = ctx + [int(ids[0, 0]), 5 + step]
    assert len(r._window) < len(ctx) - 2  # the window was rebuilt at least once
