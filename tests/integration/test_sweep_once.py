"""The sweep plans each cell once: the driver validates its config, parses its method spellings and selects its
examples once, in `prepare` (experiments/plan.py), and ships that Plan to the worker, which runs it without
validating, parsing or loading data again. Counted over a tiny real sweep (load, `--dry-run`, then every cell run
in-process as a Ray worker runs it, from a pickled copy as Ray ships it)."""
from __future__ import annotations

import pickle
import sys
from collections import Counter
from typing import Callable

from tests.integration.test_sweep import COMMON, data  # noqa: F401 (data is a fixture)

# what the sweep parses, validates and loads through; every module binding of these functions is counted
COUNTED = {"parse": ("bpdbench.methods.spelling", "parse"), "parse_list": ("bpdbench.methods.spelling", "parse_list"),
           "prepare": ("bpdbench.experiments.plan", "prepare"),
           "select": ("bpdbench.experiments.examples", "select_examples")}


def _grid(model, results) -> str:
    defaults = [f'{k} = "{model}"' if k == "model" else f"{k} = {v!r}".replace("'", '"')
                for k, v in {**COMMON, "limit": 1, "max_new_tokens": 4}.items()]
    return "\n".join(["[sweep]", f'results = "{results}"', "threads = 1", "", "[defaults]", *defaults, "",
                      "[[run]]", 'tasks = ["xsum"]', 'methods = ["ar", "pld"]', "",
                      "[[replay]]", 'tasks = ["xsum"]', 'methods = ["bpd", "pld"]', "",
                      "[[speed]]", 'tasks = ["mt_bench"]', 'methods = ["ar", "pld"]', "repeats = 1", "",
                      "[[oracle]]", 'tasks = ["xsum"]', "k = 4", ""])


def _count(monkeypatch, calls: list, phase: list) -> None:
    """Replace every bpdbench binding of the counted functions by a counting wrapper. A call from inside
    bpdbench.methods (parse_list's own parse of each item, canonical's) is part of the outer call, not counted."""
    import importlib

    from bpdbench.sweep import cells, commands, driver, grid  # noqa: F401 (their bindings are patched too)
    for what, (module, name) in COUNTED.items():
        real = getattr(importlib.import_module(module), name)

        def wrapper(*a, _real: Callable = real, _what: str = what, **k):
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if not caller.startswith("bpdbench.methods"):
                calls.append((phase[0], _what, caller, a[0] if a else None))
            return _real(*a, **k)
        for mod in [m for n, m in list(sys.modules.items()) if n.startswith("bpdbench") and m is not None]:
            for attr, value in list(vars(mod).items()):
                if value is real:
                    monkeypatch.setattr(mod, attr, wrapper)
    from bpdbench.config import RunConfig
    real_validate = RunConfig.validate

    def validate(self):
        calls.append((phase[0], "validate", "", None))
        return real_validate(self)
    monkeypatch.setattr(RunConfig, "validate", validate)


def _spellings(calls: list, phase: str) -> Counter:
    from bpdbench.methods import split_list
    out: Counter = Counter()
    for p, what, _, arg in calls:
        if p == phase and what in ("parse", "parse_list"):
            out.update(split_list(arg) if isinstance(arg, str) and what == "parse_list" else
                       [s for x in arg for s in split_list(x)] if what == "parse_list" else [arg])
    return out


def test_each_cell_is_validated_parsed_and_loaded_once(tiny_model_dir, data, tmp_path, monkeypatch):
    from bpdbench.sweep import cells, driver, grid
    monkeypatch.setenv("BPDBENCH_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "g.toml"
    path.write_text(_grid(tiny_model_dir, tmp_path / "res"))
    calls: list = []
    phase = ["driver"]
    _count(monkeypatch, calls, phase)

    plan = grid.load(path, data=str(data))
    shown: list[str] = []
    driver.show(plan, out=shown.append)                 # --dry-run: plans nothing again
    n = len(plan.cells)
    assert n == 5 and "5 cells (0 finished, 5 to run)" in shown[0]
    driver_calls = Counter(what for p, what, _, _ in calls if p == "driver")
    assert driver_calls["prepare"] == n and driver_calls["validate"] == n, driver_calls
    assert driver_calls["select"] <= n                # one selection per cell at most (cells of a task share it)
    # each spelling of each cell parsed once: run ar, run pld, replay bpd,pld, speed ar,pld, oracle's drafts
    want = Counter(["ar", "pld", "bpd", "pld", "ar", "pld", "bpd", "oracle:k=1", "oracle:k=2", "oracle:k=4"])
    assert _spellings(calls, "driver") == want, calls

    monkeypatch.setenv("BPDBENCH_RESULTS", str(plan.results))
    monkeypatch.setenv("BPDBENCH_DATA", str(data))
    phase[0] = "worker"
    for cell in plan.cells:
        shipped = pickle.loads(pickle.dumps(cell))      # as Ray ships it to another process: plain pickle
        assert [m.label for m in shipped.plan.methods] == [m.label for m in cell.plan.methods]
        assert shipped.plan.examples == cell.plan.examples and shipped.plan.cfg == cell.plan.cfg
        res = cells.run_cell(shipped, 0, "sweep/g", None)
        assert res["status"] == "ok", res
    sweep_side = [c for c in calls if c[0] == "worker" and (c[2].startswith("bpdbench.sweep")
                                                              or c[2] == "bpdbench.experiments.plan")]
    worker = Counter(what for p, what, _, _ in calls if p == "worker")
    assert worker["prepare"] == worker["validate"] == worker["select"] == 0, worker
    assert sweep_side == [], sweep_side                # the worker parses none of the cell's spellings again
    assert all((plan.results / c.rel / "config.json").is_file() for c in plan.cells)


def test_a_plan_pickles_with_its_methods_by_registry_reference(data, monkeypatch):
    """A Plan (RunConfig, parsed Methods, loaded examples) survives plain pickle; its methods come back as the
    registry's own specs, looked up by name, not parsed (a spec holds lambdas: pickled by value it would fail)."""
    from bpdbench.config import RunConfig
    from bpdbench.experiments import plan as plan_lib
    from bpdbench.methods import REGISTRY, parse
    monkeypatch.setenv("BPDBENCH_DATA", str(data))
    plan = plan_lib.prepare(RunConfig(task="xsum", limit=2, dtype="float32"), "replay",
                            [parse("bpd:heads=2"), parse("pld"), parse("sam:fallback=pld")], files=False)
    parsed: list = []
    monkeypatch.setattr(plan_lib, "parse", lambda *a: parsed.append(a) or parse(*a))
    back = pickle.loads(pickle.dumps(plan))
    assert back == plan and [m.label for m in back.methods] == ["bpd:heads=2", "pld", "sam:fallback=pld"]
    assert all(m.spec is REGISTRY[m.name] for m in back.methods) and parsed == []
    assert len(back.examples) == 2 and back.out == plan.out
