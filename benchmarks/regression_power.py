"""Benchmark: false-alarm and detection rates of `remax-bench check`, by resampling measured run-to-run noise.

    python benchmarks/regression_power.py measure --pipelines 16 --out benchmarks/data/regression_noise_probe.csv \
        [--configfile benchmarks/regression_short.yaml] [--workdir DIR]
    python benchmarks/regression_power.py power [--data benchmarks/data/regression_noise_probe.csv] [--trials 4000] \
        [--set Z_SEGMENT=inf ...]

`measure` runs the real pipeline N times in one working directory (inputs built once, every run redone with
`--forcerun run_embedded`) and writes one CSV row per (pipeline run, seed): the per-seed summaries the history
keeps; each pipeline run is also appended to the real history, WORKDIR/results/history. Nothing else should
run on the machine if the figures are to describe a quiet machine; the CSV records the load average so a
reader can tell.

`power` builds synthetic nightly series by resampling those measurements: a pipeline run is drawn whole (its
seeds together, so load shared by the seeds of one run stays shared) and its per-seed values are expressed as
ratios to the per-seed median over all measured runs, so the seed's own workload cancels. A series of H history
runs plus the next nights goes through the same code as `remax-bench check` (harness.regression.verdict.assess),
with the baseline written from the history's last BASELINE_RUNS runs (just updated) or from its first ones (the
nights since then join its reference, as they do in the check; --baseline-at):
with no change (false alarms); with the nights' throughput multiplied by 0.95, each slow night joining the history the
next is judged against (detection by night 1, 2, ... PERSISTENCE); and with a regression that was fixed (two nights
10% slower, then back), where any alert on the nights after the fix is a false alarm too; and, with a baseline just
written, one written to accept a drop (its runs and the next night --accepted-drop slower than the history before
them, which the check may take into the reference only as one level with the baseline), where any alert is a false
alarm too. It prints the rates for 1 to 3 seeds and several history lengths, and exits 1 when no row meets the
targets (<= 1% false alarms, after a fix and after accepting a level too, and >= 95% detection of a lasting 5% drop
by night DETECT_BY). With --otava it judges the same
series with Apache Otava's change-point detection too. Contended runs are left out first, as the check leaves
them out. The metrics that alert are the check's: where the data has the machine-speed probe, the throughput
adjusted by it (its sensitivity fitted on each synthetic history, as the check fits it) alone stands for
throughput; a slower step slows the throughput by the drop, and the probe, timed outside the step, stays as it was.
A night whose probe lies far outside the history's range is not judged, as the check does not judge it (the
machine-speed guard, harness.regression.statistics.machine_speed_outside); the share of clean nights it leaves
unjudged is printed beside the rates. Each series is also slowed by exactly the lasting drop the check says, on its
first slow night, that it catches by night DETECT_BY 95% of the time (`detectable_change`): how often that drop is
caught in time is the statement's calibration. The header prints the bound no method passes on the data's host: how
often a check that knew the noise and the reference exactly would catch the drop by night DETECT_BY; and, for each
history length asked for, the bound for a check that must learn both from that many runs (learnt_bound).
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
from regression_series import BASELINE_RUNS, THROUGHPUT, otava_rates, simulate

import harness.regression.statistics as check_statistics  # its numeric constants read on use: --set changes them
from harness.regression.statistics import METRICS, PROBE, adjust_for_machine, machine_sensitivity, noise_level
from harness.results import layout

REPO = Path(__file__).resolve().parents[1]
FIELDS = ["pipeline", "started_utc", "load1", "framework", "seed", "run_id", "config_hash", "inject_slowdown",
          "throughput_tok_s", "throughput_tok_cpu_s", "time_probe_s_median", "cpu_contention", "cpu_foreign_load",
          "time_step_s_median", "time_transition_s_median", "time_transition_s_p90", "reward_last10", "reward_gain"]


def snakemake(workdir: Path, configfile: Path | None, *extra: str) -> None:
    cmd = [shutil.which("snakemake") or "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(workdir),
           "--cores", "all", *extra]
    if configfile:
        cmd += ["--configfile", str(configfile.resolve())]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"snakemake failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


def measure(args) -> int:
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="remax-bench-noise-"))
    workdir.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    if args.append and args.out.is_file():  # continue a measurement in the same workdir
        with open(args.out, newline="") as f:
            rows = list(csv.DictReader(f))
    done = max((int(r["pipeline"]) for r in rows), default=0)
    for i in range(done + 1, done + args.pipelines + 1):
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        # `history` appends the pipeline run to WORKDIR/results/history, as the nightly `check` target does.
        snakemake(workdir, args.configfile, "all", "history",
                  *(["--forcerun", "run_embedded"] if i > 1 or (workdir / layout.RESULTS).exists() else []))
        results = workdir / layout.RESULTS
        config = json.loads(layout.path(results, layout.CONFIG).read_text())
        summary = pd.read_csv(layout.path(results, layout.SUMMARY))
        for r in summary.itertuples():
            run = layout.path(results, layout.RUN, framework=r.framework, seed=r.seed)
            manifest = json.loads((run / "manifest.json").read_text())
            rows.append({"pipeline": i, "started_utc": started, "load1": round(os.getloadavg()[0], 2),
                         "framework": r.framework, "seed": r.seed, "run_id": r.run_id,
                         "config_hash": manifest["config_hash"],
                         "inject_slowdown": config["reference"]["inject_slowdown"],
                         **{k: getattr(r, k) for k in FIELDS[8:]}})
        args.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.out.with_suffix(".csv.tmp")
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, FIELDS)
            w.writeheader()
            w.writerows(rows)
        os.replace(tmp, args.out)
        print(f"pipeline {i}: " + ", ".join(f"s{r['seed']} {float(r['throughput_tok_s']):.0f} tok/s"
                                            for r in rows if int(r["pipeline"]) == i), flush=True)
    return 0


def set_constants(assignments: list[str]) -> None:
    """--set NAME=VALUE: a what-if of the check's constants (harness.regression.statistics), before anything reads
    them (harness.regression.verdict binds them when regression_series first judges a night); each is printed with
    the check's own value, so output under a what-if cannot pass for the check's."""
    for assignment in assignments:
        name, _, value = assignment.partition("=")
        own = getattr(check_statistics, name, None)
        if not name.isupper() or isinstance(own, bool) or not isinstance(own, (int, float)):
            sys.exit(f"--set {assignment}: {name!r} is not a numeric constant of harness.regression.statistics")
        try:
            new = type(own)(value)  # a count stays an int, a threshold a float ("inf" turns a test off)
        except ValueError:
            sys.exit(f"--set {assignment}: {value!r} is not of {name}'s type ({type(own).__name__})")
        setattr(check_statistics, name, new)
        print(f"what-if: {name} = {new} (the check's: {own})")


def learnt_bound(night_sd: float, drop: float, history: int, nights: int, draws: int = 400_000) -> float:
    """How often the one-sided t test of the mean of `nights` slow nights against the mean of `history` runs, its
    noise their sample standard deviation, catches a lasting `drop` at 1% false alarms, where nights spread
    `night_sd` (log units) normally: the most a check that learns both from its history can do (Monte Carlo)."""
    rng = np.random.default_rng(0)
    dof = history - 1
    scale = np.sqrt(rng.chisquare(dof, draws) / dof)  # the sample sd over the true one
    null = rng.standard_normal(draws) / scale
    z = -math.log1p(-drop) / (night_sd * math.sqrt(1 / nights + 1 / history))
    return float(np.mean((z + rng.standard_normal(draws)) / scale > np.quantile(null, 0.99)))


def measured_ratios(data: Path, noise_scale: float) -> tuple[pd.DataFrame, dict, dict]:
    """The measured runs, contended ones left out; per metric the check judges (and the probe), each run's values
    over the per-seed medians (raised to `noise_scale`), and those medians, the seeds' levels."""
    df = pd.read_csv(data)
    df = df[df["inject_slowdown"] == 0]
    # The check leaves contended runs out (wall/CPU time above the series' usual by CONTENTION_MARGIN): so does
    # the resampling. Measurements older than the cpu_contention column give it as the ratio of the two medians.
    if df.get("cpu_contention", pd.Series(dtype=float)).isna().all() and "throughput_tok_cpu_s" in df.columns:
        df = df.assign(cpu_contention=df["throughput_tok_cpu_s"] / df["throughput_tok_s"])
    if "cpu_contention" in df.columns:
        per_run = df.groupby("pipeline")["cpu_contention"].median()
        contended = set(per_run[per_run > per_run.median() * check_statistics.CONTENTION_MARGIN].index)
        if "cpu_foreign_load" in df.columns and df["cpu_foreign_load"].notna().any():
            foreign = df.groupby("pipeline")["cpu_foreign_load"].median()
            contended |= set(foreign[foreign > foreign.median() + check_statistics.FOREIGN_LOAD_MARGIN].index)
        print(f"contended pipeline runs left out, as the check leaves them out: {len(contended)} of {len(per_run)}")
        df = df[~df["pipeline"].isin(contended)]
    ratios, levels = {}, {}
    for m in METRICS:
        if (m.kind != "alert" and m.name != PROBE) or m.name not in df.columns or df[m.name].isna().all():
            continue  # a metric older measurements lack, or one this backend does not measure
        table = df.pivot_table(index="pipeline", columns="seed", values=m.name).dropna()
        levels[m.name] = table.median().to_numpy()
        ratios[m.name] = (table / table.median()).to_numpy() ** noise_scale
    return df, ratios, levels


