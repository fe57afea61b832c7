"""Synthetic nightly series for benchmarks/regression_power.py `power`: whole measured pipeline runs drawn at the
seeds' own levels, judged night by night by the check's own code (harness.regression.verdict.assess) and by Apache
Otava, with the rates each gives.

The check's numeric constants are read from harness.regression.statistics when a series is judged, never bound
here, and harness.regression.verdict, which binds them, is imported on first use: `power --set` changes them first.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

import harness.regression.statistics as check_statistics
from harness.regression.statistics import (
    ADJUSTED,
    METRICS,
    PROBE,
    adjust_for_machine,
    machine_sensitivity,
    machine_speed_outside,
)

REPO = Path(__file__).resolve().parents[1]
BASELINE_RUNS = 5  # what `remax-bench baseline update` takes by default
THROUGHPUT = ("throughput_tok_s", "throughput_tok_cpu_s")
SPEED = {*THROUGHPUT, ADJUSTED}


def slower(raw: dict[str, np.ndarray], nights_slow: slice, by: float) -> dict[str, np.ndarray]:
    """A slower step lowers every throughput figure alike; the probe, timed outside the step, stays. Each slow night
    joins the history the next night is judged against."""
    out = {name: v.copy() for name, v in raw.items()}
    for name in THROUGHPUT:
        if name in out:
            out[name][nights_slow] *= 1 - by
    return out


def alerts(judged_night: dict[str, dict]) -> set[str]:
    return {name for name, v in judged_night.items() if v["status"] == "regression"}


def recent(rows: np.ndarray) -> tuple[dict, ...]:
    """The last runs of a history, most recent first, as the check takes them."""
    return tuple(dict(enumerate(r)) for r in rows[::-1][:check_statistics.PERSISTENCE - 1])


class SyntheticCheck:
    """The check over series of `history` runs and the nights after them, drawn from the measured runs (`ratios`,
    per metric an array of runs x seeds, at the seeds' `levels`); its baseline written from the history's last
    BASELINE_RUNS runs (`baseline_at` "last": just updated) or its first ones ("first": written history -
    BASELINE_RUNS nights ago; those nights join its reference)."""

    def __init__(self, ratios: dict[str, np.ndarray], levels: dict[str, np.ndarray], *, history: int,
                 baseline_at: str, rng: np.random.Generator) -> None:
        measured = set(ratios) | ({ADJUSTED} if {"throughput_tok_s", PROBE} <= set(ratios) else set())
        # As the check does: a figure with a better-controlled one beside it (raw throughput beside the one adjusted
        # for the machine's speed) is context, not an alert.
        self.metrics = [m for m in METRICS if m.kind == "alert" and m.name in measured and m.defer_to not in measured]
        self.deciding = next(m for m in self.metrics if m.name in SPEED)  # the throughput figure that alerts
        self.ratios, self.levels, self.history, self.rng = ratios, levels, history, rng
        self.n_runs = len(next(iter(ratios.values())))
        self.b0 = history - BASELINE_RUNS if baseline_at == "last" else 0

    def draw(self, n: int) -> dict[str, np.ndarray]:
        """n whole measured runs (seeds together) at the seeds' own levels. Without replacement while the pool
        allows: a run drawn twice would sit next to itself and shrink the noise estimate, an artefact no real series
        has."""
        draws = self.rng.permutation(self.n_runs)[:n] if n <= self.n_runs else self.rng.integers(self.n_runs, size=n)
        return {name: self.ratios[name][draws] * self.levels[name] for name in self.ratios}

    def outside(self, raw: dict[str, np.ndarray], night: int) -> bool:
        """The check's machine-speed guard: a night whose probe lies far beyond the history's is not judged."""
        if PROBE not in raw:
            return False
        probe = np.median(raw[PROBE], axis=1)
        return machine_speed_outside(list(probe[:night]), float(probe[night])) is not None

    def values(self, name: str, raw: dict[str, np.ndarray], n_past: int) -> np.ndarray:
        """A metric's values over the drawn runs; the adjusted throughput fitted on the first n_past, as the check
        fits it on the history, and brought to the probe time of the baseline's runs."""
        if name != ADJUSTED:
            return raw[name]
        t, p = raw["throughput_tok_s"], raw[PROBE]
        theta, _, _ = machine_sensitivity(pd.DataFrame(np.log(t[:n_past])), pd.DataFrame(np.log(p[:n_past])))
        return adjust_for_machine(t, p, theta, float(np.median(p[self.b0:self.b0 + BASELINE_RUNS])))

    def verdict(self, m, raw: dict[str, np.ndarray], night: int) -> dict:
        from harness.regression.verdict import Series, assess  # on first use: see the module's docstring

        vals = self.values(m.name, raw, night)
        past, b0 = vals[:night], self.b0
        baseline = {s: list(vals[b0:b0 + BASELINE_RUNS, s]) for s in range(vals.shape[1])}
        under_test = night - (check_statistics.PERSISTENCE - 1)  # persistence judges the runs from here with this one
        since = tuple(dict(enumerate(r)) for r in vals[b0 + BASELINE_RUNS:under_test])
        before = tuple(dict(enumerate(r)) for r in vals[:min(b0, under_test)])
        return assess(m, dict(enumerate(vals[night])),
                      Series(baseline, pd.DataFrame(np.log(past)), recent(past), since=since, before=before))

    def verdicts(self, raw: dict[str, np.ndarray], night: int) -> dict[str, dict]:
        """Each alerting metric's verdict on a night; none where the machine-speed guard leaves it unjudged."""
        return {} if self.outside(raw, night) else {m.name: self.verdict(m, raw, night) for m in self.metrics}

    def caught(self, raw: dict[str, np.ndarray]) -> int:
        """The first slow night (1, 2, ...) a throughput alert is raised on; PERSISTENCE + 1 if none."""
        nights, h = check_statistics.PERSISTENCE, self.history
        return next((k + 1 for k in range(nights) for m in self.metrics if m.name in SPEED
                     and not self.outside(raw, h + k) and self.verdict(m, raw, h + k)["status"] == "regression"),
                    nights + 1)

    def nightly(self, raw: dict[str, np.ndarray]) -> list[float]:
        """Throughput relative to the seeds' levels (a positive figure near 1, as Otava's relative changes need)."""
        relative = self.values(self.deciding.name, raw, self.history) / self.levels["throughput_tok_s"]
        return list(np.exp(np.median(np.log(relative), axis=1)))


def simulate(ratios: dict[str, np.ndarray], levels: dict[str, np.ndarray], *, history: int, drop: float,
             trials: int, rng, fix_drop: float = 0.10, fixed_after: int = 2, baseline_at: str = "last",
             accepted_drop: float = 0.05, otava: list | None = None) -> dict:
    """Rates over `trials` synthetic series: any alert on a night with no change (false alarm); a throughput alert
    by each of the first PERSISTENCE nights of a lasting `drop` (fraction, e.g. 0.05); and any alert on each of the
    PERSISTENCE - 1 nights after a fix (`fixed_after` nights `fix_drop` slower, then back: false alarms too); and
    any alert on the night after a baseline that accepted a drop (its runs and the night `accepted_drop` slower
    than the history before them: a false alarm too; only where the history has runs before the baseline).
    `otava`, when a list, receives each case's nightly series (one value a night, as Otava takes it) for
    `otava_rates`: (case, throughput at the machine's speed over its level, median over seeds, first night judged).
    `baseline_at`: as SyntheticCheck takes it."""
    check = SyntheticCheck(ratios, levels, history=history, baseline_at=baseline_at, rng=rng)
    nights = check_statistics.PERSISTENCE
    after_fix = nights - 1  # the window persistence looks back over: every night it could carry a verdict into
    counts = {"not_judged": 0, "false_alarm": 0, "false_alarm_after_fix": 0, "false_alarm_accepted": 0,
              "false_alarm_throughput": 0,
              "false_alarm_after_fix_throughput": 0, **{f"detected_by_night{k}": 0 for k in range(1, nights + 1)}}
    stated, caught_stated = [], []  # each series' own detectable drop, and whether that drop was caught in time
    for _ in range(trials):
        raw = check.draw(history + nights)
        slowed = slower(raw, slice(history, None), drop)
        clean = check.verdicts(raw, history)
        alarm = alerts(clean)
        detected = check.caught(slowed)
        # What the check says of this series on the first slow night, before it has seen the drop: the smallest
        # lasting drop it catches by night DETECT_BY 95% of the time. Slowed by exactly that, is it?
        if clean and (own := clean[check.deciding.name]["evidence"]["detectable_change"]) is not None:
            stated.append(-own / 100)
            caught_stated.append(check.caught(slower(raw, slice(history, None), -own / 100))
                                 <= check_statistics.DETECT_BY)
        counts["not_judged"] += check.outside(raw, history)
        counts["false_alarm"] += bool(alarm)
        counts["false_alarm_throughput"] += bool(alarm & SPEED)
        if check.b0:  # the baseline was written to accept a slower level: the runs before it are the old one
            counts["false_alarm_accepted"] += bool(alerts(check.verdicts(
                slower(raw, slice(check.b0, None), accepted_drop), history)))
        for k in range(1, nights + 1):
            counts[f"detected_by_night{k}"] += detected <= k
        # A regression that was fixed: the nights after the fix are clean nights, whatever came before them.
        fixed = slower(check.draw(history + fixed_after + after_fix), slice(history, history + fixed_after), fix_drop)
        if otava is not None:
            otava += [("clean", check.nightly(raw)[:history + 1], history), ("slowed", check.nightly(slowed), history),
                      ("fixed", check.nightly(fixed), history + fixed_after)]
        for k in range(after_fix):
            alarm = alerts(check.verdicts(fixed, history + fixed_after + k))
            counts["false_alarm_after_fix"] += bool(alarm)
            counts["false_alarm_after_fix_throughput"] += bool(alarm & SPEED)
    return {**per_night(counts, trials, after_fix), "accepted": bool(check.b0),
            "detectable_median": float(np.median(stated)) if stated else None,
            "caught_at_detectable": float(np.mean(caught_stated)) if stated else None}


def per_night(counts: dict[str, int], trials: int, after_fix: int) -> dict[str, float]:
    """Counts over `trials` series as rates; the after-a-fix counts per night judged, as the clean-history one is."""
    return {k: v / trials / (max(after_fix, 1) if "after_fix" in k else 1) for k, v in counts.items()}


def otava_rates(python: Path, cases: list, *, history: int, max_pvalue: float) -> dict:
    """The same rates as `simulate` for Apache Otava run each night on the series so far (its E-divisive change
    points, benchmarks/otava_changepoints.py in Otava's own environment). A night alerts when Otava finds a drop
    that it did not find the night before (a change point with a lower mean after it, at an index not within one
    of a drop it already had): what a nightly job notifying on new change points would send."""
    request = {"options": {"max_pvalue": max_pvalue},
               "series": [{"values": values, "from": start} for _, values, start in cases]}
    proc = subprocess.run([str(python), str(REPO / "benchmarks" / "otava_changepoints.py")], input=json.dumps(request),
                          capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"Otava failed:\n{proc.stderr[-3000:]}")
    nights = len(next(v for kind, v, _ in cases if kind == "slowed")) - history
    counts = {"false_alarm": 0, "false_alarm_after_fix": 0,
              **{f"detected_by_night{k}": 0 for k in range(1, nights + 1)}}
    trials = after_fix = 0

    def new_drops(before: list, after: list) -> list[int]:
        old = [i for i, change in before if change < 0]
        return [i for i, change in after if change < 0 and all(abs(i - j) > 1 for j in old)]

    for (kind, _values, _start), prefixes in zip(cases, json.loads(proc.stdout)):
        alarms = [new_drops(a, b) for a, b in itertools.pairwise(prefixes)]  # night by night
        if kind == "clean":
            trials += 1
            counts["false_alarm"] += bool(alarms[0])
        elif kind == "slowed":  # found when a new drop starts at the first slow night (give or take one)
            found = next((k + 1 for k, new in enumerate(alarms) if any(i >= history - 1 for i in new)), nights + 1)
            for k in range(1, nights + 1):
                counts[f"detected_by_night{k}"] += found <= k
        else:  # after the fix, a new drop anywhere but at the regression itself is a false alarm
            after_fix = len(alarms)
            counts["false_alarm_after_fix"] += sum(any(not history - 1 <= i <= history + 1 for i in new)
                                                   for new in alarms)
    return per_night(counts, trials, after_fix)
