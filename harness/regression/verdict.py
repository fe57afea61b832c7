"""The verdict on one night of one metric against its series (assess): the reference the night is compared with,
the test of this night alone and of its mean with the nights before it (persistence), and the verdict with its
evidence. The method is described in harness/regression/check.py and docs/regression.md; the noise, the metrics
and the method's constants are harness/regression/statistics.py's."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import pandas as pd

from harness.regression.statistics import (
    DETECT_BY,
    DETECT_MARGIN,
    MIN_HISTORY,
    PERSISTENCE,
    REFERENCE_BEFORE,
    Z_CRIT,
    Z_EARLIER,
    Z_PERSIST,
    Z_SAME_LEVEL,
    Z_SEGMENT,
    Z_SUPPORT,
    Metric,
    noise_widening,
    null_of,
    reference_share,
)

Night = dict[int, float | None]  # seed -> one run's value, untransformed; None where the run has none
Null = tuple[float, int, float]  # null_of's: the noise, the run residuals it rests on, the widest past deviation


@dataclasses.dataclass(frozen=True)
class Series:
    """What a night of one metric of one framework is judged against: the baseline, the history and the history's
    nights by the part each plays. `check` builds it once per metric from the history it reads, the power benchmark
    from its synthetic nights; assess and everything under it only read it."""

    baseline: dict[int, list[float]]  # seed -> values over the baseline's runs, untransformed
    history: pd.DataFrame  # past runs x seeds of transformed values, oldest first: the noise
    # The last runs before this night, most recent first: persistence judges them with it, so they are not in
    # `since` or `before` (under test, not the reference).
    recent: tuple[Night, ...] = ()
    names: tuple[str, ...] = ()  # this night's run and the `recent` ones: to say since when a series is back
    # The history's runs after the baseline's last one and before its first, oldest first: those at the baseline's
    # level join its runs as the reference (at_baseline_level).
    since: tuple[Night, ...] = ()
    before: tuple[Night, ...] = ()

    @property
    def n_baseline_runs(self) -> int:
        """The baseline's runs: the most values any seed has in it."""
        return max((len(vs) for vs in self.baseline.values()), default=0)


def seed_medians(metric: Metric, runs: dict[int, list[float]]) -> dict[int, float]:
    """seed -> the median of its values over the runs, transformed (log for times and rates)."""
    return {s: float(np.median([metric.transform(v) for v in vs])) for s, vs in runs.items() if vs}


def at_baseline_level(metric: Metric, series: Series, run_sigma: float) -> tuple[list[dict[int, float]], int]:
    """The series' runs outside the baseline that are at its level, and how many of them come from `before`.

    A run is at the level when its change against the baseline (median over seeds) lies within Z_SUPPORT noise
    levels either way. The nights since the baseline are judged one by one: the baseline came first, and a night
    that moved off it stays out. The runs before it may be the level a `baseline update` left behind, which a run's
    own noise can hide (a step of twice that noise passes a run's test about half the time): they are judged as one
    segment first, and join only if their median lies within Z_SEGMENT noise levels of the difference of that median
    and the baseline's."""
    tr = metric.transform
    base_ref = seed_medians(metric, series.baseline)
    n_base = series.n_baseline_runs

    def changes(runs: tuple[Night, ...]) -> list[tuple[dict[int, float], float]]:
        out = []
        for values in runs:
            present = {s: v for s, v in values.items() if s in base_ref and v is not None}
            if present:
                out.append((present, float(np.median([tr(v) - base_ref[s] for s, v in present.items()]))))
        return out

    within = Z_SUPPORT * run_sigma * math.sqrt(1 + reference_share(n_base))  # a run's change against the baseline

    def at_level(runs: list[tuple[dict[int, float], float]]) -> list[dict[int, float]]:
        return [present for present, c in runs if abs(c) < within]

    level = at_level(changes(series.since))
    segment = changes(series.before[max(0, len(series.before) - REFERENCE_BEFORE):])
    if segment and abs(float(np.median([c for _, c in segment]))) < Z_SEGMENT * run_sigma * math.sqrt(
            reference_share(n_base) + reference_share(len(segment))):
        joined = at_level(segment)
        return level + joined, len(joined)
    return level, 0


