"""What the results directory holds for each planned run: its metrics, plan, manifest and evaluation, or why it did
not run (docs/report.md). A failed or missing run is a status here, never an error."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from harness import HarnessError
from harness.config import validate_config
from harness.frameworks import Adapter, environment, get_adapter, not_runnable
from harness.io import log_tail, read_json_object, strict_json
from harness.results import layout
from harness.results.metrics import read_metrics
from harness.results.records import LIST, MANIFEST, OBJECT, TEXT, Kind, check_shape, or_null
from harness.results.summarize import read_summary

LOG_TAIL_LINES = 30


@dataclass
class Run:
    """One planned (framework, seed) run and what the results directory holds for it."""

    framework: str
    seed: int
    status: str = "not run"  # ok | failed | not run
    reason: str = ""
    log_tail: str = ""
    metrics: pd.DataFrame | None = None
    summary: dict = field(default_factory=dict)
    manifest: dict | None = None
    plan: dict | None = None

    @property
    def steps(self) -> pd.DataFrame:
        """The per-step metrics, which every completed run has."""
        if self.metrics is None:
            raise HarnessError(f"{self.framework} seed {self.seed}: no metrics (status {self.status})")
        return self.metrics


def _read_json(path: Path, problems: list[str]) -> object:
    """The JSON in `path`, or None when it is absent; a file that is not JSON is also named in `problems`."""
    if not path.is_file():
        return None
    try:
        return strict_json(path.read_bytes())
    except (OSError, ValueError) as e:  # not JSON, not UTF-8, NaN or Infinity
        problems.append(f"{path}: unreadable ({e})")
        return None


def read_record(path: Path, problems: list[str], shape: dict[str, Kind], what: str,
                required: tuple[str, ...] = ()) -> dict | None:
    """The JSON object in `path` with every field the report reads of it of its kind (harness.results.records),
    or None when it is absent, not JSON or of another shape (named in `problems`, file and field, like a run that
    failed): one damaged record never stops the report of the others (docs/report.md)."""
    record = _read_json(path, problems)
    if record is None:
        return None
    try:
        return check_shape(record, shape, path, required, what)
    except HarnessError as e:
        problems.append(str(e))
        return None


# What the report reads of a plan.json (the adapters' plan functions write it).
PLAN = {"run_id": TEXT, "framework_version": TEXT, "inputs": OBJECT, "inputs.*": OBJECT,
        "inputs.*.sha256": or_null(TEXT), "hyperparameters": LIST, "hyperparameters.*": OBJECT,
        "hyperparameters.*.key": TEXT, "hyperparameters.*.framework_key": TEXT, "deviations": LIST,
        "deviations.*": OBJECT, "deviations.*.key": TEXT, "deviations.*.cause": TEXT}


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(log_tail(path).rstrip().splitlines()[-lines:])


def _logs_tail(results: Path, run: Run) -> str:
    parts = []
    for pattern in (layout.RUN_LOG, layout.INGEST_LOG):
        log = layout.path(results, pattern, framework=run.framework, seed=run.seed)
        tail = _tail(log)
        if tail:
            parts.append(f"==> {log} <==\n{tail}")
    return "\n\n".join(parts)


# slurmstepd's line in a job's output when SLURM ends it (SLURM 22.05: src/slurmd/slurmstepd/req.c), e.g.
# "slurmstepd-vm: error: *** JOB 22 ON vm CANCELLED AT 2026-12-04T06:26:54 DUE TO TIME LIMIT ***"; a job step's
# reads "*** STEP 23.0 ON ...", a plain scancel has no "DUE TO" and releases before 17.11 no "ON <node>".
SLURM_END = re.compile(r"\*\*\* (?:JOB|STEP) (\d+)\S*(?: ON \S+)? CANCELLED AT (\S+)(?: DUE TO (.+?))? \*\*\*")
SLURM_CAUSES = {None: "cancelled in SLURM (scancel, by a user or an administrator)",
                "TIME LIMIT": "killed by SLURM at the job's time limit (the rule's runtime resource)"}


def slurm_end(results: Path, run: Run) -> tuple[str, str] | None:
    """Why SLURM ended the job that made this run, and that job's log tail, from the job's own log: Snakemake's SLURM
    executor (plugin 2.8) writes it to .snakemake/slurm_logs/rule_<rule>/<wildcards joined by _>/<job id>.log in the
    working directory (the one that holds `results`) and keeps it when the job fails. None where there is no such
    log with SLURM's end in it (a local run, or a job that failed by itself)."""
    logs = results.resolve().parent / ".snakemake" / "slurm_logs"
    found = []
    for log in logs.glob(f"rule_run_*/{run.framework}_{run.seed}/*.log"):
        text = log.read_text(errors="replace")
        end = SLURM_END.search(text)
        if end:
            found.append((int(end.group(1)), end, log, text))
    if not found:
        return None
    job, end, log, text = max(found, key=lambda f: f[0])  # the latest job that made this run
    cause = SLURM_CAUSES.get(end.group(3)) or f"ended by SLURM: {end.group(3).lower()}"
    # from a few lines before SLURM's end: what follows it is the job's own shutdown
    lines = text[:end.start()].count("\n")
    tail = "\n".join(text.rstrip().splitlines()[max(0, lines - 5):][:LOG_TAIL_LINES])
    return f"{cause}: job {job} at {end.group(2)} ({log})", f"==> {log} <==\n{tail}"


