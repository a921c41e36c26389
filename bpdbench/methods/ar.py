"""Autoregressive decoding: the empty drafter, the baseline every method is certified against. At T > 0 it is plain
sampling from p (nothing drafted, every token drawn by the sampling rule), the baseline of `bpdbench certify`.

Two more spellings of the same decoding:

- `null`: AR under its own label, timed by `speed` as an ordinary method beside `ar` (the baseline every speedup
  divides by). Its speedup is AR against AR, so it reads 1.00 up to the machine's noise: every board's noise floor,
  checked rather than assumed.
- `ar:rows=N`: AR through the cheapest forward this engine has on the machine. On some CPUs a forward over a few
  rows costs less than over one (AMD EPYC with AVX512-BF16, torch bfloat16 with packed oneDNN weights: 4 rows at
  0.88 of a 1-row step at a 1024-token context), so every decode step's forward carries its one real token padded to
  N rows. The padding is a draft of N - 1 filler tokens (`PaddedRows`) that the ordinary verify stage scores and
  accepts only where each equals the greedy choice, with the KV cache cropped as for any draft: token-identical to
  greedy decoding by the same argument as every drafter, with no code path of its own. The filler is a cheap guess
  (what followed the token's latest earlier occurrence), so a lucky guess is kept as a free token.
  `rows=auto`: the N in 1..8 whose forward this machine's calibration prices lowest (`search.Cheapest`: read from
  the cost curve alone, nothing replayed; see its docstring for why); N = 1 is the empty drafter, tagged "(auto: AR)"
  as any `auto` row sized to AR.
"""
from __future__ import annotations

from ..engine import DraftContext, EmptyDrafter, Proposal
from .base import Method, MethodSpec, Param
from .env import Env
from .search import Cheapest

ROWS_AUTO = 8             # rows=auto: the cheapest of 1..8 rows (the calibration measures 1, 2, 3, 4, 6, 8)


class PaddedRows:
    """A decode step's forward padded to `rows` rows: `rows - 1` filler tokens after the context's last token, each
    guessed as the token that followed the previous guess's latest earlier occurrence (a bigram table kept as the
    context grows), else that token again. Why a guess and not a constant: the verify forward scores the filler
    anyway, so a filler that is sometimes right turns a padded row into a kept token at no cost; why this guess:
    a dict lookup per row, nothing that could cost what the padding saves."""

    def __init__(self, name: str, rows: int):
        self.name, self.fill = name, rows - 1
        self.after: dict[int, int] = {}       # token -> the token that followed its latest occurrence
        self.indexed = 0                      # pairs (tokens[i], tokens[i + 1]) indexed for i < this

    def reset(self, prompt_ids: list[int]) -> None:
        self.after, self.indexed = {}, 0

    def propose(self, ctx: DraftContext) -> Proposal:
        ids = ctx.tokens
        if len(ids) - 1 < self.indexed:      # a context that is not a continuation of the last: index it afresh
            self.reset(ids)
        for i in range(self.indexed, len(ids) - 1):
            self.after[ids[i]] = ids[i + 1]
        self.indexed = max(len(ids) - 1, 0)
        draft, t = [], ids[-1]
        for _ in range(min(self.fill, max(ctx.budget, 0))):
            t = self.after.get(t, t)
            draft.append(t)
        return Proposal([draft]) if draft else Proposal()

    def observe(self, tokens: list[int]) -> None:
        pass


def build(env: Env, method: Method):
    rows = method.get("rows", 1)
    if rows == 1:
        drafter = EmptyDrafter()
        drafter.name = method.label
        return drafter
    env.resolved[method.label] = {"rows": rows}
    return PaddedRows(method.label, rows)


def build_null(env: Env, method: Method) -> EmptyDrafter:
    drafter = EmptyDrafter()
    drafter.name = method.label
    return drafter


SPECS = [MethodSpec("ar", "greedy autoregressive decoding (the empty drafter; block efficiency 1.0); rows=N pads "
                    "each step's forward to N rows with filler tokens kept only where greedy", build,
                    (Param("rows", int, "rows per decode forward: the real token + N - 1 filler tokens (auto: the "
                                        "cheapest 1..8 on this machine's calibration)", low=1, auto=True),),
                    artefacts=(), shapes=Cheapest("rows", most=ROWS_AUTO)),
         MethodSpec("null", "AR timed as a method under its own label: the noise floor (1.00x AR up to noise)",
                    build_null, artefacts=())]
