"""A SYNTHETIC nightly history, written as `history append` and `check` leave it (history/*.jsonl rows of the
harness's own schema, history/checks/<pipeline run>.json), for the history page's tests and its benchmark
(benchmarks/history_page.py). Only the numbers are made up: each row has the full effective config of the default
profile in its provenance, as a real row has."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import numpy as np

from harness.config import load_config
from harness.io import write_json
from harness.regression.alerts import CHECK_RECORD_ROLE
from harness.regression.history import CURVE_POINTS, SCHEMA_VERSION

REPO = Path(__file__).resolve().parents[1]
START = dt.datetime(2026, 1, 1, 3, 0, tzinfo=dt.UTC)


def _row(fw: str, seed: int, run: str, when: str, commit: str, tps: float, rng, config: dict) -> dict:
    step_s = 200 / tps
    metrics = {"throughput_tok_s": tps, "time_step_s_median": step_s, "time_gen_s_median": 0.5 * step_s,
               "time_transition_s_median": 0.0004 * (1 + 0.1 * rng.standard_normal()),
               "time_train_s_median": 0.3 * step_s, "time_probe_s_median": 0.0007, "reward_first10": 0.2,
               "reward_last10": 0.8 + 0.02 * rng.standard_normal(), "reward_gain": 0.6 + 0.02 * rng.standard_normal(),
               "eval_accuracy_before": 0.3, "eval_accuracy_after": 0.6 + 0.02 * rng.standard_normal()}
    return {"schema": SCHEMA_VERSION, "pipeline_run": run, "pipeline_time": when, "profile": "cpu",
            "hardware": "Synthetic CPU (2 CPUs, x86_64); no GPU", "framework": fw, "framework_version": "0.1.0",
            "config_hash": "c" * 64, "run_id": f"{fw}-{run}-s{seed}", "seed": seed, "created": when,
            "metrics": metrics,
            "curve": {"step": list(range(1, CURVE_POINTS + 1)), "elapsed_s": [float(i) for i in range(CURVE_POINTS)],
                      "reward": [round(0.2 + 0.012 * i, 5) for i in range(CURVE_POINTS)]},
            "provenance": {"config": config, "git": {"commit": commit, "dirty": False},
                           "versions": {"python": "3.11.9", "torch": "2.5.1", "transformers": "4.46.0"},
                           "hardware": {"cpu": "Synthetic CPU", "cpu_count": 2}, "inputs": {"dataset": "0" * 64}},
            "appended": when}


def commit_of(night: int) -> str:
    """The harness commit of synthetic night `night` (its first 12 characters differ from night to night)."""
    return f"{night:06x}" + "ab" * 17


def write_history(results: Path, nights: int, frameworks: list[str], *, seeds=(1, 2, 3), slow_from: int | None = None,
                  alerts: set[int] = frozenset(), accepted: int | None = None, seed: int = 0) -> list[str]:
    """`nights` pipeline runs of `frameworks` into RESULTS/history, one a day; throughput 10% lower from night
    `slow_from` on; a check record for every night, with a throughput regression of the first framework on the
    nights in `alerts`, and a new baseline first used on night `accepted`. Returns the pipeline run ids."""
    rng = np.random.default_rng(seed)
    config = load_config(REPO / "workflows" / "config" / "cpu.yaml")
    history = results / "history"
    history.mkdir(parents=True, exist_ok=True)
    runs = []
    for night in range(nights):
        when = (START + dt.timedelta(days=night)).isoformat(timespec="seconds")
        run = f"{night:016x}"
        runs.append(run)
        commit = commit_of(night)
        level = 0.9 if slow_from is not None and night >= slow_from else 1.0
        rows = [_row(fw, s, run, when, commit, 1000 * level * (1 + 0.01 * rng.standard_normal()), rng, config)
                for fw in frameworks for s in seeds]
        stamp = when.replace(":", "").replace("-", "").replace("+0000", "Z")
        (history / f"{stamp}-{run}.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
        base = ["base-1", "base-2", "base-3"] if accepted is None or night < accepted else runs[accepted - 3:accepted]
        checks = [{"framework": frameworks[0], "metric": "throughput_tok_s_machine", "label": "throughput",
                   "class": "alert", "status": "regression" if night in alerts else "ok", "change": -10.0, "unit": "%"}]
        write_json(history / "checks" / f"{run}.json",
                   {"pipeline_run": run, "pipeline_time": when, "status": "regression" if night in alerts else "ok",
                    "baseline": "", "baseline_runs": base, "checks": checks}, role=CHECK_RECORD_ROLE)
    return runs
