"""`verified` counter and the computed hardware-utilization table, on tiny synthetic replay files (no model runs)."""
from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from bpdbench.engine import Counters, Limits, Proposal, replay
from bpdbench.report import hardware, tables

# Tiny model: d 8, 2 layers, 2 heads of 4, 1 KV head, FFN 16, vocab 100 -> 2 * (128 + 64 + 384) + 800 matmul params.
TINY = {"hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
        "intermediate_size": 16, "vocab_size": 100}
P, BPP, D, H, S = 1952, 4, 8, 2, 100   # S: no heads config cached -> min(32768, vocab)
KV_PER_CALL_512 = 2 * 2 * 1 * 4 * 512 * BPP


def counters(**kw) -> dict:
    base = {"new_tokens": 6, "serial_calls": 3, "steps": 2, "drafted": 4, "accepted": 3,
            "accepted_per_head": [2, 1], "hist": [0, 1, 1]}
    return {**base, **kw}


def write_replay(results, tmp_path, task: str = "squad", records: list[dict] | None = None) -> None:
    model = tmp_path / "tiny-model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps(TINY))
    d = results / "replay" / task
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"config": {
        "task": task, "model": str(model), "dtype": "float32", "heads": H, "heads_profile": "quick",
        "heads_path": None, "k": 4}}))
    records = records or [{"id": "a", "new_tokens": 6,
                           "bpd": counters(verified=6),                       # two chain steps of 2 drafts + root
                           "16best-0gram": counters(verified=12),             # same steps, bigger tries
                           "medusa": counters(),                              # old file: no `verified`
                           "ngram4": counters(verified=6),
                           "neural-m": counters(verified=6),
                           "oracle-k16": counters(verified=6)}]
    (d / "replay.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.fixture()
def table(tmp_path, monkeypatch):
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path / "cache"))
    write_replay(tmp_path / "results", tmp_path)
    df = hardware.hardware_table(tmp_path / "results")
    return df[df.task == "squad"].set_index("method")


def test_counters_verified_default_add_and_fallback():
    c = Counters()
    c.record_step(3, 1)                    # chain: 3 drafts + root
    c.record_step(3, 0, verified=7)        # trie of several drafts
    assert c.verified == 11
    assert c.add(c).verified == 22
    old = Counters.from_dict({k: v for k, v in c.to_dict().items() if k != "verified"})
    assert old.verified == c.drafted + c.steps == 8
    assert Counters.from_dict(c.to_dict()).verified == 11


class ThreeDrafts:
    name = "three"

    def reset(self, prompt_ids):
        pass

    def propose(self, ctx):
        return Proposal([[50, 51], [50, 52], [53]])      # trie: root, 50, 51, 52, 53

    def observe(self, tokens):
        pass


def test_replay_counts_trie_nodes():
    n = 7
    c = replay(ThreeDrafts(), [0], list(range(1, n + 1)), None, Limits(100))
    assert c.verified == 5 * c.steps and c.steps == n - 1


def test_ar_row_reads_the_weights_once_per_token(table):
    ar = table.loc["ar"]
    assert hardware.shape_from_config(TINY).linear_params == P
    assert ar.param_GB_per_token * 1e9 == pytest.approx(P * BPP, rel=1e-12)
    assert ar.block_efficiency == 1 and ar.verified_per_call == 1
    assert ar.GFLOPs_per_token * 1e9 == pytest.approx(2 * P, rel=1e-12)
    assert ar["attn_GFLOPs_per_token@2048"] * 1e9 == pytest.approx(4 * 2 * 2 * 4 * 2048, rel=1e-12)


def test_half_the_serial_calls_half_the_kv_bytes(table):
    assert table.loc["ar", "kv_MB_per_token@512"] * 1e6 == pytest.approx(KV_PER_CALL_512, rel=1e-12)
    assert table.loc["bpd", "kv_MB_per_token@512"] == pytest.approx(table.loc["ar", "kv_MB_per_token@512"] / 2)
    assert table.loc["bpd", "block_efficiency"] == 2
    heads_bytes = 2 * (H * (D * D + D) + S * D) * BPP
    assert table.loc["bpd", "param_GB_per_token"] * 1e9 == pytest.approx((3 * P * BPP + heads_bytes) / 6)


def test_more_verified_tokens_more_flops(table):
    drafting = 2 * 2 * (H * D * D + H * S * D)
    assert table.loc["bpd", "GFLOPs_per_token"] * 1e9 == pytest.approx(((6 + 1) * 2 * P + drafting) / 6)
    assert table.loc["16best-0gram", "GFLOPs_per_token"] * 1e9 == pytest.approx(((12 + 1) * 2 * P + drafting) / 6)
    assert table.loc["16best-0gram", "verified_per_call"] == 6 and table.loc["bpd", "verified_per_call"] == 3