@dataclasses.dataclass(frozen=True)
class _Reference:
    """The runs a night's change is taken against: the baseline's and the series' others at its level."""

    values: dict[int, list[float]]  # seed -> values, untransformed
    medians: dict[int, float]  # seed -> the median of its values, transformed
    n_runs: int
    n_before: int  # of the runs, those from before the baseline

    def spread(self, m: int) -> float:
        """The noise of the mean of m nights' changes against the reference, in units of one run's: their own noise
        shrinks by m, the reference's error, which all m share, does not."""
        return math.sqrt(1 / m + reference_share(self.n_runs))

    def worse(self, metric: Metric, seeds: list[int], values: Night) -> tuple[float | None, dict[int, float]]:
        """A night's change, positive when worse, in transformed units: the median over `seeds` of the per-seed
        changes (None where the night has no value for any), and those changes."""
        per_seed = {s: metric.worse_sign * (metric.transform(v) - self.medians[s])
                    for s in seeds if (v := values.get(s)) is not None}
        return (float(np.median(list(per_seed.values()))) if per_seed else None), per_seed

    def level(self, metric: Metric, seeds: list[int]) -> float:
        """The reference in the metric's own unit, median over `seeds`: what a change's floor (min_abs) is held to."""
        return float(np.median([np.exp(self.medians[s]) if metric.log_scale else self.medians[s] for s in seeds]))


def _reference_of(metric: Metric, series: Series, null: Null) -> _Reference:
    """The baseline's runs and, once the history gives the noise, the series' others at its level: a median of more
    runs has a smaller error, which every night shares, and it restarts when `baseline update` accepts a new
    level."""
    run_sigma, n_resid, _ = null
    level, n_before = at_baseline_level(metric, series, run_sigma) if n_resid >= MIN_HISTORY else ([], 0)
    values = {s: [*vs, *(r[s] for r in level if s in r)] for s, vs in series.baseline.items() if vs}
    return _Reference(values, seed_medians(metric, values), series.n_baseline_runs + len(level), n_before)


def _record(metric: Metric, series: Series, null: Null, reference: _Reference, seeds: list[int]) -> dict:
    """The verdict's record before the night is judged: the test in words, the noise, the smallest change the series
    catches in time, and what the reference rests on."""
    run_sigma, n_resid, largest = null
    sigma = run_sigma * reference.spread(1)  # the noise of one night's change against the reference
    by = reference.spread(DETECT_BY)
    # A lasting change is caught in time when its mean over DETECT_BY nights lies DETECT_MARGIN of that mean's noise
    # beyond the persistence threshold. The widened noise stands in for the true one, as in every threshold here.
    detectable = (None if n_resid < MIN_HISTORY or math.isnan(run_sigma) else metric.change(metric.worse_sign * (
        max(metric.min_effect, Z_PERSIST * run_sigma * by, largest * by) + DETECT_MARGIN * run_sigma * by)))
    ref_values = reference.values
    return {"metric": metric.name, "label": metric.label, "class": metric.kind,
            "baseline": float(np.median([v for vs in ref_values.values() for v in vs])) if ref_values else None,
            "current": None, "change": None, "unit": "%" if metric.log_scale else "absolute",
            "evidence": {"test": ("median over seeds of the paired per-seed change vs the reference (the baseline's "
                                  "runs, the nights since at its level and, when they are one level with it, the runs "
                                  "before it); alert when worse "
                                  f"by >= {metric.change(metric.min_effect):.3g}{metric.suffix} and more than any "
                                  f"past run deviated, and by >= {Z_CRIT} x noise in this run, or >= {Z_PERSIST} x "
                                  f"the mean's noise on average over this and up to {PERSISTENCE - 1} previous runs "
                                  f"(this one worse by >= {Z_SUPPORT} x noise on its own, each earlier one by >= "
                                  f"{Z_EARLIER} x and not clearly worse than this one); the noise widened for the few "
                                  "runs that estimate it (Student t)"),
                         "noise": None if math.isnan(sigma) else metric.change(sigma),
                         "run_noise": None if math.isnan(run_sigma) else metric.change(run_sigma),
                         "noise_widening": noise_widening(n_resid),
                         "detectable_change": detectable, "detect_by": DETECT_BY,
                         "z": None, "z_runs": {},
                         "largest_past_deviation": None if math.isnan(largest) else metric.change(
                             largest * reference.spread(1)),
                         "n_history_runs": len(series.history), "n_baseline_runs": series.n_baseline_runs,
                         "n_reference_runs": reference.n_runs, "n_reference_before": reference.n_before,
                         "seeds": seeds, "per_seed_change": {}}}


