"""Benchmark: how often `remax-bench ab` calls a 5% slower line of code slower, and A against A slower, on the
cpu-short profile, and in how many pairs and minutes.

    python benchmarks/ab_power.py run [--pairs 30] [--size 72] [--out benchmarks/data/ab_power.json]
    python benchmarks/ab_power.py results [--out ...] [--max-pairs 30] [--min-pairs 3]

`run` clones this repository's HEAD, adds one commit that puts a needless eigenvalue decomposition of a size x size
matrix into the policy's forward pass (tests/test_ab.py's slower line, smaller: 72 costs about 5%), and runs
--pairs pairs of A (HEAD) against B (that commit) and as many of A against A, interleaved (AB, AA, BA, AA, ...), each
run as `ab` runs it (`python -P -m harness.cli run reference` from the arm's checkout), pair k on seed k mod 3. Each
pair's figures (ab.phase_medians: tokens/s, tokens/s at equal machine speed, the probe) go to --out as they come.

`results` replays `ab`'s sequential decision (ab.decision_basis, paired.decide, the same alpha, looks and minimum) on
the recorded pairs in 4,000 random orders per arm pair (A against A's arms also swapped at random, as exchangeable
arms may be; --max-pairs at most the pairs recorded): the chance that B is called slower, that A against A is called
different, and the pairs and minutes a decision takes. The runs are real; only their order is resampled, which
treats pairs as exchangeable (the interleaving is what makes them so). Nothing else should run on the machine
meanwhile.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from harness.comparison.ab import EQUAL_SPEED, FIGURES, PROBE, decision_basis, log_ratios, phase_medians  # noqa: E402
from harness.comparison.paired import decide  # noqa: E402

CONFIG = REPO / "benchmarks" / "regression_short.yaml"
WARMUP = 10  # regression_short.yaml's remax.warmup_steps
MODEL = "harness/frameworks/reference/model.py"
ANCHOR = "        rows, width = tokens.shape\n"


def _arms(root: Path, size: int) -> dict[str, Path]:
    """Two checkouts: A at this repository's HEAD, B with the slower line committed on top."""
    a, b = root / "A", root / "B"
    for tree in (a, b):
        subprocess.run(["git", "clone", "-q", "--no-local", str(REPO), str(tree)], check=True)
    path = b / MODEL
    text = path.read_text()
    assert text.count(ANCHOR) == 1, f"{MODEL}: the line the slowdown follows is gone"
    path.write_text(text.replace(ANCHOR, f"{ANCHOR}        torch.linalg.eigvalsh(torch.eye({size}) + 0.01)\n"))
    who = ["-c", "user.name=remax-bench benchmark", "-c", "user.email=benchmark@remax-bench.invalid"]
    subprocess.run(["git", "-C", str(b), *who, "commit", "-qam", f"eigvalsh of {size}x{size} per forward"], check=True)
    return {"A": a, "B": b}


