"""Launching a planned run: real subprocesses, exit codes, timeouts that kill the whole process tree."""

import json
import time

import pytest

from harness import HarnessError
from harness.config import validate_config
from harness.runtime.launch import launch

CONFIG = validate_config({})


def plan(tmp_path, script: str):
    d = tmp_path / "plan"
    d.mkdir()
    (d / "plan.json").write_text(json.dumps({"framework": "demo", "framework_version": "1.0", "run_id": "demo-s1",
                                             "seed": 1, "env": None, "inputs": {"dataset": {"sha256": "ab"}}}))
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


def test_not_a_plan_directory(tmp_path):
    with pytest.raises(HarnessError, match="not a plan directory"):
        launch(tmp_path, tmp_path / "run", timeout_min=1, config=CONFIG)
