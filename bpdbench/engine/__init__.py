"""The decode engine: drafter protocol, decode loop, acceptance rules, token trees, KV compaction, counters.
Imports torch and transformers only; every method plugs in through `Drafter`."""
from .acceptance import GREEDY, Acceptance, Decision, GreedyAcceptance
from .counters import Counters, ratios
from .events import OnStep, StepEvent
from .loop import Generation, Limits, TreeScorer, generate
from .replay import replay, teacher_forced, teacher_forced_layers
from .sampling import RULES, Sampler, SamplingParams, SpeculativeSampling
from .types import (EMPTY, DraftContext, Drafter, EmptyDrafter, Feedback, Lattice, Layers, Proposal,
                    layers_of)

__all__ = ["GREEDY", "Acceptance", "Decision", "GreedyAcceptance", "Counters", "ratios", "Generation", "Limits",
           "generate", "TreeScorer", "Feedback", "StepEvent", "OnStep", "replay", "teacher_forced",
           "teacher_forced_layers", "EMPTY",
           "DraftContext", "Drafter", "EmptyDrafter", "Lattice", "Layers", "layers_of", "Proposal", "RULES", "Sampler",
           "SamplingParams", "SpeculativeSampling"]
