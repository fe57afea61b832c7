"""The embedded reference ReMax backend (adapter): its registration and the ingest of its step log.

The training loop is harness.frameworks.reference.backend and the model harness.frameworks.reference.model; both
load torch and Transformers, which the registry must not: the Snakefile and every light stage (freeze-config,
dataset, ingest, summarize, report, history) read the registry, and a job that imports torch for nothing spends
seconds before its first line of work.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from harness import HarnessError
from harness.frameworks.registry import Adapter, LoggedRun, register_framework
from harness.io import read_jsonl
from harness.results import metrics

NAME = "reference"
STEP_LOG = "steps.jsonl"


def run(config: dict, seed: int, out_dir: str | Path, inputs_dir: str | Path) -> None:
    """Train one seed: metrics.parquet, steps.jsonl, eval.json and manifest.json in out_dir (reference_backend)."""
    from harness.frameworks.reference.backend import train  # torch on use only (module docstring)

    train(config, seed, out_dir, inputs_dir)


def ingest(run: LoggedRun) -> pd.DataFrame:
    """The backend's step log, whose rows carry the run's identity (an embedded run has no plan record)."""
    rows = []
    for path in run.logs:
        for lineno, row in read_jsonl(path, "not a JSON step record"):
            if not isinstance(row, dict):
                raise HarnessError(f"{path}:{lineno}: expected a JSON object per line")
            if run.n_gpus is not None:
                row["n_gpus"] = run.n_gpus
            rows.append(row)
    return metrics.to_frame(rows, ", ".join(map(str, run.logs)))


register_framework(Adapter(
    name=NAME,
    one_node="one process on one machine",
    description="embedded reference ReMax backend (harness.frameworks.reference), CPU or one CUDA device",
    ingest=ingest,
    log_glob=STEP_LOG,
    run=run,
    schema=Path(__file__).with_name("config.schema.yaml"),
))
