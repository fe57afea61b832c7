"""Launch a planned framework run: `bash PLAN/launch.sh RUN_DIR` as a real subprocess, under a timeout.

The run directory appears only when the framework exited 0; its console output is kept in console.log and
plan.json is copied beside the framework's own logs, so ingest finds the run's identity there. On a crash or a
timeout the exit reason and the log tail are printed, and nothing is left that looks like a finished run.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from harness import HarnessError
from harness.frameworks import get_adapter, read_plan, read_run
from harness.io import atomic_path, log_tail, write_json
from harness.results import layout
from harness.results.efficiency import framework_cpu_peak
from harness.results.summarize import EVAL_ROLE
from harness.runtime import container
from harness.runtime.container import env_command
from harness.runtime.manifest import MANIFEST_ROLE, build_manifest

CONSOLE_LOG = "console.log"
LAUNCH_RECORD = "launch.json"  # the launch's own times (start, end: seconds since the epoch) and exit code
EVAL = "eval.json"  # what harness.results.summarize.read_eval reads, in the reference backend's form
LAUNCH_RECORD_ROLE = "launch record"  # what LAUNCH_RECORD is (harness.io.WRITTEN)


TAIL_LINES = 40  # of a failed run's log, printed with its error
CAUSE_CHARS = 300  # the most a cause adds to a failure's one line: an exception's message can be a whole tensor


# What Ray prints when an actor's process dies (ray.exceptions.ActorDiedError with its ActorDiedErrorContext)
ACTOR_DIED = re.compile(r"The actor died unexpectedly before finishing this task\.\s+class_name: (\w+)"
                        r"(?:(?:\n\s+\w+: .*)*?\n\s+pid: (\d+))?")


# What Ray's node manager prints when a worker process dies under a task (an actor's __init__ included), where the
# driver may never get an ActorDiedError: it can wait for the dead actor until the launch's timeout
WORKER_DIED = re.compile(r"A worker died or was killed while executing a task by an unexpected system error\..*?"
                         r"Worker PID: (\d+)")


# The line that opens a traceback Python's traceback module prints, and the one that closes it: the exception's
# type, qualified by its module unless builtins or __main__ ("torch.OutOfMemoryError: ..."; Ray's wrapper classes
# are named "RayTaskError(RuntimeError)"), then ": " and its message unless it has none.
TRACEBACK = "Traceback (most recent call last):"
EXCEPTION_LINE = re.compile(r"[A-Za-z_][\w.]*(?:\(\w+\))?(?:: |$)")
# Ray's exception for a remote task that raised (RayTaskError(X), or ActorDiedError for an actor's __init__): its
# message is the remote traceback, each "Traceback ..." line of it replaced by the task's "ray::Class.method()" line
# (RayTaskError.__str__), so an exception chained in the task shows as the traceback module's separator lines.
RAY_REMOTE = re.compile(r"ray\.exceptions\.\w+(?:\(\w+\))?: .*ray::")
CHAINED = {"During handling of the above exception, another exception occurred:",
           "The above exception was the direct cause of the following exception:"}
ANSI_COLOR = re.compile(r"\x1b\[[0-9;]*m")


def exception_line(log_text: str) -> str:
    """The exception the log's last traceback ends with ("RuntimeError: ..."), through Ray's wrappers to the last
    exception the remote task raised; "" where the log has no traceback that ends."""
    lines = log_text.splitlines()
    start = next((i for i in range(len(lines) - 1, -1, -1) if lines[i] == TRACEBACK), None)
    if start is None:
        return ""
    found, looking = "", True
    for line in lines[start + 1:]:
        if looking:
            # Frames and their code are indented; another process's lines that interleave with them (Ray's log
            # monitor prints workers' lines as "(Class pid=N) ...") do not look like an exception line.
            if not line[:1].isspace() and EXCEPTION_LINE.match(line):
                found, looking = line, RAY_REMOTE.match(line) is not None
        elif line in CHAINED:
            looking = True
        elif line.strip():
            break
    return ANSI_COLOR.sub("", found).strip()


def actor_death(log_text: str, framework: str) -> tuple[str, str] | None:
    """(the framework's role for the actor, "" where it names none; the death in the field's words) for the first Ray
    actor or worker process the log says died, or None."""
    died = ACTOR_DIED.search(log_text)
    if died is not None:
        actor, pid = died.group(1), died.group(2)
    elif (worker := WORKER_DIED.search(log_text)) is not None:
        pid = worker.group(1)
        # Ray prefixes each line a worker prints with its actor class and pid: "(RolloutRayActor pid=4242)"
        printed = re.search(rf"\((\w+) pid={pid}\)", log_text)
        if printed is None:
            return "", f"a Ray worker died (pid {pid})"
        actor = printed.group(1)
    else:
        return None
    try:
        roles = get_adapter(framework).ray_roles
    except HarnessError:
        roles = {}
    role, at = roles.get(actor, ""), f"pid {pid}" if pid else "pid unknown"
    return role, f"{role} died (Ray actor {actor}, {at})" if role else f"Ray actor {actor} died ({at})"


def failure_cause(log_text: str, framework: str) -> str:
    """The cause a failed run's log names, in the field's words, where it names one: a Ray actor whose process died
    (the framework's role for that actor class, and its pid); else the exception its last traceback ends with, cut
    to CAUSE_CHARS; "" otherwise."""
    death = actor_death(log_text, framework)
    if death is not None:
        return death[1]
    raised = exception_line(log_text)
    return raised if len(raised) <= CAUSE_CHARS else raised[:CAUSE_CHARS - 4] + " ..."


def exit_reason(returncode: int | None) -> str:
    if returncode is not None and returncode < 0:
        name = signal.Signals(-returncode).name
        return f"killed by {name}" + (" (out of memory?)" if name == "SIGKILL" else "")
    return f"exit code {returncode}"


def environment_packages(env: str | None, config: dict) -> list[str] | None:
    """`pip freeze` of the framework's own environment (its venv, or inside its image): its versions, not the
    harness's, belong in the manifest."""
    if env is None:
        return None
    python = env_command(env, config, "python3")
    if config["container"]["runtime"] == "venv" and not Path(python[0]).exists():
        return None
    try:
        proc = subprocess.run([*python, "-m", "pip", "freeze"], capture_output=True, text=True)
    except OSError:  # no apptainer on this node
        return None
    return proc.stdout.splitlines() if proc.returncode == 0 else None


def _lock_record(env: str | None) -> dict | None:
    """The full lock the environment was installed from (its path and sha256), where it has one."""
    from harness.frameworks import env_spec
    from harness.runtime import locks
    from harness.runtime.envs import REPO

    try:
        return locks.lock_record(env_spec(env), REPO) if env is not None else None
    except HarnessError:  # a plan of an environment this checkout does not describe
        return None


def environment_record(env: str | None, config: dict) -> dict:
    """Which environment the run used: the runtime, its full lock (path, sha256) where it has one, and for an image
    its reference and the .sif's sha256."""
    record = {"name": env, "runtime": config["container"]["runtime"], "packages": environment_packages(env, config),
              "lock": _lock_record(env)}
    if env is not None and record["runtime"] == "apptainer":
        image = container.image_record(env)
        record["image"] = {k: v for k, v in image.items() if k != "definition"} if image else None
    return record


def write_evaluation(run_dir: Path, framework: str) -> None:
    """eval.json (eval greedy accuracy before and after) from the framework's own evaluation in its logs, where
    its adapter reads one. A run whose evaluation cannot be read keeps its timings: it is said, not fatal."""
    try:
        evaluation = get_adapter(framework).evaluation
    except HarnessError:  # a plan of a framework this harness version does not know: nothing to read
        return
    if evaluation is None:
        return
    try:
        record = evaluation(run_dir)
    except HarnessError as e:
        print(f"remax-bench launch: no eval.json: {e}", file=sys.stderr)
        return
    if record is None:
        print(f"remax-bench launch: no eval.json: {framework} logged no evaluation before and after training",
              file=sys.stderr)
        return
    write_json(run_dir / EVAL, record, role=EVAL_ROLE)


PROGRESS_EVERY_S = 30.0  # a progress line this often while a framework runs
STALL_S = 300.0  # no new step for this long: the progress line asks whether the run is stuck
# An actor in one of the framework's roles (adapter.ray_roles) dead this long, and the framework still running: it
# will not finish, and without this it would hold its node until the timeout (hours on a GPU profile). A framework
# that fails by itself does so within seconds of the death, its own error then the one line's cause.
DEATH_GRACE_S = 60.0


def steps_so_far(run_dir: Path, framework: str) -> pd.DataFrame | None:
    """The steps a running framework has logged so far, read from its own log by its adapter's ingest; None where
    nothing can be read yet (no log, or a line half-written: read again at the next look)."""
    try:
        adapter = get_adapter(framework)
        steps = adapter.ingest(read_run(framework, sorted(run_dir.glob(adapter.log_glob))))
    except (HarnessError, OSError, ValueError, KeyError):
        return None
    return steps if len(steps) else None


def last_step(steps: pd.DataFrame | None) -> int:
    return int(steps["step"].max()) if steps is not None else 0


def progress_line(who: str, steps: pd.DataFrame | None, total_steps: int, elapsed_s: float, quiet_s: float) -> str:
    """Step N of M, the median tokens/s so far and the time left at the median step time; or, after STALL_S without
    a new step, that the run may be stuck."""
    done = last_step(steps)
    if quiet_s >= STALL_S:
        what = f"no new step after step {done} of {total_steps}" if done else "no step logged yet"
        return (f"{who}: {what} for {quiet_s / 60:.1f} min ({elapsed_s / 60:.1f} min since start): still starting, "
                "or stuck?")
    if steps is None:
        return f"{who}: starting ({elapsed_s / 60:.1f} min), no step logged yet"
    left = float(steps["time_step_s"].median()) * max(0, total_steps - done)
    return (f"{who}: step {done} of {total_steps}, {float(steps['throughput_tok_s'].median()):,.0f} tokens/s so far, "
            f"about {left / 60:.1f} min left")


def wait_reporting_progress(proc: subprocess.Popen, run_dir: Path, plan: dict, total_steps: int,
                            timeout_s: float) -> str:
    """Wait for the framework's process, printing a progress line every PROGRESS_EVERY_S. "" when it exited by
    itself; else why it is to be stopped: the timeout, or an actor in one of the framework's roles dead for
    DEATH_GRACE_S while the framework still runs (OpenRLHF's driver can wait for a dead engine until the timeout)."""
    start = last_step_at = time.monotonic()
    logged, died_at = 0, None
    while True:
        try:
            proc.wait(timeout=min(PROGRESS_EVERY_S, max(0.0, start + timeout_s - time.monotonic())))
            return ""
        except subprocess.TimeoutExpired:
            now = time.monotonic()
            if now - start >= timeout_s:
                return f"timed out after {timeout_s / 60:g} min (killed)"
        death = actor_death(log_tail(run_dir / CONSOLE_LOG), plan["framework"])
        if death is not None and death[0]:
            died_at = died_at if died_at is not None else now
            if now - died_at >= DEATH_GRACE_S:
                return f"still running {now - died_at:.0f} s after a death it cannot recover from (killed)"
        steps = steps_so_far(run_dir, plan["framework"])
        if last_step(steps) > logged:
            logged, last_step_at = last_step(steps), now
        line = progress_line(f"{plan['framework']} seed {plan['seed']}", steps, total_steps, now - start,
                             now - last_step_at)
        print(f"remax-bench launch: {line}", flush=True)


def launch(plan_dir: str | Path, run_dir: str | Path, timeout_min: float, config: dict) -> None:
    plan_dir, run_dir = Path(plan_dir).resolve(), Path(run_dir)
    script = plan_dir / "launch.sh"
    if not script.is_file() or not (plan_dir / "plan.json").is_file():
        raise HarnessError(f"{plan_dir}: not a plan directory (needs launch.sh and plan.json)")
    plan = read_plan(plan_dir / "plan.json")
    timeout_s = timeout_min * 60
    with atomic_path(run_dir, owner=layout.run_owner(plan["framework"], plan["seed"])) as tmp:
        tmp.mkdir()
        shutil.copy2(plan_dir / "plan.json", tmp / "plan.json")
        # A CPU run's MFU peak: this machine's rate at the framework's dtype, measured here, in the run's timed slot.
        peak = framework_cpu_peak(get_adapter(plan["framework"]).cpu_dtype) if plan.get("n_gpus") == 0 else None
        start = time.time()
        with open(tmp / CONSOLE_LOG, "w") as console:
            # Own process group: a timeout kills the framework's whole tree (Ray, launcher workers), not just bash.
            proc = subprocess.Popen(["bash", str(script), str(tmp.resolve())], cwd=plan_dir, stdout=console,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            stopped = wait_reporting_progress(proc, tmp, plan, config["remax"]["steps"], timeout_s)
            # Whatever of its tree is still running (all of it on a timeout; after a crash an orphaned engine or
            # worker) goes too: the next run needs these cores and ports.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if stopped or proc.returncode != 0:
            reason = stopped or exit_reason(proc.returncode)
            log = log_tail(tmp / CONSOLE_LOG)
            cause = failure_cause(log, plan["framework"])
            reason += f": {cause}" if cause else ""
            raise HarnessError(f"{plan_dir.name}: run failed: {reason}\n--- last lines of {CONSOLE_LOG} ---\n"
                               + "\n".join(log.splitlines()[-TAIL_LINES:]))
        write_json(tmp / LAUNCH_RECORD, {"start": start, "end": time.time(), "exit_code": proc.returncode},
                   role=LAUNCH_RECORD_ROLE)
        write_evaluation(tmp, plan["framework"])
        write_json(tmp / "manifest.json", build_manifest(
            framework=plan["framework"], framework_version=plan["framework_version"], run_id=plan["run_id"],
            seed=plan["seed"], config=config, inputs=plan["inputs"],
            extra={"environment": environment_record(plan.get("env"), config),
                   "timed_window": {"start": start, "end": time.time()}, **({"peak_flops": peak} if peak else {})},
        ), role=MANIFEST_ROLE)
