"""Report rendering time for 50 runs x 1,000 steps (target: at most 10 s on the 2-core CI machine).

    python benchmarks/report_render.py [--runs-per-framework 10] [--steps 1000] [--keep DIR]

The results directory is SYNTHETIC (tests/synthetic.py: `synthetic-*` frameworks, formula data) and is built
before the clock starts; the timed part is `harness.report.render`, the call the pipeline's report rule makes.
Exit 1 when the target is missed.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

import synthetic  # noqa: E402

from harness.frameworks import register_framework  # noqa: E402

TARGET_S = 10.0
FRAMEWORKS = {"synthetic-a": (0.5, 0.8), "synthetic-b": (0.8, 0.85), "synthetic-c": (1.1, 0.7),
              "synthetic-d": (0.4, 0.1), "synthetic-e": (2.0, 0.8)}  # name: (step seconds, final reward)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs-per-framework", type=int, default=10)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--keep", type=Path, help="build the results here and keep them (default: a temporary dir)")
    args = ap.parse_args()
    for name in FRAMEWORKS:
        register_framework(synthetic.adapter(name))
    with tempfile.TemporaryDirectory() as tmp:
        results = (args.keep or Path(tmp)) / "results"
        seeds = list(range(1, args.runs_per_framework + 1))
        synthetic.write_config(results, list(FRAMEWORKS), seeds, steps=args.steps, warmup=10)
        for name, (step_s, final) in FRAMEWORKS.items():
            for seed in seeds:
                synthetic.write_run(results, name, seed, steps=args.steps, step_s=step_s, final_reward=final)
        n_runs = len(FRAMEWORKS) * len(seeds)
        synthetic.summarize(results)  # the stage before the report, which reads its summary.csv

        from harness.report import render  # imported before timing: plotting libraries load once per process

        start = time.perf_counter()
        render(results, results / "report")
        elapsed = time.perf_counter() - start
    print(f"report for {n_runs} runs x {args.steps} steps rendered in {elapsed:.2f} s (target <= {TARGET_S:.0f} s)")
    return 0 if elapsed <= TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