def test_missing_verified_falls_back_to_drafted_plus_steps(table):
    assert table.loc["medusa", "GFLOPs_per_token"] == pytest.approx(table.loc["bpd", "GFLOPs_per_token"])
    assert "drafted+steps" in table.loc["medusa", "note"] and "drafted+steps" not in table.loc["bpd", "note"]


def test_rescorers_and_oracle(table):
    from bpdbench.nets.small_lm import SmallLM, make_config
    cfg = make_config("m", S)
    params = SmallLM(cfg, torch.arange(S)).num_params()
    assert hardware.neural_cost("m", S) == (params, cfg.macs_per_token())
    bpd, neural = table.loc["bpd"], table.loc["neural-m"]
    assert (neural.param_GB_per_token - bpd.param_GB_per_token) * 1e9 == pytest.approx(2 * H * params * 4 / 6)
    assert (neural.GFLOPs_per_token - bpd.GFLOPs_per_token) * 1e9 == pytest.approx(2 * H * 2 * cfg.macs_per_token() / 6)
    assert table.loc["ngram4", "GFLOPs_per_token"] == pytest.approx(bpd.GFLOPs_per_token)
    assert "n-gram" in table.loc["ngram4", "note"]
    assert "oracle-k16" not in table.index


def test_all_rows_are_ratios_of_sums(tmp_path, monkeypatch):
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path / "cache"))
    write_replay(tmp_path / "results", tmp_path)
    write_replay(tmp_path / "results", tmp_path, "xsum", [{"id": "b", "new_tokens": 2, "bpd": counters(
        new_tokens=2, serial_calls=2, steps=1, drafted=2, accepted=0, verified=3)}])
    df = hardware.hardware_table(tmp_path / "results").set_index(["task", "method"])
    assert df.loc[("all", "bpd"), "block_efficiency"] == pytest.approx(8 / 5)
    assert df.loc[("all", "bpd"), "kv_MB_per_token@512"] * 1e6 == pytest.approx(5 * KV_PER_CALL_512 / 8)
    assert df.loc[("all", "ar"), "n_examples"] == 2 and ("xsum", "medusa") not in df.index


def test_tables_build_writes_hardware_table_and_pngs(tmp_path, monkeypatch):
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path / "cache"))
    results = tmp_path / "results"
    write_replay(results, tmp_path)
    pd.DataFrame({"task": "squad", "method": ["bpd", "bpd-h1"], "n_examples": 1, "new_tokens": 6,
                  "serial_calls": [3, 4], "block_efficiency": [2.0, 1.5], "relative_change_pct": [0.0, -25.0]}
                 ).to_csv(results / "replay" / "squad" / "replay.csv", index=False)
    (results / "oracle" / "squad").mkdir(parents=True)
    pd.DataFrame({"task": "squad", "method": ["oracle-k1", "oracle-k2"], "k": [1, 2],
                  "block_efficiency": [1.1, 1.2]}).to_csv(results / "oracle" / "squad" / "oracle.csv", index=False)
    (results / "analysis" / "squad").mkdir(parents=True)
    pd.DataFrame({"task": "squad", "head": [1, 2], "mean_entropy": [2.0, 3.0], "h_max": 2}
                 ).to_csv(results / "analysis" / "squad" / "entropy.csv", index=False)
    written = tables.build(results)
    out = results / "tables"
    for name in ("oracle_vs_k.png", "efficiency_vs_heads.png", "entropy.png", "hardware_utilization.csv"):
        assert out / name in written and (out / name).stat().st_size > 0
    assert (out / "oracle_vs_k.png").read_bytes()[:4] == b"\x89PNG"
    md = (out / "hardware_utilization.md").read_text()
    assert "not measured with hardware counters" in md and "param_GB_per_token" in md
    hw = pd.read_csv(out / "hardware_utilization.csv")
    assert set(hw.task) == {"all", "squad"} and hw.method.iloc[0] == "ar"


def test_neural_rescorer_weights_are_read_in_the_recorded_dtype():
    """Replays record `rescorer_dtype` (neural rescorers follow the run dtype); older replays ran them in fp32."""
    shape = hardware.ModelShape(d=8, layers=1, n_heads=1, kv_heads=1, head_dim=8, ffn=16, vocab=16)
    c = Counters(new_tokens=10, serial_calls=5, steps=4, drafted=8, accepted=5, verified=12)
    params = hardware.neural_cost("m", 16)[0]
    fp32 = hardware.totals(c, "neural-m", shape, 2, 2, 16)
    bf16 = hardware.totals(c, "neural-m", shape, 2, 2, 16, rescorer_bpp=2)
    assert fp32["param_bytes"] - bf16["param_bytes"] == c.steps * 2 * params * 2
    assert fp32["flops"] == bf16["flops"]
