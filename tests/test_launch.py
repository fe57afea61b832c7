"""Launching a planned run: real subprocesses, exit codes, timeouts that kill the whole process tree."""

import json
import shlex
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

from harness import HarnessError
from harness.config import validate_config
from harness.frameworks import launch as launch_module
from harness.frameworks import write_plan
from harness.frameworks.launch import failure_cause, launch
from harness.runtime.launch_script import RUN_DIR, launch_script

CONFIG = validate_config({})


def plan(tmp_path, script: str):
    d = tmp_path / "plan"
    d.mkdir()
    (d / "plan.json").write_text(json.dumps({"framework": "demo", "framework_version": "1.0", "run_id": "demo-s1",
                                             "seed": 1, "n_gpus": 1, "env": None,
                                             "inputs": {"dataset": {"sha256": "ab"}}}))
    (d / "launch.sh").write_text(script)
    return d


def alive(pid: int) -> bool:
    """Running, as opposed to gone or a zombie waiting for a parent to reap it."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return False
        if state in "ZX":
            return False
        time.sleep(0.05)
    return True


def test_a_successful_run_keeps_console_log_plan_and_the_frameworks_own_logs(tmp_path):
    d = plan(tmp_path, 'echo "step 1"; echo "{\\"step\\": 1}" > "$1/metrics.jsonl"\n')
    launch(d, tmp_path / "run", timeout_min=1, config=CONFIG)
    run = tmp_path / "run"
    assert (run / "console.log").read_text() == "step 1\n"
    assert json.loads((run / "metrics.jsonl").read_text()) == {"step": 1}
    assert json.loads((run / "plan.json").read_text())["framework"] == "demo"
    assert json.loads((run / "launch.json").read_text())["exit_code"] == 0
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["run_id"] == "demo-s1" and manifest["inputs"]["dataset"]["sha256"] == "ab"
    assert manifest["config_hash"] and manifest["git"]["commit"]


def test_a_crash_reports_exit_code_and_log_tail_and_leaves_no_run(tmp_path):
    d = plan(tmp_path, 'for i in $(seq 1 100); do echo "line $i"; done; echo "CUDA error: boom" >&2; exit 3\n')
    with pytest.raises(HarnessError) as err:
        launch(d, tmp_path / "run", timeout_min=1, config=CONFIG)
    assert "run failed: exit code 3" in str(err.value) and "CUDA error: boom" in str(err.value)
    assert "line 100" in str(err.value) and "line 1\n" not in str(err.value)  # a tail, not the whole log
    assert not (tmp_path / "run").exists()


def test_a_hang_is_killed_at_the_timeout_with_its_children(tmp_path):
    d = plan(tmp_path, 'sleep 300 & echo $! > child.pid; wait\n')
    start = time.monotonic()
    with pytest.raises(HarnessError, match=r"timed out after 0.02 min \(killed\)"):
        launch(d, tmp_path / "run", timeout_min=0.02, config=CONFIG)
    assert time.monotonic() - start < 30
    child = int((d / "child.pid").read_text())
    assert not alive(child), "the framework's child process outlived the timeout"
    assert not (tmp_path / "run").exists()


def test_a_run_that_logs_no_step_is_called_possibly_stuck_while_it_runs(tmp_path, monkeypatch, capsys):
    """A framework that hangs before its first step (a real process that never logs one): the progress lines say it
    is starting, then that nothing was logged for the stall time. The thresholds are shortened; the hang is real."""
    monkeypatch.setattr(launch_module, "PROGRESS_EVERY_S", 0.4)
    monkeypatch.setattr(launch_module, "STALL_S", 1.0)
    d = plan(tmp_path, "sleep 2.5\n")
    launch(d, tmp_path / "run", timeout_min=1, config=CONFIG)
    out = capsys.readouterr().out.splitlines()
    lines = [line for line in out if line.startswith("remax-bench launch: demo seed 1")]
    assert lines and "starting" in lines[0] and "no step logged yet" in lines[0]
    assert any("no step logged yet for" in line and "still starting, or stuck?" in line for line in lines[2:]), lines


# The lines ray.exceptions.ActorDiedError prints with its ActorDiedErrorContext (Ray 2.55.0, exceptions.py:
# BASE_ERROR_MSG, then "\tclass_name:", "\tactor_id:", "\tpid:", "\tnamespace:", "\tip:" lines); a real run that
# reaches them is tests/test_openrlhf_cpu.py's killed engine (there through Ray's worker-death line).
ACTOR_DIED_LOG = ("ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.\n"
                  "\tclass_name: RolloutRayActor\n\tactor_id: 5c1d0a\n\tpid: 4242\n\tnamespace: 9f\n\tip: 10.0.0.1\n"
                  "The actor is dead because its worker process has died.\n")
ENGINE_DIED = "a rollout engine (vLLM) died (Ray actor RolloutRayActor, pid 4242)"

# How the read-back check began its message in issue 54's measured run (OpenRLHF, weight sync made a no-op); the
# words after "parameters" are this test's own
READ_BACK = ("rollout engine 0 holds other values than the actor for 6 of 6 parameters after the weight sync "
             "(model.embed_tokens.weight first)")


def test_a_dead_ray_actor_in_the_log_is_named_by_its_role():
    assert failure_cause(ACTOR_DIED_LOG, "openrlhf") == ENGINE_DIED
    assert failure_cause(ACTOR_DIED_LOG.replace("RolloutRayActor", "WorkerDict"), "verl") == \
        "Ray actor WorkerDict died (pid 4242)"
    assert failure_cause("loading the checkpoint\nKilled\n", "openrlhf") == ""


def test_a_run_that_outlives_a_dead_actor_it_needs_is_stopped_naming_the_death(tmp_path, monkeypatch):
    """OpenRLHF's driver may wait for a dead rollout engine until the launch's timeout (hours on a GPU node): once an
    actor in one of the framework's roles has been dead for DEATH_GRACE_S and the process still runs, the launch
    stops it. A real process that logs the death and hangs; the intervals are shortened. tests/test_openrlhf_cpu.py
    kills a real engine."""
    monkeypatch.setattr(launch_module, "PROGRESS_EVERY_S", 0.2)
    monkeypatch.setattr(launch_module, "DEATH_GRACE_S", 1.0)
    d = plan(tmp_path, f"printf %s {shlex.quote(ACTOR_DIED_LOG)}; sleep 300 & echo $! > child.pid; wait\n")
    record = json.loads((d / "plan.json").read_text())
    (d / "plan.json").write_text(json.dumps({**record, "framework": "openrlhf"}))
    start = time.monotonic()
    with pytest.raises(HarnessError) as err:
        launch(d, tmp_path / "run", timeout_min=1, config=CONFIG)
    first = str(err.value).splitlines()[0]
    assert first.startswith("plan: run failed: still running ") and first.endswith(
        f" s after a death it cannot recover from (killed): {ENGINE_DIED}"), first
    assert time.monotonic() - start < 20 and not alive(int((d / "child.pid").read_text()))
    # An actor no role names (verl's WorkerDict, which verl's own shutdown reports) stops nothing: the run exits
    # by itself, and a clean exit is a finished run.
    (tmp_path / "again").mkdir()
    again = plan(tmp_path / "again", f"printf %s {shlex.quote(ACTOR_DIED_LOG.replace('RolloutRayActor', 'X'))}; "
                                     "sleep 2\n")
    launch(again, tmp_path / "again" / "run", timeout_min=1, config=CONFIG)
    assert json.loads((tmp_path / "again" / "run" / "launch.json").read_text())["exit_code"] == 0


def python_c(code: str) -> str:
    """A launch.sh that runs code in a real Python process, its output and traceback going to the run's console."""
    return f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}\n"


