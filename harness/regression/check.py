"""Regression check: the latest pipeline run against the committed baseline, judged by the noise in the history.

The method (docs/regression.md explains it for users):
- Values are compared per seed, paired: a seed's workload is deterministic (same tokens every run), so its
  change against the same seed in the baseline is a change in speed, not in workload.
- The run's change is the median over its seeds of the per-seed changes (log scale for times and rates): a load
  spike that hits one seed cannot raise an alert alone; at least half the seeds must show it (within-run
  replication).
- Noise comes from the history of the same series (profile, hardware, framework): each past run's per-seed value
  minus the rolling median of that seed's neighbouring runs, median over seeds, then 1.4826 x MAD of those
  residuals. Rolling medians and MAD let an earlier regression or a freak run neither hide nor fake noise.
- A metric alerts only when the change is worse by at least its minimum effect, by at least Z_CRIT noise levels
  and by more than any past run deviated (heavy tails), in this run or on average over this and up to
  PERSISTENCE - 1 previous runs (persistence: a lasting small drop is caught on a later night). Persistence counts
  only an unbroken run of nights each worse by Z_SUPPORT noise levels on its own, this one first: a night back
  within noise neither alerts through the nights before it nor lets a later night lean on them, so a fixed
  regression stops alerting the night the fix lands, and the check says since when. With fewer than MIN_HISTORY
  past runs the noise is not known, and the check says so.
- Contention: a CPU run records wall over CPU time and the cores other processes kept busy meanwhile. A run whose
  ratio is more than CONTENTION_MARGIN above the series' usual one waited for a core another job held, and one
  beside FOREIGN_LOAD_MARGIN cores more of other work than usual shared caches and memory bandwidth; either way
  its timings say more about the other job than about the code, so they are not judged ("contended"), and such
  runs are left out of the noise of the timed metrics.
- Machine speed: a CPU run times a fixed probe workload after every step (harness.frameworks.reference). The
  drift of a shared CPU's speed, most of the run-to-run noise, moves the probe and the throughput together; the
  history says by how much (machine_sensitivity), and throughput brought to the baseline's probe time (ADJUSTED)
  decides the throughput alert. The wall-clock and per-CPU-second figures defer to it (class "context": shown,
  never the exit status), and the probe's own time is an advisory: the machine, or torch under it, slowed.
Throughput and transition time alert (exit 1). Final reward and time-to-reward are an advisory class: reported,
never the exit status.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from harness import HarnessError
from harness.io import read_json_object, write_json, write_text
from harness.regression.history import HISTORY_DIR, SCHEMA_VERSION, pipeline_rows, read_history, series_key

Z_CRIT = 3.0
MIN_HISTORY = 8
MIN_BASELINE_RUNS = 3
NEIGHBOURS = 2  # on each side, for the rolling median a run's residual is taken against
PERSISTENCE = 5  # runs (this one and the previous ones, a working week) whose mean change may confirm a drop
Z_SUPPORT = 1.5  # noise levels a night must be worse by on its own before persistence may count it
MAD_TO_SIGMA = 1.4826
REWARD_TARGET_FRACTION = 0.8
CONTENTION_MARGIN = 1.05
FOREIGN_LOAD_MARGIN = 0.25  # cores of other work beyond the series' usual before a CPU run's timings are doubtful


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

    def transform(self, x: float) -> float:
        return math.log(x) if self.log_scale else x

    def change(self, delta: float) -> float:
        """A difference in transformed units as the user reads it: % for ratios, absolute otherwise."""
        return 100 * math.expm1(delta) if self.log_scale else delta


ADJUSTED = "throughput_tok_s_machine"
PROBE = "time_probe_s_median"
METRICS = (
    Metric(ADJUSTED, "throughput at the baseline's machine speed (tokens/s, adjusted by the probe; CPU runs)",
           "alert", True, True, math.log(1 / 0.97), True),
    Metric("throughput_tok_s", "throughput (tokens/s)", "alert", True, True, math.log(1 / 0.97), True, ADJUSTED),
    Metric("throughput_tok_cpu_s", "throughput per CPU-second (tokens/CPU-s; CPU runs)", "alert", True, True,
           math.log(1 / 0.97), True, ADJUSTED),
    Metric("time_transition_s_median", "transition time (s, median)", "alert", False, True, math.log(1.10), True),
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


def time_to_reward(curve: dict, target: float) -> float | None:
    """Training time (summed step time) at which the smoothed reward first reached `target`; None if never."""
    for elapsed, reward in zip(curve["elapsed_s"], curve["reward"]):
        if reward >= target:
            return float(elapsed)
    return None


# ---------------------------------------------------------------- baselines

def load_baseline(path: str | Path) -> dict:
    path = Path(path)
    base = read_json_object(path, "baseline")
    for key in ("schema", "profile", "hardware", "frameworks"):
        if key not in base:
            raise HarnessError(f"{path}: not a baseline (no {key!r}; write one with `remax-bench baseline update`)")
    if base["schema"] != SCHEMA_VERSION:
        raise HarnessError(f"{path}: baseline schema {base['schema']} (this harness reads {SCHEMA_VERSION})")
    for fw, entry in base["frameworks"].items():
        runs = entry.get("runs") if isinstance(entry, dict) else None
        if not runs or not all(isinstance(r, dict) and {"pipeline_run", "seed", "metrics"} <= r.keys() for r in runs):
            raise HarnessError(f"{path}: frameworks.{fw}: expected 'runs' with pipeline_run, seed and metrics")
    return base


def experiment_config(row: dict) -> dict:
    """The part of a run's config that defines its experiment: all of it except what no run of this framework
    reads: other frameworks' own blocks, the list of frameworks in the pipeline, the report's settings."""
    from harness.frameworks import known_frameworks

    others = set(known_frameworks()) - {row["framework"]} | {"frameworks", "report"}
    return {k: v for k, v in row["provenance"]["config"].items() if k not in others}


def _pipeline_runs(rows: list[dict]) -> list[str]:
    return list(dict.fromkeys(r["pipeline_run"] for r in rows))


def build_baseline(history_dir: str | Path, *, profile: str, runs: list[str] | None = None, last: int = 5,
                   command: str = "") -> dict:
    """A baseline from chosen history rows: the given pipeline runs (id or unique prefix), else the last `last`."""
    history_dir = Path(history_dir)
    rows = [r for r in read_history(history_dir) if r["profile"] == profile]
    if not rows:
        raise HarnessError(f"{history_dir}: no history rows for profile {profile!r}")
    available = _pipeline_runs(rows)
    if runs:
        chosen = []
        for want in runs:
            hits = [p for p in available if p.startswith(want)]
            if len(hits) != 1:
                raise HarnessError(f"{history_dir}: pipeline run {want!r} " +
                                   ("not found" if not hits else f"is ambiguous ({', '.join(hits)})") +
                                   f" among profile {profile!r} runs")
            chosen.append(hits[0])
    else:
        chosen = available[-last:]
    if len(set(chosen)) < MIN_BASELINE_RUNS:
        raise HarnessError(f"{history_dir}: a baseline needs at least {MIN_BASELINE_RUNS} pipeline runs of profile "
                           f"{profile!r}; {len(set(chosen))} chosen")
    rows = [r for r in rows if r["pipeline_run"] in chosen]
    hardware = {r["hardware"] for r in rows}
    if len(hardware) > 1:
        raise HarnessError(f"{history_dir}: the chosen runs come from different machines ({' | '.join(hardware)}); "
                           "choose runs of one machine with --runs")
    frameworks = {}
    for fw in sorted({r["framework"] for r in rows}):
        fw_rows = [r for r in rows if r["framework"] == fw]
        versions = {r["framework_version"] for r in fw_rows}
        if len(versions) > 1:
            raise HarnessError(f"{history_dir}: {fw}: the chosen runs differ in framework_version "
                               f"({', '.join(sorted(versions))}); a baseline is one experiment: "
                               "choose runs with --runs")
        first_config = experiment_config(fw_rows[0])
        differing = sorted({d["key"] for r in fw_rows[1:] for d in _diff(first_config, experiment_config(r))})
        if differing:
            raise HarnessError(f"{history_dir}: {fw}: the chosen runs differ in config ({', '.join(differing)}); "
                               "a baseline is one experiment: choose runs with --runs")
        first = float(np.median([r["metrics"]["reward_first10"] for r in fw_rows]))
        last_ = float(np.median([r["metrics"]["reward_last10"] for r in fw_rows]))
        target = first + REWARD_TARGET_FRACTION * (last_ - first)
        newest = fw_rows[-1]
        frameworks[fw] = {
            "framework_version": newest["framework_version"],
            "config_hash": newest["config_hash"],
            "config_hashes": sorted({r["config_hash"] for r in fw_rows}),
            "reward_target": round(target, 5),
            "provenance": newest["provenance"],
            "runs": [{"pipeline_run": r["pipeline_run"], "pipeline_time": r["pipeline_time"], "run_id": r["run_id"],
                      "seed": r["seed"], "source": r["_source"],
                      "metrics": {**r["metrics"], "time_to_reward_s": time_to_reward(r["curve"], target)}}
                     for r in fw_rows],
        }
    return {
        "schema": SCHEMA_VERSION,
        "profile": profile,
        "hardware": rows[0]["hardware"],
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": command,
        "pipeline_runs": [{"pipeline_run": p, "pipeline_time": next(r["pipeline_time"] for r in rows
                                                                    if r["pipeline_run"] == p)} for p in chosen],
        "frameworks": frameworks,
    }


# ---------------------------------------------------------------- the check

def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _diff(before: dict, after: dict) -> list[dict]:
    a, b = _flatten(before or {}), _flatten(after or {})
    return [{"key": k, "baseline": a.get(k), "current": b.get(k)}
            for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)]


def what_changed(base: dict, current: dict) -> dict:
    """Differences between the baseline's provenance and the current run's: the likely causes, at a glance."""
    bp, cp = base["provenance"], current["provenance"]
    return {
        "framework_version": _diff({"framework_version": base["framework_version"]},
                                   {"framework_version": current["framework_version"]}),
        "config": _diff(bp.get("config"), cp.get("config")),
        "harness_commit": _diff(bp.get("git"), cp.get("git")),
        "packages": _diff(bp.get("versions"), cp.get("versions")),
        "inputs": _diff(bp.get("inputs"), cp.get("inputs")),
    }


def run_residuals(table: pd.DataFrame) -> np.ndarray:
    """Each past run's change against its neighbours, from a (runs in time order) x (seeds) table.

    Each value minus the median of the same seed's neighbouring runs (NEIGHBOURS on each side, itself left out),
    median over seeds: the statistic the check computes for the current run, on runs with no known change.
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
                    residuals.append(np.nanmedian(per_seed))
    return np.asarray(residuals)


