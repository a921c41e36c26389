"""docs/draft-networks.md, "Adding a network": the page's toy network, taken from the page as it stands, added in at
most 3 files, trained for a few steps on the tiny model from teacher-forced prefill data that keeps the layers it
declares, then decoded with: lossless, with replay counting what decoding counted.

The page names each file above its code (``File: `path` (new)`` or ``(edit)``). The new module is written to a
temporary file and imported under the package, as the registry's import would (the package itself is never
written); the registry edit must be BUILTIN with the new name added, and the test registers the module as that
edit does. The recipe end to end is the test below it: shards, a resumed build, a few fit steps, and a report
that records positions, sources, seconds and held-out top-1 per depth at its checkpoints."""
from __future__ import annotations

import ast
import importlib.util
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from bpdbench.engine import Limits
from tests import helpers
from tests.helpers import decode_and_replay

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "draft-networks.md"


def page_files() -> dict[str, tuple[str, str]]:
    """The files the page's "Adding a network" section has a user create or edit: path -> (mode, code)."""
    text = PAGE.read_text()
    return helpers.page_files(text[text.index("### Adding a network"):].split("\n## ")[0].splitlines())


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """The page's network imported under the package and registered as the page's edit registers it; its method
    added as methods/registry does at import. Both registries are restored afterwards."""
    from bpdbench.methods import REGISTRY
    from bpdbench.methods.registry import register_networks
    from bpdbench.nets import registry
    files = page_files()
    assert 1 <= len(files) <= 3, f"the page adds a network in {len(files)} files"
    (path, (_, code)), = [(p, f) for p, f in files.items() if f[0] == "new"]
    (edit_path, (_, edit)), = [(p, f) for p, f in files.items() if f[0] == "edit"]
    name = Path(path).stem
    assert edit_path == "bpdbench/nets/registry.py"
    builtin = ast.literal_eval(edit.split("=", 1)[1].strip())
    assert builtin == (*registry.BUILTIN, name), "the page's edit is BUILTIN with the new module added"
    registry.networks()                                         # the package's own first
    monkeypatch.setattr(registry, "_SPECS", dict(registry._SPECS))
    file = tmp_path / f"{name}.py"
    file.write_text(code)
    spec = importlib.util.spec_from_file_location(f"bpdbench.nets.{name}", file)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    monkeypatch.setattr(registry, "BUILTIN", builtin)
    monkeypatch.setitem(REGISTRY, name, None)                  # undone: the method leaves the registry again
    del REGISTRY[name]
    register_networks()
    return name


def tiny_data(monkeypatch, cache: Path, model, tok, model_name: str):
    """The tiny model's prefill data budget (its low, middle and high layers kept) in a cache of the test's own,
    whose greedy distillation data (synthetic prompts) gives the `greedy` source: the random tiny model's argmax
    rarely agrees with real text, its own continuations always do."""
    from bpdbench.train import distill, prefill
    from tests.drafter_fixtures import synthetic_prompts
    monkeypatch.setenv("BPDBENCH_CACHE", str(cache))
    with monkeypatch.context() as mp:
        mp.setattr(distill, "prompt_pool", synthetic_prompts)
        mp.setattr("tasks.default_data_dir", lambda: None)
        distill.build(model_name, replace(distill.BUDGETS["ci"], n_prompts=24, gen_tokens=32), model, tok,
                      log=lambda m: None)
    return replace(prefill.BUDGETS["prefill-ci"], positions=768, chunk=48, shard_positions=200,
                   layers="low-mid-high", sources=("greedy", "train", "corpus"))


