"""Benchmark: `remax-bench bisect` finds a planted slow commit among 8, and how many A/B rounds and pairs it takes.

    python benchmarks/ab_bisect.py [--slow 5] [--commits 8] [--out DIR] [--nightly]

Clones this repository's HEAD, adds --commits commits on top (each appends a line to a scratch file; commit --slow
also adds a needless decomposition to the policy's forward pass, as tests/test_ab.py does), then does what a nightly
alert asks: `remax-bench ab GOOD BAD`, then `remax-bench bisect GOOD BAD --confirmed-by` that A/B, with the A/B config
of tests/test_ab.py, and prints the commit it names, whether it is the planted one, the bisection rounds, pairs and
minutes. With --nightly it runs `remax-bench nightly` instead, against a baseline (the shipped cpu one, its commit
set to GOOD): the A/B and the bisection the nightly job runs itself, and the commit its alert names. Nothing else
should run on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from test_ab import AB_CONFIG, MODEL, SLOW_LINE  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commits", type=int, default=8)
    ap.add_argument("--slow", type=int, default=5, help="which of the commits (1-based) is slow")
    ap.add_argument("--out", help="keep the bisection here (default: a temporary directory)")
    ap.add_argument("--nightly", action="store_true", help="as the nightly job: `remax-bench nightly` against a "
                    "baseline made by GOOD")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        clone = root / "repo"
        subprocess.run(["git", "clone", "-q", "--no-local", str(REPO), str(clone)], check=True)
        who = ["-c", "user.name=remax-bench benchmark", "-c", "user.email=benchmark@remax-bench.invalid"]
        for k in range(1, args.commits + 1):
            with open(clone / "BISECT_SCRATCH", "a") as f:
                f.write(f"commit {k}\n")
            if k == args.slow:
                path = clone / MODEL
                path.write_text(path.read_text().replace(*SLOW_LINE))
            subprocess.run(["git", "-C", str(clone), "add", "-A"], check=True)
            subprocess.run(["git", "-C", str(clone), *who, "commit", "-qm", f"commit {k}" + (" (slow)" if k ==
                                                                                           args.slow else "")],
                           check=True)
        planted = subprocess.run(["git", "-C", str(clone), "rev-parse", f"HEAD~{args.commits - args.slow}"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        config = root / "ab.yaml"
        config.write_text(yaml.safe_dump(AB_CONFIG))
        out = Path(args.out) if args.out else root / "bisect"
        cli = str(Path(sys.executable).parent / "remax-bench")
        limits = ["--config", str(config), "--max-pairs", "8"]
        started = time.monotonic()
        if args.nightly:
            return _nightly(cli, clone, root, limits, out, planted, args.commits, started)
        # As after a nightly alert: the `ab` of GOOD against BAD it prints first, then bisect reusing that A/B.
        confirm = subprocess.run([cli, "ab", "--a", f"HEAD~{args.commits}", "--b", "HEAD", *limits, "--out",
                                  str(root / "confirm")], cwd=clone, capture_output=True, text=True)
        print(confirm.stdout + confirm.stderr)
        if confirm.returncode != 1:
            return 2
        proc = subprocess.run([cli, "bisect", f"HEAD~{args.commits}", "HEAD", *limits, "--confirmed-by",
                               str(root / "confirm"), "--out", str(out)], cwd=clone, capture_output=True, text=True)
        minutes = (time.monotonic() - started) / 60
        print(proc.stdout + proc.stderr)
        if proc.returncode:
            return proc.returncode
        record = json.loads((out / "bisect.json").read_text())
        print(f"named {record['first_slow'][:12]}, planted {planted[:12]}: "
              f"{'found' if record['first_slow'] == planted else 'WRONG'}; {len(record['rounds']) - 1} bisection "
              f"rounds after the confirming A/B, {sum(r['pairs'] for r in record['rounds'])} pairs in all, "
              f"{minutes:.1f} min in all")
        for r in record["rounds"]:
            print(f"  {r['commit'][:12]}: {r['verdict']}")
        return 0 if record["first_slow"] == planted else 1


def _nightly(cli: str, clone: Path, root: Path, limits: list[str], out: Path, planted: str, commits: int,
             started: float) -> int:
    """`remax-bench nightly` with the baseline made by GOOD (HEAD~commits): the commit its alert names."""
    good = subprocess.run(["git", "-C", str(clone), "rev-parse", f"HEAD~{commits}"], capture_output=True, text=True,
                          check=True).stdout.strip()
    baseline = json.loads((REPO / "baselines" / "cpu.json").read_text())
    for entry in baseline["frameworks"].values():
        entry["provenance"]["git"] = {"commit": good, "dirty": False}
    (root / "baseline.json").write_text(json.dumps(baseline))
    proc = subprocess.run([cli, "nightly", "--baseline", str(root / "baseline.json"), *limits, "--out", str(out)],
                          cwd=clone, capture_output=True, text=True)
    minutes = (time.monotonic() - started) / 60
    print(proc.stdout + proc.stderr)
    if proc.returncode != 1:
        return 2
    record = json.loads((out / "nightly.json").read_text())
    named = record["bisect"]["first_slow"]
    print(f"nightly: {record['text']}\nnamed {named[:12]}, planted {planted[:12]}: "
          f"{'found' if named == planted else 'WRONG'}; the A/B {record['ab']['pairs']} pairs in "
          f"{record['ab']['minutes']:.1f} min, {record['bisect']['rounds']} bisection rounds; {minutes:.1f} min in all")
    return 0 if named == planted else 1


if __name__ == "__main__":
    sys.exit(main())
