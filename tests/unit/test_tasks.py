"""Task adapters on tiny synthetic fixtures (no network, no dataset text in the repo), plus one real-data count check."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tasks import TASKS, DataError, default_data_dir, get_task, load_examples, select, split, splits
from tasks._summarization import MAX_DOC_WORDS
from tasks.squad import exact_match, f1

SUMMARIZATION = ("cnn_dailymail", "samsum", "xsum", "multi_news", "newsroom")


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("BPDBENCH_DATA", raising=False)


def write(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def questions(start: int, n: int, category: str = "writing") -> list[dict]:
    return [{"question_id": start + i, "category": category, "turns": [f"q{start + i}", "follow-up"]} for i in range(n)]


def squad_records(titles: list[str], per_title: int = 2) -> list[dict]:
    return [{"id": f"{t}-{j}", "title": t, "context": f"Passage about {t}.", "question": f"What is {t}?",
             "answers": [t, f"the {t}"]} for t in titles for j in range(per_title)]


def test_lambada_parse_and_accuracy(tmp_path):
    write(tmp_path / "lambada/test.jsonl", [{"id": 0, "text": "He opened the door and saw his  dog"}])
    [ex] = load_examples(get_task("lambada"), tmp_path)
    assert (ex.id, ex.prompt, ex.target, ex.reference) == ("0", "He opened the door and saw his", " dog", "dog")
    score = TASKS["lambada"].score
    assert score(ex, " dog.") == {"accuracy": 1.0}
    assert score(ex, '\n"dog!" he said') == {"accuracy": 1.0}
    assert score(ex, " cat") == {"accuracy": 0.0}
    assert score(ex, "") == {"accuracy": 0.0}


def test_squad_parse_and_scores(tmp_path):
    write(tmp_path / "squad/validation.jsonl", squad_records(["Paris"], per_title=1))
    [ex] = load_examples(get_task("squad"), tmp_path)
    assert "Passage about Paris." in ex.prompt and "What is Paris?" in ex.prompt
    assert ex.reference == ("Paris", "the Paris")
    assert exact_match("The Eiffel Tower!", "eiffel tower") == 1.0  # article + punctuation + case removed
    assert exact_match("an apple", "apple") == 1.0
    assert exact_match("Eiffel", "Eiffel Tower") == 0.0
    assert f1("Eiffel", "the Eiffel Tower") == pytest.approx(2 / 3)
    assert f1("a", "the") == 0.0
    assert TASKS["squad"].score(ex, "the paris.\nBecause ...") == {"exact_match": 1.0, "f1": 1.0}
    assert TASKS["squad"].score(ex, "Lyon") == {"exact_match": 0.0, "f1": 0.0}


def test_squad_holds_out_whole_articles():
    titles = [f"T{i}" for i in range(12)] + ["T9"]  # T9 reappears later: still held out as one article
    task = get_task("squad")
    examples = [task.parse(r) for r in squad_records(titles)]
    parts = splits(task, examples)
    heldout = parts["train"]
    assert {ex.unit for ex in heldout} == {"T9"} and len(heldout) == 4
    assert sum(map(len, parts.values())) == len(examples)
    units = [{ex.unit for ex in part} for part in parts.values()]
    assert not units[0] & units[1] and not units[1] & units[2] and not units[0] & units[2]   # whole articles


def test_every_example_is_in_exactly_one_split_and_tune_is_the_tail():
    """train / tune / eval partition the task; tune is the tail (runs select from the front, across MT-Bench's
    10-question categories too); Spec-Bench's first 80 questions are MT-Bench's and land in the same split in both,
    its own categories each give their tail."""
    mt = [{"question_id": i, "category": f"c{i // 10}", "turns": [f"q{i}"]} for i in range(80)]
    own = [{"question_id": 80 + i, "category": "qa" if i < 20 else "rag", "turns": [f"r{i}"]} for i in range(40)]
    parts = {}
    for name, rows in (("mt_bench", mt), ("spec_bench", mt + own)):
        task = get_task(name)
        parts[name] = splits(task, [task.parse(r) for r in rows])
        ids = [ex.id for part in parts[name].values() for ex in part]
        assert sorted(ids, key=int) == [str(r["question_id"]) for r in rows] and len(set(ids)) == len(rows)
        assert split(task, [task.parse(r) for r in rows]) == (parts[name]["eval"], parts[name]["train"])
    assert [ex.id for ex in parts["mt_bench"]["tune"]] == [str(i) for i in range(73, 79)]
    assert [ex.id for ex in parts["mt_bench"]["eval"]][:10] == [str(i) for i in (*range(9), 10)]   # front intact
    for name in ("train", "tune"):
        assert {ex.id for ex in parts["mt_bench"][name]} == {ex.id for ex in parts["spec_bench"][name] if int(ex.id) < 80}
    assert [ex.id for ex in parts["spec_bench"]["tune"] if int(ex.id) >= 80] == ["97", "98", "117", "118"]
    prompts = get_task("prompts")
    assert splits(prompts, [prompts.parse({"id": "1", "prompt": "x"})])["tune"] == []


@pytest.mark.parametrize("name", SUMMARIZATION)
def test_summarization_parse_prompt_and_rouge(tmp_path, name):
    document = "Alice: hi\nBob: hello there ||||| second article"
    write(tmp_path / f"{name}/test.jsonl", [{"id": "a1", "document": document, "summary": "Bob greets Alice."}])
    [ex] = load_examples(get_task(name), tmp_path)
    assert ex.id == "a1" and ex.reference == "Bob greets Alice."
    assert ("Alice: hi\nBob: hello there" in ex.prompt) and ex.prompt.index("Alice") > 0  # instruction first
    assert ("|||||" not in ex.prompt) == (name == "multi_news")
    assert TASKS[name].score(ex, "Bob greets Alice.") == {"rougeL": pytest.approx(1.0)}
    assert TASKS[name].score(ex, "unrelated words")["rougeL"] == 0.0


def test_summarization_truncates_document(tmp_path):
    words = [f"w{i}" for i in range(MAX_DOC_WORDS + 50)]
    write(tmp_path / "xsum/test.jsonl", [{"id": "x", "document": " ".join(words), "summary": "s"}])
    [ex] = load_examples(get_task("xsum"), tmp_path)
    assert f"w{MAX_DOC_WORDS - 1}" in ex.prompt and f"w{MAX_DOC_WORDS} " not in ex.prompt + " "


@pytest.mark.parametrize("name", ["mt_bench", "spec_bench"])
def test_chat_parse(tmp_path, name):
    write(tmp_path / f"{name}/question.jsonl", questions(81, 3))
    examples = load_examples(get_task(name), tmp_path)
    assert [ex.id for ex in examples] == ["81", "82", "83"]
    assert examples[0].prompt == "q81" and examples[0].turns == ("q81", "follow-up")
    assert examples[0].category == "writing" and TASKS[name].score(examples[0], "x") == {}


def test_spec_bench_holds_out_same_mt_bench_questions(tmp_path):
    mt = questions(81, 80)
    write(tmp_path / "mt_bench/question.jsonl", mt)
    write(tmp_path / "spec_bench/question.jsonl", mt + questions(1000, 40, "translation"))
    _, mt_out = split(get_task("mt_bench"), load_examples(get_task("mt_bench"), tmp_path))
    _, spec_out = split(get_task("spec_bench"), load_examples(get_task("spec_bench"), tmp_path))
    assert [ex.id for ex in mt_out] == [ex.id for ex in spec_out if ex.category == "writing"]
    assert len(mt_out) == 8 and len(spec_out) == 12


def test_prompts_requires_data_file_and_holds_nothing_out(tmp_path):
    task = get_task("prompts")
    with pytest.raises(DataError) as err:
        load_examples(task, tmp_path)
    assert str(err.value) == "prompts: pass --data-file PATH (JSONL with fields id, prompt)"
    path = write(tmp_path / "mine.jsonl", [{"id": i, "prompt": f"p{i}"} for i in range(20)])
    examples = load_examples(task, None, data_file=path)
    assert split(task, examples) == (examples, [])


@pytest.mark.parametrize("name", [n for n in TASKS if n != "prompts"])
def test_missing_file_is_one_line_naming_path(tmp_path, name):
    task = get_task(name)
    with pytest.raises(DataError) as err:
        load_examples(task, tmp_path)
    message = str(err.value)
    assert "\n" not in message and str(tmp_path / task.files[0]) in message and task.layout in message
    if name in ("multi_news", "newsroom"):
        assert "cannot be redistributed" in message
        assert f"{name}/test.jsonl with fields id, document, summary" in message


def test_malformed_record_names_file_line_and_field(tmp_path):
    good = {"id": "1", "document": "d", "summary": "s"}
    path = write(tmp_path / "xsum/test.jsonl", [good, {"id": "2", "summary": "s"}])
    with pytest.raises(DataError, match=rf"{re.escape(str(path))}:2: missing field 'document'"):
        load_examples(get_task("xsum"), tmp_path)
    path.write_text(json.dumps(good) + "\n{not json\n", encoding="utf-8")
    with pytest.raises(DataError, match=rf"{re.escape(str(path))}:2: not valid JSON"):
        load_examples(get_task("xsum"), tmp_path)


def test_split_and_select_are_deterministic(tmp_path):
    write(tmp_path / "samsum/test.jsonl", [{"id": str(i), "document": "d", "summary": "s"} for i in range(25)])
    task = get_task("samsum")
    evaluated, heldout = split(task, load_examples(task, tmp_path))
    assert [ex.id for ex in heldout] == ["9", "19"] and len(evaluated) == 21     # ceil(8% of 23) = 2 tune
    assert [ex.id for ex in splits(task, load_examples(task, tmp_path))["tune"]] == ["23", "24"]
    assert split(task, load_examples(task, tmp_path)) == (evaluated, heldout)
    assert [ex.id for ex in select(evaluated, 2, 3)] == ["2", "3", "4"]
    assert select(evaluated, 20, None) == evaluated[20:] and select(evaluated, 0, 0) == []
    with pytest.raises(ValueError):
        select(evaluated, -1, None)


def test_unknown_task_lists_valid_names():
    with pytest.raises(ValueError) as err:
        get_task("nope")
    assert "unknown task 'nope'" in str(err.value) and all(name in str(err.value) for name in TASKS)


def test_default_data_dir_honours_env(monkeypatch, tmp_path):
    monkeypatch.setenv("BPDBENCH_DATA", str(tmp_path))
    assert default_data_dir() == tmp_path


REAL_COUNTS = {"lambada": 5153, "squad": 10570, "xsum": 1000, "cnn_dailymail": 250, "samsum": 819,
               "mt_bench": 80, "spec_bench": 480}


def test_real_shared_data_counts():
    data_dir = default_data_dir()
    if data_dir is None or not (data_dir / "squad").is_dir():
        pytest.skip("shared data directory not available")
    loaded = {name: load_examples(get_task(name), data_dir) for name in REAL_COUNTS}
    assert {name: len(examples) for name, examples in loaded.items()} == REAL_COUNTS
    assert [ex.id for ex in loaded["spec_bench"][:80]] == [ex.id for ex in loaded["mt_bench"]]