def print_noise(args, df: pd.DataFrame, ratios: dict[str, np.ndarray]) -> None:
    """The data's noise, and the bounds no method passes on the host it was measured on."""
    detect_by = check_statistics.DETECT_BY
    n_pipelines, n_seeds = ratios["throughput_tok_s"].shape
    print(f"data: {args.data} ({n_pipelines} pipeline runs x {n_seeds} seeds, load1 {df['load1'].min():.1f}-"
          f"{df['load1'].max():.1f}); noise scale {args.noise_scale}; measured: {', '.join(ratios)}")
    by_speed = ratios["throughput_tok_s"]  # the throughput that alerts: at the machine's speed where it is known
    if PROBE in ratios:
        theta, corr, points = machine_sensitivity(*(pd.DataFrame(np.log(ratios[n]))
                                                    for n in ("throughput_tok_s", PROBE)))
        print(f"throughput's sensitivity to the machine-speed probe over all runs: theta {theta:.2f} (correlation "
              f"{corr:+.2f}, {points} points); each synthetic history fits its own, as the check does")
        by_speed = adjust_for_machine(ratios["throughput_tok_s"], ratios[PROBE], theta, 1.0)
        print(f"measured run-level noise of the throughput adjusted with it: "
              f"{100 * noise_level(pd.DataFrame(np.log(by_speed)))[0]:.1f}%")
    # The bound no method passes on this host: a check that knew the noise of a night (the spread of the run
    # medians, whatever their order) and the reference exactly, judging the mean of the first DETECT_BY slow nights
    # at 1% false alarms.
    logs = np.log(by_speed)
    night_sd = float(np.std(np.median(logs - np.median(logs, axis=0), axis=1), ddof=1))
    z_mean = -math.log1p(-args.drop) * math.sqrt(detect_by) / night_sd
    normal = statistics.NormalDist()
    print(f"the bound: a night's throughput{' at the machine speed' if PROBE in ratios else ''} spreads "
          f"{100 * night_sd:.2f}% (sd of the run medians); knowing that and the reference exactly, the mean of "
          f"{detect_by} nights {100 * args.drop:.0f}% slower is z {z_mean:.1f}, caught at 1% false alarms "
          f"{100 * normal.cdf(z_mean - normal.inv_cdf(0.99)):.0f}% of the time: no method catches more by that night")
    print(f"the bound with {' and '.join(map(str, args.history))} history runs: learning the noise and the reference "
          f"from them, the best test at normal noise (Student's t, every run at the level) catches it "
          + " and ".join(f"{100 * learnt_bound(night_sd, args.drop, h, detect_by):.0f}%" for h in args.history)
          + " of the time at 1% false alarms")
    for name in (n for n in THROUGHPUT if n in ratios):
        sigma, _ = noise_level(pd.DataFrame(np.log(ratios[name])))
        print(f"measured run-level {name} noise (Qn of run residuals, median over seeds): {100 * sigma:.1f}%; per-seed "
              f"spread of single runs: {100 * np.std(np.log(ratios[name])):.1f}% (sd of log ratio)")