def failed_launch(tmp_path, script: str) -> list[str]:
    """The lines of the error a launch of script raised."""
    d = plan(tmp_path, script)
    with pytest.raises(HarnessError) as err:
        launch(d, tmp_path / "run", timeout_min=1, config=CONFIG)
    assert not (tmp_path / "run").exists()
    return str(err.value).splitlines()


def test_a_crash_is_named_by_the_exception_its_last_traceback_ends_with(tmp_path):
    """The measured case: OpenRLHF with its weight sync made a no-op stopped at its read-back check after 56 s, and
    the line said only "exit code 1". Here a real Python process prints, handles an exception, and raises the
    read-back error while handling it: of the two tracebacks the last one names the cause."""
    code = ("print('step 1', flush=True)\n"
            "def check_weights():\n"
            f"    raise RuntimeError({READ_BACK!r})\n"
            "try:\n"
            "    {}['engine 0']\n"
            "except KeyError:\n"
            "    check_weights()\n")
    first = failed_launch(tmp_path, python_c(code))[0]
    assert first == f"plan: run failed: exit code 1: RuntimeError: {READ_BACK}"


def test_a_ray_task_error_is_named_by_the_exception_the_remote_task_raised(tmp_path):
    """A driver's ray.get of an actor method that raised while handling another exception: the traceback ends in
    the remote task's own, and its last exception, not Ray's wrapper line nor the first of the chain, names the
    cause."""
    # Built the way Ray 2.x's ray/exceptions.py (the releases with ActorDiedError) builds it: as_instanceof_cause()
    # raises a class make_dual_exception_type names "RayTaskError(RuntimeError)", defined in ray.exceptions, whose
    # str is RayTaskError.__str__: the remote traceback with each "Traceback (most recent call last):" line replaced
    # by the task's proctitle line in cyan (colorama's Fore.CYAN, Fore.RESET) and "(pid=, ip=, actor_id=, repr=)".
    # Python's traceback module prints the driver's frames and that str. No Ray-internal frames here: __str__ drops
    # them from the remote part, and the driver's are frames like any other.
    code = ("import traceback\n"
            "def broadcast_to_vllm():\n"
            "    try:\n"
            "        {}['engine 0']\n"
            "    except KeyError:\n"
            f"        raise RuntimeError({READ_BACK!r})\n"
            "try:\n"
            "    broadcast_to_vllm()\n"
            "except RuntimeError:\n"
            "    printed = traceback.format_exc().strip().split('\\n')\n"
            "title = ('\\x1b[36mray::PolicyModelActor.fit()\\x1b[39m (pid=4242, ip=10.0.0.1, actor_id=5c1d0a, '\n"
            "         'repr=<openrlhf.trainer.ray.ppo_actor.PolicyModelActor object at 0x7f3a>)')\n"
            "remote = [title if line.startswith('Traceback ') else line for line in printed]\n"
            "class RayTaskError(RuntimeError):\n"
            "    def __str__(self):\n"
            "        return '\\n'.join(remote)\n"
            "RayTaskError.__module__ = 'ray.exceptions'\n"
            "RayTaskError.__name__ = RayTaskError.__qualname__ = 'RayTaskError(RuntimeError)'\n"
            "def get_objects():\n"
            "    raise RayTaskError()\n"
            "get_objects()\n")
    lines = failed_launch(tmp_path, python_c(code))
    assert lines[0] == f"plan: run failed: exit code 1: RuntimeError: {READ_BACK}"
    wrapper = "ray.exceptions.RayTaskError(RuntimeError): \x1b[36mray::PolicyModelActor.fit()\x1b[39m (pid=4242, "
    assert any(line.startswith(wrapper) for line in lines), lines  # the log tail: the printed form is Ray's


