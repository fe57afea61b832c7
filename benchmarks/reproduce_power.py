"""Benchmark: how often `remax-bench reproduce` calls a rerun of the same experiment on "another machine" not
consistent (its false alarms), and a planted real change not consistent (its power), over repeated trials.

    python benchmarks/reproduce_power.py run [--seeds 30] [--kl-coef 0.05] [--work DIR] [--out F]
    python benchmarks/reproduce_power.py results [--work DIR] [--out F] [--sets 1000]

`run` clones this repository's HEAD twice, the second with one commit that flips the KL term's sign in the shaped
reward (harness/remax.py: the penalty becomes a bonus), and trains the reference backend on the cpu-short profile
(benchmarks/regression_short.yaml, 150 steps) with the default profile's 30 SFT steps (which leave the task to RL:
cpu-short's 300 leave little to learn in 150 steps) and `remax.kl_coef` set to --kl-coef, seeds 1..K, in three worlds:

- original: HEAD;
- another kernel path: HEAD with torch's scalar kernels (ATEN_CPU_CAPABILITY=default, instead of the AVX2/AVX-512
  ones this CPU picks): floating point rounds otherwise, as on another CPU, and the runs part within the first steps.
  The experiment is the same, so `reproduce` should call it consistent. (Another thread count does not serve here:
  this model's matrices are too small for torch to split, and 1 and 2 threads give the same bits.)
- KL flipped: the flipped commit. Another experiment, which it should call not consistent.

At the profiles' kl_coef of 0.001 the KL term does not change what is learnt (docs/reproducibility.md, "Measured"),
so neither can its flip: --kl-coef sets one at which it does. Every run is on one thread, two at a time; each run's
directory stays in --work.

`results` judges trials exactly as `reproduce` does (reproduce_comparison.judge: its test, its Holm level, its
margin): a set of 3 seeds, the original's runs of those seeds against the same seeds' runs in another world, as a
3-seed comparison rerun elsewhere. The share of sets called not consistent against another kernel path is the
false-alarm rate; against KL flipped, the power. Sets share seeds, so they are not independent: the disjoint sets
(seeds 1-3, 4-6, ...) are counted apart. The figures judged are learning figures, not timings, so other work on the
machine changes only how long it takes.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from harness.io import nan_as_null, write_json  # noqa: E402
from harness.results.consistency import FAMILY_FALSE_ALARM, FIGURES  # noqa: E402
from harness.results.metrics import read_metrics  # noqa: E402
from harness.results.summarize import edge_means, read_eval  # noqa: E402
from harness.runs.reproduce_comparison import judge  # noqa: E402
from harness.runs.train import METRICS  # noqa: E402

CONFIG = REPO / "benchmarks" / "regression_short.yaml"
KL_LINE = ("    rewards = -kl_coef * kl * mask\n", "    rewards = kl_coef * kl * mask\n")
WORLDS = {"original": ("HEAD", {}), "another kernel path": ("HEAD", {"ATEN_CPU_CAPABILITY": "default"}),
          "KL flipped": ("flipped", {})}
SFT_STEPS = 30
RECORD_ROLE = "reproduce power record"  # what this script writes to --out (harness.io.WRITTEN)
KL_COEF = 0.05
SET = 3  # seeds a side, as the profiles run


def _cli(*args: object) -> list[str]:
    return [sys.executable, "-P", "-m", "harness.cli", *map(str, args)]


def profile(kl_coef: float = KL_COEF) -> dict:
    """cpu-short with the default profile's SFT steps and `kl_coef` (tests/test_reproduce_anywhere.py runs it too)."""
    config = yaml.safe_load(CONFIG.read_text())
    config["policy"]["sft"]["steps"] = SFT_STEPS
    config["remax"]["kl_coef"] = kl_coef
    return config


def _trees(root: Path) -> dict[str, Path]:
    """HEAD, and HEAD with the KL term's sign flipped committed on top."""
    trees = {"HEAD": root / "head", "flipped": root / "flipped"}
    for tree in trees.values():
        subprocess.run(["git", "clone", "-q", "--no-local", str(REPO), str(tree)], check=True)
    path = trees["flipped"] / "harness" / "remax.py"
    text = path.read_text()
    assert text.count(KL_LINE[0]) == 1, "harness/remax.py: the KL penalty's line is gone"
    path.write_text(text.replace(*KL_LINE))
    who = ["-c", "user.name=remax-bench benchmark", "-c", "user.email=benchmark@remax-bench.invalid"]
    subprocess.run(["git", "-C", str(trees["flipped"]), *who, "commit", "-qam", "KL term's sign flipped"], check=True)
    return trees


def run(seeds: int, kl_coef: float, work: Path) -> None:
    if work.exists():  # runs of another profile or commit would mix into the trials
        raise SystemExit(f"{work}: exists; give run a new --work (results reads an existing one)")
    work.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        trees = _trees(Path(tmp))
        head = {**os.environ, "PYTHONPATH": str(trees["HEAD"])}
        subprocess.run(_cli("freeze-config", "--json", json.dumps(profile(kl_coef)), "--out", work / "config.json"),
                       env=head, check=True)
        for what in ("dataset", "policy", "reward"):
            subprocess.run(_cli("inputs", what, "--config", work / "config.json", "--inputs", work / "inputs"),
                           env=head, check=True, stdout=subprocess.DEVNULL)
        queue = [(seed, world) for seed in range(1, seeds + 1) for world in WORLDS]
        running: list[tuple[int, str, subprocess.Popen]] = []
        while queue or running:
            while queue and len(running) < 2:  # two 1-thread runs at a time on 2 cores
                seed, world = queue.pop(0)
                tree, env = WORLDS[world]
                out = work / world.replace(" ", "-") / f"seed{seed}"
                running.append((seed, world, subprocess.Popen(
                    _cli("train", "reference", "--config", work / "config.json", "--seed", seed, "--out", out,
                         "--inputs", work / "inputs", "--timeout-min", 30),
                    env={**os.environ, "PYTHONPATH": str(trees[tree]), **env}, stdout=subprocess.DEVNULL)))
            seed, world, proc = running.pop(0)
            if proc.wait() != 0:
                raise SystemExit(f"seed {seed}, {world}: the run failed")
            print(f"seed {seed}: {world} trained", flush=True)


