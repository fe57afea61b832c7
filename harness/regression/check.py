"""Regression check: the latest pipeline run against the committed baseline, judged by the noise in the history.

The method (docs/regression.md explains it for users):
- Values are compared per seed, paired: a seed's workload is deterministic (same tokens every run), so its
  change against the same seed in the reference is a change in speed, not in workload.
- The reference is the baseline's runs and the history's runs whose change against the baseline is within
  Z_SUPPORT noise levels either way (the last PERSISTENCE - 1 excepted: persistence judges them with this run):
  the nights after them, and the REFERENCE_BEFORE runs before them when, as one segment, those are at the
  baseline's level (Z_SEGMENT). A baseline of 5 runs has an error every night shares; the runs at its level
  shrink that error, and a `baseline update` that accepts a new level starts the reference again from its runs:
  the level it left behind fails the segment's test.
- The run's change is the median over its seeds of the per-seed changes (log scale for times and rates): a load
  spike that hits one seed cannot raise an alert alone; at least half the seeds must show it (within-run
  replication).
- Noise comes from the history of the same series (profile, hardware, framework): each past run's per-seed value
  minus the rolling median of that seed's neighbouring runs, median over seeds, less the neighbours' median's own
  noise, then Qn (a robust standard deviation) of those residuals: one run's noise, widened for how few runs
  estimate it (a z over an estimated noise is a Student t; noise_widening). A night's change against the
  reference has that noise and the reference's share of it, which shrinks as the reference grows. Rolling medians
  and Qn let an earlier regression or a freak run neither hide nor fake noise.
- A metric alerts only when the change is worse by at least its minimum effect and by more than any past run
  deviated (heavy tails), and by at least Z_CRIT noise levels in this run alone, or Z_PERSIST noise levels of
  their mean on average over this and up to PERSISTENCE - 1 previous runs (persistence: a lasting small drop is
  caught on a later night). Persistence counts only an unbroken run of nights, this one worse by Z_SUPPORT noise
  levels on its own, each earlier one by Z_EARLIER and none clearly worse than this one: a night back within noise
  neither alerts through the nights before it nor lets a later night lean on them, so a fixed regression stops
  alerting the night the fix lands, and the check says since when. With fewer than MIN_HISTORY
  past runs the noise is not known, and the check says so. A change smaller than the metric's min_abs in its own
  unit (a transition under 1 ms longer: OS jitter on a CPU run) is never judged, whatever its z.
- Sensitivity: every judged metric states the smallest lasting change it catches by night DETECT_BY 95% of the
  time at the series' noise (detectable_change): on a noisy machine that is more than a 5% drop, and the user reads
  it on every night, not only after a miss.
- Contention: a CPU run records wall over CPU time and the cores other processes kept busy meanwhile. A run whose
  ratio is more than CONTENTION_MARGIN above the series' usual one waited for a core another job held, and one
  beside FOREIGN_LOAD_MARGIN cores more of other work than usual shared caches and memory bandwidth; a run whose
  machine-speed probe lies beyond the range of the series' other runs by more than PROBE_EXTRAPOLATION of its
  width ran on a machine the adjustment below knows nothing about. Either way its timings say more about the
  machine than about the code, so they are not judged ("contended"), and such runs are left out of the noise of
  the timed metrics.
- Machine speed: a CPU run times a fixed probe workload after every step (harness.frameworks.reference). The
  drift of a shared CPU's speed, most of the run-to-run noise, moves the probe and the throughput together; the
  history says by how much (machine_sensitivity), and throughput brought to the baseline's probe time (ADJUSTED)
  decides the throughput alert. The wall-clock and per-CPU-second figures defer to it (class "context": shown,
  never the exit status), and the probe's own time is an advisory: the machine, or torch under it, slowed.
Throughput and transition time alert (exit 1). Final reward and time-to-reward are an advisory class: reported,
never the exit status.
"""

from __future__ import annotations

import datetime as dt
import math
import shlex
from collections.abc import Callable
from pathlib import Path

import numpy as np

