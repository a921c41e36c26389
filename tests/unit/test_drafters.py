"""Draft networks (EAGLE, Hydra, Hydra++, Amphista, Medusa/KOALA heads) on the tiny model: every trainer name
trains on the cached distillation data and reports per-depth agreement; saved folders reload (Medusa/KOALA heads
also as Medusa-1 heads); decoding with each is lossless and replay equals real decoding, chain, tree and refined;
a perfect drafter accepts everything and a wrong one nothing; training-time drafting (EAGLE's unrolled passes,
Hydra++'s prefix over a window) computes what drafting computes; bad requests fail in one line."""
from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from bpdbench import models
from bpdbench.nets import heads as heads_lib
from bpdbench.cli import app
from bpdbench.config import RunConfig
from bpdbench.nets import checkpoint as drafters
from bpdbench.nets.base import DraftModel
from bpdbench.nets.eagle import Eagle
from bpdbench.nets.hydra import Hydra
from bpdbench.nets.layers import causal_mask
from bpdbench.engine import Limits, Proposal, generate, ratios
from bpdbench.methods import Env, parse
from bpdbench.methods.lattice import LatticeDrafter
from bpdbench.methods.trained import TrainedDrafter, drafter_for
from tests.drafter_fixtures import copy_drafters
from tests.helpers import decode_and_replay, eos_limits

PROMPTS = ([5, 17, 3, 42, 8, 11], [1, 2, 3], [90, 4, 4, 4, 7, 90, 4, 4])
SPELLINGS = ("eagle", "eagle:tree=3", "eagle:depth=5,threshold=0.2", "eagle:refine=16best-0gram,k=4", "hydra",
             "hydra:tree=2", "hydra++", "hydra++:tree=3", "amphista", "amphista:tree=2", "koala",
             "koala:refine=medusa,k=4", "koala:base=hydra,adv=1", "koala:base=hydra,adv=1,tree=2",
             "eagle:shortlist=40", "eagle3", "eagle3:tree=3")


@pytest.fixture(scope="module")
def tiny(tiny_model_dir, tmp_path_factory, trained_drafters):
    torch.set_num_threads(1)
    model, tok = models.load(str(tiny_model_dir), "float32")
    cache = tmp_path_factory.mktemp("drafter-cache")
    folders = copy_drafters(trained_drafters, cache)
    return model, tok, str(tiny_model_dir), cache, folders


def test_every_trainer_reports_agreement_and_reloads(tiny):
    model, tok, name, cache, folders = tiny
    assert set(folders) == {"medusa", "koala", "koala-hydra-adv", "hydra", "hydra++", "amphista", "eagle", "eagle3"}
    embed, lm = model.model.embed_tokens.weight, model.lm_head.weight
    for trained, path in folders.items():
        report = json.loads((path / "report.json").read_text())
        held = report["heldout"]
        assert len(held["top1"]) == len(held["top16"]) == report["depth"] == 3, trained
        assert all(0 <= a <= b <= 1 for a, b in zip(held["top1"], held["top16"])), trained
        assert held["positions"] > 0 and report["trainable_parameters"] > 0 and report["fit"]["steps"] == 150
        curve = report["fit"]["validation"]          # checkpoints on held-back training sequences, best kept
        assert len(curve) >= 2 and report["fit"]["kept_score"] == max(r["score"] for r in curve)
        config = drafters.read_config(path)
        assert config["name"] == trained and config["training"]["heldout"] == held
        loaded, cfg = drafters.load(path, embed, lm)
        assert loaded.depth == 3 and cfg["drafting_shortlist"] == len(loaded.proj)
        if config["drafter"] == "medusa":       # the Medusa-1 layout: heads methods (bpd --heads-path) read it
            heads, hcfg = heads_lib.load(path, 32)
            assert heads.num_heads == 3 and heads.num_layers == (2 if trained == "koala" else 1)
    assert json.loads((folders["koala-hydra-adv"] / "report.json").read_text())["fit"]["final"]["adversarial"] > 0


