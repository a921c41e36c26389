"""eagle3 (nets/eagle3.py) beyond what every draft network is tested for (test_drafters.py, test_dyntree.py,
test_compose.py): its record and report say EAGLE-3's recipe, its passes are weighted 0.8^(p-1), it trains on prefill
data that keeps its layers at quick and bench and refuses a profile without them in one line, and at T > 0 its
chain and dynamic tree sample what AR sampling samples (the two-sample test of `bpdbench certify`, with the lossy
always-accept control that must be rejected)."""
from __future__ import annotations

import json

import pytest
import torch

from bpdbench.config import RunConfig
from bpdbench.engine import Layers, Limits, SamplingParams, SpeculativeSampling, generate
from bpdbench.methods import Env, parse
from bpdbench.nets import registry
from bpdbench.stats import holm, homogeneity
from tests.unit.test_drafters import tiny  # noqa: F401 (the trained tiny drafters, one fixture)

PROMPT = [5, 17, 3, 42, 8, 11]


def test_the_record_and_report_say_eagle3s_recipe(tiny):
    model, _, _, _, folders = tiny
    spec = registry.get("eagle3")
    assert spec.objective == "unrolled" and (spec.defaults.unroll, spec.defaults.decay) == (7, 0.8)
    assert spec.defaults.feature_weight == 0.0                 # EAGLE-3 drops EAGLE's feature regression
    report = json.loads((folders["eagle3"] / "report.json").read_text())
    assert report["drafter"] == "eagle3" and report["data"]["kind"] == "prefill"
    assert report["family"]["decay"] == 0.8 and report["family"]["unroll"] == 7
    config = json.loads((folders["eagle3"] / "config.json").read_text())
    n = model.config.num_hidden_layers
    assert tuple(config["dims"]["layers"]) == Layers.low_mid_high(n).indices


def test_each_pass_is_weighted_as_eagle3_weights_its_steps(tiny, monkeypatch):
    from bpdbench.nets.checkpoint import load
    from bpdbench.train import prefill
    from bpdbench.train.objectives import DistillRows, objective
    model, _, name, cache, folders = tiny
    monkeypatch.setenv("BPDBENCH_CACHE", str(cache))
    ds = prefill.load(prefill.path_for(name, "prefill-ci"))
    m, _ = load(folders["eagle3"], model.model.embed_tokens.weight, model.lm_head.weight)
    m.train().requires_grad_(True)
    rows = DistillRows.of(ds, m.hidden_layers)
    obj = objective("unrolled", m, 3, unroll=4, decay=0.8)
    pred = obj.batch(rows, list(range(len(ds.n_prompt))), 4, 3.0, torch.Generator().manual_seed(0))
    assert set(pred.depth.tolist()) == {1, 2, 3, 4}
    greedy = 1.0 + 2.0 * rows.greedy[pred.target].float()
    assert torch.allclose(pred.weight, greedy * 0.8 ** (pred.depth - 1).float())
    assert objective("unrolled", m, 3, unroll=4).batch(rows, list(range(len(ds.n_prompt))), 4, 3.0,
                                                       torch.Generator().manual_seed(0)).weight is None
    with pytest.raises(ValueError, match="trains no passes"):
        objective("positional", m, 3, decay=0.8)


def test_its_passes_grow_from_one_to_seven_over_the_budget(tiny, tmp_path, monkeypatch):
    """The ramp (FitDefaults.ramp): a CPU fit of hours trains depth 1 first, then on its own drafts up to EAGLE-3's
    7 passes; at equal CPU on prefill-quick data it drafted better than 7 passes from the start (docs/methods.md)."""
    from dataclasses import replace
    from bpdbench.train import network, objectives
    from tests.drafter_fixtures import tiny_prefill
    model, tok, name, cache, _ = tiny
    monkeypatch.setenv("BPDBENCH_CACHE", str(cache))
    assert registry.get("eagle3").defaults.ramp and not registry.get("eagle").defaults.ramp
    seen, real = [], objectives.Sequential.batch
    monkeypatch.setattr(objectives.Sequential, "batch", lambda self, *a: seen.append(self.unroll) or real(self, *a))
    network.train("eagle3", replace(network.PROFILES["ci"], steps=8, data=tiny_prefill()), name, model, tok,
                  log=lambda m: None, out=tmp_path / "ramped")
    assert seen == [1, 1, 2, 3, 4, 5, 6, 7]
    report = json.loads((tmp_path / "ramped" / "report.json").read_text())
    assert report["fit_config"]["ramp"] and report["family"]["ramp"]


