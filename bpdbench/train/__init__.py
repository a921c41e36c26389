"""Training: heads, draft networks, neural rescorers, the model history, distillation data. `register_builders`
hands its builders to the artefact policy (bpdbench/artefacts/policy.py), which is how a method's first use trains
what it needs without decoding code importing training code; the command runtime calls it
(experiments.session.register_builders), and each builder imports its trainer when called."""
from __future__ import annotations

from ..artefacts.policy import register


def _heads(model_name, profile, model=None, tok=None, log=print):
    from . import heads
    return heads.train(model_name, profile, model, tok, log=log)


def _network(trained_name, profile, model_name, model=None, tok=None, log=print):
    from .network import train
    return train(trained_name, profile, model_name, model, tok, log=log)


def _neural_rescorer(size, model_name, minutes, log=print):
    from .rescorer import train_neural
    return train_neural(size, model_name, minutes=minutes, log=log)


def _history(model_name, profile, model=None, tok=None, log=print):
    from . import history
    return history.build(model_name, profile, model, tok, log)


def _distill(model_name, budget, model=None, tok=None, log=print):
    """A distillation dataset by its budget's name: a networks' budget (quick, full, ci), a heads profile's
    (heads-quick), derived from that profile as `train-heads` derives it, or teacher-forced prefill data
    (prefill-bench: train/prefill.py)."""
    from . import heads
    from .data import load_data
    from .profiles import resolve
    if budget.startswith("heads-"):
        budget = heads.data_budget(resolve(budget[len("heads-"):], heads.PROFILES))
    return load_data(model_name, budget, model, tok, log)


def register_builders() -> None:
    """Explicit, not an import's side effect: importing training code changes nothing until a command asks."""
    register("heads", _heads)
    register("distill", _distill)
    register("network", _network)
    register("neural-rescorer", _neural_rescorer)
    register("history", _history)