def test_save_and_reload_draft_the_same(tiny, tmp_path):
    model, tok, name, cache, folders = tiny
    embed, lm = model.model.embed_tokens.weight, model.lm_head.weight
    hidden = torch.randn(32)
    for trained in ("eagle", "eagle3", "hydra++", "amphista", "koala"):
        first, cfg = drafters.load(folders[trained], embed, lm)
        drafters.save(first, tmp_path / trained, name, cfg["training"], trained)
        again, _ = drafters.load(tmp_path / trained, embed, lm)
        for a, b in zip(first.state_dict().values(), again.state_dict().values()):
            assert torch.equal(a, b), trained
        if first.drafting == "parallel":
            assert torch.equal(first.parallel_logits(hidden, 7, 3), again.parallel_logits(hidden, 7, 3))


def _env(model, tok, name, limits, **cfg) -> Env:
    return Env(model, tok, RunConfig(model=name, k=4, **cfg), limits, log=lambda m: None)


@pytest.mark.parametrize("eos_at,max_new", [(None, 30), (9, 30), (None, 11)])
def test_lossless_and_replay_equals_real(tiny, monkeypatch, eos_at, max_new):
    model, tok, name, cache, _ = tiny
    monkeypatch.setenv("BPDBENCH_CACHE", str(cache))
    limits = eos_limits(model, PROMPTS[0], eos_at, max_new)
    env = _env(model, tok, name, limits)
    # greedy decoding depends only on the prompt and the limits: one decode per prompt serves every drafter
    greedies = {tuple(p): generate(model, None, list(p), limits).tokens for p in PROMPTS}
    for spelling in SPELLINGS:
        method = parse(spelling)
        drafter = env.build(method)
        accepted = 0
        for prompt in PROMPTS:
            real = decode_and_replay(model, drafter, prompt, limits, list(greedies[tuple(prompt)]), features=True,
                                     label=spelling, memo={})
            accepted += real.counters.accepted
        assert accepted > 0, spelling        # trained on the tiny model's own continuations: some drafts hit
        resolved = env.resolved[method.label]
        assert resolved["heldout"]["top1"]
        if method.get("shortlist"):
            assert resolved["shortlist"] == 40


class Scripted(DraftModel):
    """A draft model that knows the greedy continuation: `shift` 0 drafts it, 1 drafts a wrong token everywhere.
    Sequential (an expansion per proposal) or parallel (all depths at once), over a shortlist of every id."""

    def __init__(self, greedy: list[int], start: int, shift: int, drafting: str, vocab: int = 128):
        super().__init__(8, 4)
        self.greedy, self.start, self.shift, self.drafting, self.vocab = greedy, start, shift, drafting, vocab
        self.shortlist = torch.arange(vocab)
        self.proj = torch.zeros(vocab, 8)

    def _logits(self, m: int, path: list[int]) -> torch.Tensor:
        out = torch.full((self.vocab,), -5.0)
        j = m + len(path)
        out[(self.greedy[j] + self.shift) % self.vocab if j < len(self.greedy) else 0] = 5.0
        out[(self.greedy[j] + self.shift + 1) % self.vocab if j < len(self.greedy) else 1] = 4.0
        return out

    def session(self):
        outer = self

        class Session:
            def sync(self, ctx):
                self.m = len(ctx.tokens) - outer.start

            def expansion(self, bonus):
                m = self.m

                class Exp:
                    def logits(self, paths):
                        return torch.stack([outer._logits(m, p) for p in paths])
                return Exp()
        return Session()

    def parallel_logits(self, hidden, bonus, n):
        return torch.stack([self._logits(self.m, [0] * i) for i in range(n)])


@pytest.mark.parametrize("drafting", ["sequential", "parallel"])
@pytest.mark.parametrize("tree", [0, 2])
def test_perfect_drafter_accepts_everything_and_wrong_one_nothing(tiny, drafting, tree):
    model = tiny[0]
    prompt, limits = list(PROMPTS[0]), Limits(41)
    greedy = generate(model, None, prompt, limits).tokens
    for shift, accept_all in ((0, True), (1, False)):
        drafter = scripted_drafter(greedy, prompt, shift, drafting, tree=tree)
        c = decode_and_replay(model, drafter, prompt, limits, greedy, features=True).counters
        if accept_all:
            assert c.accepted == c.drafted and ratios(c)["block_efficiency"] == 41 / (1 + 8)
        else:
            assert c.accepted == 0 and c.serial_calls == 41


