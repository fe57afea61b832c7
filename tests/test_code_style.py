"""House rules a maintainer expects, checked with the suite: ruff's rule set (pyproject.toml [tool.ruff.lint]) on
all Python in the repository, and mypy on the harness package ([tool.mypy]: every function annotated)."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *argv], cwd=REPO, capture_output=True, text=True, timeout=900)


def test_ruff_finds_nothing():
    proc = _run("ruff", "check", "--no-cache", "harness", "tests", "benchmarks", "scripts")
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]


def test_mypy_finds_nothing_in_the_harness():
    proc = _run("mypy")
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