def noise_level(table: pd.DataFrame) -> tuple[float, int]:
    """Robust run-to-run noise (1.4826 x MAD of the run residuals) and how many runs it rests on."""
    return null_of(table)[:2]


def null_of(history: pd.DataFrame) -> tuple[float, int, float]:
    """(noise, how many run residuals it rests on, the widest past deviation) of a history with no known change.

    The widest deviation matters on a shared machine: noise has heavy tails that a MAD from a few runs
    underestimates, so a change must also beat what the series has already shown."""
    r = run_residuals(history) if len(history) else np.array([])
    if not len(r):
        return float("nan"), 0, float("nan")
    spread = np.abs(r - np.median(r))
    return float(MAD_TO_SIGMA * np.median(spread)), len(r), float(np.max(spread))


def _series_table(rows: list[dict], metric: Metric, values: Callable[[dict], float | None]) -> pd.DataFrame:
    records = [{"pipeline_run": r["pipeline_run"], "pipeline_time": r["pipeline_time"], "seed": r["seed"],
                "value": metric.transform(v)} for r in rows if (v := values(r)) is not None and
               (not metric.log_scale or v > 0)]
    if not records:
        return pd.DataFrame()
    df = pd.DataFrame(records)
    order = df.groupby("pipeline_run")["pipeline_time"].first().sort_values().index
    return df.pivot_table(index="pipeline_run", columns="seed", values="value", aggfunc="median").loc[order]


