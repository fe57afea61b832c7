import json
import os
import sys

from harness.config import arms_from_config, nightly_from_config, refuse_large_files, validate_config
from harness.frameworks import conformance_env, env_spec, environment, get_adapter, not_runnable, sources
from harness.results import layout

# The arms of `snakemake ab` (rules/ab.smk) are not part of the experiment: taken out before the config is frozen.
AB = config.pop("ab", None)


def ab_arms():
    return arms_from_config(AB, "snakemake config")


# Likewise the nightly A/B's framework and budgets (rules/nightly.smk).
NIGHTLY = nightly_from_config(config.pop("nightly", None), "snakemake config")


# Validated (defaults filled) before any job starts: a bad key stops the workflow here, naming the key.
refuse_large_files(workflow.configfiles)
config.update(validate_config(config, source="snakemake config"))

# Timed runs hold the one `timed_run` slot, so two timed runs never overlap on a machine; untimed jobs may.
# A cluster profile that gives each timed run a node of its own raises the limit (--resources timed_run=N).
if "timed_run" not in workflow.global_resources:
    workflow.register_resource("timed_run", 1)

RESULTS = layout.RESULTS
INPUTS = f"{RESULTS}/{layout.INPUTS}"
FRAMEWORKS = config["frameworks"]
SEEDS = config["seeds"]
EMBEDDED = [fw for fw in FRAMEWORKS if get_adapter(fw).run is not None]
PLANNED = [fw for fw in FRAMEWORKS if fw not in EMBEDDED]
# Embedded backends run anywhere; real frameworks where the profile has GPUs, or on a CPU (launch.device cpu) those
# with a CPU path. The others are named with the reason as the workflow loads (a dry run too), and listed by the
# report, as not run, with the same reason.
NOT_RUNNING = {fw: why for fw in PLANNED if (why := not_runnable(get_adapter(fw), config)) is not None}
for fw, why in NOT_RUNNING.items():
    print(f"remax-bench: framework {fw} will not run in this profile: {why}", file=sys.stderr)
RUNNABLE = EMBEDDED + [fw for fw in PLANNED if fw not in NOT_RUNNING]
# Every real framework this profile runs gets its ReMax advantage checked against the reference (rules/conformance.smk).
CONFORMING = [fw for fw in RUNNABLE if fw in PLANNED and get_adapter(fw).conformance is not None]
# and its update on one fixed batch against the reference's (rules/parity.smk).
PARITY = [fw for fw in RUNNABLE if fw in PLANNED and get_adapter(fw).parity is not None]
# A pattern that matches nothing when the list is empty, so a rule without frameworks never matches.
EMBEDDED_PATTERN = "|".join(EMBEDDED) or "(?!)"
PLANNED_PATTERN = "|".join(PLANNED) or "(?!)"


wildcard_constraints:
    framework="|".join(FRAMEWORKS),
    seed=r"\d+",


def preflight_gate(wildcards):
    """The preflight's table, for every job of a profile that runs real frameworks on GPUs; nothing otherwise."""
    on_gpus = config["launch"]["device"] == "gpu" and any(fw in RUNNABLE for fw in PLANNED)
    return [f"{RESULTS}/{layout.PREFLIGHT}"] if on_gpus else []


def run_dirs(framework):
    return [f"{RESULTS}/{layout.RUN.format(framework=framework, seed=seed)}" for seed in SEEDS]


def framework_env_stamp(wildcards):
    """The framework's environment: its venv's stamp, or its image's record when container.runtime is apptainer."""
    env = environment(get_adapter(wildcards.framework), config)
    if config["container"]["runtime"] == "apptainer":
        return f"{RESULTS}/{layout.IMAGE_RECORD.format(env=env)}"
    return f"{RESULTS}/{layout.ENV_STAMP.format(env=env)}"


def conformance_inputs(wildcards):
    """The environments the conformance checks run in (on a CPU profile the runs' own) and the pinned sources."""
    envs = sorted({conformance_env(get_adapter(fw), config) for fw in CONFORMING})
    return [f"{RESULTS}/{layout.ENV_STAMP.format(env=env)}" for env in envs] + sources(CONFORMING, config)


def parity_inputs(wildcards):
    """The environments the parity drivers run in (the runs' own: venvs, or images under apptainer) and the pinned
    sources."""
    envs = sorted({environment(get_adapter(fw), config) for fw in PARITY})
    made = layout.IMAGE_RECORD if config["container"]["runtime"] == "apptainer" else layout.ENV_STAMP
    return [f"{RESULTS}/{made.format(env=env)}" for env in envs] + sources(PARITY, config)


