"""The model-history artefact (the target's own greedy continuations, read by hierarchy's history table and REST's
datastore): its profiles, where it is cached and how it is read. Generating it is train/history.py's work; reading it
is decoding's, which therefore never imports the generator."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .. import paths


@dataclass(frozen=True)
class HistoryProfile:
    n_prompts: int
    gen_tokens: int
    max_prompt_tokens: int
    batch: int
    dtype: str                        # the target's dtype while generating
    seed: int = 0                     # the heads' seed: the same prompt pool, in the same order


# A fixed number of prompts, not a time budget, so the history (and every number drafted from it) is the same on
# every machine. ci: seconds, fp32 (deterministic across CPUs, as the ci heads); quick: 64 prompts x <= 128 greedy
# tokens, about 4 minutes on 2 idle cores (native bf16, batches of 16); full: 1024 prompts, about an hour. quick and
# full generate in the machine's fast dtype (auto: float32 where bfloat16 is emulated), and say the expected time
# first (train/pacing.py).
PROFILES = {"ci": HistoryProfile(n_prompts=8, gen_tokens=16, max_prompt_tokens=64, batch=8, dtype="float32"),
            "quick": HistoryProfile(n_prompts=64, gen_tokens=128, max_prompt_tokens=160, batch=16, dtype="auto"),
            "full": HistoryProfile(n_prompts=1024, gen_tokens=128, max_prompt_tokens=160, batch=16, dtype="auto")}
MINUTES = {"ci": 1, "quick": 4, "full": 60}


def history_file(model_name: str, profile: str) -> Path:
    return paths.lookup_dir(model_name) / f"history-{profile}.json"


def load(path: Path) -> tuple[list[list[int]], dict]:
    """(continuations, metadata without them). A file that is not such a record (random bytes, a torn write, other
    JSON) is one line naming it and the fix, not a parser's words about a byte."""
    from ..store.seal import ArtefactDamaged
    path = Path(path)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        seqs = record.pop("continuations")
        if not isinstance(seqs, list) or not all(isinstance(s, list) for s in seqs):
            raise TypeError("continuations is not a list of token lists")
    except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as e:
        profile = path.stem.removeprefix("history-")
        raise ArtefactDamaged(f"{path} is not a model history ({type(e).__name__}); delete it and run `bpdbench "
                              f"build-history --profile {profile}` (or let the next run build it)") from None
    return seqs, record
