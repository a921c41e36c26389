"""Which training data a profile names: the greedy distillation data (train/distill.py: the base's own continuations,
made at decode speed) or teacher-forced prefill data (train/prefill.py: fixed text, one forward per chunk).

Why one entry point: every trainer (draft networks, the blockwise heads) takes a data name or budget object from
its profile, and both kinds load as the same `DistillData`, so a profile switches data by naming it, and no trainer
asks which kind it got. Prefill budgets are named `prefill-*`, so the two tables never share a cache folder.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from . import distill, prefill
from .profiles import name_of

Log = Callable[[str], None]


def is_prefill(data) -> bool:
    return isinstance(data, prefill.PrefillBudget) or (isinstance(data, str) and data in prefill.BUDGETS)


def check(data) -> None:
    """A one-line ValueError for a data name neither table knows (before anything loads)."""
    if isinstance(data, str) and data not in distill.BUDGETS and data not in prefill.BUDGETS:
        raise ValueError(f"unknown training data '{data}'; valid: {', '.join([*distill.BUDGETS, *prefill.BUDGETS])}")


def load_data(model_name: str, data, model=None, tok=None, log: Log = print, device: str | None = None,
              layers: bool = True) -> distill.DistillData:
    """The cached data a profile names, built first when missing (prefill data resumes a killed build). `layers`:
    whether the trainer reads chosen layers' states (prefill data keeps them; only eagle3 reads them)."""
    check(data)
    if is_prefill(data):
        return prefill.ensure(model_name, data, model, tok, log, device, layers)
    return distill.ensure(model_name, data, model, tok, log, device)


def data_path(model_name: str, data) -> Path:
    return distill.path_for(model_name, name_of(data))