def image_inputs(wildcards):
    settings = config["container"]["images"][wildcards.env]
    spec = [str(env_spec(wildcards.env))] if settings["install"] else []
    return spec + [f"{workflow.basedir}/{script}" for script in settings["setup"]]


def image_settings_json(wildcards):
    """Only what the image is made from: a change elsewhere in the config must not rebuild a multi-GB image."""
    settings = config["container"]
    return json.dumps({"container": {"apptainer": settings["apptainer"],
                                     "images": {wildcards.env: settings["images"][wildcards.env]}}})


def framework_sources(wildcards):
    """Pinned source checkouts a framework runs from (rules/setup.smk makes them)."""
    return sources([wildcards.framework], config)


def metric_files():
    return [f"{RESULTS}/{layout.METRICS.format(framework=fw, seed=s)}" for fw in RUNNABLE for s in SEEDS]


def runnable_run_dirs():
    """Every run directory this profile makes: their eval.json (the reference's own, or one launch wrote from a
    framework's own evaluation) give the summary's eval accuracy."""
    return [d for fw in RUNNABLE for d in run_dirs(fw)]


def repeat_dirs():
    rc = config["reproducibility"]
    return [f"{RESULTS}/{layout.REPEAT.format(framework=fw, seed=s, repeat=k)}"
            for fw in RUNNABLE for s in rc["repeat_seeds"] for k in range(2, rc["repeats"] + 1)]


def final_outputs():
    return [
        f"{RESULTS}/{layout.SUMMARY}",
        f"{RESULTS}/{layout.REPORT}/throughput.md",
        f"{RESULTS}/{layout.REPORT}/throughput.csv",
        f"{RESULTS}/{layout.REPORT}/reward_curve.png",
        f"{RESULTS}/{layout.HISTORY_RECEIPT}",  # every finished pipeline run goes into the history
    ] + ([f"{RESULTS}/{layout.CONFORMANCE}"] if CONFORMING else []) + ([f"{RESULTS}/{layout.PARITY}"] if PARITY else [])


def stop_without_scheduler():
    """Under the SLURM executor, before the first sbatch: SLURM's commands, munge, the controller and the partition
    (harness/frameworks/preflight.py slurm_rows). Dry runs never get here, so they need no SLURM."""
    if workflow.executor_plugin is None or workflow.executor_plugin.name != "slurm":
        return
    from harness.frameworks.preflight import render, slurm_rows

    partition = (workflow.resource_settings.default_resources or {}).get("slurm_partition")
    rows = slurm_rows(partition.raw if partition is not None else None)
    if any(r["status"] == "fail" for r in rows):
        raise WorkflowError(f"this machine cannot submit to SLURM; nothing was submitted\n{render(rows)}")


def report_what_finished():
    """After a failed job: summarize the runs that finished and render the report from them; it marks the others as
    failed.

    Runs outside the job graph on purpose: the report rule waits for every run, and a failed run would otherwise
    leave no report at all. The summary goes to logs/, not summary.csv, which is left to the summarize rule: it stays
    missing or out of date, so the next pipeline run re-runs the failed runs (and only those) and then summary and
    report.
    """
    if not os.path.exists(f"{RESULTS}/{layout.CONFIG}"):
        return
    finished = [m for m in metric_files() if os.path.exists(m)]
    summary = f"{RESULTS}/logs/summary-of-finished-runs.csv"
    if os.path.exists(summary):
        os.remove(summary)  # one from an earlier failure would describe other runs
    if finished:
        runs = [d for d in runnable_run_dirs() if os.path.isdir(d)]
        config_json, policy = f"{RESULTS}/{layout.CONFIG}", f"{RESULTS}/{layout.POLICY}"
        shell("remax-bench summarize --partial --config {config_json:q} --metrics {finished:q} --runs {runs:q}"
              + (" --policy {policy:q}" if os.path.exists(policy) else "")
              + " --out {summary:q} > {RESULTS:q}/logs/summarize-finished.log 2>&1 || true")
    shell("remax-bench report {RESULTS:q} --summary {summary:q} --out {RESULTS:q}/report"
          " > {RESULTS:q}/logs/report.log 2>&1")
