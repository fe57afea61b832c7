"""Benchmark: the default CPU pipeline from an empty results/ directory, against the issue's targets.

    python benchmarks/default_pipeline.py [--configfile FILE] [--keep DIR]

Runs the real `snakemake --cores all` in a fresh working directory (nothing else should run on the machine
meanwhile: timings are wall clock) and prints wall time, per-seed reward gain and eval greedy accuracy
before/after, and the median throughput. Exits 1 when a target is missed:
wall time <= 90 s; every seed's mean reward over its last 10% of steps exceeds its first 10% by >= 0.2;
eval greedy accuracy rises for every seed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from harness.results import layout

REPO = Path(__file__).resolve().parents[1]
TARGET_WALL_S, TARGET_GAIN = 90.0, 0.2


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configfile", type=Path, default=REPO / "workflows" / "config" / "cpu.yaml",
                    help="the Snakefile's default config is relative to the working directory, so name it")
    ap.add_argument("--keep", type=Path, default=None, help="working directory to use and keep (must not exist)")
    args = ap.parse_args()
    workdir = args.keep or Path(tempfile.mkdtemp(prefix="remax-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    cmd = [shutil.which("snakemake") or "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(workdir),
           "--cores", "all", "--configfile", str(args.configfile.resolve())]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode:
        print(proc.stdout[-4000:], proc.stderr[-4000:], sep="\n", file=sys.stderr)
        return 1
    summary = pd.read_csv(layout.path(workdir / layout.RESULTS, layout.SUMMARY))
    report = {
        "wall_s": round(wall, 1),
        "cpu_count": os.cpu_count(),
        "throughput_tok_s_median": round(float(summary["throughput_tok_s"].median()), 1),
        "runs": summary[["run_id", "reward_first10", "reward_last10", "reward_gain", "eval_accuracy_before",
                         "eval_accuracy_after"]].round(3).to_dict("records"),
    }
    misses = []
    if wall > TARGET_WALL_S:
        misses.append(f"wall time {wall:.0f} s > {TARGET_WALL_S:.0f} s")
    misses += [f"{r.run_id}: reward gain {r.reward_gain:.3f} < {TARGET_GAIN}"
               for r in summary.itertuples() if r.reward_gain < TARGET_GAIN]
    misses += [f"{r.run_id}: eval accuracy did not rise ({r.eval_accuracy_before} -> {r.eval_accuracy_after})"
               for r in summary.itertuples() if not r.eval_accuracy_after > r.eval_accuracy_before]
    report["targets_missed"] = misses
    print(json.dumps(report, indent=2))
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