def assess(metric: Metric, current: dict[int, float | None], baseline: dict[int, list[float]],
           history: pd.DataFrame, previous: list[dict[int, float | None]] | None = None,
           runs: list[str] | None = None) -> dict:
    """Judge one metric of one framework. Pure: the power benchmark calls it exactly as `check` does.

    `current`: seed -> value; `previous`: the same for the last runs in the history, most recent first;
    `baseline`: seed -> values over its runs; `history`: past runs x seeds of transformed values (for the noise);
    `runs`: the names of this run and of the `previous` ones, for saying since when a series is back to its baseline.
    """
    tr = metric.transform
    base_ref = {s: float(np.median([tr(v) for v in vs])) for s, vs in baseline.items() if vs}
    seeds = sorted(s for s in current if s in base_ref)
    n_history = len(history)
    sigma, n_resid, largest = null_of(history)
    n_base_runs = max((len(vs) for vs in baseline.values()), default=0)
    unit = "%" if metric.log_scale else ""
    out: dict[str, Any] = {"metric": metric.name, "label": metric.label, "class": metric.kind,
           "baseline": float(np.median([v for vs in baseline.values() for v in vs])) if baseline else None,
           "current": None, "change": None, "unit": "%" if metric.log_scale else "absolute",
           "evidence": {"test": (f"median over seeds of the paired per-seed change vs the baseline; alert when worse "
                                 f"by >= {metric.change(metric.min_effect):.3g}{unit}, >= {Z_CRIT} x noise and more "
                                 "than any past run deviated, in this run or on average over this and up to "
                                 f"{PERSISTENCE - 1} previous runs, each worse by >= {Z_SUPPORT} x noise on its own "
                                 "and not clearly worse than this one"),
                        "noise": None if math.isnan(sigma) else metric.change(sigma), "z": None, "z_runs": {},
                        "largest_past_deviation": None if math.isnan(largest) else metric.change(largest),
                        "n_history_runs": n_history, "n_baseline_runs": n_base_runs, "seeds": seeds,
                        "per_seed_change": {}}}
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
    sign = -1.0 if metric.higher_is_better else 1.0  # positive = worse

    def worse_of(values: dict[int, float | None]) -> tuple[float | None, dict[int, float]]:
        per_seed = {s: sign * (tr(v) - base_ref[s]) for s in seeds if (v := values.get(s)) is not None}
        return (float(np.median(list(per_seed.values()))) if per_seed else None), per_seed

    worse, per_seed = worse_of(current)
    if worse is None:  # e.g. a metric the baseline's runs recorded and this run's producer does not
        out.update(status="no comparison", reason=f"this run has no {metric.name} value for seeds {seeds}")
        return out
    out["change"] = metric.change(sign * worse)
    out["evidence"]["per_seed_change"] = {str(s): round(metric.change(sign * w), 4) for s, w in per_seed.items()}
    if n_resid < MIN_HISTORY or math.isnan(sigma):
        out.update(status="insufficient history",
                   reason=f"{n_resid} past runs give the noise level; {MIN_HISTORY} are needed to judge a change")
        return out
    sigma = max(sigma, 1e-12)  # a deterministic metric (a reward with fixed seeds) has no noise: the effect decides
    z = worse / sigma
    out["evidence"]["z"] = z
    changes = [worse]  # this run's, then the previous runs' while they have a value
    for values in (previous or [])[:PERSISTENCE - 1]:
        before, _ = worse_of(values)
        if before is None:
            break
        changes.append(before)
    # The mean of m runs' changes is judged against the history before the m - 1 previous runs it includes (they
    # are under test, not the null). Averaging shrinks the runs' own noise by m but not the baseline's, which all
    # m changes share: with a baseline median of n runs holding c = (pi / 2) / n of a run's variance, the mean's
    # noise is sigma * sqrt((1/m + c) / (1 + c)); the widest past deviation it must beat shrinks alike.
    share = (math.pi / 2) / max(n_base_runs, 1)
    nulls = {1: (sigma, n_resid, largest)}
    nulls.update({m: null_of(history.iloc[:n_history - (m - 1)]) for m in range(2, len(changes) + 1)})
    shrink = {m: math.sqrt((1 / m + share) / (1 + share)) for m in nulls}
    z_runs = {m: float(np.mean(changes[:m])) / (max(nulls[m][0], 1e-12) * shrink[m])
              for m in range(2, len(changes) + 1) if nulls[m][1] >= MIN_HISTORY}
    out["evidence"]["z_runs"] = {str(m): zz for m, zz in z_runs.items()}

    def decided(ws: list[float]) -> bool:
        mean, m = float(np.mean(ws)), len(ws)
        s_m, n_m, largest_m = nulls[m]
        return (n_m >= MIN_HISTORY and mean >= metric.min_effect and mean / (max(s_m, 1e-12) * shrink[m]) >= Z_CRIT
                and mean > largest_m * shrink[m])

    def worse_itself(w: float) -> bool:
        """A night worse than the noise on its own figure: the only kind persistence may add to or confirm."""
        return w / sigma >= Z_SUPPORT

    def same_level(w: float) -> bool:
        """An earlier night not clearly worse than this one (by Z_CRIT noise levels of the difference of two runs,
        in which the baseline's error cancels): a night clearly better than those before it has changed since."""
        return w - worse < Z_CRIT * sigma * math.sqrt(2)

    # Persistence confirms a night only with the unbroken run of nights before it that are each worse on their own
    # and at this night's level: a night back within noise ends the run, and a fixed night is not carried by the
    # regressed nights before it, so an earlier night's verdict never carries into a fixed one.
    streak = next((k for k, w in enumerate(changes) if not (worse_itself(w) and same_level(w))), len(changes))
    persisted = next((m for m in range(2, streak + 1) if decided(changes[:m])), None)
    if decided([worse]):
        out["status"] = "regression"
    elif persisted:
        out.update(status="regression",
                   reason=f"persisted over the last {persisted} runs (mean z {z_runs[persisted]:+.1f})")
    elif decided([-worse]):
        out["status"] = "improved"
    else:
        out["status"] = "ok"
        back = next((k for k, w in enumerate(changes) if decided([w])), None)  # the last night worse on its own
        if back and runs and back < len(runs):
            out["reason"] = (f"back to the baseline since run {runs[back - 1]}: run {runs[back]} before it was "
                             f"{metric.change(sign * changes[back]):+.1f}{unit} (z {changes[back] / sigma:+.1f})")
    return out


