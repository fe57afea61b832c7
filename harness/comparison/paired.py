"""Paired statistics of an A/B comparison: B against A in pairs run back to back on one machine, so that the machine's
drift cancels out of each pair's difference (docs/regression.md, "Is B slower than A?").

Each pair gives one log ratio B/A of a figure (tokens/s, or a phase's step time). Their mean has a Student-t interval;
the comparison looks after every pair from the `min_pairs`-th on and stops as soon as it can decide, so each look
is held to a level (look_alpha) at which the chance that A against A is ever called different, over every look it
may take, is alpha.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np

from harness.results.student_t import central_t, t_quantile

# Paths of A against A the boundary is set on; the rate it holds is alpha to within 2 standard errors of a binomial
# over these (0.06 percentage points at alpha 0.01), from a fixed seed, so one (alpha, looks) gives one boundary.
BOUNDARY_PATHS = 100_000
BOUNDARY_SEED = 20261206
Z_POWER = 0.8416212335729143  # the standard normal's 0.8 quantile: what the budget sees, it sees 4 times in 5


@functools.cache
def look_alpha(alpha: float, min_pairs: int, max_pairs: int) -> float:
    """The two-sided level each look's t interval is held to, from the `min_pairs`-th pair to the `max_pairs`-th, so
    that the chance any look excludes no change when there is none is alpha: Pocock's constant boundary, on the
    t statistic's p-value. The looks' t statistics are correlated (each adds one pair to the last), so this level is
    several times Bonferroni's alpha / looks (about 0.0012 against 0.0001 for alpha 0.01 and pairs 3 to 100), which
    a 2% change needs. Under no change a paired t statistic's law does not depend on the pairs' spread, so paths of
    standard normal pairs give the boundary for every spread: the alpha-quantile of each path's smallest p-value
    over its looks. A p-value above alpha cannot move that quantile, so only the looks below it are evaluated."""
    rng = np.random.default_rng(BOUNDARY_SEED)
    total = np.zeros(BOUNDARY_PATHS)
    squares = np.zeros(BOUNDARY_PATHS)
    smallest = np.full(BOUNDARY_PATHS, alpha)
    for n in range(1, max_pairs + 1):
        x = rng.standard_normal(BOUNDARY_PATHS)
        total += x
        squares += x * x
        if n >= min_pairs:
            mean = total / n
            t = np.abs(mean) / np.sqrt(np.maximum(squares - n * mean * mean, 0) / (n - 1) / n)
            beyond = np.flatnonzero(t > t_quantile(alpha, n - 1))
            smallest[beyond] = np.minimum(smallest[beyond], 1 - central_t(t[beyond], n - 1))
    return float(np.quantile(smallest, alpha))


def interval(log_ratios: Sequence[float], alpha: float) -> tuple[float, float, float]:
    """(mean, low, high) of the mean log ratio, a two-sided 1 - alpha Student-t interval; (mean, -inf, inf) for one
    pair, whose spread is unknown."""
    n = len(log_ratios)
    mean = math.fsum(log_ratios) / n
    if n < 2:
        return mean, -math.inf, math.inf
    sd = math.sqrt(math.fsum((x - mean) ** 2 for x in log_ratios) / (n - 1))
    half = t_quantile(alpha, n - 1) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def detectable_change(log_ratios: Sequence[float], level: float, pairs: int) -> float | None:
    """The smallest slowdown that `pairs` pairs at these pairs' spread call slower at least 4 times in 5 at `level`:
    the shift d whose power is 0.8 by the normal approximation to the noncentral t, d = sd / sqrt(n) (t + z_0.8
    sqrt(1 + t^2 / 2(n - 1))), which allows for the spread being estimated too (without that term d called B slower
    75% of the time at 10 pairs; with it 81-87% from 3 to 30 pairs, tests/test_ab.py). None under two pairs."""
    if len(log_ratios) < 2 or pairs < 2:
        return None
    mean = math.fsum(log_ratios) / len(log_ratios)
    sd = math.sqrt(math.fsum((x - mean) ** 2 for x in log_ratios) / (len(log_ratios) - 1))
    t = t_quantile(level, pairs - 1)
    return 1 - math.exp(-sd / math.sqrt(pairs) * (t + Z_POWER * math.sqrt(1 + t * t / (2 * (pairs - 1)))))


def decide(log_ratios: Sequence[float], *, level: float, resolution: float, final: bool,
           split: float | None = None) -> dict:
    """The verdict on tokens/s B/A after these pairs: {"verdict": slower | faster | same | not slower | inconclusive |
    continue, "text", "change", "low", "high", "pairs", "more_pairs"}. change/low/high are B's slowdown as a fraction
    (positive: B slower). "same" needs the whole interval within `resolution` either way; at the last look, neither
    is "inconclusive" with the pairs that interval would need at this spread.

    With `split` (bisect: half the slowdown BAD has against GOOD) the question is only which side of it B lies on:
    "slower" when the whole interval is above it, "not slower" when below, which takes far fewer pairs than proving
    no difference at all."""
    n = len(log_ratios)
    mean, lo, hi = interval(log_ratios, level)
    change, slow_lo, slow_hi = 1 - math.exp(mean), 1 - math.exp(hi), 1 - math.exp(lo)
    out = {"change": change, "low": slow_lo, "high": slow_hi, "pairs": n, "more_pairs": 0}
    ci = f"CI {100 * slow_lo:.1f}% to {100 * slow_hi:.1f}%, {n} pairs"
    if split is not None:
        side = f"the split at {100 * split:.1f}%"
        if slow_lo > split:
            return {**out, "verdict": "slower", "text": f"B is {100 * change:.1f}% slower, beyond {side} ({ci})"}
        if slow_hi < split:
            return {**out, "verdict": "not slower", "text": f"B is {100 * change:+.1f}%, short of {side} ({ci})"}
        if not final:
            return {**out, "verdict": "continue", "text": f"undecided ({ci})"}
        half, target = (hi - lo) / 2, abs(mean + math.log1p(-split))
        more = max(1, math.ceil(n * (half / target) ** 2) - n) if math.isfinite(half) and target > 0 else n
        return {**out, "verdict": "inconclusive", "more_pairs": more,
                "text": f"inconclusive: about {more} more pairs needed to place B against {side} ({ci})"}
    if hi < 0:
        return {**out, "verdict": "slower", "text": f"B is {100 * change:.1f}% slower ({ci})"}
    if lo > 0:
        return {**out, "verdict": "faster", "text": f"B is {-100 * change:.1f}% faster ({ci})"}
    seen = max(abs(slow_lo), abs(slow_hi))
    if seen <= resolution:
        return {**out, "verdict": "same", "text": f"no difference larger than {100 * seen:.1f}% ({ci})"}
    if not final:
        return {**out, "verdict": "continue", "text": f"undecided ({ci})"}
    half, target = (hi - lo) / 2, math.log1p(resolution)
    more = max(1, math.ceil(n * (half / target) ** 2) - n) if math.isfinite(half) else n
    return {**out, "verdict": "inconclusive", "more_pairs": more,
            "text": f"inconclusive: about {more} more pairs needed to see a {100 * resolution:.0f}% change ({ci})"}