def _train(tree: Path, seed: int, out: Path, inputs: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    subprocess.run([sys.executable, "-P", "-m", "harness.cli", "train", "reference", "--config", str(CONFIG), "--seed",
                    str(seed), "--out", str(out), "--inputs", str(inputs)], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    figures = phase_medians(out, WARMUP)
    return {k: figures[k] for k in FIGURES}


def run(pairs: int, size: int, out: Path) -> None:
    record: dict = {"size": size, "config": str(CONFIG.relative_to(REPO)), "commit": subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
        "AB": [], "AA": []}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        trees = _arms(root, size)
        env = {**os.environ, "PYTHONPATH": str(trees["A"])}
        for what in ("dataset", "policy", "reward"):
            subprocess.run([sys.executable, "-P", "-m", "harness.cli", "inputs", what, "--config", str(CONFIG),
                            "--inputs", str(root / "inputs")], env=env, check=True, stdout=subprocess.DEVNULL)
        for k in range(pairs):
            seed = 1 + k % 3
            for kind in ("AB", "AA"):
                order, started, figures = "AB" if k % 2 == 0 else "BA", time.monotonic(), {}
                for label in order:  # in A against A, "B" is the second arm, running A's checkout too
                    tree = trees["A" if kind == "AA" else label]
                    figures[label] = _train(tree, seed, root / "runs" / f"{kind}{k}{label}", root / "inputs")
                pair = {"pair": k + 1, "seed": seed, "order": order, "seconds": time.monotonic() - started,
                        **{f"{arm}_{f}": figures[arm][f] for arm in "AB" for f in FIGURES}}
                record[kind].append(pair)
                raw, equal = (math.exp(log_ratios([pair], f)[0]) for f in ("throughput_tok_s", EQUAL_SPEED))
                print(f"{kind} pair {k + 1}: tokens/s B/A {raw:.3f}, at equal machine speed {equal:.3f}", flush=True)
                tmp_out = out.with_suffix(".tmp")
                tmp_out.write_text(json.dumps(record, indent=1))
                tmp_out.rename(out)


def _swapped(pair: dict) -> dict:
    return {**pair, **{f"{arm}_{f}": pair[f"{other}_{f}"] for arm, other in ("AB", "BA") for f in FIGURES}}


def _sequence(pool: list[dict], rng: np.random.Generator, max_pairs: int, min_pairs: int, alpha: float,
              resolution: float, exchangeable: bool) -> dict:
    """One A/B as `ab` decides it, on the pairs of `pool` in a random order. Where the arms are exchangeable (A
    against A), each pair's arms are also swapped at random: the pool's own mean difference is noise there, not a
    truth the sequences should inherit."""
    draws = [pool[i] for i in rng.permutation(len(pool))[:max_pairs]]  # each real pair once: no run counted twice
    if exchangeable:
        draws = [_swapped(p) if flip else p for p, flip in zip(draws, rng.integers(0, 2, max_pairs))]
    looks = max_pairs - min_pairs + 1
    for n in range(min_pairs, max_pairs + 1):
        basis = decision_basis(draws[:n], True, alpha / looks)
        verdict = decide(log_ratios(draws[:n], basis), alpha=alpha, looks=looks, resolution=resolution,
                         final=n == max_pairs)
        if verdict["verdict"] != "continue":
            return {**verdict, "basis": basis, "seconds": sum(p["seconds"] for p in draws[:n])}
    raise AssertionError("the last look decides")


def results(out: Path, max_pairs: int, min_pairs: int, alpha: float, resolution: float) -> None:
    record = json.loads(out.read_text())
    if max_pairs > min(len(record["AB"]), len(record["AA"])):
        raise SystemExit(f"--max-pairs {max_pairs}: {out} holds {len(record['AB'])} A/B and {len(record['AA'])} A/A "
                         "pairs; each sequence uses each pair at most once")
    print(f"{out}: eigvalsh of {record['size']}x{record['size']} per forward, at {record['commit'][:12]}; "
          f"{len(record['AB'])} pairs A/B, {len(record['AA'])} A/A")
    for kind in ("AB", "AA"):
        pool = record[kind]
        for figure in ("throughput_tok_s", EQUAL_SPEED, PROBE):
            x = np.array(log_ratios(pool, figure))
            print(f"  {kind} {FIGURES[figure]:<32} B/A {100 * math.expm1(x.mean()):+6.2f}% (per pair sd of the log "
                  f"ratio {x.std(ddof=1):.3f})")
    rng = np.random.default_rng(20261204)
    print(f"ab's decision (alpha {alpha}, pairs {min_pairs}..{max_pairs}), 4000 sequences drawn from the pairs:")
    for kind in ("AB", "AA"):
        seqs = [_sequence(record[kind], rng, max_pairs, min_pairs, alpha, resolution, kind == "AA")
                for _ in range(4000)]
        counts = {v: sum(s["verdict"] == v for s in seqs) / len(seqs) for v in ("slower", "faster", "same",
                                                                                 "inconclusive")}
        pairs = np.array([s["pairs"] for s in seqs])
        minutes = np.array([s["seconds"] for s in seqs]) / 60
        on_probe = sum(s["basis"] == EQUAL_SPEED for s in seqs) / len(seqs)
        print(f"  {kind}: " + ", ".join(f"{v} {100 * c:.1f}%" for v, c in counts.items())
              + f"; pairs median {np.median(pairs):.0f} (95th pct {np.percentile(pairs, 95):.0f}); minutes median "
              f"{np.median(minutes):.1f} (95th pct {np.percentile(minutes, 95):.1f}, max {minutes.max():.1f}); "
              f"decided at equal machine speed {100 * on_probe:.0f}%")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("run", "results"))
    ap.add_argument("--pairs", type=int, default=30)
    ap.add_argument("--size", type=int, default=72)
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "data" / "ab_power.json")
    ap.add_argument("--max-pairs", type=int, default=30)
    ap.add_argument("--min-pairs", type=int, default=3)
    ap.add_argument("--alpha", type=float, default=0.01)
    ap.add_argument("--resolution", type=float, default=0.03)
    args = ap.parse_args()
    if args.what == "run":
        run(args.pairs, args.size, args.out)
    results(args.out, args.max_pairs, args.min_pairs, args.alpha, args.resolution)
    return 0


if __name__ == "__main__":
    sys.exit(main())
