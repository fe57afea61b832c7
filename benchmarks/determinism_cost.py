"""Benchmark: what `reproducibility.determinism: strict` costs the reference backend, against `off`, side by side.

    python benchmarks/determinism_cost.py [--config FILE] [--steps 40] [--pairs 4]

Builds the shared inputs of --config (the default profile's) once, then runs seed 1 of the reference backend
`--pairs` times under each mode, alternating off and strict (ABBA order, so a machine's drift hits both alike), each
trained by `remax-bench train` (harness.runs.train, the one way a run is trained). Prints each run's median tokens/s
after warm-up, the strict/off ratio per pair and its median, and whether strict changed what the runs computed
(their behaviour columns against off's). Nothing else should run on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from harness.results.metrics import read_metrics  # noqa: E402
from harness.results.reproducibility import first_divergence, verdict_text  # noqa: E402
from harness.runs.train import METRICS  # noqa: E402

CLI = [sys.executable, "-m", "harness.cli"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(REPO / "workflows" / "config" / "cpu.yaml"))
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--pairs", type=int, default=4)
    args = ap.parse_args()
    raw = yaml.safe_load(Path(args.config).read_text())
    raw.setdefault("remax", {})["steps"] = args.steps
    warmup = raw["remax"].get("warmup_steps", 5)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        configs = {}
        for mode in ("off", "strict"):
            configs[mode] = root / f"{mode}.json"
            configs[mode].write_text(json.dumps({**raw, "reproducibility": {"determinism": mode}}))
        for what in ("dataset", "policy", "reward"):
            subprocess.run([*CLI, "inputs", what, "--config", configs["off"], "--inputs", root / "inputs"],
                           check=True, capture_output=True)
        order = [m for i in range(args.pairs) for m in (("off", "strict") if i % 2 == 0 else ("strict", "off"))]
        speed: dict[str, list[float]] = {"off": [], "strict": []}
        first = {}
        for i, mode in enumerate(order):
            out = root / f"run{i}-{mode}"
            subprocess.run([*CLI, "train", "reference", "--config", configs[mode], "--seed", "1", "--out", out,
                            "--inputs", root / "inputs"], check=True, capture_output=True)
            steps = read_metrics(out / METRICS)
            speed[mode].append(float(steps[steps["step"] > warmup]["throughput_tok_s"].median()))
            first.setdefault(mode, steps)
            print(f"run {i + 1}: {mode:6s} {speed[mode][-1]:9,.0f} tokens/s", flush=True)
    ratios = [s / o for o, s in zip(speed["off"], speed["strict"])]
    print(f"\nstrict / off tokens/s per pair: {', '.join(f'{r:.3f}' for r in ratios)}; "
          f"median {statistics.median(ratios):.3f} ({args.pairs} pairs of {args.steps} steps, config {args.config})")
    changed = verdict_text(first_divergence(first["off"], first["strict"]))
    print(f"strict against off, what the runs computed: {changed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