def test_a_long_or_multi_line_message_is_cut_to_one_bounded_line(tmp_path):
    message = "engine 0 differs at " + ", ".join(f"layers.{i}.mlp.weight" for i in range(200))
    code = f"raise ValueError({message + chr(10) + 'second line of the message'!r})\n"
    first = failed_launch(tmp_path, python_c(code))[0]
    cause = first.removeprefix("plan: run failed: exit code 1: ")
    assert cause.startswith("ValueError: engine 0 differs at layers.0.mlp.weight, ") and cause.endswith(" ...")
    assert len(cause) == launch_module.CAUSE_CHARS and "second line" not in first


def test_a_huge_log_is_read_from_its_end_only(tmp_path, monkeypatch):
    """A run that logged 32 MiB before it raised: its cause and tail come from the log's end, in memory far below the
    log's size (reading it whole took more than twice its size at once: bytes, text, lines)."""
    log_bytes = 32 << 20
    line = "filler " * 15 + "\n"
    code = ("import sys\n"
            f"sys.stdout.write({line!r} * {log_bytes // len(line)})\n"
            "sys.stdout.flush()\n"
            f"raise RuntimeError({READ_BACK!r})\n")
    wait = launch_module.wait_reporting_progress

    def wait_then_count_from_here(*args):
        # What launch allocates from the framework's exit on is its reading of the log; before it, what reading the
        # plan and starting the run take is none of this test's business.
        timed_out = wait(*args)
        tracemalloc.reset_peak()
        return timed_out

    monkeypatch.setattr(launch_module, "wait_reporting_progress", wait_then_count_from_here)
    tracemalloc.start()
    try:
        first = failed_launch(tmp_path, python_c(code))[0]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < log_bytes // 4, f"reading a failed run's log took {peak / 2**20:.0f} MiB"
    assert first == f"plan: run failed: exit code 1: RuntimeError: {READ_BACK}"


