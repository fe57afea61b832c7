"""Baselines: reading them, and writing one from chosen history rows (`remax-bench baseline update`)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np

from harness import HarnessError
from harness.frameworks import known_frameworks
from harness.io import read_json_object
from harness.regression.history import SCHEMA_VERSION, read_history
from harness.regression.statistics import MIN_BASELINE_RUNS, REWARD_TARGET_FRACTION, training_time_to
from harness.results.records import COMMIT, INTEGER, LIST, NUMBER, OBJECT, TEXT, check_shape, or_null

BASELINE_ROLE = "baseline"  # what build_baseline's record is, once written (harness.io.WRITTEN)
# What `check` reads of a baseline (build_baseline writes it).
BASELINE = {"schema": INTEGER, "profile": TEXT, "hardware": TEXT, "frameworks": OBJECT, "frameworks.*": OBJECT,
            "frameworks.*.framework_version": TEXT, "frameworks.*.config_hash": TEXT,
            "frameworks.*.reward_target": or_null(NUMBER), "frameworks.*.provenance": OBJECT,
            **{f"frameworks.*.provenance.{k}": OBJECT for k in ("config", "git", "versions", "hardware", "inputs")},
            "frameworks.*.provenance.git.commit": or_null(COMMIT),
            "frameworks.*.runs": LIST, "frameworks.*.runs.*": OBJECT, "frameworks.*.runs.*.pipeline_run": TEXT,
            "frameworks.*.runs.*.pipeline_time": TEXT, "frameworks.*.runs.*.seed": INTEGER,
            "frameworks.*.runs.*.metrics": OBJECT, "frameworks.*.runs.*.metrics.*": or_null(NUMBER)}
REQUIRED = ("schema", "profile", "hardware", "frameworks", "frameworks.*.framework_version", "frameworks.*.provenance",
            "frameworks.*.runs", "frameworks.*.runs.*.pipeline_run", "frameworks.*.runs.*.seed",
            "frameworks.*.runs.*.metrics")


def load_baseline(path: str | Path) -> dict:
    path = Path(path)
    base = check_shape(read_json_object(path, "baseline"), BASELINE, path, REQUIRED, "baseline")
    if base["schema"] != SCHEMA_VERSION:
        raise HarnessError(f"{path}: baseline schema {base['schema']} (this harness reads {SCHEMA_VERSION})")
    empty = [fw for fw, entry in base["frameworks"].items() if not entry["runs"]]
    if empty:
        raise HarnessError(f"{path}: frameworks.{empty[0]}.runs: empty; a baseline is made of runs")
    return base


def experiment_config(row: dict) -> dict:
    """The part of a run's config that defines its experiment: all of it except what no run of this framework
    reads: other frameworks' own blocks, the list of frameworks in the pipeline, the report's settings."""
    others = set(known_frameworks()) - {row["framework"]} | {"frameworks", "report"}
    return {k: v for k, v in row["provenance"]["config"].items() if k not in others}


def _pipeline_runs(rows: list[dict]) -> list[str]:
    return list(dict.fromkeys(r["pipeline_run"] for r in rows))


def _reward_target(rows: list[dict]) -> float:
    """The baseline's reward target: its first reward plus REWARD_TARGET_FRACTION of its gain (medians over rows)."""
    for r in rows:
        for key in ("reward_first10", "reward_last10"):
            if r["metrics"].get(key) is None:
                raise HarnessError(f"{r['_source']}: metrics.{key}: missing; a baseline's reward target needs it")
    first = float(np.median([r["metrics"]["reward_first10"] for r in rows]))
    last = float(np.median([r["metrics"]["reward_last10"] for r in rows]))
    return first + REWARD_TARGET_FRACTION * (last - first)


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
    if len(set(chosen)) < len(chosen):
        raise HarnessError(f"{history_dir}: pipeline run(s) named more than once: "
                           + ", ".join(sorted({p for p in chosen if chosen.count(p) > 1})))
    if len(set(chosen)) < MIN_BASELINE_RUNS:
        raise HarnessError(f"{history_dir}: a baseline needs at least {MIN_BASELINE_RUNS} pipeline runs of profile "
                           f"{profile!r}; {len(set(chosen))} chosen")
    rows = [r for r in rows if r["pipeline_run"] in chosen]
    # A history file copied or appended twice repeats its runs: each would count as another night's evidence.
    where: dict[tuple, list[str]] = {}
    for r in rows:
        where.setdefault((r["pipeline_run"], r["framework"], r["seed"]), []).append(r["_source"])
    repeated = {k: v for k, v in where.items() if len(v) > 1}
    if repeated:
        raise HarnessError(f"{history_dir}: the history repeats runs; remove the copies first: " + "; ".join(
            f"pipeline run {p} {fw} seed {s} at {', '.join(v)}" for (p, fw, s), v in sorted(repeated.items())))
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
        target = _reward_target(fw_rows)
        newest = fw_rows[-1]
        frameworks[fw] = {
            "framework_version": newest["framework_version"],
            "config_hash": newest["config_hash"],
            "config_hashes": sorted({r["config_hash"] for r in fw_rows}),
            "reward_target": round(target, 5),
            "provenance": newest["provenance"],
            "runs": [{"pipeline_run": r["pipeline_run"], "pipeline_time": r["pipeline_time"], "run_id": r["run_id"],
                      "seed": r["seed"], "source": r["_source"],
                      "metrics": {**r["metrics"], "time_to_reward_s": training_time_to(r["curve"], target)}}
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