def _metric_of(name: str) -> Callable[[dict], float | None]:
    return lambda r: r["metrics"].get(name)


def _check_framework(fw: str, cur_rows: list[dict], base: dict, history: list[dict]) -> list[dict]:
    target = base.get("reward_target")
    extract = {m.name: _metric_of(m.name) for m in METRICS}
    extract["time_to_reward_s"] = lambda r: (r["metrics"].get("time_to_reward_s") if "curve" not in r
                                             else time_to_reward(r["curve"], target) if target is not None else None)
    # Noise from the history of the series; the baseline's own runs fill in what the history does not hold.
    known = {r["pipeline_run"] for r in history}
    series = history + [{**r, "pipeline_time": r.get("pipeline_time", "")} for r in base["runs"]
                        if r["pipeline_run"] not in known]
    def per_run(name: str) -> dict[str, float]:
        by_run: dict[str, list[float]] = {}
        for r in series + cur_rows:
            if (v := r["metrics"].get(name)) is not None:
                by_run.setdefault(r["pipeline_run"], []).append(v)
        return {run: float(np.median(v)) for run, v in by_run.items()}

    now = cur_rows[0]["pipeline_run"]
    contention, foreign = per_run("cpu_contention"), per_run("cpu_foreign_load")
    def usual_of(values: dict[str, float]) -> float | None:
        past = [v for run, v in values.items() if run != now]
        return float(np.median(past)) if past else None

    usual, usual_foreign = usual_of(contention), usual_of(foreign)

    def contended(run: str) -> str | None:
        """Why the run's timings cannot be judged, or None."""
        if usual is not None and run in contention and contention[run] > usual * CONTENTION_MARGIN:
            return (f"wall/CPU time {contention[run]:.2f}x, the series' usual {usual:.2f}x: the run waited for "
                    "cores another job held")
        if usual_foreign is not None and run in foreign and foreign[run] > usual_foreign + FOREIGN_LOAD_MARGIN:
            return (f"other processes kept {foreign[run]:.2f} cores busy beside the run, the series' usual "
                    f"{usual_foreign:.2f}: they shared its caches and memory bandwidth")
        return None

    quiet = [r for r in series if not contended(r["pipeline_run"])]
    now_contended = contended(now)
    # The machine-speed adjustment (CUPED-style: the probe is a covariate the run's own code cannot move), fitted
    # on the quiet history; the baseline's median probe time is the speed everything is brought to.
    by_name = {m.name: m for m in METRICS}
    theta, corr, points = machine_sensitivity(
        *(_series_table(quiet, by_name[n], extract[n]) for n in ("throughput_tok_s", PROBE)))
    base_probe = [v for r in base["runs"] if (v := extract[PROBE](r))]
    probe_ref = float(np.median(base_probe)) if base_probe else None

    def adjusted(r: dict) -> float | None:
        t, p = extract["throughput_tok_s"](r), extract[PROBE](r)
        return None if probe_ref is None or t is None or not p or p <= 0 else adjust_for_machine(t, p, theta,
                                                                                                probe_ref)

    extract[ADJUSTED] = adjusted
    checks = []
    for m in METRICS:
        rows = quiet if m.timed else series
        # The latest runs of the series before this one, most recent first (quiet ones only for timed metrics).
        recent = list(dict.fromkeys(r["pipeline_run"] for r in reversed(history) if r in rows))[:PERSISTENCE - 1]
        baseline: dict[int, list[float]] = {}
        for r in base["runs"]:
            v = extract[m.name](r)
            if v is not None and (not m.log_scale or v > 0):
                baseline.setdefault(r["seed"], []).append(v)
        current = {r["seed"]: extract[m.name](r) for r in cur_rows}
        current = {s: (v if v is None or not m.log_scale or v > 0 else None) for s, v in current.items()}
        if not baseline and all(v is None for v in current.values()):
            continue  # a metric this backend does not measure (CPU time on accelerators)
        previous = [{r["seed"]: v if (v := extract[m.name](r)) is None or not m.log_scale or v > 0 else None
                     for r in history if r["pipeline_run"] == run} for run in recent]
        result = assess(m, current, baseline, _series_table(rows, m, extract[m.name]), previous, [now, *recent])
        if m.name == ADJUSTED:
            result["evidence"]["machine_sensitivity"] = {
                "theta": theta, "correlation": None if math.isnan(corr) else corr, "points": points,
                "probe_reference_s": probe_ref,
                "fit": "Theil-Sen slope of log throughput on log probe time over the quiet history (runs x seeds)"}
        if m.timed and now_contended:
            result.update(status="contended", reason=f"{now_contended}; timings not judged: rerun on a quiet machine")
        checks.append({"framework": fw, **result})
    judged = {c["metric"] for c in checks if c["status"] in ("ok", "regression", "improved", "contended")}
    for c in checks:
        if by_name[c["metric"]].defer_to in judged:
            c["class"] = "context"
    return checks


