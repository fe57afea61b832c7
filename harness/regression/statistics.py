"""Regression statistics: the metrics the check judges, the noise of a series, the machine-speed adjustment, and
the method's constants. The verdict on one metric that uses them is harness/regression/verdict.py's (assess); the
method is described in harness/regression/check.py and docs/regression.md."""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable
from typing import TypeVar

import numpy as np
import pandas as pd

from harness.results.summarize import time_to_reward

Z_CRIT = 4.0  # noise levels one night must be worse by, alone
Z_PERSIST = 2.5  # noise levels the mean of 2 to PERSISTENCE nights must be worse by (its own noise: spread(m))
MIN_HISTORY = 8
MIN_BASELINE_RUNS = 3
NEIGHBOURS = 2  # on each side, for the rolling median a run's residual is taken against
PERSISTENCE = 5  # runs (this one and the previous ones, a working week) whose mean change may confirm a drop
# Noise levels this night must be worse by on its own before persistence may count it; a night since the baseline
# within this many of it, either way, is at its level and joins its reference.
Z_SUPPORT = 1.5
Z_EARLIER = 0.5  # ... and each earlier night persistence averages with it
Z_SAME_LEVEL = 1.0  # noise levels of the difference of two runs by which an earlier night is clearly worse than this
REWARD_TARGET_FRACTION = 0.8
CONTENTION_MARGIN = 1.05
PROBE_EXTRAPOLATION = 0.5  # of the history's range of probe times, beyond it either way, before a run is not judged
FOREIGN_LOAD_MARGIN = 0.25  # cores of other work beyond the series' usual before a CPU run's timings are doubtful
NOISE_DOF_PER_RUN, NOISE_DOF_OFFSET = 0.48, 1.75  # degrees of freedom of Qn over n run residuals: a (n - b)
# The history's runs before the baseline that may join its reference: the most recent, as one segment. Older ones
# are more likely to lie at some other level, which would make the whole segment fail the test below.
REFERENCE_BEFORE = 10
# Noise levels of the difference of two medians (theirs and the baseline's) within which the runs before the baseline
# are one level with it: no change point at the baseline, the runs a routine `baseline update` was written after.
Z_SEGMENT = 1.0
DETECT_BY = 3  # the night by which the change a series states it can detect is caught
# How far beyond the persistence threshold, in noise levels of the mean of DETECT_BY nights, a lasting change must lie
# to be caught by then 95% of the time. The mean alone would need the normal's 1.645; a drop must also pass the
# streak's conditions and meet the real noise's tails. Calibrated on the 2026-11-30 to 12-02 hosts (docs/regression.md).
DETECT_MARGIN = 2.6


@dataclasses.dataclass(frozen=True)
class Metric:
    name: str
    label: str
    kind: str  # "alert" or "advisory"
    higher_is_better: bool
    log_scale: bool  # compare ratios (times, rates) rather than differences (rewards)
    min_effect: float  # log-ratio or absolute difference below which no change matters
    timed: bool  # measured with a clock, so a run that waited for the CPU cannot be judged on it
    # A better-controlled figure of the same thing: where that one is judged, this one is shown as context.
    defer_to: str | None = None
    # A change smaller than this in the metric's own unit is not one anybody can act on, whatever its z.
    min_abs: float = 0.0

    def transform(self, x: float) -> float:
        return math.log(x) if self.log_scale else x

    def change(self, delta: float) -> float:
        """A difference in transformed units as the user reads it: % for ratios, absolute otherwise."""
        return 100 * math.expm1(delta) if self.log_scale else delta

    @property
    def worse_sign(self) -> float:
        """What a change in transformed units is multiplied by to be positive when it is worse."""
        return -1.0 if self.higher_is_better else 1.0

    @property
    def suffix(self) -> str:
        """The unit a change is written with as the user reads it (Metric.change)."""
        return "%" if self.log_scale else ""


ADJUSTED = "throughput_tok_s_machine"
PROBE = "time_probe_s_median"
METRICS = (
    Metric(ADJUSTED, "throughput at the baseline's machine speed (tokens/s, adjusted by the probe; CPU runs)",
           "alert", True, True, math.log(1 / 0.97), True),
    Metric("throughput_tok_s", "throughput (tokens/s)", "alert", True, True, math.log(1 / 0.97), True, ADJUSTED),
    Metric("throughput_tok_cpu_s", "throughput per CPU-second (tokens/CPU-s; CPU runs)", "alert", True, True,
           math.log(1 / 0.97), True, ADJUSTED),
    # Under a millisecond a transition's change is the OS scheduler's jitter, with heavy tails (the CPU reference's
    # whole transition takes 0.1-0.4 ms); a GPU framework's transition takes hundreds of milliseconds to seconds.
    Metric("time_transition_s_median", "transition time (s, median)", "alert", False, True, math.log(1.10), True,
           min_abs=0.001),
    # The machine's own speed: when it changes, the raw throughput follows it and the adjusted one does not.
    Metric(PROBE, "machine speed probe (s per fixed workload; CPU runs)", "advisory", False, True, math.log(1.03),
           True),
    Metric("reward_last10", "final reward (last 10% of steps)", "advisory", True, False, 0.05, False),
    Metric("time_to_reward_s", "time to reward target (s of training)", "advisory", False, True, math.log(1.25),
           True),
)