from harness import HarnessError
from harness.regression.baseline import load_baseline, what_changed
from harness.regression.history import pipeline_rows, read_history, series_key
from harness.regression.statistics import (
    ADJUSTED,
    CONTENTION_MARGIN,
    DETECT_BY,
    DETECT_MARGIN,
    FOREIGN_LOAD_MARGIN,
    METRICS,
    MIN_HISTORY,
    NEIGHBOURS,
    PERSISTENCE,
    PROBE,
    REFERENCE_BEFORE,
    Z_CRIT,
    Z_EARLIER,
    Z_PERSIST,
    Z_SAME_LEVEL,
    Z_SEGMENT,
    Z_SUPPORT,
    Metric,
    adjust_for_machine,
    machine_sensitivity,
    machine_speed_outside,
    series_table,
    training_time_to,
)
from harness.regression.verdict import Series, assess
from harness.results import layout

_BY_NAME = {m.name: m for m in METRICS}


def _metric_of(name: str) -> Callable[[dict], float | None]:
    return lambda r: r["metrics"].get(name)


def _judgeable(metric: Metric, value: Callable[[dict], float | None], row: dict) -> float | None:
    """The metric's value in a row; None where absent or, on a log scale, not positive."""
    v = value(row)
    return None if v is None or (metric.log_scale and v <= 0) else v


def _per_seed(metric: Metric, value: Callable[[dict], float | None], rows: list[dict]) -> dict[int, float | None]:
    """seed -> the metric's value in those rows (one run's), as _judgeable gives it."""
    return {r["seed"]: _judgeable(metric, value, r) for r in rows}


def _extractors(target: float | None) -> dict[str, Callable[[dict], float | None]]:
    """metric name -> its value in a row; a history row's time-to-reward from its stored curve, at the baseline's
    own reward target, so that every run is timed to the same reward."""
    extract = {m.name: _metric_of(m.name) for m in METRICS}
    extract["time_to_reward_s"] = lambda r: (r["metrics"].get("time_to_reward_s") if "curve" not in r
                                             else training_time_to(r["curve"], target) if target is not None else None)
    return extract


def _disturbed(rows: list[dict], cur_rows: list[dict]) -> dict[str, str | None]:
    """pipeline run -> why its timings cannot be judged (contention, a machine speed beyond the series'), or None:
    the series' runs and this one, each against the series' usual without this one."""
    def per_run(name: str) -> dict[str, float]:
        by_run: dict[str, list[float]] = {}
        for r in rows + cur_rows:
            if (v := r["metrics"].get(name)) is not None:
                by_run.setdefault(r["pipeline_run"], []).append(v)
        return {run: float(np.median(v)) for run, v in by_run.items()}

    now = cur_rows[0]["pipeline_run"]
    contention, foreign, probes = per_run("cpu_contention"), per_run("cpu_foreign_load"), per_run(PROBE)
    def usual_of(values: dict[str, float]) -> float | None:
        past = [v for run, v in values.items() if run != now]
        return float(np.median(past)) if past else None

    usual, usual_foreign = usual_of(contention), usual_of(foreign)

    def contended(run: str) -> str | None:
        if usual is not None and run in contention and contention[run] > usual * CONTENTION_MARGIN:
            return (f"wall/CPU time {contention[run]:.2f}x, the series' usual {usual:.2f}x: the run waited for "
                    "cores another job held")
        if usual_foreign is not None and run in foreign and foreign[run] > usual_foreign + FOREIGN_LOAD_MARGIN:
            return (f"other processes kept {foreign[run]:.2f} cores busy beside the run, the series' usual "
                    f"{usual_foreign:.2f}: they shared its caches and memory bandwidth")
        if run in probes:  # against the series' other runs, this one excepted
            return machine_speed_outside([p for r, p in probes.items() if r not in (run, now)], probes[run])
        return None

    return {run: contended(run) for run in {r["pipeline_run"] for r in rows} | {now}}