def adapter_of(name: str) -> Adapter | None:
    """The registered adapter, or None for a framework this harness version no longer knows."""
    try:
        return get_adapter(name)
    except HarnessError:
        return None


def results_config(results: Path) -> dict:
    path = layout.path(results, layout.CONFIG)
    config = read_json_object(path, "effective config", " (run the pipeline's freeze_config step first)")
    for key in ("frameworks", "seeds", "remax", "launch"):
        if key not in config:
            raise HarnessError(f"{path}: lacks key {key!r} (freeze the config again with this version)")
    # A config frozen before the report block or launch.device existed: the schema's defaults.
    defaults = validate_config({}, source="schema defaults")
    config.setdefault("report", defaults["report"])
    config["launch"].setdefault("device", defaults["launch"]["device"])
    return config


def _without_metrics(results: Path, run: Run, adapter: Adapter | None, config: dict) -> tuple[str, str]:
    """Status and reason of a planned run that left no metrics file."""
    fw, seed = run.framework, run.seed
    metrics_path = layout.path(results, layout.METRICS, framework=fw, seed=seed)
    run_log = layout.path(results, layout.RUN_LOG, framework=fw, seed=seed)
    if _logs_tail(results, run):
        return "failed", f"no metrics ({metrics_path} missing); see the log"
    if layout.path(results, layout.RUN, framework=fw, seed=seed).is_dir():
        return "not run", f"the run finished but was not ingested ({metrics_path} missing; the pipeline stopped early)"
    if run_log.exists():  # the job started (its shell made the log) and died without a word
        return "failed", f"no metrics ({metrics_path} missing); {run_log} is empty (killed?)"
    blocked = not_runnable(adapter, config) if adapter is not None else None
    if blocked:
        return "not run", blocked
    if adapter is None:
        return "not run", f"framework {fw!r} has no registered adapter in this harness version"
    upstream = _upstream_failure(results, run, config)
    if upstream:
        return "not run", upstream
    return "not run", f"no metrics yet ({metrics_path} missing)"


def _upstream_failure(results: Path, run: Run, config: dict) -> str | None:
    """Why a run never started, from the jobs it waits for (the pipeline keeps going past them): its plan refused,
    its environment not built, its pinned source checkout not made (e.g. no network). The stage's last log line."""
    env = environment(get_adapter(run.framework), config)
    fw, seed = run.framework, run.seed
    stages = [("its plan was refused", layout.path(results, layout.PLAN_LOG, framework=fw, seed=seed),
               layout.path(results, layout.PLAN, framework=fw, seed=seed))]
    if env:
        stages.append(("its environment could not be built", layout.path(results, layout.ENV_LOG, env=env),
                       layout.path(results, layout.ENV_STAMP, env=env)))
    checkout = (config.get(fw) or {}).get("checkout")
    if checkout:
        stages.append(("its pinned source checkout could not be made",
                       layout.path(results, layout.CHECKOUT_LOG, framework=fw), Path(checkout)))
    for what, log, output in stages:
        lines = _tail(log).strip().splitlines()
        if lines and not output.exists():
            return f"{what}: {lines[-1].strip()} ({log})"
    return None