def test_a_dead_ray_actor_outranks_the_exception_the_driver_raised():
    """An engine killed under the driver's ray.get ends the driver's traceback with ActorDiedError, and a framework
    may log another exception after it: which role died says more than either exception's type."""
    # The driver's frames as Python's traceback module prints them (traceback.StackSummary.format)
    frames = ("Traceback (most recent call last):\n"
              '  File "/opt/openrlhf/cli/train_ppo_ray.py", line 460, in <module>\n'
              "    train(args)\n")
    read_back = frames + f"RuntimeError: {READ_BACK}\n"
    assert failure_cause(read_back, "openrlhf") == f"RuntimeError: {READ_BACK}"
    assert failure_cause(frames + ACTOR_DIED_LOG, "openrlhf") == ENGINE_DIED
    assert failure_cause(frames + ACTOR_DIED_LOG + read_back, "openrlhf") == ENGINE_DIED


def test_not_a_plan_directory(tmp_path):
    with pytest.raises(HarnessError, match="not a plan directory"):
        launch(tmp_path, tmp_path / "run", timeout_min=1, config=CONFIG)


def test_the_written_launch_sh_runs_the_planned_argv_word_for_word_from_the_run_directory(tmp_path):
    """The one launch.sh every adapter writes: plan.json's argv and env_vars reach the program exactly, with the
    RUN_DIR placeholder expanded, quoting and all; the program runs in the run directory, beside plan.json."""
    show = ("import json, os, sys; json.dump({'argv': sys.argv[1:], 'cwd': os.getcwd(), 'env': os.environ['DEMO_OUT']},"
            " open('seen.json', 'w'))")
    argv = [sys.executable, "-c", show, "--flag", "it's \"quoted\" $HOME `x`", "--out", f"{RUN_DIR}/a b", "-x", ""]
    d = plan(tmp_path, launch_script(title="demo", argv=argv, env_vars={"DEMO_OUT": f"{RUN_DIR}/out dir"}))
    run = tmp_path / "run"
    launch(d, run, timeout_min=1, config=CONFIG)
    seen = json.loads((run / "seen.json").read_text())
    real = seen["cwd"]  # the run directory while it ran: launch() writes it under a temporary name, then renames it
    assert Path(real).name == "run" and Path(real).parent.parent == tmp_path.resolve()
    assert seen == {"argv": ["--flag", "it's \"quoted\" $HOME `x`", "--out", f"{real}/a b", "-x", ""], "cwd": real,
                    "env": f"{real}/out dir"}
    assert json.loads((run / "plan.json").read_text())["run_id"] == "demo-s1"
    proc = subprocess.run(["bash", d / "launch.sh"], capture_output=True, text=True)
    assert proc.returncode == 2 and "usage: bash launch.sh RUN_DIR" in proc.stderr


def test_each_environment_keeps_its_own_torch_extension_cache(tmp_path, monkeypatch):
    """DeepSpeed's JIT-built ops go to a cache torch names by Python and CUDA version only, one per user: OpenRLHF and
    DeepSpeed-Chat (same versions, their own torch) rebuilt each other's there at every run's start. launch.sh points
    each environment at a folder of its own, and keeps a TORCH_EXTENSIONS_DIR the user set."""
    from harness.runtime import container, envs

    monkeypatch.setattr(envs, "ENV_ROOT", tmp_path / "envs")
    program = tmp_path / "envs" / "demo-env" / "bin" / "python"
    program.parent.mkdir(parents=True)
    program.write_text('#!/usr/bin/env bash\necho "$TORCH_EXTENSIONS_DIR" > seen\n')
    program.chmod(0o755)
    script = launch_script(title="demo", argv=[str(program)], env_vars={},
                           env_check=container.env_check("demo-env", validate_config({})))
    d = plan(tmp_path, script)
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    launch(d, tmp_path / "run", timeout_min=1, config=CONFIG)
    assert (tmp_path / "run" / "seen").read_text().strip() == str(tmp_path / "envs" / "demo-env" / "torch_extensions")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "mine"))
    launch(d, tmp_path / "run2", timeout_min=1, config=CONFIG)
    assert (tmp_path / "run2" / "seen").read_text().strip() == str(tmp_path / "mine")


def test_a_plan_without_its_record_is_refused_before_anything_runs(tmp_path):
    """An adapter's plan that leaves out what launch and the manifest need (here `inputs`) is named, not a KeyError
    after the run."""
    d = plan(tmp_path, "touch ran\n")
    record = json.loads((d / "plan.json").read_text())
    del record["inputs"]
    (d / "plan.json").write_text(json.dumps(record))
    with pytest.raises(HarnessError, match=r"plan.json: not a plan.json \(missing inputs\)"):
        launch(d, tmp_path / "run", 1, {"remax": {"steps": 1}})
    assert not (d / "ran").exists() and not (tmp_path / "run").exists()


