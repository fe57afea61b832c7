"""The append-only results history: every pipeline run's per-run summaries, kept across nightly runs.

Layout: `RESULTS/history/<time>-<pipeline run id>.jsonl`, one file per pipeline run, one JSON object per line
(one line per framework and seed). A file is written whole under a temporary name, fsynced and renamed into place,
so a concurrent or interrupted writer never leaves a torn row and never touches an earlier file. The pipeline run
id is a hash of the run's summary and manifests: appending the same pipeline run twice (a rule rerun, a manual
call) finds its file and writes nothing.

A row carries everything the regression check needs without the run directory: the identity (profile, hardware,
framework, framework version, config hash), the summary metrics, a compact reward curve (for time-to-reward) and
the provenance from the manifest (package versions, harness commit, effective config, input hashes).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import os
from pathlib import Path

import pandas as pd

from harness import HarnessError
from harness.io import atomic_path, strict_json, text_lines
from harness.results import layout
from harness.results.metrics import read_metrics
from harness.results.records import COMMIT, INTEGER, LIST, NUMBER, OBJECT, TEXT, check_shape, or_null, read_manifest
from harness.results.summarize import read_summary, reward_curve

SCHEMA_VERSION = 1
# What append writes (harness.io.WRITTEN): a pipeline run's rows, and the receipt `history append --receipt` writes.
HISTORY_ROLE, RECEIPT_ROLE = "history file", "history receipt"
# The columns of summary.csv that are measurements (the rest are identity or counts).
HISTORY_METRICS = ("throughput_tok_s", "throughput_tok_s_per_gpu", "throughput_tok_cpu_s", "time_probe_s_median",
           "cpu_contention",
           "cpu_foreign_load", "time_step_s_median", "time_gen_s_median", "time_transition_s_median",
           "time_train_s_median", "time_transition_s_p90", "wall_time_s", "reward_first10", "reward_last10",
           "reward_gain", "task_accuracy_first10", "task_accuracy_last10", "eval_accuracy_before",
           "eval_accuracy_after", "mfu_gen", "mfu_train", "mfu_step")
CURVE_POINTS = 50
# A row as append writes it, and as the baseline and the check read it back.
ROW = {"schema": INTEGER, "pipeline_run": TEXT, "pipeline_time": TEXT, "profile": TEXT, "hardware": TEXT,
       "framework": TEXT, "framework_version": TEXT, "config_hash": TEXT, "run_id": TEXT, "seed": INTEGER,
       "created": TEXT, "metrics": OBJECT, "metrics.*": or_null(NUMBER),
       "curve": OBJECT, "curve.step": LIST, "curve.step.*": INTEGER, "curve.elapsed_s": LIST,
       "curve.elapsed_s.*": NUMBER, "curve.reward": LIST, "curve.reward.*": or_null(NUMBER),
       "provenance": OBJECT, "provenance.config": OBJECT, "provenance.git": OBJECT,
       "provenance.git.commit": or_null(COMMIT), "provenance.versions": OBJECT,
       "provenance.hardware": OBJECT, "provenance.inputs": OBJECT}
REQUIRED = ("schema", "pipeline_run", "pipeline_time", "profile", "hardware", "framework", "framework_version",
            "config_hash", "run_id", "seed", "metrics", "curve", "curve.step", "curve.elapsed_s", "curve.reward",
            "provenance", "provenance.config")


def hardware_label(hw: dict) -> str:
    """A readable fingerprint of the machine: runs are only compared on the same one."""
    gpus = hw.get("gpus") or []
    accel = "no GPU" if not gpus else ", ".join(f"{gpus.count(g)}x {g}" for g in sorted(set(gpus)))
    return f"{hw.get('cpu')} ({hw.get('cpu_count')} CPUs, {hw.get('machine')}); {accel}"


def series_key(row: dict) -> tuple[str, str, str]:
    """Rows with equal keys are one benchmark series: same profile, same machine, same framework.

    Framework version, config hash and harness commit are not part of the key on purpose: a change in any of them
    is exactly what the nightly check must catch, so it is compared against the series and named as a cause.
    """
    return row["profile"], row["hardware"], row["framework"]


def _finite(x: float) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def sampled_reward_curve(metrics: pd.DataFrame, points: int = CURVE_POINTS) -> dict:
    """harness.results.summarize.reward_curve at up to `points` evenly spread steps (None where it has no value
    yet): enough to tell when a run first reached a reward level, and at what training time (time-to-reward), to
    within one spacing of the points."""
    curve = reward_curve(metrics)
    idx = sorted({round(i) for i in [k * (len(curve) - 1) / max(1, points - 1) for k in range(points)]})
    reward = curve["reward"]
    return {"step": [int(curve["step"].iloc[i]) for i in idx],
            "elapsed_s": [round(float(curve["elapsed_s"].iloc[i]), 4) for i in idx],
            "reward": [None if math.isnan(reward.iloc[i]) else round(float(reward.iloc[i]), 5) for i in idx]}


def pipeline_rows(results_dir: str | Path) -> list[dict]:
    """History rows of the pipeline run whose outputs are in `results_dir` (summary, manifests, metrics)."""
    results_dir = Path(results_dir)
    summary_path = layout.path(results_dir, layout.SUMMARY)
    if not summary_path.is_file():
        raise HarnessError(f"{summary_path}: missing: no pipeline run in {results_dir} (run the pipeline first)")
    summary = read_summary(summary_path)
    if "framework_version" not in summary.columns or summary.empty:
        raise HarnessError(f"{summary_path}: not a summary (" + ("no rows)" if summary.empty
                                                                 else "missing framework_version)"))
    digest = hashlib.sha256(summary_path.read_bytes())
    rows = []
    for r in summary.to_dict("records"):
        manifest_path = layout.path(results_dir, layout.RUN, framework=r["framework"], seed=r["seed"]) / "manifest.json"
        manifest = read_manifest(manifest_path, ("profile", "config_hash", "config", "hardware", "created"))
        digest.update(manifest_path.read_bytes())
        metrics = read_metrics(layout.path(results_dir, layout.METRICS, framework=r["framework"], seed=r["seed"]))
        rows.append({
            "schema": SCHEMA_VERSION,
            "profile": manifest["profile"],
            "hardware": hardware_label(manifest["hardware"]),
            "framework": r["framework"],
            "framework_version": str(r["framework_version"]),
            "config_hash": manifest["config_hash"],
            "run_id": r["run_id"],
            "seed": int(r["seed"]),
            "created": manifest["created"],
            "metrics": {k: _finite(r[k]) for k in HISTORY_METRICS if k in r},
            "curve": sampled_reward_curve(metrics),
            "provenance": {"versions": manifest.get("versions", {}), "git": manifest.get("git", {}),
                           "config": manifest["config"], "hardware": manifest["hardware"],
                           "inputs": {k: v.get("sha256") for k, v in manifest.get("inputs", {}).items()}},
        })
    run_id = digest.hexdigest()[:16]
    when = max(r["created"] for r in rows)
    for r in rows:
        r.update(pipeline_run=run_id, pipeline_time=when)
    return rows


def _file_name(rows: list[dict]) -> str:
    stamp = rows[0]["pipeline_time"].replace(":", "").replace("-", "").replace("+0000", "Z")
    return f"{stamp}-{rows[0]['pipeline_run']}.jsonl"


def append(results_dir: str | Path, history_dir: str | Path | None = None) -> tuple[Path, list[dict], bool]:
    """Add the pipeline run in `results_dir` to the history once. Returns (file, rows, newly written)."""
    rows = pipeline_rows(results_dir)
    history_dir = Path(history_dir) if history_dir else layout.path(results_dir, layout.HISTORY)
    existing = sorted(history_dir.glob(f"*-{rows[0]['pipeline_run']}.jsonl"))
    if existing:
        return existing[0], rows, False
    appended = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    text = "".join(json.dumps({**r, "appended": appended}, sort_keys=True, allow_nan=False) + "\n" for r in rows)
    dest = history_dir / _file_name(rows)
    with atomic_path(dest, role=HISTORY_ROLE) as tmp, open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    fd = os.open(history_dir, os.O_RDONLY)
    try:
        os.fsync(fd)  # the rename itself reaches the disk before we report success
    finally:
        os.close(fd)
    return dest, rows, True


def _check_row(row: object, where: str) -> dict:
    row = check_shape(row, ROW, where, REQUIRED, "row")
    if row["schema"] != SCHEMA_VERSION:
        raise HarnessError(f"{where}: history schema {row['schema']} (this harness reads {SCHEMA_VERSION})")
    return row


def read_history(history_dir: str | Path) -> list[dict]:
    """Every row, checked; in pipeline-run order. A damaged row stops the read, naming file and line."""
    history_dir = Path(history_dir)
    if history_dir.exists() and not history_dir.is_dir():
        raise HarnessError(f"{history_dir}: expected the history directory, found a file")
    rows = []
    for path in sorted(history_dir.glob("*.jsonl")):
        # io.text_lines: each line bounded, and bytes that are not UTF-8 named by line
        for lineno, line in text_lines(path):
            where = f"{path}:{lineno}"
            if not line.endswith("\n"):
                raise HarnessError(f"{where}: incomplete row (no line end): the file was cut off")
            try:
                row = strict_json(line)
            except json.JSONDecodeError as e:
                raise HarnessError(f"{where}: corrupt row, not valid JSON ({e.msg}, column {e.colno})") from None
            except ValueError as e:
                raise HarnessError(f"{where}: corrupt row ({e})") from None
            rows.append(_check_row(row, where) | {"_source": where})
    rows.sort(key=lambda r: (r["pipeline_time"], r["pipeline_run"], r["framework"], r["seed"]))
    return rows
