"""A run killed mid-way: the other runs and the report complete; re-running re-runs only the failed run."""

import os
import signal
import subprocess
import time

import pandas as pd
import pytest
from conftest import BIN, REPO

pytestmark = pytest.mark.e2e


def find_pid(pattern: str, cwd) -> int | None:
    """A process matching `pattern` that runs in `cwd` (this test's pipeline, not another one on the machine)."""
    for pid in map(int, subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()):
        try:
            if os.readlink(f"/proc/{pid}/cwd") == str(cwd):
                return pid
        except OSError:
            continue
    return None


def test_a_killed_run_is_reported_failed_and_only_it_is_rerun(tmp_path):
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    cmd = [str(BIN / "snakemake"), "-s", str(REPO / "Snakefile"), "--directory", str(tmp_path), "--cores", "2",
           "--configfile", str(REPO / "workflows" / "config" / "micro.yaml")]
    pipeline = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
    # the Python process itself, not the shell that Snakemake wraps around it
    victim = "bin/remax-bench run reference .* --seed 2 .*--out results/runs/reference/seed2"
    deadline = time.monotonic() + 300
    pid = None
    while pid is None and time.monotonic() < deadline and pipeline.poll() is None:
        pid = find_pid(victim, tmp_path)
        time.sleep(0.05)
    assert pid, "the seed-2 run never started"
    os.kill(pid, signal.SIGKILL)
    out, _ = pipeline.communicate(timeout=300)
    assert pipeline.returncode != 0, out[-2000:]

    results = tmp_path / "results"
    assert not (results / "runs" / "reference" / "seed2").exists()  # nothing that looks complete
    assert (results / "runs" / "reference" / "seed1" / "metrics.parquet").is_file()
    status = pd.read_csv(results / "report" / "runs.csv").set_index("seed")["status"].to_dict()
    assert status == {1: "ok", 2: "failed"}
    assert not (results / "summary.csv").exists()  # left to the summarize rule, so the rerun completes it

    dry = subprocess.run(cmd + ["-n"], cwd=tmp_path, env=env, capture_output=True, text=True)
    table = (dry.stdout + dry.stderr).split("Job stats:")[1].split("\n\n")[0]
    jobs = dict(line.split() for line in table.splitlines()[3:] if line.strip())
    assert jobs == {"run_embedded": "1", "ingest": "1", "summarize": "1", "report": "1", "history": "1", "all": "1",
                    "total": "6"}
