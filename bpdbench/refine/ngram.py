"""n-gram rescoring of the draft lattice (the paper's "n-gram BPD" and "16-best n-gram BPD"), plus training.

The LM is a KenLM model over the target's token ids written as words (str(id)), so no detokenisation happens at
decode time. Training shells out to KenLM's lmplz/build_binary (built by `make kenlm`, scripts/install_kenlm.sh).
"""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

from .lattice import DEFAULT_BEAM, pbest_rescored
from ..models import sha256_file  # checksum of the trained binary
from .base import Lattice

LN10 = math.log(10.0)
REPO_ROOT = Path(__file__).resolve().parents[2]
_FIX = "run `make kenlm` (scripts/install_kenlm.sh)"


class KenLMMissing(RuntimeError):
    """KenLM (Python module or lmplz/build_binary) is not installed; the message names the fix."""


def _import_kenlm():
    try:
        import kenlm  # noqa: PLC0415 - optional dependency, imported on use
    except ImportError as e:
        raise KenLMMissing(f"the kenlm Python module is not installed ({e}); {_FIX}") from None
    return kenlm


class KenLMScorer:
    """A KenLM model seen as the `StateLM` that `pbest_rescored` searches over.

    States are `kenlm.State` objects, which hash and compare by the (minimised) context words, so two histories the
    model cannot tell apart become one DP state. Scores are natural logs (KenLM gives log10).
    """

    def __init__(self, path: str | Path):
        kenlm = _import_kenlm()
        self._kenlm = kenlm
        self.path = str(path)
        self.model = kenlm.Model(self.path)
        self.order: int = int(self.model.order)
        self._base_score = self.model.BaseScore
        self._new_state = kenlm.State
        self._words: dict[int, str] = {}
        self.score = self._make_score()  # per-instance closure: the search calls it thousands of times per step

    def _word(self, token: int) -> str:
        w = self._words.get(token)
        if w is None:
            w = self._words[token] = str(int(token))
        return w

    def initial_state(self, context: list[int]):
        """State after the last order-1 context ids, starting from the null context (not <s>): the draft continues
        running text, it does not start a sentence."""
        state = self._new_state()
        self.model.NullContextWrite(state)
        n = self.order - 1
        for tok in (context[-n:] if n > 0 else []):
            out = self._new_state()
            self._base_score(state, self._word(tok), out)
            state = out
        return state

    def _make_score(self):
        base_score, new_state, words, word = self._base_score, self._new_state, self._words, self._word

        def score(state, token: int):
            """(natural-log P(token | state), next state)."""
            out = new_state()
            w = words.get(token)
            return base_score(state, w if w is not None else word(token), out) * LN10, out

        return score

    def sentence_logprob(self, ids: list[int]) -> float:
        """log10 of a whole id sequence with <s> ... </s>, as `kenlm.Model.score` computes it (used by tests)."""
        return float(self.model.score(" ".join(map(str, ids)), bos=True, eos=True))


class NgramRescorer:
    """Global n-gram rescoring of the top-k lattice: the p best paths under head + alpha * LM log-probs."""

    def __init__(self, name: str, lm_path: str | Path, alpha: float, p: int, k: int, beam: int = DEFAULT_BEAM):
        self.name = name
        self.alpha = float(alpha)
        self.p = int(p)
        self.k = int(k)
        self.beam = int(beam)
        self.lm = KenLMScorer(lm_path)

    def reset(self, prompt_ids: list[int]) -> None:
        """Nothing to drop: all caches live inside one `refine` call."""

    def refine(self, lattice: Lattice, context: list[int]) -> list[list[int]]:
        if lattice.ids.shape[-1] > self.k:
            lattice = Lattice(ids=lattice.ids[:, : self.k], logprobs=lattice.logprobs[:, : self.k])
        paths = pbest_rescored(lattice, self.p, self.alpha, self.lm, context, beam=self.beam)
        return [ids for _, ids in paths]


# ---------------------------------------------------------------------------------------------------- training


def find_kenlm_tool(name: str) -> str:
    """Path of a KenLM binary: $KENLM_BIN, then .cache/kenlm/build/bin under the repo root, then PATH."""
    dirs = [os.environ.get("KENLM_BIN"), str(REPO_ROOT / ".cache" / "kenlm" / "build" / "bin")]
    for d in dirs:
        if d and os.access(os.path.join(d, name), os.X_OK):
            return os.path.join(d, name)
    found = shutil.which(name)
    if found:
        return found
    raise KenLMMissing(f"KenLM tool `{name}` not found in $KENLM_BIN, .cache/kenlm/build/bin or PATH; {_FIX}")


def _documents(path: Path) -> Iterator[str]:
    """Documents of a corpus file: the `text` field of each JSONL record, or each non-empty line of a text file."""
    with open(path, encoding="utf-8") as f:
        if path.suffix == ".jsonl":
            for line in f:
                if line.strip():
                    text = json.loads(line).get("text", "")
                    if text.strip():
                        yield text
        else:
            for line in f:
                if line.strip():
                    yield line.rstrip("\n")


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        raise RuntimeError(f"{Path(cmd[0]).name} failed (exit {proc.returncode}): {tail}")


def train_ngram(order: int, tokenize: Callable[[str], list[int]], corpus_files: list[Path], out_dir: Path,
                memory: str = "500M", discount_fallback: bool = False) -> Path:
    """Train a modified-Kneser-Ney order-`order` LM over token ids; returns out_dir/ngram{order}.bin (trie).

    Each document becomes one line of whitespace-joined ids (lmplz adds <s>/</s> per line). `memory` is passed as
    -S: without it lmplz grabs 80% of RAM. Tiny corpora need `discount_fallback` (lmplz cannot estimate the
    discounts). Writes out_dir/ngram{order}.json next to the binary with what was trained and its sha256.
    """
    lmplz, build_binary = find_kenlm_tool("lmplz"), find_kenlm_tool("build_binary")
    t0 = time.time()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    binary = out_dir / f"ngram{order}.bin"
    n_tokens = n_lines = 0
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".ngram_tmp_") as tmp:
        text, arpa = Path(tmp) / "corpus.txt", Path(tmp) / "lm.arpa"
        with open(text, "w", encoding="utf-8") as f:
            for cf in corpus_files:
                for doc in _documents(Path(cf)):
                    ids = tokenize(doc)
                    if ids:
                        f.write(" ".join(map(str, ids)))
                        f.write("\n")
                        n_tokens += len(ids)
                        n_lines += 1
        if n_lines == 0:
            raise ValueError(f"no documents in {[str(c) for c in corpus_files]}")
        cmd = [lmplz, "-o", str(order), "-S", memory, "-T", tmp, "--text", str(text), "--arpa", str(arpa)]
        if discount_fallback:
            cmd.append("--discount_fallback")
        _run(cmd)
        _run([build_binary, "trie", str(arpa), str(binary)])
    meta = {
        "order": order,
        "n_tokens": n_tokens,
        "n_lines": n_lines,
        "corpus_files": [str(c) for c in corpus_files],
        "memory": memory,
        "discount_fallback": discount_fallback,
        "binary": binary.name,
        "sha256": sha256_file(binary),
        "seconds": round(time.time() - t0, 3),
    }
    (out_dir / f"ngram{order}.json").write_text(json.dumps(meta, indent=2) + "\n")
    return binary
