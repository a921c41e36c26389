"""Rescorer artefacts on first use, as heads are: a missing n-gram is built (seconds), a missing neural LM is trained
after saying how long it takes (refuse with --no-auto-train)."""
from __future__ import annotations

from pathlib import Path

from .. import refine
from .keys import Requirement
from .policy import Need, builder
from ..config import RunConfig


def _path(spec: refine.RescorerSpec, model: str):
    if spec.scorer == "ngram" or spec.scorer == "neural" or spec.size:
        tag = f"ngram{spec.order}" if spec.scorer == "ngram" else f"neural-{spec.size}"
        name = f"ngram{spec.order}.bin" if spec.scorer == "ngram" else "config.json"
        return tag, refine.artefact_dir(tag, model) / name
    return None, None


def ready(spec: refine.RescorerSpec, model: str) -> list[Requirement]:
    tag, path = _path(spec, model)
    return [] if tag is None else [Requirement(tag, path.exists(), "rescorer", path.parent, need(spec, model).minutes)]


def need(spec: refine.RescorerSpec, model: str) -> Need:
    """What building the rescorer's artefact is: said by its first use and by the sweep's dry run alike."""
    if spec.scorer == "ngram":
        return Need(f"ngram{spec.order} for {model}", f"bpdbench train-rescorer ngram --order {spec.order}", 0.25,
                    spec.name)
    return Need(f"neural-{spec.size} for {model}", f"bpdbench train-rescorer neural --size {spec.size}", 15, spec.name)


def ensure(spec: refine.RescorerSpec, cfg: RunConfig, tok, log) -> None:
    tag, path = _path(spec, cfg.model)
    if tag is None or path.exists():
        return
    if spec.scorer == "ngram":
        from ..refine.ngram import train_ngram
        from tasks import corpus_files
        log(f"{spec.name} needs a {spec.order}-gram for {cfg.model}: building it now (about 15 s; "
            f"`{need(spec, cfg.model).command}`)")
        corpus = corpus_files(Path(cfg.data_dir) if cfg.data_dir else None)
        train_ngram(spec.order, lambda s: tok(s, add_special_tokens=False)["input_ids"], corpus, path.parent,
                    discount_fallback=True)   # only used when the corpus is too small to estimate discounts
        return
    need(spec, cfg.model).build(cfg.auto_train, lambda: builder("neural-rescorer")(spec.size, cfg.model, 15.0, log),
                                log, path)