@dataclasses.dataclass(frozen=True)
class _NightTest:
    """This night's change and the recent nights' (positive: worse), and the null the mean of each m of them is
    judged by: for m >= 2 the history before the m - 1 earlier nights it includes (they are under test, not the
    null), whose widest past deviation shrinks with spread(m) as the noise does."""

    metric: Metric
    reference: _Reference
    changes: list[float]  # this night's, then the recent nights' while they have a value
    nulls: dict[int, Null]  # m -> the null of the mean of the first m changes

    @property
    def sigma(self) -> float:
        """The noise of one night's change against the reference."""
        return self.nulls[1][0] * self.reference.spread(1)

    def z_runs(self) -> dict[int, float]:
        """m -> the z of the mean of the first m changes (m >= 2), where the history before them gives the noise."""
        return {m: float(np.mean(self.changes[:m])) / (max(self.nulls[m][0], 1e-12) * self.reference.spread(m))
                for m in range(2, len(self.changes) + 1) if self.nulls[m][1] >= MIN_HISTORY}

    def decided(self, ws: list[float]) -> bool:
        """Whether the mean of these changes (one night's: Z_CRIT; more: Z_PERSIST) is a change."""
        mean, m = float(np.mean(ws)), len(ws)
        s_m, n_m, largest_m = self.nulls[m]
        z_needed = Z_CRIT if m == 1 else Z_PERSIST
        spread = self.reference.spread(m)
        return (n_m >= MIN_HISTORY and mean >= self.metric.min_effect
                and mean / (max(s_m, 1e-12) * spread) >= z_needed and mean > largest_m * spread)

    def in_streak(self, k: int, w: float) -> bool:
        """Night k back (0: this one) may be averaged with this one: worse on its own figure (this night by
        Z_SUPPORT noise levels, an earlier one by Z_EARLIER), and an earlier night not clearly worse than this one
        (by Z_SAME_LEVEL noise levels of the difference of two runs, in which the reference's error cancels): a
        night clearly better than those before it has changed since."""
        return (w / self.sigma >= (Z_SUPPORT if k == 0 else Z_EARLIER)
                and w - self.changes[0] < Z_SAME_LEVEL * self.nulls[1][0] * math.sqrt(2))

    def persisted(self) -> int | None:
        """How many nights' mean confirms this one, or None. Persistence counts only the unbroken run of nights
        that pass in_streak: this night itself worse, so a fixed night is never carried by the regressed nights
        before it and an earlier night's verdict never carries into a fixed one; the earlier nights need less on
        their own (the mean is the evidence) but must be at this night's level."""
        streak = next((k for k, w in enumerate(self.changes) if not self.in_streak(k, w)), len(self.changes))
        return next((m for m in range(2, streak + 1) if self.decided(self.changes[:m])), None)


