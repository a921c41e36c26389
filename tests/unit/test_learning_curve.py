"""The draft networks' learning curve (`bpdbench tables`: drafters_learning_curve.csv/.png): held-out top-1 at depth
1 against the positions each fit had seen, from training reports only."""
from __future__ import annotations

import json

import pytest

from bpdbench.report import drafters, plots


def _report(tmp_path, name, **extra):
    folder = tmp_path / "drafters" / "training"
    folder.mkdir(parents=True, exist_ok=True)
    r = {"name": name, "profile": "quick", "drafter": "hydra", "heldout": {"top1": [0.4, 0.2]},
         "fit": {"steps": 10, "kept_step": 8}, "fit_config": {"batch": 512}, "family": {"objective": "positional"},
         "data": {"greedy_positions": 1000, "rows": 1500, "sequences": 10}} | extra
    (folder / f"{name}.json").write_text(json.dumps(r))


def test_checkpoints_and_kept_weights_in_positions(tmp_path):
    curve = [{"step": 4, "samples_seen": 32, "heldout_top1": [0.3, 0.1]},
             {"step": 8, "samples_seen": 64, "heldout_top1": [0.5, 0.2]}, {"step": 9, "score": 1.2}]
    _report(tmp_path, "eagle", fit={"steps": 10, "kept_step": 8, "validation": curve}, fit_config={"batch": 8},
            family={"objective": "unrolled"}, positions_per_sample=150.0, heldout={"top1": [0.5, 0.2]})
    _report(tmp_path, "hydra")
    df = drafters.learning_curve(tmp_path)
    eagle = df[df.network == "eagle"]
    assert eagle.point.tolist() == ["checkpoint", "checkpoint", "kept"]     # a checkpoint without top-1 is left out
    assert eagle.positions_seen.tolist() == [32 * 150, 64 * 150, 8 * 8 * 150]
    assert eagle.top1_d1.tolist() == [0.3, 0.5, 0.5]
    hydra = df[df.network == "hydra"].iloc[0]      # positional: a sample is one row; the kept step, not the last
    assert (hydra.point, hydra.positions_seen, hydra.distinct_positions) == ("kept", 8 * 512, 1000)
    assert plots.learning_curves(df, tmp_path / "c.png", "x").stat().st_size > 0


@pytest.mark.parametrize("batch,per", [(8, 150.0), (512, 1.0)])
def test_older_reports_infer_a_sample_from_the_batch(tmp_path, batch, per):
    """Reports from before `positions_per_sample` name no objective: a sequential fit batches a few sequences."""
    _report(tmp_path, "old", family={}, fit_config={"batch": batch})
    assert drafters.learning_curve(tmp_path).positions_seen.iloc[0] == round(8 * batch * per)


def test_nothing_to_draw(tmp_path):
    assert drafters.learning_curve(tmp_path).empty
    assert plots.learning_curves(drafters.learning_curve(tmp_path), tmp_path / "c.png", "x") is None
