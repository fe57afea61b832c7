"""Student's t, exactly, for the few degrees of freedom a comparison of seeds or of A/B pairs has: the A/B's
interval (harness.comparison.paired) and a rerun's verdict per figure (harness.results.consistency)."""

from __future__ import annotations

import functools
import math
from typing import Any, TypeVar

import numpy as np

T = TypeVar("T", float, np.ndarray)


def central_t(t: T, dof: int) -> T:
    """P(|T| <= t) for Student's t with an integer number of degrees of freedom: the finite series of Abramowitz and
    Stegun 26.7.3 (odd) and 26.7.4 (even), exact up to rounding; elementwise for an array of t (the A/B's sequential
    boundary takes it for every simulated path at once)."""
    theta = np.arctan(t / math.sqrt(dof))
    c2: Any = np.cos(theta) ** 2
    term: Any = 1.0
    total: Any = 1.0
    if dof % 2:
        if dof == 1:
            return 2 * theta / math.pi
        term = total = np.cos(theta)
        for k in range(3, dof - 1, 2):  # (2*4*...*(k-1)) / (1*3*...*k) cos^k
            term = term * c2 * (k - 1) / k
            total = total + term
        return 2 / math.pi * (theta + np.sin(theta) * total)
    for k in range(2, dof - 1, 2):  # (1*3*...*(k-1)) / (2*4*...*k) cos^k
        term = term * c2 * (k - 1) / k
        total = total + term
    return np.sin(theta) * total


@functools.cache  # a bisection of 200 steps; the same few (alpha, dof) recur in every verdict
def t_quantile(alpha: float, dof: int) -> float:
    """The t with P(|T| > t) = alpha (a two-sided 1 - alpha interval's multiplier), by bisection on central_t."""
    lo, hi = 0.0, 1.0
    while central_t(hi, dof) < 1 - alpha:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if central_t(mid, dof) < 1 - alpha else (lo, mid)
    return (lo + hi) / 2


def two_sided_p(t: float, dof: int) -> float:
    """P(|T| >= |t|) for Student's t with `dof` degrees of freedom."""
    return max(0.0, 1.0 - float(central_t(abs(t), dof)))
