"""Every path in a results directory, named once (docs/design.md, "Results layout").

The patterns are relative to the results directory and hold Snakemake-style fields ({framework}, {seed}, {env}):
the workflow's rules use them as their wildcard patterns (workflows/rules/*.smk), and the stages that read a results
directory fill them in with `path`. A file that only one stage writes and reads inside a directory of its own
(a plan's launch.sh, a run's console.log) is named by that stage.
"""

from __future__ import annotations

from pathlib import Path

# The workflow's results directory, relative to its working directory (the repository, normally).
RESULTS = "results"

CONFIG = "config.json"  # the effective config, frozen before any job uses it
INPUTS = "inputs"  # the shared dataset, policy and reward (harness.inputs names what is inside)
POLICY = "inputs/policy"
REWARD_RECORD = "inputs/reward/reward.json"
PREFLIGHT = "preflight.md"
ENV_STAMP = "envs/{env}.txt"  # a built framework environment's package list
IMAGE = "images/{env}.sif"
IMAGE_RECORD = "images/{env}.json"
PLAN = "plans/{framework}/seed{seed}"  # plan.json and launch.sh of a real framework's run
RUN = "runs/{framework}/seed{seed}"  # a run's logs, manifest.json, eval.json
METRICS = "metrics/{framework}/seed{seed}.parquet"  # a run's steps in the common schema
# A repeat of a run (reproducibility.repeat_seeds): a run of its own, with reproduce.json comparing it to the original.
REPEAT = "repeats/{framework}/seed{seed}-r{repeat}"
SUMMARY = "summary.csv"
CONFORMANCE = "conformance.csv"
PARITY = "parity"  # `remax-bench parity`: the fixed batch, each framework's update, parity.csv (harness/parity.py)
REPORT = "report"
HISTORY = "history"  # the append-only history of pipeline runs (never a rule output: it outlives every run)
HISTORY_RECEIPT = "history.appended.json"
ALERTS = "alerts.md"
# Each night's verdict as `check` gave it, kept beside the history (the history page marks its alerts).
CHECK_RECORD = "history/checks/{pipeline_run}.json"
AB = "ab"  # `snakemake ab`: a paired A/B of two commits (harness.comparison.ab), its page index.md
ALERTS_JSON = "alerts.json"
ALERTS_SUMMARY = "alerts-summary.md"  # the verdict for a CI job summary or a pull-request comment (regression/ci.py)
ALERTS_JUNIT = "alerts-junit.xml"  # the verdict as JUnit XML: a test case per framework and metric
BISECT = "bisect"  # `remax-bench bisect --out results/bisect`: bisect.json, each round's A/B under rounds/
# `snakemake nightly`: tonight's commit against the baseline's (harness.comparison.nightly): nightly.json, summary.md,
# junit.xml, the A/B (ab/) and, where it confirmed a slowdown, the bisection (bisect/)
NIGHTLY = "nightly"
NIGHTLY_RECORD = "history/nightly/{name}.json"  # each night's record, beside the pipeline runs' history

# Logs: one per job, under logs/<stage>/.
RUN_LOG = "logs/run/{framework}_seed{seed}.log"
INGEST_LOG = "logs/ingest/{framework}_seed{seed}.log"
PLAN_LOG = "logs/plan/{framework}_seed{seed}.log"
REPEAT_LOG = "logs/repeat/{framework}_seed{seed}-r{repeat}.log"
ENV_LOG = "logs/env/{env}.log"
IMAGE_LOG = "logs/image/{env}.log"
CHECKOUT_LOG = "logs/setup/{framework}_checkout.log"


def path(results: str | Path, pattern: str, **fields: object) -> Path:
    """`pattern` (one of the names above) under the results directory `results`, its fields filled in."""
    return Path(results) / pattern.format(**fields)


def run_owner(framework: str, seed: int) -> dict:
    """What a run directory is (harness.io.OWNER): a rerun of the same run may replace it, nothing else may."""
    return {"kind": "run", "framework": framework, "seed": seed}


def plan_owner(framework: str, seed: int) -> dict:
    """What a plan directory is, likewise."""
    return {"kind": "plan", "framework": framework, "seed": seed}


def checkout_owner(framework: str) -> dict:
    """What a framework's source checkout is (the NAME_checkout rule writes it last): no commit in it, so a new
    pinned commit may replace the harness's own checkout."""
    return {"kind": "checkout", "framework": framework}


def report_owner() -> dict:
    """What a report directory is: a report may replace a report, and nothing else (a results directory, a run)."""
    return {"kind": "report"}