def scripted_drafter(greedy: list[int], prompt: list[int], shift: int, drafting: str, **shape
                     ) -> LatticeDrafter | TrainedDrafter:
    """The depth-4 drafter of `Scripted` (`shape`: its tree options) for decoding `prompt`."""
    scripted = Scripted(greedy, len(prompt), shift, drafting)
    drafter = drafter_for("scripted", scripted, depth=4, **shape)
    if drafting == "parallel":                   # parallel drafters read the position from the context
        drafter.propose = _with_position(drafter, scripted, len(prompt))
    return drafter


def _with_position(drafter: LatticeDrafter | TrainedDrafter, scripted: Scripted, start: int):
    propose = drafter.propose

    def wrapped(ctx) -> Proposal:
        scripted.m = len(ctx.tokens) - start
        return propose(ctx)
    return wrapped


def _randomise(model: torch.nn.Module, seed: int) -> None:
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)


def test_eagle_training_passes_compute_what_drafting_computes():
    """Pass p of Eagle.unrolled at row j (training) = drafting depth p from the context ending at row j - p + 1,
    through the session's KV cache and the tree expansion, with the true tokens as the draft path."""
    d, n, vocab = 32, 12, 50
    m = Eagle(d, 4, heads=4, kv_heads=2, ffn=48, window=64)
    _randomise(m, 0)
    m.eval().bind(torch.randn(vocab, d), torch.randn(vocab, d), None)
    feat, toks = torch.randn(1, n, d), torch.randint(0, vocab, (1, n))
    _passes_equal_drafting(m, feat, toks, lambda h: m.project(h[None])[0])


def _passes_equal_drafting(m, feat, toks, project) -> None:
    """Training pass p at position c+p-1 (`unrolled`, projected by `project`) equals the logits drafting computes
    for the path after c: what the head is fitted on is what it drafts."""
    n = toks.shape[1]
    pos, valid = torch.arange(n)[None], torch.ones(1, n, dtype=torch.bool)
    with torch.no_grad():
        passes = m.unrolled(feat, m.emb[toks], pos, valid, 4)
    for c in (0, 3, 6):
        s = m.session()
        s.push(feat[0, : c + 1], toks[0, : c + 1].tolist())
        tree = s.expansion(int(toks[0, c]))
        for p in range(1, 5):
            path = toks[0, c + 1: c + p].tolist()
            logits = tree.logits([path, path])[0] if path else tree.logits([[]])[0]
            assert torch.allclose(logits, project(passes[p - 1][0, c + p - 1]), atol=1e-4), (c, p)


def test_eagle3_training_passes_compute_what_drafting_computes():
    """The same for EAGLE-3's layer: pass 1 reads the fused layers (fc over [k, d]), later passes its own raw output,
    and both training and drafting project through its final norm."""
    from bpdbench.nets.eagle3 import Eagle3
    d, n, vocab, k = 32, 12, 50, 3
    m = Eagle3(d, 4, (1, 2, 3), heads=4, kv_heads=2, ffn=48, window=64)
    _randomise(m, 0)
    m.eval().bind(torch.randn(vocab, d), torch.randn(vocab, d), None)
    feat, toks = torch.randn(1, n, k, d), torch.randint(0, vocab, (1, n))
    _passes_equal_drafting(m, feat, toks, lambda h: h @ m.proj.T)      # the fit projects the normed states as they are


def test_hydra_prefix_over_a_window_equals_its_cache():
    d, n = 32, 10
    m = Hydra(d, 3, prefix=True, heads=4, kv_heads=2, ffn=48, window=64)
    _randomise(m, 1)
    m.eval().bind(torch.randn(40, d), torch.randn(40, d), None)
    feat = torch.randn(1, n, d)
    with torch.no_grad():
        window = m.prefix(feat, torch.arange(n)[None], causal_mask(torch.ones(1, n, dtype=torch.bool)))
    s = m.session()
    s.push(feat[0, :4])
    for j in range(4, n):
        assert torch.allclose(s.base, window[0, j - 1], atol=1e-4)
        s.push(feat[0, j: j + 1])


def cli(*args) -> tuple[int, str]:
    result = CliRunner().invoke(app, [str(a) for a in args])
    return result.exit_code, result.output


