"""One run: one (framework, seed) trained from a frozen config and the shared inputs into a run directory.

The one place a run's sequence is written: an embedded backend's `run`, or a real framework's `plan`, `launch` and
`ingest`. Everything that needs a whole run calls `train`: `remax-bench train`, each arm of `ab` and `bisect` (through
the arm's own CLI), `reproduce` and the benchmarks. The pipeline runs the same stages as rules of their own
(`run_embedded`, `plan`, `run_planned`, `ingest`: each a thin call through the CLI of the stage function here), so that
Snakemake gives the launch alone a GPU node or a SLURM job, keeps a plan a reader can inspect before anything runs,
and ingests again without training again.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from harness import HarnessError
from harness.frameworks import get_adapter, read_run
from harness.frameworks.launch import launch
from harness.io import check_replaceable
from harness.results import layout
from harness.results.metrics import read_metrics, write_metrics

__all__ = ["METRICS", "ingest", "launch", "plan", "run_embedded", "run_steps", "train"]  # launch: the stage as is

# A whole run's steps in the common schema, inside its run directory (the pipeline keeps them in layout.METRICS).
METRICS = "metrics.parquet"


def run_embedded(config: dict, framework: str, seed: int, out: str | Path, inputs: str | Path) -> None:
    """An embedded backend's run into `out` (its logs, metrics, evaluation and manifest)."""
    adapter = get_adapter(framework)
    if adapter.run is None:
        raise HarnessError(f"framework {framework!r} is not embedded: use `remax-bench plan {framework}` "
                           "and launch it with its own environment")
    check_replaceable(out, layout.run_owner(framework, seed))  # before the run, not after it
    adapter.run(config, seed, Path(out), Path(inputs))


def plan(config: dict, framework: str, seed: int, out: str | Path, inputs: str | Path) -> None:
    """A real framework's launch directory for one seed (launch.sh, plan.json, its data), without running it."""
    adapter = get_adapter(framework)
    if adapter.plan is None:
        raise HarnessError(f"framework {framework!r} is embedded: use `remax-bench run {framework}`")
    check_replaceable(out, layout.plan_owner(framework, seed))
    adapter.plan(config, seed, Path(out), Path(inputs))


def ingest(framework: str, logs: Sequence[str | Path], n_gpus: int | None = None) -> pd.DataFrame:
    """Runs' own logs in the common schema: each path a log file, or a run directory holding the adapter's logs. The
    logs of each run directory are one run, which its adapter's ingest receives as read_run gives it."""
    adapter = get_adapter(framework)
    runs: dict[Path, list[Path]] = {}
    for log in map(Path, logs):
        paths = sorted(log.glob(adapter.log_glob)) if log.is_dir() else [log]
        if not paths or not all(p.is_file() for p in paths):
            where = f" ({adapter.log_glob})" if log.is_dir() else ""
            raise HarnessError(f"{log}: no {adapter.name} log found{where}")
        for path in paths:
            runs.setdefault(path.parent, []).append(path)
    frames = [adapter.ingest(read_run(framework, found, n_gpus)) for found in runs.values()]
    return frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)


def train(config: dict, framework: str, seed: int, out: str | Path, inputs: str | Path,
          timeout_min: float | None = None) -> pd.DataFrame:
    """Train one (framework, seed) into the run directory `out`; its steps, also written to out/METRICS. A real
    framework's plan lives in a folder of its own beside `out` for the launch only (launch copies plan.json into the
    run). `timeout_min`: the launch's limit, the config's launch.timeout_min by default."""
    out = Path(out)
    adapter = get_adapter(framework)
    if adapter.run is not None:
        run_embedded(config, framework, seed, out, inputs)
        return read_metrics(out / METRICS)  # the embedded backend writes its own
    check_replaceable(out, layout.run_owner(framework, seed))  # before the plan and the launch, not after them
    out.parent.mkdir(parents=True, exist_ok=True)
    planned = Path(tempfile.mkdtemp(prefix=f".{out.name}.plan.", dir=out.parent))
    try:
        plan(config, framework, seed, planned / "plan", inputs)
        launch(planned / "plan", out, timeout_min or config["launch"]["timeout_min"], config)
    finally:
        shutil.rmtree(planned, ignore_errors=True)
    steps = ingest(framework, [out])
    write_metrics(steps, out / METRICS)
    return steps


def run_steps(run_dir: Path, framework: str) -> pd.DataFrame:
    """A finished run directory's steps: its own METRICS where `train` or an embedded backend wrote them, else its
    logs ingested (a planned run of the pipeline, whose metrics the pipeline keeps apart)."""
    own = run_dir / METRICS
    return read_metrics(own) if own.is_file() else ingest(framework, [run_dir])
