"""SYNTHETIC results directories for report tests and the report benchmark.

Nothing here is framework output: frameworks are named `synthetic-*`, the numbers come from a formula and a
seeded random generator, and every manifest says `"synthetic": true`. Metrics go through
harness.results.metrics.to_frame, so the files are real parquet in the common schema, exactly what ingest writes.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np

from harness import HarnessError
from harness.frameworks import Adapter
from harness.io import write_json
from harness.results.metrics import FRAMEWORK_THROUGHPUT, to_frame, write_metrics
from harness.runtime.manifest import MANIFEST_ROLE

A100X8 = ["NVIDIA A100-SXM4-80GB"] * 8


def _no_logs(run):
    raise HarnessError("synthetic framework: it has no logs to ingest")


def adapter(name: str) -> Adapter:
    """A registry entry for a synthetic framework that has no CPU path (to be put into the registry by the caller,
    then removed)."""
    return Adapter(name=name, description="SYNTHETIC test framework", ingest=_no_logs, log_glob="none",
                   plan=lambda *a: None, cpu_blocker="SYNTHETIC: it has no CPU path")


def write_run(results: Path, framework: str, seed: int, *, steps: int, step_s: float, final_reward: float,
              transition_s: float | None = 0.01, n_gpus: int = 0, gpus: list[str] | None = None,
              own_throughput_ratio: float | None = None) -> None:
    """One synthetic run: metrics parquet (common schema) and a manifest marked synthetic; with
    `own_throughput_ratio`, a throughput figure of the framework's own, that ratio times the harness's."""
    rng = np.random.default_rng(zlib.crc32(f"{framework}/{seed}".encode()))
    rows = []
    for step in range(1, steps + 1):
        t = step_s * rng.uniform(0.9, 1.1)
        gen, train = 0.5 * t, 0.3 * t
        rows.append(dict(
            framework=framework, framework_version="0.0-synthetic", run_id=f"{framework}-s{seed}", seed=seed,
            step=step, n_gpus=n_gpus, time_step_s=t, time_gen_s=gen,
            time_transition_s=float("nan") if transition_s is None else transition_s * rng.uniform(0.8, 1.5),
            time_train_s=train, tokens_prompt=4096.0, tokens_response=1024.0 + rng.integers(0, 64),
            tokens_baseline=512.0,
            reward_mean=final_reward * (1 - np.exp(-5 * step / steps)) + rng.normal(0, 0.02),
            reward_baseline_mean=0.0, kl_mean=0.01, response_length_mean=8.0))
        if own_throughput_ratio is not None:
            row = rows[-1]
            row[FRAMEWORK_THROUGHPUT] = own_throughput_ratio * (row["tokens_prompt"] + row["tokens_response"]) / t
    write_metrics(to_frame(rows, f"synthetic {framework} seed {seed}"),
                  results / "metrics" / framework / f"seed{seed}.parquet")
    write_json(results / "runs" / framework / f"seed{seed}" / "manifest.json", {
        "synthetic": True, "framework": framework, "framework_version": "0.0-synthetic",
        "run_id": f"{framework}-s{seed}", "seed": seed, "config_hash": "synthetic",
        "hardware": {"cpu": "synthetic CPU", "cpu_count": 2, "gpus": gpus or []},
        "inputs": {name: {"path": name, "sha256": f"{name}-synthetic".ljust(64, "0")}
                   for name in ("dataset", "policy", "reward")},
        "git": {"commit": "0" * 40, "dirty": False}, "versions": {"python": "3.11", "torch": "synthetic"},
    }, role=MANIFEST_ROLE)


def write_config(results: Path, frameworks: list[str], seeds: list[int], *, steps: int, warmup: int = 2,
                 gpus_per_node: int = 0) -> dict:
    from harness.config import CONFIG_ROLE, validate_config

    config = validate_config({"frameworks": frameworks, "seeds": seeds, "profile": "synthetic",
                              "remax": {"steps": steps, "warmup_steps": warmup},
                              "launch": {"gpus_per_node": gpus_per_node}}, source="synthetic config")
    write_json(results / "config.json", config, role=CONFIG_ROLE)
    return config


def summarize(results: Path) -> None:
    """The pipeline's summarize stage on a results directory, by the CLI (with --partial, as after a failed pipeline
    run: an unreadable run is left out, and the report marks it failed)."""
    from harness.cli import main

    metrics = sorted((results / "metrics").glob("*/seed*.parquet"))
    if metrics:
        main(["summarize", "--partial", "--config", str(results / "config.json"), "--metrics", *map(str, metrics),
              "--runs", *map(str, sorted((results / "runs").glob("*/seed*"))), "--out", str(results / "summary.csv")])


def report(results: Path, **render_kw) -> Path:
    """The pipeline's last two stages: summarize, then the report (into RESULTS/report)."""
    from harness.report import render

    summarize(results)
    render(results, results / "report", **render_kw)
    return results / "report"