def test_the_page_s_network_trains_on_prefill_data_and_decodes_losslessly(toy, loaded, tiny_model_dir, tmp_path,
                                                                         monkeypatch):
    from bpdbench import paths
    from bpdbench.methods import contract, parse
    from bpdbench.nets.checkpoint import load as load_drafter
    from bpdbench.methods.trained import drafter_for
    from bpdbench.train import network
    model, tok = loaded
    model_name = str(tiny_model_dir)
    data = tiny_data(monkeypatch, tmp_path / "cache", model, tok, model_name)
    profile = replace(network.PROFILES["ci"], steps=60, depth=3, data=data)
    out = network.train(toy, profile, model_name, model, tok, log=lambda m: None)
    report = network.read_report(out)
    assert report["drafter"] == toy and report["positions"] == 768 and report["family"]["objective"] == "positional"
    assert report["positions_per_sample"] == 1          # the learning curve's x: a positional fit's sample is a row
    assert len(report["heldout"]["top1"]) == 3 and report["heldout"]["positions"] > 0
    assert report["data"]["kind"] == "prefill" and report["data"]["sources"]["greedy"] > 0
    curve = report["fit"]["validation"]
    assert len(curve) >= 2 and all(len(c["heldout_top1"]) == 3 and "seconds" in c for c in curve)
    assert out == paths.network_dir(model_name, toy, "ci")
    assert contract.Input.LAYERS in contract.inputs(parse(toy))          # its record declares layers
    drafter_model, _ = load_drafter(out, model.model.embed_tokens.weight, model.lm_head.weight)
    n = model.config.num_hidden_layers
    assert drafter_model.hidden_layers.indices == (min(2, n), n // 2, max(n - 3, 0))
    drafter = drafter_for(toy, drafter_model, 3)
    assert contract.Input.LAYERS in contract.takes(drafter)
    prompt = tok("The quick brown fox jumps over the lazy dog. ", add_special_tokens=False)["input_ids"]
    real = decode_and_replay(model, drafter, prompt, Limits(40), features=True,
                             layer_states=_layers(model, prompt, drafter_model.hidden_layers, 40))
    assert real.counters.drafted > 0
    tree = drafter_for(toy, drafter_model, 3, tree=2)
    decode_and_replay(model, tree, prompt, Limits(40), features=True,
                      layer_states=_layers(model, prompt, drafter_model.hidden_layers, 40))


def _layers(model, prompt, layers, max_new):
    """The replay's layer states, from the greedy output's teacher-forced forward."""
    from bpdbench.engine import generate, teacher_forced_layers
    greedy = generate(model, None, list(prompt), Limits(max_new)).tokens
    return teacher_forced_layers(model, prompt, greedy, layers.indices, with_prompt=True)[1]


def test_prefill_data_is_sharded_resumable_and_records_what_it_saw(loaded, tiny_model_dir, tmp_path, monkeypatch):
    import tasks
    from bpdbench.engine import Layers
    from bpdbench.train import prefill
    model, tok = loaded
    model_name = str(tiny_model_dir)
    b = tiny_data(monkeypatch, tmp_path / "cache", model, tok, model_name)
    real_forward = prefill.forward
    out = prefill.path_for(model_name, b.name)
    partial = out.with_name(out.name + ".partial")

    def killed_after_a_shard(*args):              # the process dies in the forward after a shard was written
        if list(partial.glob("shard-*.json")):
            raise KeyboardInterrupt
        return real_forward(*args)
    monkeypatch.setattr(prefill, "forward", killed_after_a_shard)
    with pytest.raises(KeyboardInterrupt):
        prefill.build(model_name, b, model, tok, log=lambda m: None)
    done = prefill._records(partial)
    assert done and not (prefill.path_for(model_name, b.name) / "meta.json").exists()
    monkeypatch.setattr(prefill, "forward", real_forward)
    logs: list[str] = []
    prefill.build(model_name, b, model, tok, log=logs.append)
    assert any(line.startswith(f"resuming the '{b.name}' data: 1 shards") for line in logs)
    assert not partial.exists()
    ds = prefill.load(prefill.path_for(model_name, b.name))
    meta = ds.meta
    assert meta["positions"] == ds.hidden.shape[0] == 768 and meta["shards"] >= 3
    assert set(meta["sources"]) == {"greedy", "train", "corpus"} and sum(meta["sources"].values()) == 768
    assert meta["greedy_data"] == ["ci"] and meta["model"] == model_name
    assert meta["layers"] == list(Layers.low_mid_high(model.config.num_hidden_layers).indices)
    assert ds.layers.shape == (768, 3, ds.d) and meta["dtype"] == meta["hidden_dtype"] == "float32"
    assert int(ds.greedy.sum()) == meta["greedy_positions"] > 0
    assert torch.equal(ds.greedy, ds.next_ids == ds.top_ids[:, 0])
    # the stored states are those whose projection gave the stored top-8 (one forward, kept in its dtype)
    with torch.inference_mode():
        assert torch.equal(model.lm_head(ds.hidden[:64]).argmax(-1), ds.top_ids[:64, 0])
    # only the train split of any task
    seen = meta["seen"]
    assert seen["split"] == "train"
    for task_name, group in seen["ids"].items():
        task = tasks.get_task(task_name)
        train = {ex.id for ex in tasks.splits(task, tasks.load_examples(task, tasks.default_data_dir()))["train"]}
        assert set(group) <= train, task_name
    held, kept = ds.split(held_out=True), ds.split(held_out=False)
    assert held and kept and not {int(ds.units[s]) for s in held} & {int(ds.units[s]) for s in kept}


def test_every_trainer_trains_from_prefill_data(loaded, tiny_model_dir, tmp_path, monkeypatch):
    """Each objective (positional, unrolled, prefix) and the blockwise heads fit a few steps on the same prefill data
    and score held-out agreement on it; the reports say which data they saw."""
    from bpdbench.train import heads, network
    model, tok = loaded
    model_name = str(tiny_model_dir)
    data = replace(tiny_data(monkeypatch, tmp_path / "cache", model, tok, model_name), layers=())
    profile = replace(network.PROFILES["ci"], steps=4, depth=2, data=data)
    for name in ("medusa", "eagle", "hydra++"):
        report = network.read_report(network.train(name, profile, model_name, model, tok, log=lambda m: None))
        assert report["data"]["kind"] == "prefill" and report["positions"] == 768, name
        assert report["fit"]["steps"] == 4 and report["heldout"]["positions"] > 0, name
    p = replace(heads.PROFILES["ci"], steps=4, num_heads=2, shortlist=64, data=data)
    out = heads.train(model_name, p, model, tok, log=lambda m: None)
    report = network.read_report(out)
    assert report["data"]["kind"] == "prefill" and report["data"]["positions"] == 768
    assert report["fit"]["steps"] == 4 and len(report["heldout"]["top1"]) == 2
    assert report["seen"]["split"] == "train"


def test_a_wrapper_hands_each_inner_drafter_its_own_layers_with_the_rows_it_sat_out():
    """methods/compose.Wrapper: the loop collects the union of its inner drafters' layers; each inner drafter gets
    its own, in its order, preceded by the rows of the steps it sat out (as its final states are)."""
    from types import SimpleNamespace

    from bpdbench.engine import DraftContext, Layers
    from bpdbench.methods.compose import Wrapper
    a, b, plain = (SimpleNamespace(hidden_layers=Layers((2, 0))), SimpleNamespace(hidden_layers=Layers((1, 2))),
                   SimpleNamespace())

    class Both(Wrapper):
        def inner_drafters(self):
            return [a, b, plain]
    w = Both()
    assert w.hidden_layers == Layers((2, 0, 1))
    rows = lambda n, k: torch.arange(n * k * 1.0).reshape(n, k, 1)        # noqa: E731 [n, k, d=1]
    first = DraftContext([1, 2, 3], None, 4, accepted_hidden=torch.zeros(2, 1), accepted_layers=rows(2, 3))
    w.hold(b, first)                                                       # b sits the first step out
    assert torch.equal(w.context_for(a, first).accepted_layers, first.accepted_layers[:, [0, 1]])
    assert w.context_for(plain, first).accepted_layers is None
    second = DraftContext([1, 2, 3, 4], None, 4, accepted_hidden=torch.ones(1, 1), accepted_layers=rows(1, 3) + 100)
    got = w.context_for(b, second)
    assert got.accepted_hidden.shape[0] == 3
    assert torch.equal(got.accepted_layers, torch.cat([first.accepted_layers, second.accepted_layers])[:, [2, 0]])