def _machine_adjustment(quiet: list[dict], base_runs: list[dict], extract: dict[str, Callable[[dict], float | None]]
                        ) -> tuple[Callable[[dict], float | None], dict]:
    """A row's throughput at the baseline's machine speed (ADJUSTED), and the fit's evidence. CUPED-style: the probe
    is a covariate the run's own code cannot move; fitted on the quiet history, and the baseline's median probe time
    is the speed everything is brought to."""
    theta, corr, points = machine_sensitivity(
        *(series_table(quiet, _BY_NAME[n], extract[n]) for n in ("throughput_tok_s", PROBE)))
    base_probe = [v for r in base_runs if (v := extract[PROBE](r))]
    probe_ref = float(np.median(base_probe)) if base_probe else None

    def adjusted(r: dict) -> float | None:
        t, p = extract["throughput_tok_s"](r), extract[PROBE](r)
        return None if probe_ref is None or t is None or not p or p <= 0 else adjust_for_machine(t, p, theta,
                                                                                                probe_ref)

    return adjusted, {"theta": theta, "correlation": None if math.isnan(corr) else corr, "points": points,
                      "probe_reference_s": probe_ref, "fit": "Theil-Sen slope of log throughput on log probe time "
                      "over the quiet history (runs x seeds)"}


def _series(metric: Metric, value: Callable[[dict], float | None], rows: list[dict], base_runs: list[dict],
            runs_of: dict[str, list[dict]], now: str) -> Series:
    """The metric's series, as assess judges this night (`now`) against it, from the rows it is judged on (the quiet
    ones for a timed metric) and the history's runs (`runs_of`: pipeline run -> its rows, oldest first)."""
    judged_runs = {r["pipeline_run"] for r in rows}
    recent = [run for run in reversed(runs_of) if run in judged_runs][:PERSISTENCE - 1]
    baseline: dict[int, list[float]] = {}
    for r in base_runs:
        if (v := _judgeable(metric, value, r)) is not None:
            baseline.setdefault(r["seed"], []).append(v)
    base_times = [t for r in base_runs if (t := r.get("pipeline_time"))]
    first, last = (min(base_times), max(base_times)) if base_times else ("", "")
    # Persistence judges the recent runs with this one: they are under test, not the reference.
    others = [run for run in runs_of if run in judged_runs and first and run not in recent]

    def nights(runs: list[str]) -> tuple[dict[int, float | None], ...]:
        return tuple(_per_seed(metric, value, runs_of[run]) for run in runs)

    return Series(baseline, series_table(rows, metric, value), nights(recent), (now, *recent),
                  since=nights([run for run in others if runs_of[run][0]["pipeline_time"] > last]),
                  before=nights([run for run in others if runs_of[run][0]["pipeline_time"] < first]))


