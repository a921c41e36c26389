"""Heads: Medusa-1 on-disk layout round trip, foreign checkpoints with own projections, training signal."""
from __future__ import annotations

import json

import pytest
import torch

from bpdbench.nets import heads as H
from bpdbench.train import distill, greedy
from bpdbench.train import heads as train_heads


def test_save_load_roundtrip_shared_projection(tmp_path, tiny_model):
    torch.manual_seed(0)
    h = H.Heads(32, 3)
    for p in h.parameters():
        torch.nn.init.normal_(p, std=0.2)
    h.shortlist = torch.tensor([1, 5, 9, 20])
    H.save(h, H.HeadsInfo("tiny", 3, shortlist_size=4), tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["medusa_num_heads"] == 3 and cfg["medusa_num_layers"] == 1 and cfg["base_model_name_or_path"] == "tiny"
    state = torch.load(tmp_path / H.WEIGHTS)
    assert set(state) == {f"{i}.0.linear.{w}" for i in range(3) for w in ("weight", "bias")}
    loaded, _ = H.load(tmp_path, 32)
    x = torch.randn(32)
    assert torch.allclose(loaded.draft_logits(x, 3, tiny_model.lm_head), h.draft_logits(x, 3, tiny_model.lm_head))
    assert loaded.to_token_ids(torch.tensor([2])).item() == 9


def test_medusa_checkpoint_with_own_projections(tmp_path, tiny_model):
    """A published Medusa-1 checkpoint: ModuleList of Sequential(ResBlock, Linear(d, V)), 2 heads."""
    torch.manual_seed(1)
    state = {}
    for i in range(2):
        state[f"{i}.0.linear.weight"] = torch.randn(32, 32) * 0.1
        state[f"{i}.0.linear.bias"] = torch.randn(32) * 0.1
        state[f"{i}.1.weight"] = torch.randn(96, 32)
    torch.save(state, tmp_path / H.WEIGHTS)
    (tmp_path / "config.json").write_text(json.dumps({"medusa_num_heads": 2, "medusa_num_layers": 1,
                                                      "base_model_name_or_path": "x"}))
    heads, _ = H.load(tmp_path, 32)
    x = torch.randn(32)
    z = x + torch.nn.functional.silu(state["1.0.linear.weight"] @ x + state["1.0.linear.bias"])
    expected = state["1.1.weight"] @ z
    assert torch.allclose(heads.draft_logits(x, 2, tiny_model.lm_head)[1], expected, atol=1e-5)


def test_fit_learns_a_shift_rule():
    """Synthetic teacher: head i's target is a fixed linear function of x; the heads' settings of the one fit loop
    must raise agreement."""
    torch.manual_seed(2)
    d, vocab, h, n = 16, 40, 2, 600
    lm_w = torch.randn(vocab, d)
    x = torch.randn(n, d)
    made = []
    for s in range(0, n, 50):
        hid = x[s:s + 50]
        prev = torch.cat([torch.zeros(1, d), hid[:-1]])
        logits = prev @ lm_w.roll(3, 0).T * 3          # teacher at step s depends on x_{s-1}: head 0 can learn it
        lp = torch.log_softmax(logits, -1)
        top_lp, top_ids = lp.topk(greedy.TOPK_TEACHER, -1)
        made.append({"hidden": hid, "next_ids": top_ids[:, 0], "top_ids": top_ids, "top_lp": top_lp,
                     "positions": torch.arange(50), "n_prompt": 0})
    ds = distill.DistillData(**distill.pack(made, hidden_dtype=None), rank=torch.arange(vocab), meta={})
    assert ds.hidden.dtype == torch.float32           # the heads fit on the states as made, not rounded to bf16
    seqs = ds.sequences(list(range(len(made))))
    shortlist = torch.arange(vocab)
    before = train_heads.agreement(lm_w, torch.zeros(h, d, d), torch.zeros(h, d), seqs, shortlist, h)
    prof = train_heads.HeadsProfile(n_prompts=0, gen_tokens=0, steps=150, batch_positions=128, negatives=8, lr=1e-2,
                               num_heads=h)
    w, b, stats = train_heads.fit(lm_w, ds, list(range(len(made))), shortlist, prof, log=lambda m: None)
    after = train_heads.agreement(lm_w, w, b, seqs, shortlist, h)
    assert stats["steps"] == 150 and w.shape == (h, d, d) and b.shape == (h, d)
    assert after["top1"][0] > before["top1"][0] + 0.1
    assert all(0 <= v <= 1 for v in after["top16"])


def test_cli_profiles_match_training_profiles():
    from bpdbench.config import HEAD_PROFILES
    assert set(HEAD_PROFILES) == set(train_heads.PROFILES) | {"init"}


def test_batched_greedy_for_head_training_equals_greedy_decoding(tiny_model):
    """Left-padded batched generation (head-training data) must continue each prompt exactly as greedy decoding."""
    from tests.conftest import decode
    prompts = [[5, 17, 3, 42, 8, 11], [7, 1], [30, 31, 32, 33]]
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    _, hid, lp, top, new = greedy.greedy_batch(tiny_model, ids, mask, 12, torch.tensor([-1]))
    assert hid.shape[:2] == (3, 12) and top.shape == (3, 12, greedy.TOPK_TEACHER)
    for b, p in enumerate(prompts):
        assert new[b].tolist() == decode(tiny_model, p, 12).tokens
    assert torch.all(lp[..., 0] >= lp[..., 1])


def test_rows_that_finish_leave_the_batch_and_the_others_stay_greedy(tiny_model):
    """Finished rows are dropped from the batch (cache rows too); the rows still running must be unaffected."""
    from tests.conftest import decode
    prompts = [[5, 17, 3, 42, 8, 11], [7, 1], [30, 31, 32, 33], [9, 9, 2]]
    caps = [3, 12, 1, 7]
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    stop = torch.tensor([decode(tiny_model, prompts[3], 12).tokens[4]])       # row 3 meets its EOS early
    _, hid, lp, top, new = greedy.greedy_batch(tiny_model, ids, mask, 12, stop, torch.tensor(caps))
    for b, (p, cap) in enumerate(zip(prompts, caps)):
        want = decode(tiny_model, p, 12).tokens[:cap]
        cut = next((j + 1 for j, t in enumerate(want) if t in stop.tolist()), cap)
        assert new[b, :cut].tolist() == want[:cut]
        assert torch.allclose(hid[b, :cut], greedy.greedy_batch(tiny_model, ids[b:b + 1], mask[b:b + 1], cut,
                                                                      torch.tensor([-1]))[1][0], atol=1e-5)


def test_quick_and_full_are_sizes_in_greedy_positions_in_the_fast_dtype():
    """Profiles are defined by data: a seconds budget gave one batch and useless heads where bf16 is emulated."""
    from dataclasses import fields
    quick, full, ci = (train_heads.PROFILES[k] for k in ("quick", "full", "ci"))
    assert quick.greedy_positions >= 12000 and full.greedy_positions >= 2.5 * quick.greedy_positions
    assert quick.gen_dtype == full.gen_dtype == "auto" and ci.gen_dtype == "float32"
    assert "gen_seconds" not in {f.name for f in fields(train_heads.HeadsProfile)}


def test_generation_stops_at_the_positions_target(tiny_model):
    prompts = [([5, 17, 3, 42, 8, 11], 12), ([7, 1], 12), ([30, 31, 32, 33], 12)] * 4
    tok = type("Tok", (), {"pad_token_id": 0})()
    budget = lambda positions: distill.Budget(len(prompts), 12, positions, batch=2)   # noqa: E731
    data = distill.generate(tiny_model, tok, prompts, budget(30), lambda m: None)
    n = [len(q["next_ids"]) - q["n_prompt"] for q in data]
    assert sum(n) >= 30 and sum(n[:-2]) < 30 and len(data) < len(prompts)
    everything = distill.generate(tiny_model, tok, prompts, budget(None), lambda m: None)
    assert len(everything) == len(prompts)


def _flagged_heads(tiny_model_dir, tmp_path, monkeypatch, lines):
    """Heads trained on the tiny model with a profile the data cannot fill and a floor they cannot reach."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import tasks
    from bpdbench.hardware import dtype as dtype_lib
    from bpdbench.train import pacing
    monkeypatch.setattr(dtype_lib, "choose", lambda device="cpu", threads=None, fp=None: dtype_lib.DtypeChoice(
        "float32", "test machine: bfloat16 emulated"))
    monkeypatch.setattr(pacing, "QUALITY_FLOOR", 1.0)
    monkeypatch.setattr(tasks, "default_data_dir", lambda: None)
    prompts = [([5 + i, 17, 3, 42, 8, 11 + i], 10) for i in range(12)]
    monkeypatch.setattr(distill, "prompt_pool", lambda tok, n, max_tokens, seed, gen: prompts[:n])
    profile = train_heads.HeadsProfile(n_prompts=12, gen_tokens=10, steps=10, batch_gen=4, num_heads=4, shortlist=64,
                                  greedy_positions=10**5, gen_dtype="auto", name="ci")
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    return train_heads.train(str(tiny_model_dir), profile, model, tok, log=lines.append, out=tmp_path / "heads")


def test_heads_below_the_floor_warn_and_a_run_with_them_says_and_records_it(tiny_model_dir, tmp_path, monkeypatch):
    import pandas as pd
    from typer.testing import CliRunner

    from bpdbench.cli import app
    from tests.conftest import write_prompts
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path / "cache"))
    lines = []
    out = _flagged_heads(tiny_model_dir, tmp_path, monkeypatch, lines)
    report = json.loads((out / "report.json").read_text())
    assert report["gen_dtype"] == "float32" and report["gen_dtype_reason"].startswith("auto: test machine")
    assert not report["bf16_fit"] and report["truncated_by_time"] is False
    warning = report["quality_warning"]
    assert "below the quality floor" in warning and "the prompt pool ran out" in warning
    assert json.loads((out / "config.json").read_text())["bpdbench"]["training"]["quality_warning"] == warning
    assert any("greedy positions in batches of 4, float32 (auto: test machine" in m for m in lines)
    assert any(m.startswith("WARNING:") and "report.json" in m for m in lines)

    prompts = write_prompts(tmp_path, 3)
    result = CliRunner().invoke(app, [str(a) for a in (
        "run", "--task", "prompts", "--data-file", prompts, "--model", tiny_model_dir, "--heads-path", out,
        "--heads", "4", "--limit", "2", "--max-new-tokens", "8", "--dtype", "float32", "--out", tmp_path / "run")])
    assert result.exit_code == 0, result.output
    said = [m for m in result.output.splitlines() if m.startswith("WARNING:") and warning in m]
    assert len(said) == 1
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["resolved"]["heads"]["quality_warning"] == warning
    row = pd.read_csv(tmp_path / "run" / "summary.csv").iloc[0]
    assert row.quality_warning == warning and row.lossless_rate == 1.0


def test_expected_time_from_a_cached_calibration(monkeypatch):
    """With a calibration cached, the time is predicted before generation and said in one line."""
    import sys
    import types

    from bpdbench.train import pacing
    cal = types.SimpleNamespace(step_ms=50.0, cost=lambda n: 1.0 + n / 16, prefill_tok_per_s=1000.0)
    fake = types.ModuleType("bpdbench.hardware.calibration")
    fake.cached = lambda model, dtype, device, threads: cal if dtype == "float32" else None
    monkeypatch.setitem(sys.modules, "bpdbench.hardware.calibration", fake)
    prompts = [([1] * 100, 100)] * 64
    # 16,000 positions / (16 rows x 100 x FILL) batches, each 100 steps of 2 decode steps + 1,600 prompt tokens
    batches = -(-16000 // (16 * 100 * pacing.FILL))
    assert pacing.predict_seconds("m", "float32", 16000, 16, prompts) == pytest.approx(batches * (10.0 + 1.6))
    assert pacing.predict_seconds("m", "bfloat16", 16000, 16, prompts) is None
    p = pacing.Pacer("quick heads", 16000, print, pacing.predict_seconds("m", "float32", 16000, 16, prompts))
    assert p.header(16, "float32", "auto: emulated") == (
        "quick heads: 16,000 greedy positions in batches of 16, float32 (auto: emulated), expected ~3 min "
        "(calibration)")


def test_the_graph_knows_which_data_each_heads_profile_reads():
    """artefacts/heads.HEADS_DATA says to the graph (which never imports training) what train/heads.PROFILES say."""
    from bpdbench.artefacts.heads import heads_data
    from bpdbench.train.profiles import name_of
    for name, p in train_heads.PROFILES.items():
        assert heads_data(name) == (name_of(p.data) if p.data else f"heads-{name}"), name
    assert train_heads.PROFILES["bench"].clock == "cpu" and train_heads.PROFILES["quick"].clock == "wall"
