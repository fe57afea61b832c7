"""End-to-end proof of the regression alerts: the real pipeline, a history, a baseline, then 0% and 10% slowdown.

    python benchmarks/regression_e2e.py [--configfile FILE] [--history 8] [--workdir DIR] [--slowdown 0.1]

In one working directory (kept; default: a new temporary one):
1. `--history` nightly runs of the pipeline with no injected slowdown, each appended to results/history by the
   pipeline's `history` rule (`snakemake --cores all all history`, runs redone with --forcerun run_embedded);
2. `remax-bench baseline update` from the last 5 of them -> WORKDIR/baselines/<profile>.json;
3. one more nightly run, `snakemake --cores all all check`, with `reference.inject_slowdown: 0` (expect exit 0);
4. one with `reference.inject_slowdown: --slowdown` (expect the check target to fail with a throughput alert).
Prints both checks' status and throughput line, exits 1 unless the 0 run passes and the slowed run alerts on
throughput. With no --configfile it runs the default (cpu) profile: about 2.5 minutes per night on a quiet
2-core machine; the timings mean something only when nothing else runs meanwhile. A workdir that already holds
a history (e.g. from `regression_power.py measure`) can be reused with --history 0.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def snakemake(workdir: Path, configfiles: list[Path], *targets: str, forcerun: bool) -> int:
    cmd = [shutil.which("snakemake") or "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(workdir),
           "--cores", "all", *targets, *(["--forcerun", "run_embedded"] if forcerun else [])]
    if configfiles:
        cmd += ["--configfile", *map(str, configfiles)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode and "check" not in targets:
        sys.exit(f"snakemake failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc.returncode


def summary_line(results: Path) -> str:
    alerts = json.loads((results / "alerts.json").read_text())
    lines = [f"status {alerts['status']}"]
    for c in alerts["checks"]:
        if c["class"] in ("alert", "context"):
            ev = c["evidence"]
            change = "n/a" if c["change"] is None else f"{c['change']:+.1f}%"
            noise = "n/a" if ev["noise"] is None else f"{ev['noise']:.1f}%"
            z = "n/a" if ev["z"] is None else f"{ev['z']:+.1f}"
            lines.append(f"  {c['framework']} {c['metric']} ({c['class']}): {c['status']}, change {change}, "
                         f"noise {noise}, z {z}, "
                         f"{ev['n_history_runs']} history runs, {len(ev['seeds'])} seeds")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configfile", type=Path, default=None)
    ap.add_argument("--history", type=int, default=8, help="no-change nightly runs before the checks")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--slowdown", type=float, default=0.1)
    args = ap.parse_args()
    workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="remax-bench-e2e-"))).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    base = [args.configfile.resolve()] if args.configfile else []
    results = workdir / "results"
    for i in range(args.history):
        snakemake(workdir, base, "all", "history", forcerun=i > 0 or results.exists())
        print(f"history run {i + 1}/{args.history} appended", flush=True)
    profile = json.loads((results / "config.json").read_text())["profile"]
    baseline = workdir / "baselines" / f"{profile}.json"
    proc = subprocess.run([shutil.which("remax-bench") or "remax-bench", "baseline", "update", "--results",
                           str(results), "--out", str(baseline)], capture_output=True, text=True)
    if proc.returncode:
        sys.exit(proc.stderr)
    print(proc.stdout.strip())

    outcome = {}
    for slowdown in (0.0, args.slowdown):
        knob = workdir / f"slowdown-{slowdown}.yaml"
        knob.write_text(f"reference: {{inject_slowdown: {slowdown}}}\n")
        rc = snakemake(workdir, [*base, knob], "all", "check", forcerun=True)
        alerts = json.loads((results / "alerts.json").read_text())
        # Whichever throughput figure decides (in probe units where the run has a probe) is the throughput alert.
        tput = {c["status"] for c in alerts["checks"] if c["class"] == "alert" and c["metric"].startswith("throughput")}
        outcome[slowdown] = (rc, alerts["status"], "regression" if "regression" in tput else ", ".join(sorted(tput)))
        print(f"inject_slowdown {slowdown}: `snakemake ... check` exit {rc}; {summary_line(results)}", flush=True)
        shutil.copy2(results / "alerts.md", workdir / f"alerts-slowdown-{slowdown}.md")
    quiet, slow = outcome[0.0], outcome[args.slowdown]
    ok = quiet[0] == 0 and quiet[1] != "regression" and slow[0] != 0 and slow[2] == "regression"
    print(f"workdir {workdir}: " + ("PASS" if ok else "FAIL") + " (0 run: no alert; slowed run: throughput alert)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