def check(baseline_path: str | Path, results_dir: str | Path) -> dict:
    """Compare the pipeline run in `results_dir` with the baseline and the history; write the alerts; return them."""
    results_dir = Path(results_dir)
    if not results_dir.is_dir():
        raise HarnessError(f"{results_dir}: results directory not found")
    base = load_baseline(baseline_path)
    current = pipeline_rows(results_dir)
    now = current[0]
    for key in ("profile", "hardware"):
        if base[key] != now[key]:
            raise HarnessError(f"{baseline_path}: baseline is for {key} {base[key]!r}, but the run in {results_dir} "
                               f"is {key} {now[key]!r}: compare like with like (write a baseline for this {key} "
                               "with `remax-bench baseline update`)")
    history = [r for r in read_history(results_dir / HISTORY_DIR)
               if r["pipeline_run"] != now["pipeline_run"] and r["pipeline_time"] <= now["pipeline_time"]]
    checks, changes = [], {}
    for fw in sorted({r["framework"] for r in current}):
        cur_rows = [r for r in current if r["framework"] == fw]
        if fw not in base["frameworks"]:
            checks.append({"framework": fw, "metric": "*", "class": "alert", "status": "no comparison",
                           "reason": f"no baseline for framework {fw!r} in {baseline_path}"})
            continue
        b = base["frameworks"][fw]
        series = [r for r in history if series_key(r) == series_key(cur_rows[0])]
        checks += _check_framework(fw, cur_rows, b, series)
        changes[fw] = what_changed(b, cur_rows[0])
    alerts = [c for c in checks if c["class"] == "alert" and c["status"] == "regression"]
    advisories = [c for c in checks if c["class"] == "advisory" and c["status"] == "regression"]
    undecided = {c["status"] for c in checks if c["class"] == "alert" and c["status"] in (
        "contended", "insufficient history", "no comparison")}
    status = ("regression" if alerts else "contended" if "contended" in undecided
              else "insufficient history" if undecided else "ok")
    return {"status": status, "baseline": str(baseline_path), "results": str(results_dir),
            "pipeline_run": now["pipeline_run"], "pipeline_time": now["pipeline_time"], "profile": now["profile"],
            "hardware": now["hardware"], "checked": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "method": {"z_crit": Z_CRIT, "min_history": MIN_HISTORY, "persistence": PERSISTENCE, "z_support": Z_SUPPORT,
                       "noise": "1.4826 x MAD of run residuals "
                       f"around a rolling median of {2 * NEIGHBOURS} neighbouring runs, median over seeds"},
            "alerts": alerts, "advisories": advisories, "checks": checks, "changes": changes}