def machine_sensitivity(throughput: pd.DataFrame, probe: pd.DataFrame) -> tuple[float, float, int]:
    """How strongly a series' throughput follows the machine-speed probe: (theta, correlation, points).

    From history tables (runs x seeds) of log throughput and log probe time: each value minus its seed's median,
    then the Theil-Sen slope (the median of the pairwise slopes: a freak run or an old regression, which moves the
    throughput but not the probe, cannot tilt it) of throughput on probe time. theta is minus that slope, at
    least 0: how many percent throughput loses per percent the probe slows. A probe that says nothing about the
    run gives theta near 0 and adjusts nothing; the history, not an assumption, sets how much it corrects."""
    y, x = throughput.align(probe, join="inner")
    x, y = (x - x.median()).to_numpy(float).ravel(), (y - y.median()).to_numpy(float).ravel()
    ok = ~(np.isnan(x) | np.isnan(y))
    x, y = x[ok], y[ok]
    i, j = np.triu_indices(len(x), 1)
    dx = x[j] - x[i]
    if not np.any(dx != 0):
        return 0.0, float("nan"), len(x)
    slope = float(np.median((y[j] - y[i])[dx != 0] / dx[dx != 0]))
    return max(0.0, -slope), float(np.corrcoef(x, y)[0, 1]), len(x)


# One run's figure (the check) or arrays of them (benchmarks/regression_power.py).
_Values = TypeVar("_Values", float, np.ndarray)


def adjust_for_machine(throughput: _Values, probe: _Values, theta: float, probe_reference: float) -> _Values:
    """Throughput as it would have been at the reference probe time (the baseline's machine speed)."""
    return throughput * (probe / probe_reference) ** theta


def machine_speed_outside(past: list[float], now: float) -> str | None:
    """Why this run's machine-speed probe time is too far from the history's for the adjustment to hold, or None.

    `past`: the quiet history's probe times (a run's median), `now`: this run's. theta is fitted on the swings the
    history has shown; a run beyond their range by more than PROBE_EXTRAPOLATION of its width is an extrapolation
    of the fit, not a measurement. On the 2026-12-01 end-to-end run the host slowed until the probe took 27% longer
    than the baseline's, beyond anything in its history: throughput fell about 1.4 times as much in logs, not
    theta 1.9 times, and the adjusted figure read "improved +19%" on a night whose code was 7% slower."""
    if len(past) < MIN_HISTORY or not now > 0:
        return None
    logs = np.log(past)
    lo, hi, x = float(np.min(logs)), float(np.max(logs)), math.log(now)
    margin = PROBE_EXTRAPOLATION * (hi - lo)
    if lo - margin <= x <= hi + margin:
        return None
    usual = float(np.median(logs))
    return (f"the machine-speed probe took {100 * math.expm1(x - usual):+.0f}% against the history's usual, beyond "
            f"its range ({100 * math.expm1(lo - usual):+.0f}% to {100 * math.expm1(hi - usual):+.0f}%) by more than "
            f"{PROBE_EXTRAPOLATION:g} of its width: the throughput's adjustment for the machine's speed would "
            "extrapolate")


def training_time_to(curve: dict, target: float) -> float | None:
    """A history row's time-to-reward: the training time at which its stored curve first reached `target` (the
    baseline's own target: its first reward plus REWARD_TARGET_FRACTION of its gain); None if never."""
    reached = time_to_reward(curve, target)
    return reached[0] if reached else None


# Variance of the median of k standard normal draws (order statistics; k = 2 and 3 exact): a residual against the
# median of k neighbours carries that median's noise as well as its own run's.
_MEDIAN_VARIANCE = {1: 1.0, 2: 0.5, 3: 0.4487, 4: 0.2982}
QN_FACTOR = 2.2219  # makes Qn a standard deviation at the normal


def qn_scale(x: np.ndarray) -> float:
    """Rousseeuw and Croux's Qn (1993): the first quartile of the pairwise distances, made a standard deviation.
    As robust as the MAD (up to half the points may be wild) and about twice as efficient at the normal (82% against
    37%): with the 12-20 runs a nightly history has, a MAD's estimate spreads by 25-32% of the noise it estimates
    (Qn's by 20-27%, simulated at the normal), and a night judged against an underestimate is a false alarm."""
    x = np.asarray(x, float)
    n = len(x)
    if n < 2:
        return float("nan")
    i, j = np.triu_indices(n, 1)
    h = n // 2 + 1
    k = h * (h - 1) // 2
    q = float(np.partition(np.abs(x[i] - x[j]), k - 1)[k - 1])
    # Their small-sample corrections, which make it unbiased at the normal for n runs.
    small = {2: 0.399, 3: 0.994, 4: 0.512, 5: 0.844, 6: 0.611, 7: 0.857, 8: 0.669, 9: 0.872}
    d = small.get(n, n / (n + 1.4) if n % 2 else n / (n + 3.8))
    return QN_FACTOR * d * q