@pytest.mark.parametrize("args,expect", [
    (["train-network", "medusa2"], ["unknown drafter", "eagle"]),
    (["train-network", "eagle", "--profile", "huge"], ["unknown profile", "quick"]),
    (["train-network", "eagle", "--adversarial", "0.1"], ["--adversarial", "koala"]),
    (["train-network", "eagle", "--threads", "0"], ["--threads", ">= 1"]),
    (["train-network", "eagle3", "--profile", "full"], ["eagle3 reads the base's layers", "--profile quick or bench"]),
    (["run", "--method", "eagle3:profile=full"], ["eagle3 reads the base's layers", "profile=quick or profile=bench"]),
    (["distill-data", "--profile", "huge"], ["unknown profile", "quick"]),
    (["run", "--method", "eagle:tree=2,refine=ngram4"], ["refine=", "tree="]),
    (["run", "--method", "eagle:path=/nonexistent/eagle"], ["no drafter at", "train-network"]),
    (["run", "--method", "hydra", "--no-auto-train"], ["no 'quick' hydra drafter", "train-network hydra"]),
    (["run", "--method", "koala:base=lstm"], ["base must be one of", "medusa"]),
    (["run", "--method", "eagle:depth=0"], ["depth must be >= 1"]),
])
def test_bad_requests_fail_in_one_line(args, expect, tmp_path, monkeypatch):
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path / "cache"))
    code, text = cli(*args, *(["--limit", "1", "--out", tmp_path / "r"] if args[0] == "run" else []))
    assert code == 2, text
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in text and "Loading" not in text, text
    for word in expect:
        assert word in errors[0], (word, errors[0])
    assert not (tmp_path / "r").exists() and not (tmp_path / "cache" / "drafters").exists()


def test_wrong_family_folder_is_refused_before_loading(tiny, tmp_path, monkeypatch):
    folders = tiny[4]
    code, text = cli("run", "--method", f"eagle:path={folders['hydra']}", "--limit", "1", "--out", tmp_path / "r")
    assert code == 2 and "holds a hydra drafter, not eagle" in text, text


def test_replay_cli_and_tables_from_result_files(tiny, tmp_path, monkeypatch):
    """`bpdbench replay` with drafters on the tiny model, then `bpdbench tables` renders the drafter tables from the
    result files alone (training report, block efficiency, draft repetition)."""
    import shutil
    from tests.conftest import write_prompts
    model, tok, name, cache, folders = tiny
    monkeypatch.setenv("BPDBENCH_CACHE", str(cache))
    results = tmp_path / "results"
    (results / "drafters" / "training").mkdir(parents=True)
    shutil.copy(folders["eagle"] / "report.json", results / "drafters" / "training" / "tiny-eagle-ci.json")
    prompts = write_prompts(tmp_path, 3)
    code, text = cli("replay", "--task", "prompts", "--data-file", prompts, "--model", name, "--methods",
                     "eagle,hydra:tree=2,amphista", "--limit", "2", "--max-new-tokens", "12", "--dtype", "float32",
                     "--out", results / "drafters" / "replay" / "prompts")
    assert code == 0, text
    code, text = cli("tables", "--results", results)
    assert code == 0, text
    import pandas as pd
    eff = pd.read_csv(results / "tables" / "drafters_block_efficiency.csv")
    assert set(eff.columns) >= {"task", "profile", "eagle", "hydra:tree=2", "amphista"}
    assert (eff[["eagle"]] >= 1).all().all()
    rep = pd.read_csv(results / "tables" / "drafters_repetition.csv")
    assert "greedy_text" in rep and 0 <= float(rep["eagle"].iloc[0]) <= 1
    train = pd.read_csv(results / "tables" / "drafters_training.csv")
    assert train.drafter.tolist() == ["eagle"] and train.top1_d1.between(0, 1).all()


def test_replays_of_two_profiles_stay_apart(tmp_path):
    """Quick and full drafters replayed on one task are two rows of the block-efficiency table, never averaged or
    overwritten: the profile comes from each replay's config.json."""
    import json
    import pandas as pd
    from bpdbench.report import drafters
    for folder, profile, be in (("xsum", "quick", 1.3), ("xsum-full", "full", 1.6)):
        d = tmp_path / "drafters" / "replay" / folder
        d.mkdir(parents=True)
        pd.DataFrame([{"task": "xsum", "method": "hydra", "n_examples": 20, "block_efficiency": be,
                       "draft_repeat_share": 0.01, "text_repeat_share": 0.0},
                      {"task": "xsum", "method": "bpd", "n_examples": 20, "block_efficiency": be - 0.2,
                       "draft_repeat_share": 0.1, "text_repeat_share": 0.0}]).to_csv(d / "replay.csv", index=False)
        (d / "config.json").write_text(json.dumps({"config": {"heads_profile": profile}}))
    eff = drafters.efficiency_table(drafters.collect_replays(tmp_path)).set_index("profile")
    assert eff.loc["quick", "hydra"] == 1.3 and eff.loc["full", "hydra"] == 1.6 and eff.loc["full", "bpd"] == 1.4
    rep = drafters.repetition_table(drafters.collect_replays(tmp_path))
    assert sorted(rep.profile) == ["full", "quick"]