# ---------------------------------------------------------------- rendering

def _fmt(value: float | None, unit: str | None = None) -> str:
    if value is None:
        return "n/a"
    if unit == "%":
        return f"{value:+.1f}%"
    return f"{value:+.3f}" if unit == "absolute" else f"{value:.4g}"


def _changes_md(changes: dict) -> list[str]:
    lines = []
    for fw, groups in changes.items():
        items = [f"- {group}: `{d['key']}` {d['baseline']!r} -> {d['current']!r}"
                 for group, diffs in groups.items() for d in diffs]
        lines += [f"### {fw}", *(items or ["- nothing: same framework version, config, harness commit, packages, "
                                          "inputs"]), ""]
    return lines


def render_markdown(result: dict) -> str:
    head = {"regression": "REGRESSION: a throughput or transition-time regression was found",
            "ok": "OK: no regression",
            "contended": "NOT JUDGED: the run waited for the CPU (another job held the cores); rerun it on a quiet "
                         "machine; no alert raised",
            "insufficient history":
            "NOT JUDGED: too little history to know the noise (see below); no alert raised"}[result["status"]]
    lines = [f"# Regression check: {head}", "",
             f"- run: `{result['pipeline_run']}` ({result['pipeline_time']}), profile `{result['profile']}`",
             f"- hardware: {result['hardware']}", f"- baseline: `{result['baseline']}`", ""]
    header = ["| framework | metric | status | baseline | current | change | noise (1 sigma) | z | history runs |"
              " seeds |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]

    def row(c: dict) -> str:
        if c.get("metric") == "*":
            return f"| {c['framework']} | * | {c['status']}: {c['reason']} | | | | | | | |"
        ev = c["evidence"]
        unit = c["unit"]
        status = c["status"] + (f" ({c['reason']})" if c.get("reason") else "")
        z = "n/a" if ev["z"] is None else f"{ev['z']:+.1f}"
        return (f"| {c['framework']} | {c['label']} | {status} | {_fmt(c['baseline'])} | {_fmt(c['current'])} |"
                f" {_fmt(c['change'], unit)} | {_fmt(ev['noise'], unit).lstrip('+')} | {z} | {ev['n_history_runs']} |"
                f" {len(ev['seeds'])} |")

    for title, kind in (("Alerts (throughput, transition time)", "alert"),
                        ("Context (raw throughput: the figure adjusted for the machine's speed decides; never fails "
                         "the check)", "context"),
                        ("Advisory (reward curve, machine speed; never fails the check)", "advisory")):
        rows = [row(c) for c in result["checks"] if c["class"] == kind]
        if rows or kind != "context":
            lines += [f"## {title}", "", *header, *rows, ""]
        if kind == "alert":
            lines += [f"Machine-speed adjustment ({c['framework']}): throughput brought to the baseline's probe time "
                      f"{ms['probe_reference_s']:.4g} s with theta {ms['theta']:.2f} (throughput falls theta % per % "
                      f"the probe slows; Theil-Sen fit over {ms['points']} quiet history points, correlation "
                      f"{_fmt(ms['correlation'])})." for c in result["checks"]
                      if (ms := c.get("evidence", {}).get("machine_sensitivity")) and ms["correlation"] is not None]
            lines += [""] if lines[-1] else []
    lines += ["## What changed since the baseline", "", *_changes_md(result["changes"])]
    lines += ["## Method", "",
              "Change = median over seeds of each seed's change against the same seed in the baseline (paired; log "
              "ratio for times and rates). Noise = 1.4826 x MAD of the same statistic over the history, each past run "
              f"against the rolling median of its {2 * NEIGHBOURS} neighbours. A metric alerts when it is worse by at "
              f"least its minimum effect, by at least {Z_CRIT} noise levels and by more than any past run deviated "
              f"(in this run, or on average over this and up to {PERSISTENCE - 1} previous runs, each worse by at "
              f"least {Z_SUPPORT} noise levels on its own and not clearly worse than this one); with fewer than "
              f"{MIN_HISTORY} past runs it is not judged. See docs/regression.md.", ""]
    return "\n".join(lines)


def write_alerts(result: dict, results_dir: str | Path) -> None:
    results_dir = Path(results_dir)
    write_json(results_dir / "alerts.json", result)
    write_text(results_dir / "alerts.md", render_markdown(result))