def run_residuals(table: pd.DataFrame) -> np.ndarray:
    """Each past run's change against its neighbours, from a (runs in time order) x (seeds) table, in units of one
    run's own noise.

    Each value minus the median of the same seed's neighbouring runs (NEIGHBOURS on each side, itself left out),
    median over seeds: the statistic the check computes for the current run, on runs with no known change. The
    neighbours' median has noise of its own, so each residual is divided by sqrt(1 + its variance): the spread is
    then one run's, whatever the reference a night is later compared with.
    """
    values = table.to_numpy(dtype=float)
    residuals = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices: a seed absent from some runs
        for i in range(len(values)):
            lo, hi = max(0, i - NEIGHBOURS), min(len(values), i + NEIGHBOURS + 1)
            around = np.delete(values[lo:hi], i - lo, axis=0)
            if len(around):
                per_seed = values[i] - np.nanmedian(around, axis=0)
                if not np.all(np.isnan(per_seed)):
                    residuals.append(np.nanmedian(per_seed) / math.sqrt(1 + _MEDIAN_VARIANCE[len(around)]))
    return np.asarray(residuals)


def noise_level(table: pd.DataFrame) -> tuple[float, int]:
    """Robust run-to-run noise of one run (Qn of the run residuals) and how many runs it rests on."""
    r = run_residuals(table) if len(table) else np.array([])
    return (qn_scale(r), len(r)) if len(r) else (float("nan"), 0)


def student_quantile(z: float, dof: float) -> float:
    """The Student-t quantile at the normal's upper tail beyond z, for dof degrees of freedom: the Cornish-Fisher
    expansion (Abramowitz and Stegun 26.7.5), within 2% of the exact quantile from 4 degrees of freedom at z 2.75."""
    g = ((z ** 3 + z) / 4, (5 * z ** 5 + 16 * z ** 3 + 3 * z) / 96,
         (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / 384,
         (79 * z ** 9 + 776 * z ** 7 + 1482 * z ** 5 - 1920 * z ** 3 - 945 * z) / 92160)
    return z + sum(gk / dof ** (k + 1) for k, gk in enumerate(g))


def noise_dof(n_residuals: int) -> float:
    """The degrees of freedom the Qn of n run residuals is worth, 1 / (2 c^2) with c the spread of the estimate
    over the noise it estimates (simulated at the normal, the residuals of runs x 3 seeds: see tests)."""
    return max(NOISE_DOF_PER_RUN * (n_residuals - NOISE_DOF_OFFSET), 1.0)


def noise_widening(n_residuals: int) -> float:
    """How much wider than its estimate the noise is taken for resting on n runs. A change over an estimated noise
    is a Student t, not a normal z: its tail at the mean's threshold is the normal's at Z_PERSIST / this factor.
    The thresholds are then those of a known noise, whatever the history's length: a short history pays for its
    uncertain noise with later detection, not with false alarms (1.54 at 12 runs, 1.25 at 20, 1.11 at 40)."""
    return student_quantile(Z_PERSIST, noise_dof(n_residuals)) / Z_PERSIST


def null_of(history: pd.DataFrame) -> tuple[float, int, float]:
    """(noise, how many run residuals it rests on, the widest past deviation) of a history with no known change.
    The noise is one run's, widened for how few runs its estimate rests on (noise_widening).

    The widest deviation matters on a shared machine: noise has heavy tails that a few runs' robust spread
    underestimates, so a change must also beat what the series has already shown."""
    r = run_residuals(history) if len(history) else np.array([])
    if not len(r):
        return float("nan"), 0, float("nan")
    return qn_scale(r) * noise_widening(len(r)), len(r), float(np.max(np.abs(r - np.median(r))))


def reference_share(n_runs: int) -> float:
    """The variance of a reference's median over n runs, in units of one run's: (pi / 2) / n."""
    return (math.pi / 2) / max(n_runs, 1)


def series_table(rows: list[dict], metric: Metric, values: Callable[[dict], float | None]) -> pd.DataFrame:
    """The series' past runs x seeds of a metric's transformed values, oldest first (a seed's runs in one pipeline
    run: their median); empty where no row has a value."""
    records = [{"pipeline_run": r["pipeline_run"], "pipeline_time": r["pipeline_time"], "seed": r["seed"],
                "value": metric.transform(v)} for r in rows if (v := values(r)) is not None and
               (not metric.log_scale or v > 0)]
    if not records:
        return pd.DataFrame()
    df = pd.DataFrame(records)
    order = df.groupby("pipeline_run")["pipeline_time"].first().sort_values().index
    return df.pivot_table(index="pipeline_run", columns="seed", values="value", aggfunc="median").loc[order]
