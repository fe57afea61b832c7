"""End-to-end proof of the regression alerts on a slowdown in the code: it alerts while it lasts, not after its fix.

    python benchmarks/regression_e2e.py [--configfile FILE] [--workdir DIR] [--history 8] [--fraction 0.4]
                                        [--clean-before 1] [--slow 3] [--clean-after 3]

In one working directory (kept; default: a new temporary one), with the real pipeline and the real
`snakemake ... check`:
1. `--history` nightly runs of the pipeline, each appended to results/history by the pipeline's `history` rule
   (`snakemake --cores all all history`, runs redone with --forcerun run_embedded); a workdir that already holds a
   history (e.g. from `regression_power.py measure`) can be reused with --history 0;
2. `remax-bench baseline update` from the last 5 of them -> WORKDIR/baselines/<profile>.json;
3. `--clean-before` nights of this checkout, `snakemake --cores all all check` (expect exit 0, no alert);
4. `--slow` nights of a slower harness: a clone of this checkout's HEAD with one commit that adds an extra
   reference-model forward pass over `--fraction` of the batch's rows to every training step (the kind of slip a
   refactoring makes; the config, its hash and the inputs stay exactly as they were, as with a real regression),
   imported ahead of this checkout through PYTHONPATH (expect a throughput alert by the DETECT_BY-th slow night,
   the detection target of docs/regression.md, and on every slow night after the first alert);
5. `--clean-after` nights of this checkout again: the slowdown reverted (expect exit 0, no alert, every night).
Prints each night's exit status and throughput lines, copies each night's alerts.md into the workdir, and exits 1
unless the slowdown is caught so and no clean night alerts, before the slowdown or after its fix. On the cpu-short
profile (benchmarks/regression_short.yaml) a night takes about a minute on a quiet 2-core machine; the timings mean
something only when nothing else runs meanwhile.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from harness.regression.statistics import DETECT_BY  # the night by which a lasting drop of about 5% must be caught
from harness.results import layout

REPO = Path(__file__).resolve().parents[1]
# The fault, applied to harness/frameworks/reference/backend.py in the slower clone: right after the step's
# reference forward pass, another one over the first prompts of the batch (and their responses) whose result nobody
# uses.
ANCHOR = '        ref_logprobs = response_logprobs(ref, rolled["ids"], rolled["attn"], rolled["response"], n)\n'
FAULT = ('        rows = max(1, round(len(rolled["ids"]) * {fraction}))\n'
         '        response_logprobs(ref, rolled["ids"][:rows], rolled["attn"][:rows],\n'
         '                          rolled["response"][:rows * n], n)\n')


def snakemake(workdir: Path, configfiles: list[Path], *targets: str, forcerun: bool, harness: Path = REPO) -> int:
    cmd = [shutil.which("snakemake") or "snakemake", "-s", str(harness / "Snakefile"), "--directory", str(workdir),
           "--cores", "all", *targets, *(["--forcerun", "run_embedded"] if forcerun else [])]
    if configfiles:
        cmd += ["--configfile", *map(str, configfiles)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(harness), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode and "check" not in targets:
        sys.exit(f"snakemake failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc.returncode


def slower_harness(root: Path, fraction: float) -> tuple[Path, str]:
    """A clone of HEAD with the fault committed on top; returns its path and commit."""
    clone = root / "slower-harness"
    shutil.rmtree(clone, ignore_errors=True)
    subprocess.run(["git", "clone", "--quiet", "--shared", str(REPO), str(clone)], check=True)
    target = clone / "harness" / "frameworks" / "reference" / "backend.py"
    source = target.read_text()
    if source.count(ANCHOR) != 1:
        sys.exit(f"{target}: the reference forward pass the fault follows is not there once; update ANCHOR")
    target.write_text(source.replace(ANCHOR, ANCHOR + FAULT.format(fraction=fraction)))
    git = ["git", "-C", str(clone), "-c", "user.name=regression-e2e", "-c", "user.email=regression-e2e@localhost"]
    subprocess.run([*git, "commit", "--quiet", "-am", f"extra reference forward over {fraction:.0%} of the rows"],
                   check=True)
    return clone, subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True,
                                 check=True).stdout.strip()


def summary_line(results: Path) -> str:
    alerts = json.loads(layout.path(results, layout.ALERTS_JSON).read_text())
    lines = [f"status {alerts['status']}"]
    for c in alerts["checks"]:
        if c["class"] in ("alert", "context"):
            ev = c["evidence"]
            change = "n/a" if c["change"] is None else f"{c['change']:+.1f}%"
            noise = "n/a" if ev["noise"] is None else f"{ev['noise']:.1f}%"
            z = "n/a" if ev["z"] is None else f"{ev['z']:+.1f}"
            reason = f" ({c['reason']})" if c.get("reason") else ""
            detectable = ("" if c["class"] != "alert" or ev.get("detectable_change") is None
                          else f", detectable {ev['detectable_change']:+.1f}%")
            lines.append(f"  {c['framework']} {c['metric']} ({c['class']}): {c['status']}{reason}, change {change}, "
                         f"noise {noise}, z {z}{detectable}, {ev['n_history_runs']} history runs, "
                         f"{len(ev['seeds'])} seeds")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configfile", type=Path, default=None)
    ap.add_argument("--history", type=int, default=8, help="no-change nightly runs before the checks")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--fraction", type=float, default=0.4,
                    help="share of the batch's rows the extra reference forward pass covers (0.4: about 5%% slower)")
    ap.add_argument("--clean-before", type=int, default=1)
    ap.add_argument("--slow", type=int, default=3)
    ap.add_argument("--clean-after", type=int, default=3)
    args = ap.parse_args()
    workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="remax-bench-e2e-"))).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    base = [args.configfile.resolve()] if args.configfile else []
    results = workdir / layout.RESULTS
    for i in range(args.history):
        snakemake(workdir, base, "all", "history", forcerun=i > 0 or results.exists())
        print(f"history run {i + 1}/{args.history} appended", flush=True)
    profile = json.loads(layout.path(results, layout.CONFIG).read_text())["profile"]
    baseline = workdir / "baselines" / f"{profile}.json"
    proc = subprocess.run([shutil.which("remax-bench") or "remax-bench", "baseline", "update", "--results",
                           str(results), "--out", str(baseline)], capture_output=True, text=True)
    if proc.returncode:
        sys.exit(proc.stderr)
    print(proc.stdout.strip())
    slow_harness, slow_commit = slower_harness(workdir, args.fraction)
    print(f"slower harness: {slow_harness} at {slow_commit[:12]} (extra reference forward over "
          f"{args.fraction:.0%} of the rows)")

    nights = ([("clean", REPO)] * args.clean_before + [("slow", slow_harness)] * args.slow
              + [("fixed", REPO)] * args.clean_after)
    clean_quiet, slow_alerts = True, []
    for i, (kind, harness) in enumerate(nights, 1):
        rc = snakemake(workdir, base, "all", "check", forcerun=True, harness=harness)
        alerts = json.loads(layout.path(results, layout.ALERTS_JSON).read_text())
        manifest = json.loads(next((results / "runs").glob("*/seed*/manifest.json")).read_text())
        if (manifest["git"]["commit"] == slow_commit) != (kind == "slow"):
            sys.exit(f"night {i} ({kind}): the runs were made by harness commit {manifest['git']['commit']}, not the "
                     "one this night was meant to run: PYTHONPATH did not take effect")
        # Whichever throughput figure decides (in probe units where the run has a probe) is the throughput alert.
        alerted = any(c["class"] == "alert" and c["metric"].startswith("throughput") and c["status"] == "regression"
                      for c in alerts["checks"])
        if kind == "slow":
            slow_alerts.append(alerted and rc != 0)
        else:
            clean_quiet &= not alerted and rc == 0
        print(f"night {i} ({kind}): `snakemake ... check` exit {rc}, {'ALERT' if alerted else 'no alert'}; "
              f"{summary_line(results)}", flush=True)
        shutil.copy2(layout.path(results, layout.ALERTS), workdir / f"alerts-night{i}-{kind}.md")
    first = next((k for k, a in enumerate(slow_alerts) if a), len(slow_alerts))
    caught = first < min(DETECT_BY, len(slow_alerts)) and all(slow_alerts[first:])
    ok = caught and clean_quiet
    when = f"first caught on slow night {first + 1}" if first < len(slow_alerts) else "never caught"
    print(f"workdir {workdir}: " + ("PASS" if ok else "FAIL") + f" (slowdown {when}; by night {DETECT_BY}, and on "
          f"every slow night after: {caught}; no alert on any clean night, before the slowdown or after its fix: "
          f"{clean_quiet})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
