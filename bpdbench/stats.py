"""Chi-square tests for sampled outputs: goodness of fit to an exact distribution, two-sample homogeneity, Holm.

Why here and why by hand: the tiny-model tests (against an enumerated distribution) and `bpdbench certify` (a
method's samples against AR samples) must use one definition of the test, and scipy is not a dependency; the
chi-square survival function is the regularised upper incomplete gamma, which torch provides.

Cells whose expected count is below `min_expected` (5, the textbook rule) are pooled into one cell, so the
chi-square approximation holds; pooling loses power on rare tokens but never makes the false-alarm rate worse.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Hashable, Iterable, Mapping

import torch

MIN_EXPECTED = 5.0


@dataclass(frozen=True)
class ChiSquare:
    statistic: float
    df: int
    p_value: float
    cells: int          # cells after pooling


def chi2_sf(x: float, df: int) -> float:
    """P(X >= x) for X ~ chi-square(df)."""
    if df <= 0:
        return 1.0
    return float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64),
                                         torch.tensor(max(x, 0.0) / 2.0, dtype=torch.float64)))


def goodness_of_fit(observed: Mapping[Hashable, int], probs: Mapping[Hashable, float],
                    min_expected: float = MIN_EXPECTED) -> ChiSquare:
    """Pearson's test of counts against exact cell probabilities (cells absent from `probs` have probability 0:
    one observation there is an impossible outcome and gives p = 0)."""
    n = sum(observed.values())
    if any(c and probs.get(k, 0.0) <= 0.0 for k, c in observed.items()):
        return ChiSquare(float("inf"), 0, 0.0, 0)
    big = [k for k, p in probs.items() if n * p >= min_expected]
    rest_o = n - sum(observed.get(k, 0) for k in big)
    rest_e = n - sum(n * probs[k] for k in big)
    pairs = [(observed.get(k, 0), n * probs[k]) for k in big]
    if rest_e > 1e-9:
        pairs.append((rest_o, rest_e))
    stat = sum((o - e) ** 2 / e for o, e in pairs)
    df = len(pairs) - 1
    return ChiSquare(stat, df, chi2_sf(stat, df), len(pairs))


def homogeneity(a: Iterable[Hashable], b: Iterable[Hashable], min_expected: float = MIN_EXPECTED) -> ChiSquare:
    """Two-sample chi-square test (2 x cells contingency table) that samples `a` and `b` come from one
    distribution. Cells whose smaller expected count is below `min_expected` are pooled."""
    ca, cb = Counter(a), Counter(b)
    na, nb = sum(ca.values()), sum(cb.values())
    if not na or not nb:
        return ChiSquare(0.0, 0, 1.0, 0)
    n = na + nb
    keys = sorted(set(ca) | set(cb), key=lambda k: -(ca[k] + cb[k]))
    big = [k for k in keys if (ca[k] + cb[k]) * min(na, nb) / n >= min_expected]
    rows = [(ca[k], cb[k]) for k in big]
    ra, rb = na - sum(x for x, _ in rows), nb - sum(y for _, y in rows)
    if ra + rb:
        rows.append((ra, rb))
    stat = 0.0
    for x, y in rows:
        tot = x + y
        ea, eb = tot * na / n, tot * nb / n
        stat += (x - ea) ** 2 / ea + (y - eb) ** 2 / eb
    df = len(rows) - 1
    return ChiSquare(stat, df, chi2_sf(stat, df), len(rows))


def holm(p_values: list[float], alpha: float) -> list[bool]:
    """Holm's step-down: which hypotheses are rejected with family-wise error rate <= alpha."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    reject = [False] * len(p_values)
    m = len(p_values)
    for rank, i in enumerate(order):
        if p_values[i] <= alpha / (m - rank):
            reject[i] = True
        else:
            break
    return reject


def bootstrap_ratio(num: list[float], den: list[float], resamples: int = 2000, seed: int = 0,
                    level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of sum(num) / sum(den) with the units (prompts) resampled with replacement.

    Why prompts and not tokens: the tokens of one prompt are not independent draws (one long easy prompt moves a
    speedup a lot), so the unit that varies between benchmarks is the prompt, and the interval must say how much the
    number would move with other prompts of the same kind. (nan, nan) with fewer than two units."""
    n = len(num)
    if n < 2 or n != len(den):
        return float("nan"), float("nan")
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, n, (resamples, n), generator=g)
    a = torch.tensor(num, dtype=torch.float64)[idx].sum(1)
    b = torch.tensor(den, dtype=torch.float64)[idx].sum(1)
    ratios = (a / b)[b > 0]
    if not len(ratios):
        return float("nan"), float("nan")
    lo, hi = torch.quantile(ratios, torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64)).tolist()
    return float(lo), float(hi)


def paired_bootstrap_ratio(best: list[float], other: list[float], strata: list | None = None,
                           resamples: int = 2000, seed: int = 0,
                           level: float = 0.95) -> tuple[float, float, float]:
    """sum(other) / sum(best) over units both rows counted, and its percentile interval with the units resampled
    together (the same draw for both rows), within each stratum when `strata` is given.

    Why paired: two methods timed on the same prompts share each prompt's difficulty (a long easy prompt speeds up
    every drafter), so intervals drawn apart overlap even when one method is faster on every prompt; resampling the
    prompts once for both keeps that shared part out of the comparison. Why strata: a benchmark of tasks in fixed
    shares (Spec-Bench: the same number per task) keeps those shares in every resample. An interval excluding 1
    separates the two rows. (ratio, nan, nan) with fewer than two units."""
    n = len(best)
    if n != len(other) or (strata is not None and len(strata) != n):
        raise ValueError("paired_bootstrap_ratio: best, other and strata must have one entry per unit")
    a, b = torch.tensor(other, dtype=torch.float64), torch.tensor(best, dtype=torch.float64)
    ratio = float(a.sum() / b.sum()) if n and float(b.sum()) > 0 else float("nan")
    if n < 2:
        return ratio, float("nan"), float("nan")
    g = torch.Generator().manual_seed(seed)
    groups: dict = {}
    for i, s in enumerate(strata if strata is not None else [None] * n):
        groups.setdefault(None if s is None or s != s else s, []).append(i)     # NaN: no stratum
    cols = []
    for members in groups.values():
        m = torch.tensor(members)
        cols.append(m[torch.randint(0, len(members), (resamples, len(members)), generator=g)])
    idx = torch.cat(cols, dim=1)
    num, den = a[idx].sum(1), b[idx].sum(1)
    ratios = (num / den)[den > 0]
    if not len(ratios):
        return ratio, float("nan"), float("nan")
    lo, hi = torch.quantile(ratios, torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64)).tolist()
    return ratio, float(lo), float(hi)