def _check_framework(fw: str, cur_rows: list[dict], base: dict, history: list[dict]) -> list[dict]:
    """Each metric of one framework's run judged against its series: `history`, the series' rows (this profile,
    hardware and framework), and `base`, the framework's baseline. A timed metric is judged on the quiet runs only,
    and not at all when this run was disturbed."""
    extract = _extractors(base.get("reward_target"))
    # Noise from the history of the series; the baseline's own runs fill in what the history does not hold.
    known = {r["pipeline_run"] for r in history}
    rows = history + [{**r, "pipeline_time": r.get("pipeline_time", "")} for r in base["runs"]
                      if r["pipeline_run"] not in known]
    now = cur_rows[0]["pipeline_run"]
    disturbed = _disturbed(rows, cur_rows)
    quiet = [r for r in rows if not disturbed[r["pipeline_run"]]]
    extract[ADJUSTED], sensitivity = _machine_adjustment(quiet, base["runs"], extract)
    runs_of: dict[str, list[dict]] = {}
    for r in history:
        runs_of.setdefault(r["pipeline_run"], []).append(r)
    checks = []
    for m in METRICS:
        series = _series(m, extract[m.name], quiet if m.timed else rows, base["runs"], runs_of, now)
        current = _per_seed(m, extract[m.name], cur_rows)
        if not series.baseline and all(v is None for v in current.values()):
            continue  # a metric this backend does not measure (CPU time on accelerators)
        result = assess(m, current, series)
        if m.name == ADJUSTED:
            result["evidence"]["machine_sensitivity"] = sensitivity
        if m.timed and disturbed[now]:
            result.update(status="contended", reason=f"{disturbed[now]}; timings not judged: rerun on a quiet machine")
        checks.append({"framework": fw, **result})
    judged = {c["metric"] for c in checks if c["status"] in ("ok", "regression", "improved", "contended")}
    for c in checks:
        if _BY_NAME[c["metric"]].defer_to in judged:
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
    history = [r for r in read_history(layout.path(results_dir, layout.HISTORY))
               if r["pipeline_run"] != now["pipeline_run"] and r["pipeline_time"] <= now["pipeline_time"]]
    checks, changes, commits = [], {}, {}
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
        commits[fw] = (b["provenance"].get("git", {}).get("commit"), cur_rows[0]["provenance"]["git"].get("commit"))
    alerts = [c for c in checks if c["class"] == "alert" and c["status"] == "regression"]
    advisories = [c for c in checks if c["class"] == "advisory" and c["status"] == "regression"]
    undecided = {c["status"] for c in checks if c["class"] == "alert" and c["status"] in (
        "contended", "insufficient history", "no comparison")}
    status = ("regression" if alerts else "contended" if "contended" in undecided
              else "insufficient history" if undecided else "ok")
    return {"status": status, "baseline": str(baseline_path), "results": str(results_dir),
            "baseline_runs": [p["pipeline_run"] for p in base.get("pipeline_runs") or []],
            "pipeline_run": now["pipeline_run"], "pipeline_time": now["pipeline_time"], "profile": now["profile"],
            "hardware": now["hardware"], "checked": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "method": {"z_crit": Z_CRIT, "z_persist": Z_PERSIST, "min_history": MIN_HISTORY, "persistence": PERSISTENCE,
                       "z_support": Z_SUPPORT, "z_earlier": Z_EARLIER, "z_same_level": Z_SAME_LEVEL,
                       "reference_before": REFERENCE_BEFORE, "z_segment": Z_SEGMENT,
                       "noise": "Qn of run residuals around a rolling median of "
                       f"{2 * NEIGHBOURS} neighbouring runs (less its own noise), median over seeds, widened by the "
                       "Student t's quantile over the normal's at z_persist for the runs that estimate it, times "
                       "sqrt(1 + (pi/2) / reference runs)",
                       "detect_by": DETECT_BY, "detect_margin": DETECT_MARGIN,
                       "detectable": "evidence.detectable_change: the smallest lasting change caught by night "
                       "detect_by 95% of the time at this series' noise: the mean of detect_by nights' threshold "
                       "plus detect_margin noise levels of that mean (calibrated on measured hosts)"},
            "alerts": alerts, "advisories": advisories, "checks": checks, "changes": changes,
            "confirm": confirm_commands(alerts, commits, results_dir)}


def confirm_commands(alerts: list[dict], commits: dict[str, tuple[str | None, str | None]],
                     results_dir: Path) -> list[str]:
    """The paired A/B (and bisect) that confirms an alert on this machine, against the baseline's commit: a series
    of nights cannot separate a slower commit from a slower host, a paired comparison in one sitting can
    (harness.comparison.ab)."""
    out = []
    for fw in sorted({a["framework"] for a in alerts}):
        base, now = commits.get(fw, (None, None))
        if not (base and now):
            continue
        config = str(layout.path(results_dir, layout.CONFIG))
        # Quoted: a person or a CI job pastes these into a shell, and the folder and framework came from files.
        out += [shlex.join(["remax-bench", "ab", "--framework", fw, "--a", base, "--b", now, "--config", config,
                            "--out", f"{results_dir}/ab"])]
        if base != now:
            out += [shlex.join(["remax-bench", "bisect", base, now, "--framework", fw, "--config", config,
                                "--confirmed-by", f"{results_dir}/ab", "--out", f"{results_dir}/bisect"])]
    return out

