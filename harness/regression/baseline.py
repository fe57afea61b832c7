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


def load_baseline(path: str | Path) -> dict:
    path = Path(path)
    base = read_json_object(path, "baseline")
    for key in ("schema", "profile", "hardware", "frameworks"):
        if key not in base:
            raise HarnessError(f"{path}: not a baseline (no {key!r}; write one with `remax-bench baseline update`)")
    if base["schema"] != SCHEMA_VERSION:
        raise HarnessError(f"{path}: baseline schema {base['schema']} (this harness reads {SCHEMA_VERSION})")
    if not isinstance(base["frameworks"], dict):
        raise HarnessError(f"{path}: frameworks: expected an object of frameworks")
    for fw, entry in base["frameworks"].items():
        runs = entry.get("runs") if isinstance(entry, dict) else None
        if not runs or not all(isinstance(r, dict) and {"pipeline_run", "seed", "metrics"} <= r.keys() for r in runs):
            raise HarnessError(f"{path}: frameworks.{fw}: expected 'runs' with pipeline_run, seed and metrics")
        if not _number_or_null(entry.get("reward_target")):
            raise HarnessError(f"{path}: frameworks.{fw}.reward_target: {entry.get('reward_target')!r} is not a number")
        for i, r in enumerate(runs):
            at = f"{path}: frameworks.{fw}.runs[{i}]"
            if not isinstance(r["pipeline_run"], str) or not isinstance(r["seed"], int) or isinstance(r["seed"], bool):
                raise HarnessError(f"{at}: pipeline_run must be a string and seed an integer")
            if not isinstance(r["metrics"], dict):
                raise HarnessError(f"{at}.metrics: expected an object")
            for name, value in r["metrics"].items():
                if not _number_or_null(value):
                    raise HarnessError(f"{at}.metrics.{name}: {value!r} is not a number")
            if not isinstance(r.get("pipeline_time", ""), str):
                raise HarnessError(f"{at}.pipeline_time: expected a string")
    return base


def _number_or_null(value: object) -> bool:
    """NaN and Infinity never get here: the JSON reader refuses them."""
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def experiment_config(row: dict) -> dict:
    """The part of a run's config that defines its experiment: all of it except what no run of this framework
    reads: other frameworks' own blocks, the list of frameworks in the pipeline, the report's settings."""
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