def test_a_plan_record_of_the_wrong_types_is_refused_where_it_is_written_and_where_it_is_read(tmp_path):
    """The typed record: a seed written as text (a YAML seed list read as strings) would name another run in every
    table; the adapter's write_plan refuses it, and launch refuses a plan.json edited that way."""
    d = plan(tmp_path, "touch ran\n")
    record = json.loads((d / "plan.json").read_text())
    with pytest.raises(HarnessError, match=r"adapter's plan is not a plan record \(seed is str '1', not int\)"):
        write_plan(tmp_path / "written.json", {**record, "seed": "1"}, {"remax": {"rollout_n": 2}})
    assert not (tmp_path / "written.json").exists()
    with pytest.raises(HarnessError, match=r"missing inputs; n_gpus is bool True, not int"):
        write_plan(tmp_path / "written.json", {k: v for k, v in record.items() if k != "inputs"} | {"n_gpus": True},
                   {"remax": {"rollout_n": 2}})
    with pytest.raises(HarnessError, match=r"samples_per_prompt is 0, not at least 1"):
        write_plan(tmp_path / "written.json", record, {"remax": {"rollout_n": 0}})
    write_plan(tmp_path / "written.json", record, {"remax": {"rollout_n": 2}})
    assert json.loads((tmp_path / "written.json").read_text())["samples_per_prompt"] == 2  # the config's, copied
    (d / "plan.json").write_text(json.dumps({**record, "run_id": 7}))
    with pytest.raises(HarnessError, match=r"plan.json: not a plan.json \(run_id is int 7, not str\)"):
        launch(d, tmp_path / "run", 1, {"remax": {"steps": 1}})
    assert not (d / "ran").exists() and not (tmp_path / "run").exists()


def test_a_greedy_evaluation_record_is_read_by_one_reader_that_names_its_writer(tmp_path):
    """DeepSpeed-Chat's launcher, TRL's trainer and OpenRLHF's greedy_eval.py write the same record; one reader turns
    it into the run's eval.json record, and refuses a record cut short naming the file and what should have written
    it."""
    from harness.frameworks.registry import greedy_evaluation

    d = plan(tmp_path, "")
    assert greedy_evaluation(d / "eval.json", "demo", "demo's launcher", "demo's decoding") is None
    point = {"greedy_accuracy": 0.25, "reward_mean": 0.5}
    (d / "eval.json").write_text(json.dumps({"before": {**point, "responses": [{"prompt": "1+1=", "response": "2"}]},
                                             "after": point}))
    record = greedy_evaluation(d / "eval.json", "demo", "demo's launcher", "demo's decoding")
    assert record["run_id"] == "demo-s1" and record["after"] == point and record["source"] == "demo's decoding"
    assert record["before"]["responses"] == [{"prompt": "1+1=", "response": "2"}]
    (d / "eval.json").write_text(json.dumps({"before": point}))
    with pytest.raises(HarnessError, match=r"eval.json: not demo's launcher's evaluation record \(KeyError\('after'\)"):
        greedy_evaluation(d / "eval.json", "demo", "demo's launcher", "demo's decoding")
    (d / "eval.json").write_text('{"before": ')
    with pytest.raises(HarnessError, match=r"eval.json: demo's launcher's evaluation record is not valid JSON"):
        greedy_evaluation(d / "eval.json", "demo", "demo's launcher", "demo's decoding")


def test_two_processes_building_one_environment_build_it_once(tmp_path):
    """ensure_env holds a lock per environment: a second process (a prebuild in CI, two `ab` arms, two pipelines)
    waits for the build in progress instead of deleting it, then finds it made."""
    import textwrap

    from harness.io import locked

    spec = tmp_path / "tiny.txt"
    spec.write_text("# nothing to install: the venv alone\n")
    root = tmp_path / "venvs"
    root.mkdir()
    build = textwrap.dedent(f"""
        from pathlib import Path
        from harness.runtime.envs import ensure_env
        print(ensure_env("tiny", root=Path({str(root)!r}), spec=Path({str(spec)!r})))
    """)
    with locked(root / ".tiny.lock"):
        waiting = subprocess.Popen([sys.executable, "-c", build], stdout=subprocess.PIPE, text=True)
        time.sleep(3)
        assert waiting.poll() is None and not (root / "tiny").exists()  # waits: builds nothing under a held lock
    python = waiting.communicate(timeout=120)[0].strip()
    assert waiting.returncode == 0 and Path(python).is_file()
    (root / "tiny" / "built-once").touch()
    again = subprocess.run([sys.executable, "-c", build], capture_output=True, text=True, timeout=120)
    assert again.stdout.strip() == python and (root / "tiny" / "built-once").exists()  # found made, not rebuilt