def test_it_trains_on_prefill_data_that_keeps_its_layers():
    from bpdbench.methods import trained
    from bpdbench.train import network
    eagle3, eagle = registry.get("eagle3"), registry.get("eagle")
    assert network.data_for(eagle3, network.PROFILES["quick"]).data == "prefill-quick"
    assert network.data_for(eagle3, network.PROFILES["bench"]).data == "prefill-bench"
    assert network.data_for(eagle, network.PROFILES["quick"]).data == "quick"
    from bpdbench.train.prefill import BUDGETS
    assert BUDGETS["prefill-quick"].layers == "low-mid-high"
    assert BUDGETS["prefill-ci"].layers == "low-mid-high"
    for profile, data in (("quick", "prefill-quick"), ("bench", "prefill-bench"), ("ci", "prefill-ci")):
        cfg = RunConfig(model="none", heads_profile=profile)
        assert trained.data_of(parse("eagle3"), cfg) == data
        assert trained.data_of(parse("eagle"), cfg) == network.PROFILES[profile].data
    with pytest.raises(ValueError, match="eagle3 reads the base's layers"):
        network.check("eagle3", "full", 0.0)


def test_auto_sizes_it_as_it_sizes_eagle():
    """tree=auto, depth=auto and a dynamic tree's nodes=auto search its shapes with the draft networks' one search
    (methods/trained.SEARCH), and the board lists it among the trained rows."""
    from bpdbench.methods import trained
    from bpdbench.report.board import TRAINED
    assert parse("eagle3:tree=auto").auto == ["tree"] and parse("eagle3:depth=auto").auto == ["depth"]
    assert parse("eagle3:tree=dynamic,nodes=auto").auto == ["nodes"]
    assert parse("eagle3").spec.shapes is trained.SEARCH is parse("eagle").spec.shapes
    assert "eagle3" in TRAINED


@pytest.mark.parametrize("spelling", ["eagle3", "eagle3:tree=dynamic,nodes=12,topk=3"])
def test_sampling_is_certified_and_the_lossy_control_is_not(tiny, monkeypatch, spelling):
    """Per position of the first 3 generated tokens, a chi-square homogeneity test of 300 seeded runs of the method
    against 300 of AR sampling (Holm over the positions at 0.01, as `bpdbench certify`): exact passes, the
    always-accept rule, which keeps every draft, is rejected."""
    model, tok, name, cache, _ = tiny
    monkeypatch.setenv("BPDBENCH_CACHE", str(cache))
    env = Env(model, tok, RunConfig(model=name), Limits(3), log=lambda m: None)
    method = parse(spelling)
    drafter = env.build(method)
    params, n, positions = SamplingParams(temperature=1.0), 300, 3

    def draws(d, rule: str, offset: int) -> list[list[int]]:
        return [generate(model, d, list(PROMPT), Limits(positions), SpeculativeSampling(params, offset + s, rule)
                         ).tokens for s in range(n)]
    ar = draws(None, "exact", 0)
    verdict = {}
    for rule in ("exact", "always-accept"):
        mine = draws(drafter, rule, 10_000)
        p = [homogeneity([o[i] for o in ar], [o[i] for o in mine]).p_value for i in range(positions)]
        verdict[rule] = any(holm(p, 0.01))
    assert verdict == {"exact": False, "always-accept": True}, verdict
