"""Bad input, refused up front: each case asserts the exit code, one `error:` line naming the problem and the fix,
no traceback, no progress bar (nothing was loaded), and that the result folder it points at is byte-for-byte intact.

Every `run` case resumes a finished 2-example run (`--out <copy> --resume`), so a case that damaged result files
would show up as changed bytes. Crash safety and the certificate are in test_crash_safety.py.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from bpdbench.cli import app
from tests.conftest import write_prompts


def cli(*args) -> tuple[int, str]:
    result = CliRunner().invoke(app, [str(a) for a in args])
    return result.exit_code, result.output


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != ".bpdbench.lock"}


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("BPDBENCH_RESULTS", str(tmp_path / "results"))


@pytest.fixture(scope="module")
def finished_run(tiny_model_dir, tmp_path_factory):
    """A finished 2-example float32 run on the tiny model: the result folder every case must leave intact."""
    import os
    root = tmp_path_factory.mktemp("finished")
    prompts = write_prompts(root, 5)
    old = {k: os.environ.get(k) for k in ("BPDBENCH_CACHE", "BPDBENCH_RESULTS")}
    os.environ.update(BPDBENCH_CACHE=str(root / "cache"), BPDBENCH_RESULTS=str(root / "results"))
    try:
        code, text = cli(*base_args(prompts, tiny_model_dir, root / "run")[:-1])
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    assert code == 0, text
    return root / "run", prompts


def base_args(prompts, model, out) -> list:
    return ["run", "--task", "prompts", "--data-file", prompts, "--model", model, "--heads-profile", "init",
            "--heads", "2", "--limit", "2", "--max-new-tokens", "6", "--dtype", "float32", "--out", out, "--resume"]


def with_opts(args: list, **opts) -> list:
    """Replace (or add) `--name value` options; value None drops the option."""
    args = list(args)
    for name, value in opts.items():
        flag = "--" + name.replace("_", "-")
        if flag in args:
            i = args.index(flag)
            del args[i:i + 2]
        if value is not None:
            args[1:1] = [flag, value]
    return args


def write_lines(path: Path, lines: list) -> Path:
    path.write_bytes(b"".join((x if isinstance(x, bytes) else json.dumps(x).encode()) + b"\n" for x in lines))
    return path


def heads_dir(tmp: Path, n_config: int = 2, n_weights: int = 2, corrupt: str = "") -> Path:
    """A heads folder in our layout for the tiny model (d=32), optionally broken."""
    d = tmp / "heads"
    d.mkdir(exist_ok=True)
    state = {f"{i}.0.linear.{w}": torch.zeros(32, 32) if w == "weight" else torch.zeros(32)
             for i in range(n_weights) for w in ("weight", "bias")}
    torch.save(state, d / "medusa_lm_head.pt")
    config = {"medusa_num_heads": n_config, "medusa_num_layers": 1, "base_model_name_or_path": "tiny",
              "bpdbench": {"shared_lm_head": True, "shortlist_size": 50 if corrupt == "no-shortlist" else None}}
    (d / "config.json").write_text(json.dumps(config))
    if corrupt == "truncated":
        data = (d / "medusa_lm_head.pt").read_bytes()
        (d / "medusa_lm_head.pt").write_bytes(data[: len(data) // 3])
    if corrupt == "config-json":
        (d / "config.json").write_text('{"medusa_num_heads": 2,')
    if corrupt == "shortlist-ok":
        torch.save(torch.arange(10), d / "shortlist.pt")
        config["bpdbench"]["shortlist_size"] = 10
        (d / "config.json").write_text(json.dumps(config))
    if corrupt == "shortlist-size":
        torch.save(torch.arange(10), d / "shortlist.pt")
        config["bpdbench"]["shortlist_size"] = 20
        (d / "config.json").write_text(json.dumps(config))
    return d


def model_dir(tmp: Path, tiny: Path, how: str) -> Path:
    d = tmp / f"model-{how}"
    if how == "empty":
        d.mkdir()
    elif how == "no-weights":
        d.mkdir()
        shutil.copy(tiny / "config.json", d / "config.json")
    elif how == "truncated":
        shutil.copytree(tiny, d)
        w = d / "model.safetensors"
        w.write_bytes(w.read_bytes()[:-1000])
    return d


# (case id, how to change the base args given (args, tmp, tiny model dir), expected substrings of the error line)
RUN_CASES = [
    ("alpha-nan", lambda a, t, m: with_opts(a, alpha="nan"), ["--alpha", "finite"]),
    ("alpha-inf", lambda a, t, m: with_opts(a, alpha="inf"), ["--alpha", "finite"]),
    ("alpha-negative", lambda a, t, m: with_opts(a, alpha="-1"), ["--alpha", ">= 0"]),
    ("threshold-nan", lambda a, t, m: with_opts(a, draft_threshold="nan"), ["--draft-threshold", "finite"]),
    ("threshold-1.5", lambda a, t, m: with_opts(a, draft_threshold="1.5"), ["--draft-threshold", "[0, 1)"]),
    ("threads-negative", lambda a, t, m: with_opts(a, threads="-2"), ["--threads", ">= 1"]),
    ("threads-zero", lambda a, t, m: with_opts(a, threads="0"), ["--threads", ">= 1"]),
    ("heads-zero", lambda a, t, m: with_opts(a, heads="0"), ["--heads", "positive"]),
    ("k-zero", lambda a, t, m: with_opts(a, k="0"), ["--k", "positive"]),
    ("limit-zero", lambda a, t, m: with_opts(a, limit="0"), ["--limit", ">= 1"]),
    ("max-new-tokens-zero", lambda a, t, m: with_opts(a, max_new_tokens="0"), ["--max-new-tokens", ">= 1"]),
    ("offset-past-end", lambda a, t, m: with_opts(a, offset="50"), ["no examples selected", "lower --offset"]),
    ("device-tpu", lambda a, t, m: with_opts(a, device="tpu"), ["unknown device", "cpu"]),
    ("unknown-task", lambda a, t, m: with_opts(a, task="nope"), ["unknown task", "valid:"]),
    ("unknown-dtype", lambda a, t, m: with_opts(a, dtype="int3"), ["unknown dtype", "valid:"]),
    ("unknown-method", lambda a, t, m: with_opts(a, method="warp"), ["unknown method", "valid:"]),
    ("method-param-type", lambda a, t, m: with_opts(a, method="bpd:heads=x"), ["heads='x'", "int"]),
    ("method-param-unknown", lambda a, t, m: with_opts(a, method="bpd:foo=1"), ["unknown parameter", "valid:"]),
    ("method-param-nan", lambda a, t, m: with_opts(a, method="ngram2:alpha=nan"), ["alpha", "finite"]),
    ("method-param-form", lambda a, t, m: with_opts(a, method="bpd:heads"), ["key=value"]),
    ("method-vs-rescorer", lambda a, t, m: with_opts(a, method="pld", rescorer="ngram2"), ["two methods", "pass one"]),
    ("method-option-choice", lambda a, t, m: with_opts(a, method="hierarchy:order=xyz"), ["order", "one of"]),
    ("method-shape", lambda a, t, m: with_opts(a, method="cascade:split=5,length=4"), ["split=5", "length=4"]),
    ("heads-profile", lambda a, t, m: with_opts(a, heads_profile="huge"), ["heads profile", "valid:"]),
    ("k-beyond-vocab", lambda a, t, m: with_opts(a, method="16best-0gram", k="1000"), ["k=1000", "--k 128"]),
    ("k-beyond-shortlist", lambda a, t, m: with_opts(a, method="16best-0gram", k="16", heads_profile=None,
                                                     heads_path=heads_dir(t, corrupt="shortlist-ok")),
     ["k=16", "shortlist", "--k 10"]),
    ("heads-beyond-files", lambda a, t, m: with_opts(a, heads="4", heads_profile=None, heads_path=heads_dir(t)),
     ["--heads 4", "only 2 heads"]),
    ("heads-config-mismatch", lambda a, t, m: with_opts(a, heads_profile=None, heads_path=heads_dir(t, 3, 2)),
     ["config.json", "medusa_num_heads is 3", "2 heads", "train-heads"]),
    ("heads-truncated", lambda a, t, m: with_opts(a, heads_profile=None, heads_path=heads_dir(t, corrupt="truncated")),
     ["medusa_lm_head.pt", "truncated", "train-heads"]),
    ("heads-config-corrupt", lambda a, t, m: with_opts(a, heads_profile=None,
                                                       heads_path=heads_dir(t, corrupt="config-json")),
     ["config.json", "unreadable", "train-heads"]),
    ("shortlist-size", lambda a, t, m: with_opts(a, heads_profile=None,
                                                 heads_path=heads_dir(t, corrupt="shortlist-size")),
     ["shortlist.pt", "shortlist_size is 20", "train-heads"]),
    ("heads-path-missing", lambda a, t, m: with_opts(a, heads_profile=None, heads_path=t / "none"),
     ["no heads at", "train-heads"]),
    ("out-is-file", lambda a, t, m: with_opts(a, out=write_lines(t / "f.txt", [])), ["is a file", "directory"]),
    ("out-under-file", lambda a, t, m: with_opts(a, out=write_lines(t / "g.txt", []) / "sub"), ["is a file"]),
    ("out-unwritable", lambda a, t, m: with_opts(a, out="/sys/bpdbench-out"), ["--out", "writable directory"]),
    ("data-missing", lambda a, t, m: with_opts(a, data_file=t / "none.jsonl"), ["not found", "none.jsonl"]),
    ("data-file-is-dir", lambda a, t, m: with_opts(a, data_file=t), ["is a directory", "--data-dir"]),
    ("null-prompt", lambda a, t, m: with_opts(a, data_file=write_lines(t / "n.jsonl", [{"id": "a", "prompt": None}])),
     ["n.jsonl:1", "'prompt' must be a string", "NoneType"]),
    ("duplicate-ids", lambda a, t, m: with_opts(a, data_file=write_lines(t / "d.jsonl", [
        {"id": "a", "prompt": "x"}, {"id": "b", "prompt": "y"}, {"id": "a", "prompt": "z"}])),
     ["'a'", "lines 1 and 3", "unique"]),
    ("non-utf8", lambda a, t, m: with_opts(a, data_file=write_lines(t / "u.jsonl", [
        {"id": "a", "prompt": "x"}, b'{"id": "b", "prompt": "caf\xe9"}'])), ["u.jsonl:2", "UTF-8"]),
    ("empty-prompt", lambda a, t, m: with_opts(a, data_file=write_lines(t / "e.jsonl", [
        {"id": "a", "prompt": "x"}, {"id": "blank", "prompt": ""}])), ["'blank'", "empty prompt"]),
    ("blank-prompt", lambda a, t, m: with_opts(a, data_file=write_lines(t / "w.jsonl", [
        {"id": "ws", "prompt": "  \n "}])), ["'ws'", "empty prompt"]),
    ("bad-json", lambda a, t, m: with_opts(a, data_file=write_lines(t / "j.jsonl", [b'{"id": 1,'])),
     ["j.jsonl:1", "not valid JSON"]),
    ("missing-field", lambda a, t, m: with_opts(a, data_file=write_lines(t / "m.jsonl", [{"id": "a"}])),
     ["missing field 'prompt'", "id, prompt"]),
    ("empty-data-file", lambda a, t, m: with_opts(a, data_file=write_lines(t / "z.jsonl", [])), ["no examples"]),
    ("model-empty-dir", lambda a, t, m: with_opts(a, model=model_dir(t, m, "empty")), ["no config.json", "model-empty"]),
    ("model-no-weights", lambda a, t, m: with_opts(a, model=model_dir(t, m, "no-weights")), ["no weights"]),
    ("model-truncated", lambda a, t, m: with_opts(a, model=model_dir(t, m, "truncated")),
     ["model.safetensors", "truncated"]),
    ("model-unknown", lambda a, t, m: with_opts(a, model="gpt-17"), ["unknown model", "valid:"]),
    ("model-missing-path", lambda a, t, m: with_opts(a, model="./no/such/model"), ["no model folder"]),
    ("resume-other-dtype", lambda a, t, m: with_opts(a, dtype="bfloat16"), ["cannot resume", "config.dtype"]),
    ("no-resume-existing", lambda a, t, m: [x for x in a if x != "--resume"], ["exists", "--resume"]),
    ("temperature-negative", lambda a, t, m: with_opts(a, temperature="-1"), ["--temperature", ">= 0"]),
    ("top-p-range", lambda a, t, m: with_opts(a, temperature="1", top_p="1.5"), ["--top-p", "(0, 1]"]),
    ("top-k-negative", lambda a, t, m: with_opts(a, temperature="1", top_k="-3"), ["--top-k", ">= 0"]),
    ("top-p-greedy", lambda a, t, m: with_opts(a, top_p="0.9"), ["--top-p", "--temperature > 0"]),
    ("oracle-sampled", lambda a, t, m: with_opts(a, method="oracle", temperature="1"), ["oracle", "greedy"]),
    ("resume-sampled", lambda a, t, m: with_opts(a, temperature="0.7"), ["cannot resume", "config.temperature"]),
]


@pytest.mark.parametrize("case,change,expect", RUN_CASES, ids=[c[0] for c in RUN_CASES])
def test_run_refuses_bad_input(case, change, expect, finished_run, tiny_model_dir, tmp_path):
    src, prompts = finished_run
    out = tmp_path / "run"
    shutil.copytree(src, out)
    before = snapshot(out)
    code, text = cli(*change(base_args(prompts, tiny_model_dir, out), tmp_path, tiny_model_dir))
    assert code == 2, text
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in text, text
    for word in expect:
        assert word in errors[0], (word, errors[0])
    assert "━" not in text, "the progress bar was drawn before the input was checked"
    assert snapshot(out) == before


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_cuda_without_gpu_is_one_line(finished_run, tiny_model_dir, tmp_path):
    src, prompts = finished_run
    code, text = cli(*with_opts(base_args(prompts, tiny_model_dir, tmp_path / "new"), device="cuda"))
    assert code == 2 and "no CUDA GPU" in text and "--device cpu" in text, text
    assert not (tmp_path / "new").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
@pytest.mark.parametrize("command", [["train-heads"], ["distill-data"], ["build-history"], ["train-network", "eagle"]])
def test_training_on_cuda_without_gpu_is_one_line(command, tmp_path):
    """The training commands generate on --device: a missing GPU is refused before the base model loads."""
    code, text = cli(*command, "--device", "cuda")
    assert code == 2 and "no CUDA GPU" in text and "--device cpu" in text and "Traceback" not in text, text


def test_corrupt_middle_line_is_named_not_dropped(finished_run, tiny_model_dir, tmp_path):
    src, prompts = finished_run
    out = tmp_path / "run"
    shutil.copytree(src, out)
    lines = (out / "examples.jsonl").read_text().splitlines()
    (out / "examples.jsonl").write_text(lines[0] + "\n" + "garbage\n" + lines[1] + "\n")
    before = snapshot(out)
    code, text = cli(*with_opts(base_args(prompts, tiny_model_dir, out), limit="3"))
    assert code == 2 and "examples.jsonl:2" in text and "delete that line" in text, text
    assert snapshot(out) == before


OTHER_CASES = [
    ("tables-missing", ["tables", "--results", "{tmp}/nope"], ["no results directory", "--results"]),
    ("tune-no-tune-split", ["tune", "--task", "prompts", "--data-file", "{prompts}", "--rescorer", "ngram2",
                         "--model", "{model}", "--heads-profile", "init"], ["has no tune split", "--alpha"]),
    ("tune-not-tunable", ["tune", "--task", "prompts", "--data-file", "{prompts}", "--rescorer", "warp",
                          "--model", "{model}"], ["unknown method"]),
    ("replay-offset", ["replay", "--task", "prompts", "--data-file", "{prompts}", "--model", "{model}",
                       "--heads-profile", "init", "--offset", "99", "--out", "{tmp}/r"], ["no examples selected"]),
    ("replay-external", ["replay", "--task", "prompts", "--data-file", "{prompts}", "--model", "{model}",
                         "--methods", "bpd,hf-greedy", "--out", "{tmp}/r"], ["cannot be replayed", "speed"]),
    ("speed-repeats", ["speed", "--task", "prompts", "--data-file", "{prompts}", "--model", "{model}",
                       "--repeats", "0", "--out", "{tmp}/s"], ["--repeats", ">= 1"]),
    ("speed-threads", ["speed", "--task", "prompts", "--data-file", "{prompts}", "--model", "{model}",
                       "--threads", "-2", "--out", "{tmp}/s"], ["--threads", ">= 1"]),
    ("oracle-k", ["oracle", "--task", "prompts", "--data-file", "{prompts}", "--model", "{model}", "--k", "0",
                  "--out", "{tmp}/o"], ["--k", "positive"]),
    ("analyze-alpha", ["analyze", "--task", "prompts", "--data-file", "{prompts}", "--model", "{model}",
                       "--heads", "-1", "--out", "{tmp}/a"], ["--heads", "positive"]),
    ("train-heads-threads", ["train-heads", "--threads", "-2", "--out", "{tmp}/h"], ["--threads", ">= 1"]),
    ("train-heads-profile", ["train-heads", "--profile", "huge", "--out", "{tmp}/h"], ["unknown profile"]),
    ("train-heads-device", ["train-heads", "--device", "tpu", "--out", "{tmp}/h"], ["unknown device", "cuda:N"]),
    ("distill-data-device", ["distill-data", "--device", "gpu0"], ["unknown device 'gpu0'"]),
    ("build-history-device", ["build-history", "--device", "cuda:x"], ["unknown device"]),
    ("train-network-device", ["train-network", "eagle", "--device", "npu", "--out", "{tmp}/d"], ["unknown device"]),
    ("regress-no-baseline", ["regress", "--baseline", "{tmp}/none.json"], ["no baseline", "--update"]),
    ("replay-sampled", ["replay", "--task", "prompts", "--data-file", "{prompts}", "--model", "{model}",
                        "--temperature", "0.7", "--out", "{tmp}/r"], ["depends on the draws", "run --temperature"]),
    ("certify-greedy", ["certify", "--task", "prompts", "--data-file", "{prompts}", "--model", "{model}",
                        "--method", "bpd", "--temperature", "0", "--out", "{tmp}/c"], ["--temperature > 0"]),
    ("certify-rule", ["certify", "--task", "prompts", "--data-file", "{prompts}", "--model", "{model}",
                      "--method", "bpd", "--temperature", "1", "--rules", "lenient", "--out", "{tmp}/c"],
     ["unknown rule", "always-accept"]),
    ("speed-assistant-unused", ["speed", "--task", "prompts", "--data-file", "{prompts}", "--model", "{model}",
                                "--methods", "ar,pld", "--assistant", "nope", "--out", "{tmp}/s"],
     ["--assistant nope", "no plain hf-assisted"]),
    ("speed-prompts-missing", ["speed", "--task", "spec_bench", "--model", "{model}", "--prompts", "{tmp}/none.json",
                               "--out", "{tmp}/s"], ["no such draw file", "bpdbench draw"]),
    ("speed-turns-zero", ["speed", "--task", "mt_bench", "--model", "{model}", "--turns", "0", "--out", "{tmp}/s"],
     ["--turns", ">= 1"]),
    ("speed-top-k", ["speed", "--task", "prompts", "--data-file", "{prompts}", "--model", "{model}",
                     "--temperature", "1", "--top-k", "-1", "--out", "{tmp}/s"], ["--top-k", ">= 0"]),
]


@pytest.mark.parametrize("case,args,expect", OTHER_CASES, ids=[c[0] for c in OTHER_CASES])
def test_other_commands_refuse_bad_input(case, args, expect, finished_run, tiny_model_dir, tmp_path):
    src, prompts = finished_run
    fill = {"tmp": tmp_path, "prompts": prompts, "model": tiny_model_dir}
    results = tmp_path / "results"
    results.mkdir()
    (results / "keep.txt").write_text("reference results")
    code, text = cli(*[a.format(**fill) for a in args])
    assert code == 2, text
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in text, text
    for word in expect:
        assert word in errors[0], (word, errors[0])
    # nothing was created or changed: no output folders, the results root untouched
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["results"]
    assert snapshot(results) == {"keep.txt": b"reference results"}
