import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def run_cli(*args, cwd=None):
    """The real console script, in a subprocess, as users and Snakemake rules call it."""
    return subprocess.run([str(BIN / "remax-bench"), *map(str, args)], cwd=cwd, capture_output=True, text=True)


def snakemake(workdir, *args):
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(
        [str(BIN / "snakemake"), "-s", str(REPO / "Snakefile"), "--directory", str(workdir), *map(str, args)],
        cwd=workdir, capture_output=True, text=True, env=env,
    )


@pytest.fixture(scope="session")
def micro_pipeline(tmp_path_factory):
    """One real `snakemake` run of the micro profile; several tests read its results."""
    workdir = tmp_path_factory.mktemp("pipeline")
    proc = snakemake(workdir, "--cores", "2", "--configfile", REPO / "workflows" / "config" / "micro.yaml")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return workdir