def _runs(work: Path, world: str) -> dict[int, dict]:
    folder = work / world.replace(" ", "-")
    return {int(d.name[4:]): {"framework": "reference", "seed": int(d.name[4:]), "dir": d,
                              "steps": read_metrics(d / METRICS)}
            for d in sorted(folder.glob("seed*")) if (d / METRICS).is_file()}


def results(work: Path, out: Path, sets: int) -> None:
    config = json.loads((work / "config.json").read_text())
    worlds = {world: _runs(work, world) for world in WORLDS}
    seeds = sorted(set.intersection(*(set(runs) for runs in worlds.values())))
    if len(seeds) < SET:
        raise SystemExit(f"{work}: {len(seeds)} seeds trained in every world; {SET} at least")
    rng = np.random.default_rng(20261206)
    every = list(itertools.combinations(seeds, SET))
    drawn = [every[i] for i in sorted(rng.choice(len(every), min(sets, len(every)), replace=False))]
    disjoint = [tuple(seeds[i:i + SET]) for i in range(0, len(seeds) - SET + 1, SET)]
    record: dict = {"kl_coef": config["remax"]["kl_coef"], "seeds": seeds, "family_false_alarm": FAMILY_FALSE_ALARM,
                    "runs": [], "trials": {}}
    for world, runs in worlds.items():
        for seed, r in runs.items():
            steps = r["steps"].sort_values("step")
            (first, last), (_, kl) = edge_means(steps["reward_mean"]), edge_means(steps["kl_mean"])
            record["runs"].append({"world": world, "seed": seed, "reward_first": first, "reward_last": last,
                                   "kl_last": kl,
                                   "eval_accuracy": read_eval(r["dir"] / "eval.json")["eval_accuracy_after"]})
    print(f"{work}: the reference backend on cpu-short with {SFT_STEPS} SFT steps, kl_coef {record['kl_coef']:g}, "
          f"seeds {seeds[0]}..{seeds[-1]}")
    for world, group in pd.DataFrame(record["runs"]).groupby("world", sort=False):
        print(f"  {world:<19} reward first {group.reward_first.mean():.3f} -> last {group.reward_last.mean():.3f} "
              f"(sd across seeds {group.reward_last.std():.3f}), KL last {group.kl_last.mean():.2f} nats, eval "
              f"greedy accuracy {group.eval_accuracy.mean():.3f}")
    for world in ("another kernel path", "KL flipped"):
        verdicts = {trio: judge([worlds["original"][s] for s in trio], [worlds[world][s] for s in trio], config)
                    for trio in dict.fromkeys(drawn + disjoint)}
        called = {trio: v["verdict"] == "not consistent" for trio, v in verdicts.items()}
        figures = pd.DataFrame([f for trio in drawn for f in verdicts[trio]["figures"]],
                               columns=["figure", "verdict", "margin_spreads", "margin", "difference"])
        by_figure = figures.groupby("figure").agg(not_consistent=("verdict", lambda v: (v == "not consistent").mean()),
                                                  margin_spreads=("margin_spreads", "median"),
                                                  margin=("margin", "median"), difference=("difference", "median"))
        record["trials"][world] = {
            "sets": len(drawn), "not_consistent": float(np.mean([called[t] for t in drawn])),
            "identical": float(np.mean([verdicts[t]["verdict"] == "identical" for t in drawn])),
            "disjoint_sets": len(disjoint), "disjoint_not_consistent": int(sum(called[t] for t in disjoint)),
            "figures": by_figure.reset_index().to_dict("records")}
        t = record["trials"][world]
        print(f"  original against {world}: not consistent in {100 * t['not_consistent']:.1f}% of {t['sets']} sets "
              f"of {SET} seeds (identical {100 * t['identical']:.1f}%); disjoint sets: {t['disjoint_not_consistent']} "
              f"of {t['disjoint_sets']}")
        for f in t["figures"]:
            print(f"    {FIGURES.get(f['figure'], f['figure']):<24} not consistent {100 * f['not_consistent']:5.1f}%; "
                  f"median difference {f['difference']:+.3f}, margin {f['margin']:.3f} "
                  f"({f['margin_spreads']:.1f} seed spreads)")
    write_json(out, nan_as_null(record), role=RECORD_ROLE)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("run", "results"))
    ap.add_argument("--seeds", type=int, default=30)
    ap.add_argument("--kl-coef", type=float, default=KL_COEF)
    ap.add_argument("--work", type=Path, default=Path("reproduce-power"))
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "data" / "reproduce_power.json")
    ap.add_argument("--sets", type=int, default=1000, help="sets of 3 seeds drawn for the shares")
    args = ap.parse_args()
    if args.what == "run":
        run(args.seeds, args.kl_coef, args.work)
    results(args.work, args.out, args.sets)
    return 0


if __name__ == "__main__":
    sys.exit(main())