def print_method(args) -> None:
    """How the rows judge (the check's constants, with any what-if), what each column counts, the table's head."""
    s = check_statistics
    print(f"method: z >= {s.Z_CRIT} alone, >= {s.Z_PERSIST} for a mean of up to {s.PERSISTENCE} runs (persistence), "
          "the noise widened for the runs that estimate it (Student t), "
          f"the detectable change {s.DETECT_MARGIN} noise levels of a {s.DETECT_BY}-night mean beyond its threshold, "
          f"minimum history {s.MIN_HISTORY} runs, "
          f"baseline = {BASELINE_RUNS} runs, the last of the history (just written) or its first (written that many "
          f"nights before); {args.trials} synthetic series per row; drop {100 * args.drop:.0f}%")
    nights = range(1, s.PERSISTENCE + 1)
    print(f"false alarms: per clean night, after a clean history and on each of the {s.PERSISTENCE - 1} nights after a "
          f"fix ({args.fixed_after} nights {100 * args.fix_drop:.0f}% slower, then back)")
    print(f"detectable drop: what the check states on the first slow night (median over series); caught: how often a "
          f"lasting drop of exactly that much, each series its own, was caught by night {s.DETECT_BY} (95% is the "
          "claim)")
    print(f"after accepting: false alarms on the night after a baseline written to accept a drop of "
          f"{100 * args.accepted_drop:.0f}% (the history before it at the old level; a baseline just written only)")
    print("| method | seeds | history runs | baseline from | not judged (machine speed) | false alarms | after a fix | "
          "after accepting | " + " | ".join(f"detected by night {k}" for k in nights)
          + " | detectable drop | caught at it |")
    print("|---|---:|---:|---|---:|---:|---:|---:|" + "---:|" * (len(nights) + 2))


