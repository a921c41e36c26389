"""Shared fixtures: tiny random models for decoding logic (fast, fp32, deterministic)."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# The cost tier of a test is the folder it sits in (pyproject.toml lists the markers): unit (tiny random models, in
# memory), integration (whole commands on files), slow (the real default model), heavy (minutes of CPU; also slow).
TIERS = ("unit", "integration", "slow", "heavy")
# (integration/test_sweep marks only its tests that start Ray: its grid checks need none, and `-m "not ray"` keeps
# them)
NEEDS = {"test_heads": ("train",), "test_drafters": ("train",), "test_distill": ("train",), "test_neural": ("train",),
         "test_trained_trees": ("train",)}


def pytest_collection_modifyitems(config, items):
    """One tier per test, from its folder, so `-m unit` and `-m "not slow"` select by cost; a test module outside
    the tier folders, or a tier marker that contradicts the folder, stops the collection with one line."""
    for item in items:
        tier = Path(str(item.path)).parent.name
        if tier not in TIERS:
            raise pytest.UsageError(f"{item.path}: put test modules in one of tests/{{{','.join(TIERS)}}}/ (its tier)")
        marked = {m.name for m in item.iter_markers()} & set(TIERS)
        if marked - {tier}:
            raise pytest.UsageError(f"{item.nodeid}: marked {sorted(marked - {tier})} but sits in tests/{tier}/; "
                                    f"move it to the folder of its tier")
        item.add_marker(getattr(pytest.mark, tier))
        if tier == "heavy":
            item.add_marker(pytest.mark.slow)
        for name in NEEDS.get(item.module.__name__.rsplit(".", 1)[-1], ()):
            item.add_marker(getattr(pytest.mark, name))


def make_tiny_model(vocab: int = 96, seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=False)
    model = Qwen2ForCausalLM(cfg).eval().requires_grad_(False)
    # Sharpen the output so greedy continuations are varied rather than one repeated token.
    model.lm_head.weight.mul_(8.0)
    return model


def random_heads(lm_head, n: int, seed: int, std: float, d: int = 32):
    """Heads with random weights (they accept little): the logic must stay lossless whatever they draft."""
    from bpdbench.nets.heads import Heads

    torch.manual_seed(seed)
    heads = Heads(d, n)
    for p in heads.parameters():
        torch.nn.init.normal_(p, std=std)
    heads.pack(lm_head)
    return heads


@pytest.fixture(scope="session")
def tiny_model():
    torch.set_num_threads(1)
    return make_tiny_model()


def write_tiny_hf_model(path, vocab: int = 128):
    """A tiny Qwen2 model + character-level tokenizer saved as a normal HF folder (loads offline by path)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [chr(c) for c in range(32, 127)]
    table = {"<unk>": 0, "<eos>": 1, **{c: i + 2 for i, c in enumerate(chars)}}
    core = Tokenizer(models.WordLevel(table, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", eos_token="<eos>", pad_token="<unk>")
    model = make_tiny_model(vocab=vocab)
    model.generation_config.eos_token_id = 1
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def write_prompts(tmp_path, n: int):
    """A `prompts` task file (JSONL with id, prompt) for CLI tests on the tiny model."""
    import json

    path = tmp_path / "prompts.jsonl"
    rows = [{"id": f"p{i}", "prompt": f"Example number {i}: the quick brown fox"} for i in range(n)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    return write_tiny_hf_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def trained_drafters(tiny_model_dir, tmp_path_factory):
    """Every tiny draft network (tests/drafter_fixtures.py), trained once per session: several modules decode
    with them, and each takes its own copy (drafter_fixtures.copy_drafters)."""
    from bpdbench import models
    from tests.drafter_fixtures import build_tiny_drafters
    torch.set_num_threads(1)
    model, tok = models.load(str(tiny_model_dir), "float32")
    cache = tmp_path_factory.mktemp("draft-networks")
    return cache, build_tiny_drafters(model, tok, str(tiny_model_dir), cache)


@pytest.fixture(scope="session")
def calibrated_cache(tiny_model_dir, tmp_path_factory):
    """A cache holding this machine's calibration of the tiny model (float32, one thread), as `speed` measures it
    on first use. Tests whose subject is not the first use copy it into their fresh cache (seed_calibration)."""
    from bpdbench import models
    from bpdbench.hardware import calibration
    cache = tmp_path_factory.mktemp("calibrated-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BPDBENCH_CACHE", str(cache))
        model, _ = models.load(str(tiny_model_dir), "float32")
        calibration.ensure(str(tiny_model_dir), "float32", "cpu", 1, model=model, log=lambda m: None)
    return cache


def seed_calibration(calibrated: Path, cache: Path) -> None:
    """The session's calibration into a test's own cache (a copy: what a run adds to it stays the test's)."""
    shutil.copytree(calibrated / "calibration", cache / "calibration", dirs_exist_ok=True)


@pytest.fixture(scope="module")
def loaded(tiny_model_dir):
    """(model, tokenizer) of the tiny HF checkpoint, loaded as the commands load it (float32), once per module."""
    from bpdbench import models
    torch.set_num_threads(1)
    return models.load(str(tiny_model_dir), "float32")


@pytest.fixture(scope="module")
def noisy_model(tiny_model):
    """The target with noise on every weight: it agrees with the target often but not always, so steps accept
    partly and the draft cache is rolled back mid-draft (a different seed agrees almost never)."""
    import copy
    model = copy.deepcopy(tiny_model)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2 * p.abs().mean())
    return model


def decode(model, prompt, max_new, eos_ids=(), heads=None, n_heads=0, rescorer=None, k=1, threshold=0.0):
    """The engine's loop with a heads drafter (or none: AR), in the argument order the decoding tests read best."""
    from bpdbench.engine import Limits, generate
    from bpdbench.methods.lattice import HeadsSource, LatticeDrafter

    drafter = None
    if heads is not None and n_heads:
        drafter = LatticeDrafter("test", HeadsSource(heads, model.lm_head), n_heads,
                                 k=k if rescorer is not None else 1, threshold=threshold, rescorer=rescorer)
    return generate(model, drafter, list(prompt), Limits(max_new, frozenset(eos_ids)))


@pytest.fixture(scope="session", autouse=True)
def _probe_linear_once():
    """The linear-kernel probe (hardware/kernels.probe) times oneDNN against torch on fixed shapes: a property of
    this machine and thread count that the product caches per machine. Tests give each run a fresh cache (for its
    artefacts), which would time it again every time; the first measurement per dtype and thread count serves the
    session, and choose/decide/persist still run on every fresh cache."""
    from bpdbench.hardware import kernels
    real, seen = kernels.probe, {}

    def probe(dtype=torch.float32, repeats=9):
        key = (dtype, repeats, torch.get_num_threads())
        if key not in seen:
            seen[key] = real(dtype, repeats)
        return seen[key]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kernels, "probe", probe)
        yield


@pytest.fixture(autouse=True, scope="session")
def _no_waiting_out_the_other_worker():
    """A timing taken beside another process is taken again after a pause (20 s for a self-draft profile or a
    prompt, 5 s for one call), so that a benchmark waits out a passing neighbour. In the parallel tier of `make
    test` the neighbour is the other test worker, which never leaves, and no test reads what a timing measured: the
    pauses were sleep, up to 40 s in one test. There they are 0; the retries still run (their logic has its own
    tests, tests/unit/test_state_leaks.py and test_selfdraft_cache.py). The serial tier, alone on the machine,
    keeps them."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    from bpdbench.experiments import speed
    from bpdbench.methods import selfdraft
    with pytest.MonkeyPatch.context() as mp:
        for module, name in ((selfdraft, "PAUSE_S"), (speed, "RETIME_PAUSE_S"), (speed, "RETIME_CALL_PAUSE_S")):
            mp.setattr(module, name, 0.0)
        yield


@pytest.fixture(autouse=True)
def _private_results(tmp_path_factory, monkeypatch):
    """Tests never write into the checkout's results/ (the committed reference results)."""
    monkeypatch.setenv("BPDBENCH_RESULTS", str(tmp_path_factory.mktemp("results")))


SIGINT_FOUND: list[str] = []     # tests that started with Ctrl-C not raising KeyboardInterrupt, and what it was


@pytest.fixture(autouse=True)
def _ctrl_c_interrupts(request):
    """Every test starts with Ctrl-C raising KeyboardInterrupt, as in a terminal. Why: a test run started as a
    background job of a non-interactive shell (`make test &`, `nohup ... &`) inherits SIGINT ignored (POSIX), and
    Python keeps an inherited SIG_IGN, in the run and in every child it starts: the two tests that interrupt a run
    and a build then saw exit 0 and a child that would not stop. Which tests found it so is recorded (printed at
    the end of a run outside xdist)."""
    import signal
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        SIGINT_FOUND.append(f"{request.node.nodeid}: {signal.getsignal(signal.SIGINT)}")
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield


def pytest_sessionfinish(session, exitstatus):
    if SIGINT_FOUND:
        print(f"\nSIGINT was not the default handler when {len(SIGINT_FOUND)} test(s) started (reset for each); "
              f"first: {SIGINT_FOUND[0]}")


@pytest.fixture(scope="module")
def llamacpp_runtime():
    """llama.cpp for the GGUF drafts: a skip where it is not installed, a failure where BPDBENCH_REQUIRE_LLAMACPP=1
    (`make test` sets it after `make llamacpp`)."""
    from bpdbench.nets import llamacpp
    if not llamacpp.available():
        if os.environ.get("BPDBENCH_REQUIRE_LLAMACPP") == "1":
            pytest.fail(f"llama.cpp is required here (BPDBENCH_REQUIRE_LLAMACPP=1): {llamacpp.INSTALL}")
        pytest.skip(f"llama.cpp is not installed: {llamacpp.INSTALL}")