def test_a_killed_fit_resumes_from_its_saved_state_and_ends_where_an_unbroken_one_ends(tiny, tmp_path, monkeypatch):
    """The benchmark's fits take hours: one killed mid-way continues from its last saved state (train/fit.py) and
    ends with the weights of a fit that never stopped; the state is removed once the network is saved."""
    from dataclasses import replace
    from bpdbench.train import fit as fit_lib, network
    from tests.drafter_fixtures import LR, STEPS, tiny_prefill
    model, tok, name, cache, _ = tiny
    monkeypatch.setenv("BPDBENCH_CACHE", str(cache))
    monkeypatch.setattr(fit_lib, "RESUME_EVERY", 0.0)               # a state after every step
    profile = replace(network.PROFILES["ci"], steps=STEPS, data=tiny_prefill())

    def train(out):
        return network.train("eagle3", profile, name, model, tok, log=lambda m: None, out=out, lr=LR)

    unbroken = train(tmp_path / "unbroken")
    saves, real_save = [0], fit_lib._save_state

    def killed_after_40(state, snapshot):
        real_save(state, snapshot)
        saves[0] += 1
        if saves[0] == 40:
            raise KeyboardInterrupt("killed")
    monkeypatch.setattr(fit_lib, "_save_state", killed_after_40)
    with pytest.raises(KeyboardInterrupt):
        train(tmp_path / "resumed")
    state = tmp_path / "resumed.fit-state.pt"
    assert torch.load(state, weights_only=False)["step"] == 40 and not (tmp_path / "resumed").exists()
    monkeypatch.setattr(fit_lib, "_save_state", real_save)
    resumed = train(tmp_path / "resumed")
    assert not state.exists() and not (tmp_path / "unbroken.fit-state.pt").exists()
    a, b = (json.loads((p / "report.json").read_text()) for p in (unbroken, resumed))
    assert a["fit"]["steps"] == b["fit"]["steps"] == STEPS and a["heldout"] == b["heldout"]
    for x, y in zip(torch.load(unbroken / "drafter.pt").values(), torch.load(resumed / "drafter.pt").values()):
        assert torch.equal(x, y)
    # a state made with other settings is not resumed: the fit starts afresh and says so
    logs = []
    torch.save({"key": {"other": 1}}, tmp_path / "again.fit-state.pt")
    network.train("eagle3", profile, name, model, tok, log=logs.append, out=tmp_path / "again", lr=LR)
    assert any("made with other settings" in m for m in logs) and not any("resuming" in m for m in logs)


def test_a_network_that_reads_final_states_leaves_the_layers_on_disk(tiny, tmp_path, monkeypatch):
    """The bench data's chosen layers are 5 GB of its 7: only a network that reads them (eagle3) loads them, so a
    hydra fit and the tests fit in memory beside each other."""
    from dataclasses import replace
    from bpdbench.train import data as data_lib, network
    from tests.drafter_fixtures import tiny_prefill
    model, tok, name, cache, _ = tiny
    monkeypatch.setenv("BPDBENCH_CACHE", str(cache))
    both = data_lib.load_data(name, tiny_prefill(), model, tok, log=lambda m: None)
    final = data_lib.load_data(name, tiny_prefill(), model, tok, log=lambda m: None, layers=False)
    assert both.layers is not None and final.layers is None and torch.equal(both.hidden, final.hidden)
    asked, real = [], network.load_data
    monkeypatch.setattr(network, "load_data", lambda *a, **k: asked.append(k["layers"]) or real(*a, **k))
    profile = replace(network.PROFILES["ci"], steps=2, data=tiny_prefill())
    for net in ("hydra", "eagle3"):
        network.train(net, profile, name, model, tok, log=lambda m: None, out=tmp_path / net)
    assert asked == [False, True]