def table_rows(args, ratios: dict[str, np.ndarray], levels: dict[str, np.ndarray], rng) -> list[dict]:
    """The table's rows, printed as they come: per number of seeds, history length and baseline, the check's rates
    (all its alerts, and its throughput alerts alone: Otava's like for like) and Otava's where asked for."""
    n_pipelines, n_seeds = ratios["throughput_tok_s"].shape
    persistence, results = check_statistics.PERSISTENCE, []
    for k in sorted({min(k, n_seeds) for k in args.seeds}):
        sub_r = {n: r[:, :k] for n, r in ratios.items()}
        sub_l = {n: lv[:k] for n, lv in levels.items()}
        for h, at in itertools.product(args.history, args.baseline_at):
            cases = [] if args.otava else None
            r = simulate(sub_r, sub_l, history=h, drop=args.drop, trials=args.trials, rng=rng,
                         fix_drop=args.fix_drop, fixed_after=args.fixed_after, baseline_at=at,
                         accepted_drop=args.accepted_drop, otava=cases)
            results.append({"seeds": k, "history": h, "baseline_at": at, **r})
            drawn = "" if h + persistence <= n_pipelines else " (runs drawn with replacement)"
            rows = [("remax-bench check", r), ("remax-bench check, throughput alerts alone",
                                               {**r, "false_alarm": r["false_alarm_throughput"],
                                                "false_alarm_after_fix": r["false_alarm_after_fix_throughput"]})]
            if args.otava:
                rows += [(f"Otava 0.8.0, p {p}", otava_rates(args.otava, cases, history=h, max_pvalue=p))
                         for p in args.otava_pvalue]
            for method, rr in rows:
                not_judged = f"{100 * rr['not_judged']:.2f}%" if "not_judged" in rr else "-"
                stated, at_stated = rr.get("detectable_median"), rr.get("caught_at_detectable")
                accepted = f"{100 * rr['false_alarm_accepted']:.2f}%" if rr.get("accepted") else "-"
                print(f"| {method} | {k} | {h}{drawn} | {at} {BASELINE_RUNS} runs | {not_judged} | "
                      f"{100 * rr['false_alarm']:.2f}% | "
                      f"{100 * rr['false_alarm_after_fix']:.2f}% | "
                      f"{accepted} | "
                      + " | ".join(f"{100 * rr[f'detected_by_night{n}']:.1f}%" for n in range(1, persistence + 1))
                      + f" | {'-' if stated is None else f'{100 * stated:.1f}%'} | "
                      f"{'-' if at_stated is None else f'{100 * at_stated:.1f}%'} |", flush=True)
    return results


