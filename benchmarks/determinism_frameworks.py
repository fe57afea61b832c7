"""Benchmark: what `reproducibility.determinism: strict` gives and costs each framework, against `off`, side by side.

    snakemake --cores all --configfile workflows/config/cpu-frameworks.yaml OFF.yaml     # repeat_seeds [1], off
    mv results results-off
    snakemake --cores all --configfile workflows/config/cpu-frameworks.yaml STRICT.yaml  # the same, strict
    mv results results-strict
    python benchmarks/determinism_frameworks.py results-off results-strict

OFF.yaml and STRICT.yaml set `reproducibility: {repeat_seeds: [1], repeats: 2, determinism: off | strict}`. For each
framework and mode this prints the verdict of seed 1's repeat against its original (identical, or the first divergent
step and metric: the repeat's reproduce.json), the median tokens/s after warm-up of the original and the repeat, and
strict's tokens/s over off's (the mean of each mode's two runs). The modes ran one after the other, so the machine's
drift between them is in the ratio; within a mode the two runs show how large that noise is. Nothing else should
run on the machine meanwhile.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from harness.results.reproducibility import run_figures
from harness.runs.train import run_steps


def mode_rows(results: Path) -> dict[str, dict]:
    """Per framework: the mode, the repeat's verdict and both runs' median tokens/s after warm-up."""
    config = json.loads((results / "config.json").read_text())
    warmup = config["remax"]["warmup_steps"]
    out = {}
    for record_path in sorted(results.glob("repeats/*/seed*-r2/reproduce.json")):
        record = json.loads(record_path.read_text())
        fw, seed = record["framework"], record["seed"]
        runs = {"original": results / "runs" / fw / f"seed{seed}", "repeat": record_path.parent}
        speed = {k: run_figures(run_steps(d, fw), None, warmup)["tokens_per_s"] for k, d in runs.items()}
        out[fw] = {"mode": config["reproducibility"]["determinism"], "verdict": record["text"], **speed}
    return out


def main(off_dir: str, strict_dir: str) -> int:
    off, strict = mode_rows(Path(off_dir)), mode_rows(Path(strict_dir))
    print("| framework | off: repeat | strict: repeat | off tokens/s (original, repeat) | "
          "strict tokens/s (original, repeat) | strict / off |")
    print("|---|---|---|---:|---:|---:|")
    for fw in sorted(set(off) | set(strict)):
        o, s = off.get(fw), strict.get(fw)
        ratio = (s["original"] + s["repeat"]) / (o["original"] + o["repeat"]) if o and s else float("nan")
        cells = [f"{r['original']:,.0f}, {r['repeat']:,.0f}" if r else "not run" for r in (o, s)]
        print(f"| {fw} | {o['verdict'] if o else 'not run'} | {s['verdict'] if s else 'not run'} | {cells[0]} | "
              f"{cells[1]} | {ratio:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
