"""The leaderboard's prompts are held out: drawn once from the eval split, the same number per Spec-Bench task,
disjoint from every prompt another committed folder evaluated and from the replication draw."""
from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

import tasks
from bpdbench import paths
from bpdbench.config import ConfigError, RunConfig
from bpdbench.experiments import draw
from bpdbench.experiments.examples import select_examples

DRAWS = sorted((paths.REPO / "grids" / "draws").glob("*.json"))
BOARD = paths.REPO / "grids" / "draws" / "spec_bench-board.json"
REPLICATION = paths.REPO / "grids" / "draws" / "spec_bench-replication.json"
needs_data = pytest.mark.skipif(tasks.default_data_dir() is None, reason="no ../shared/data beside the checkout")


def test_the_board_and_its_replication_are_committed():
    assert BOARD in DRAWS and REPLICATION in DRAWS


@needs_data
@pytest.mark.parametrize("path", DRAWS, ids=lambda p: p.name)
def test_a_draw_is_eval_prompts_the_same_number_per_subtask(path: Path):
    data = json.loads(path.read_text())
    task = tasks.get_task(data["task"])
    split = tasks.split_of(task, tasks.load_examples(task, tasks.default_data_dir()))
    assert {split[i] for i in data["ids"]} == {"eval"}
    counts = Counter(data["subtasks"][i] for i in data["ids"])
    assert set(counts.values()) == {data["per_subtask"]}
    assert len(counts) == 6 if data["task"] == "spec_bench" else True


def test_board_and_replication_are_disjoint():
    board = set(json.loads(BOARD.read_text())["ids"])
    again = set(json.loads(REPLICATION.read_text())["ids"])
    assert len(board) >= 48 and len(again) >= 12 and not board & again


@pytest.mark.parametrize("path", DRAWS, ids=lambda p: p.name)
def test_no_other_committed_folder_evaluated_a_drawn_prompt(path: Path):
    assert draw.violations(paths.REPO / "results", path) == []


def _folder(root: Path, name: str, ids: list[str], prompts: str | None = None) -> None:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"config": {"task": "mt_bench", "prompts": prompts}}))
    (folder / "speed.jsonl").write_text("".join(json.dumps({"id": i, "method": "ar"}) + "\n" for i in ids))


def test_the_check_fails_on_a_folder_that_evaluated_a_board_prompt(tmp_path: Path):
    """The control: an MT-Bench study (same question ids as Spec-Bench's MT-Bench block) on a drawn question, its
    second turn included, is caught; the board's own folder is not."""
    board = tmp_path / "board.json"
    shutil.copy(BOARD, board)
    mt = next(i for i, s in json.loads(board.read_text())["subtasks"].items() if s == "mt_bench")
    _folder(tmp_path / "results", "study/mt_bench", ["1", f"{mt}-t2"])
    _folder(tmp_path / "results", "board/spec_bench", [mt], prompts=str(board))
    assert draw.violations(tmp_path / "results", board) == [f"study/mt_bench: {mt}"]


@needs_data
def test_a_draw_skips_what_was_evaluated_and_is_reproducible(tmp_path: Path):
    first = draw.make("spec_bench", 2, seed=3, exclude=set())
    again = draw.make("spec_bench", 2, seed=3, exclude=set())
    other = draw.make("spec_bench", 2, seed=4, exclude=set())
    assert first.ids == again.ids and first.ids != other.ids
    left = draw.make("spec_bench", 2, seed=3, exclude={first.ids[0]})
    assert first.ids[0] not in left.ids
    with pytest.raises(ConfigError, match="fewer than --per-subtask"):
        draw.make("spec_bench", 81, seed=3, exclude=set())


@needs_data
def test_selection_reads_the_draw_and_adds_second_turns(tmp_path: Path):
    cfg = RunConfig(task="spec_bench", prompts=str(BOARD), limit=None, turns=2)
    chosen = select_examples(cfg)
    ids = json.loads(BOARD.read_text())["ids"]
    firsts = [ex.id for ex in chosen if ex.turn == 0]
    assert firsts == ids
    seconds = [ex for ex in chosen if ex.turn == 1]
    assert len(seconds) == 8 and all(ex.id.endswith("-t2") and ex.prompt == ex.turns[1] for ex in seconds)
    assert chosen[chosen.index(seconds[0]) - 1].id == tasks.question_of(seconds[0].id, 1)
    tuned = select_examples(cfg, split="tune")          # sizing reads the tune split's first turns, not the draw
    assert all(ex.turn == 0 and ex.id not in ids for ex in tuned)


@needs_data
def test_bad_draw_files_are_one_line_errors(tmp_path: Path):
    with pytest.raises(ConfigError, match="no such draw file"):
        select_examples(RunConfig(task="spec_bench", prompts=str(tmp_path / "none.json")))
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(ConfigError, match="not a draw file"):
        select_examples(RunConfig(task="spec_bench", prompts=str(broken)))
    with pytest.raises(ConfigError, match="drawn for task spec_bench"):
        select_examples(RunConfig(task="mt_bench", prompts=str(BOARD)))
    stale = tmp_path / "stale.json"
    stale.write_text(json.dumps({"task": "spec_bench", "ids": ["90"]}))      # 90: the 10th record, train
    with pytest.raises(ConfigError, match="not in spec_bench's eval split"):
        select_examples(RunConfig(task="spec_bench", prompts=str(stale)))
    with pytest.raises(ConfigError, match="not both"):
        select_examples(RunConfig(task="spec_bench", prompts=str(BOARD)), per_category=1)


@needs_data
def test_the_audit_counts_a_second_turn_as_its_question():
    from bpdbench.experiments.audit import overlap
    seen = {"heads": {"ids": {"mt_bench": ["81"]}, "sha256": "x"}}
    out = overlap("mt_bench", ["81-t2", "82"], seen)
    assert out["evaluated"] == 2 and out["not_in_data"] == 0 and out["artefacts"]["heads"]["overlap"] == 1


def test_turns_below_one_is_refused():
    with pytest.raises(ConfigError, match="--turns must be >= 1"):
        RunConfig(turns=0).validate()