def power(args) -> int:
    set_constants(args.set)
    df, ratios, levels = measured_ratios(args.data, args.noise_scale)
    rng = np.random.default_rng(args.seed)
    print_noise(args, df, ratios)
    print_method(args)
    results = table_rows(args, ratios, levels, rng)
    by = f"detected_by_night{check_statistics.DETECT_BY}"
    meets = [r for r in results if max(r["false_alarm"], r["false_alarm_after_fix"], r["false_alarm_accepted"]) <= 0.01
             and r[by] >= 0.95]
    print(f"targets (<= 1% false alarms, after a fix and after accepting a level too; >= 95% detection of a lasting "
          f"{100 * args.drop:.0f}% drop by night {check_statistics.DETECT_BY}) met by: "
          + (", ".join(f"{r['seeds']} seeds with {r['history']} history runs, baseline from its {r['baseline_at']} "
                       f"{BASELINE_RUNS}" for r in meets) or "no row"))
    return 0 if meets else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--pipelines", type=int, default=12)
    m.add_argument("--configfile", type=Path, default=None)
    m.add_argument("--workdir", type=Path, default=None)
    m.add_argument("--out", type=Path, required=True)
    m.add_argument("--append", action="store_true", help="add to an existing CSV (same workdir), numbering on")
    m.set_defaults(func=measure)
    p = sub.add_parser("power")
    p.add_argument("--data", type=Path, default=REPO / "benchmarks" / "data" / "regression_noise_probe.csv")
    p.add_argument("--trials", type=int, default=2000)
    p.add_argument("--history", type=int, nargs="+", default=[8, 12, 20, 30])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="how many of the measured seeds a run has")
    p.add_argument("--drop", type=float, default=0.05)
    p.add_argument("--fix-drop", type=float, default=0.10, help="how much slower the nights before a fix were")
    p.add_argument("--fixed-after", type=int, default=2, help="how many slow nights a fix ended")
    p.add_argument("--accepted-drop", type=float, default=0.05,
                   help="how much slower the level a just-written baseline accepted was than the history before it")
    p.add_argument("--otava", type=Path, default=None,
                   help="the python of an environment with Apache Otava (benchmarks/otava-requirements.txt): judge the "
                        "same series with its change-point detection too")
    p.add_argument("--otava-pvalue", type=float, nargs="+", default=[0.001],
                   help="Otava's max_pvalue (its CLI's default: 0.001)")
    p.add_argument("--baseline-at", nargs="+", choices=["last", "first"], default=["last", "first"],
                   help="which history runs the baseline is written from: the last (just updated) or the first "
                        "(the nights since then join its reference)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", nargs="+", default=[], metavar="NAME=VALUE",
                   help="a what-if: set constants of the check (harness.regression.statistics), e.g. "
                        "REFERENCE_BEFORE=0 or Z_SEGMENT=inf; printed, with the check's own values, above the table")
    p.add_argument("--noise-scale", type=float, default=1.0,
                   help="raise the measured ratios to this power (0.5 = half the noise in log units): a what-if for "
                        "a quieter machine, labelled as such; 1 = the measurements as they are")
    p.set_defaults(func=power)
    args = ap.parse_args()
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