def _night_test(metric: Metric, series: Series, reference: _Reference, null: Null, seeds: list[int],
                worse: float) -> _NightTest:
    """This night's change `worse` and the recent nights' in the series, each with its null."""
    run_sigma, n_resid, largest = null
    changes = [worse]
    for values in series.recent[:PERSISTENCE - 1]:
        earlier, _ = reference.worse(metric, seeds, values)
        if earlier is None:
            break
        changes.append(earlier)
    n_history = len(series.history)
    # A deterministic metric (a reward with fixed seeds) has no noise: the effect decides.
    nulls = {1: (max(run_sigma, 1e-12), n_resid, largest)}
    nulls.update({m: null_of(series.history.iloc[:n_history - (m - 1)]) for m in range(2, len(changes) + 1)})
    return _NightTest(metric, reference, changes, nulls)


def _conclusion(metric: Metric, test: _NightTest, current: float, reference: float, names: tuple[str, ...]) -> dict:
    """The status and its reason: a change under the metric's floor is none; this night alone, then persistence,
    decide a regression; else an improvement, or ok, saying since when a series that was worse is back."""
    worse = test.changes[0]
    persisted = test.persisted()
    if abs(current - reference) < metric.min_abs and (test.decided([worse]) or persisted
                                                      or test.decided([-worse])):
        return {"status": "ok", "reason": f"{current - reference:+.2g} against the baseline, under this metric's "
                                          f"floor of {metric.min_abs:g}: too small to act on, whatever its z"}
    if test.decided([worse]):
        return {"status": "regression"}
    if persisted:
        return {"status": "regression",
                "reason": f"persisted over the last {persisted} runs (mean z {test.z_runs()[persisted]:+.1f})"}
    if test.decided([-worse]):
        return {"status": "improved"}
    back = next((k for k, w in enumerate(test.changes) if test.decided([w])), None)  # the last worse on its own
    if back and names and back < len(names):
        change = test.changes[back]
        return {"status": "ok", "reason": f"back to the baseline since run {names[back - 1]}: run {names[back]} "
                                          f"before it was {metric.change(metric.worse_sign * change):+.1f}"
                                          f"{metric.suffix} (z {change / test.sigma:+.1f})"}
    return {"status": "ok"}


def assess(metric: Metric, current: Night, series: Series) -> dict:
    """Judge one night of one metric of one framework (`current`: seed -> value) against its series. Pure: the
    power benchmark calls it exactly as `check` does."""
    null = null_of(series.history)  # one run's own noise (widened), the runs it rests on, the widest deviation
    reference = _reference_of(metric, series, null)
    seeds = sorted(s for s in current if s in reference.medians)
    out: dict[str, Any] = _record(metric, series, null, reference, seeds)
    if not seeds:
        out.update(status="no comparison", reason="no seed in common with the baseline")
        return out
    missing = [s for s in seeds if current[s] is None]
    present = [s for s in seeds if current[s] is not None]
    if present:
        out["current"] = float(np.median([current[s] for s in present]))
    if missing and metric.name == "time_to_reward_s":
        out.update(status="regression" if len(missing) * 2 >= len(seeds) else "ok",
                   reason=f"seeds {missing} never reached the reward target")
        return out
    worse, per_seed = reference.worse(metric, seeds, current)
    if worse is None:  # e.g. a metric the baseline's runs recorded and this run's producer does not
        out.update(status="no comparison", reason=f"this run has no {metric.name} value for seeds {seeds}")
        return out
    out["change"] = metric.change(metric.worse_sign * worse)
    out["evidence"]["per_seed_change"] = {str(s): round(metric.change(metric.worse_sign * w), 4)
                                          for s, w in per_seed.items()}
    run_sigma, n_resid, _ = null
    if n_resid < MIN_HISTORY or math.isnan(run_sigma):
        out.update(status="insufficient history",
                   reason=f"{n_resid} past runs give the noise level; {MIN_HISTORY} are needed to judge a change")
        return out
    test = _night_test(metric, series, reference, null, seeds, worse)
    out["evidence"]["z"] = worse / test.sigma
    out["evidence"]["z_runs"] = {str(m): zz for m, zz in test.z_runs().items()}
    out.update(_conclusion(metric, test, out["current"], reference.level(metric, present), series.names))
    return out