def _summary_of(run: Run, run_id: str, metrics_path: Path, summary_path: Path, summary: pd.DataFrame | None) -> dict:
    """The run's row of the summarize stage's table, which must have been written after its metrics."""
    if summary is None:
        raise HarnessError(f"{summary_path}: missing; summarize the runs first (the summarize rule, or "
                           "`remax-bench summarize`)")
    if run_id not in summary.index:
        raise HarnessError(f"{summary_path}: has no row for run {run_id} (summarize again; its log says why a run "
                           "was left out)")
    if metrics_path.stat().st_mtime > summary_path.stat().st_mtime:
        raise HarnessError(f"{summary_path}: older than {metrics_path} (summarize again)")
    row = summary.loc[run_id].to_dict()
    if (row["framework"], row["seed"]) != (run.framework, run.seed):
        raise HarnessError(f"{summary_path}: its row of run {run_id} is {row['framework']} seed {row['seed']}, "
                           f"not {run.framework} seed {run.seed} as {metrics_path} (summarize again)")
    return row


def _read_summary(path: Path, config: dict, results: Path) -> pd.DataFrame | None:
    """The summarize stage's table, every row of a configured framework: another framework's row would be
    compared as if it had been planned."""
    if not path.exists():
        return None
    summary = read_summary(path)
    foreign = ~summary["framework"].isin(config["frameworks"])
    if foreign.any():
        i = int(foreign.to_numpy().argmax())
        raise HarnessError(f"{path}:{i + 2}: framework {summary['framework'].iloc[i]!r} is not one of the "
                           f"frameworks of {layout.path(results, layout.CONFIG)}")
    return summary


def collect_runs(results: Path, config: dict, problems: list[str], summary_path: Path | None = None) -> list[Run]:
    """Every planned run with its status; metrics that cannot be read, or that the summary (default: RESULTS'
    summary.csv) does not cover, mark the run failed."""
    runs = []
    summary_path = summary_path or layout.path(results, layout.SUMMARY)
    summary = _read_summary(summary_path, config, results)
    for fw in config["frameworks"]:
        adapter = adapter_of(fw)
        for seed in config["seeds"]:
            run = Run(fw, int(seed))
            run_dir = layout.path(results, layout.RUN, framework=fw, seed=seed)
            run.plan = read_record(layout.path(results, layout.PLAN, framework=fw, seed=seed) / "plan.json", problems,
                                   PLAN, "plan")
            run.manifest = read_record(run_dir / "manifest.json", problems, MANIFEST, "manifest")
            metrics_path = layout.path(results, layout.METRICS, framework=fw, seed=seed)
            if metrics_path.exists():
                try:
                    df = read_metrics(metrics_path)
                    if set(df["framework"]) != {fw} or set(df["seed"]) != {seed}:
                        raise HarnessError(f"{metrics_path}: holds framework {sorted(set(df['framework']))} seed "
                                           f"{sorted(set(df['seed']))}, not {fw} seed {seed}")
                    run.summary = _summary_of(run, df["run_id"].iloc[0], metrics_path, summary_path, summary)
                    run.metrics, run.status = df, "ok"
                except HarnessError as e:
                    run.status, run.reason = "failed", str(e)
            else:
                run.status, run.reason = _without_metrics(results, run, adapter, config)
            if run.status == "failed":
                run.log_tail = _logs_tail(results, run)
                ended = slurm_end(results, run) if run.metrics is None else None
                if ended:
                    run.reason = f"{ended[0]}; {run.reason}"
                    run.log_tail = "\n\n".join(t for t in (run.log_tail, ended[1]) if t)
            runs.append(run)
    return runs


def status_frame(runs: list[Run]) -> pd.DataFrame:
    return pd.DataFrame([{"framework": r.framework, "seed": r.seed, "status": r.status, "reason": r.reason}
                         for r in runs], columns=["framework", "seed", "status", "reason"])
