"""Benchmark: how often `remax-bench ab` calls a slower line of code slower, and A against A different, and in how
many pairs and minutes: on the cpu-short profile (the reference backend), or on a planned framework's A/B profile.

    python benchmarks/ab_power.py run [--pairs 60] [--size 56] [--one-at-a-time] [--out benchmarks/data/ab_power.json]
    python benchmarks/ab_power.py run --framework openrlhf --size 240 --pairs 10 --out OUT.json \
        --config workflows/config/cpu.yaml workflows/config/cpu-frameworks.yaml
    python benchmarks/ab_power.py results [--out ...] [--max-pairs 100] [--min-pairs 3] [--max-minutes 15]
                                          [--aa-also OTHER.json ...]

`run` clones this repository's HEAD, adds one commit that puts a needless eigenvalue decomposition of a size x size
matrix into the framework's own path (FAULTS: the reference policy's forward pass, test_ab.py's slower line, smaller:
72 cost 5.4%, 56 4.2%, 46 3.6%, 30 3.1%, 24 2.6%; OpenRLHF's, each sample's rollout in its vLLM rollout actor, the
harness's ReMax agent, run from the arm's checkout, so both arms launch with the one environment already built), and
runs --pairs pairs of A (HEAD) against B (that commit) and as many of A against A, interleaved (AB, AA, BA, AA, ...),
each pair as `ab` runs it (ab.run_pair: side by side where ab.side_by_side finds cores for each run, B's ports moved
apart, else one after the other), pair k on seed k mod 3. A planned framework's runs take its A/B profile
(the adapter's ab_profile) over the --config files, merged in order. Each pair's figures (ab.phase_medians: tokens/s,
tokens/s at equal machine speed and the probe where the reference times it, each phase, the time outside the steps)
and its wall time go to --out as they come.

`results` replays `ab`'s sequential decision (ab.decision_basis, paired.decide, the same level, looks, minimum and
time cap) on the recorded pairs in 4,000 random orders per arm pair (A against A's arms also swapped at random, as
exchangeable arms may be; --max-pairs at most the pairs recorded): the chance that B is called slower, that A
against A is called different, and the pairs and minutes a decision takes. The runs are real; only their order is
resampled, which treats pairs as exchangeable (the interleaving is what makes them so); --aa-also pools other records'
A against A pairs with this one's, for a false-alarm rate resting on more pairs. Nothing else should run on the
machine meanwhile.
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
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from harness.comparison import ab, arms  # noqa: E402
from harness.comparison.paired import decide, detectable_change, look_alpha  # noqa: E402
from harness.frameworks import get_adapter  # noqa: E402
from harness.frameworks.registry import environment  # noqa: E402
from harness.runtime import envs  # noqa: E402

CONFIG = [REPO / "benchmarks" / "regression_short.yaml"]
# framework -> (the file the slower line goes into, the line it follows, an import it needs after that file's line)
FAULTS = {
    "reference": ("harness/frameworks/reference/model.py", "        rows, width = tokens.shape\n", None),
    # each sample's rollout, in OpenRLHF's vLLM rollout actor (the harness's ReMax agent, run from the arm's checkout)
    "openrlhf": ("harness/frameworks/openrlhf/inside/remax/remax_agent.py",
                 "        sampling_params = deepcopy(sampling_params)\n", ("import aiohttp\n", "import torch\n")),
}


def _arms(root: Path, size: int, framework: str) -> dict[str, Path]:
    """Two checkouts: A at this repository's HEAD, B with the slower line committed on top."""
    a, b = root / "A", root / "B"
    for tree in (a, b):
        subprocess.run(["git", "clone", "-q", "--no-local", str(REPO), str(tree)], check=True)
    where, anchor, needs = FAULTS[framework]
    path = b / where
    text = path.read_text()
    assert text.count(anchor) == 1, f"{where}: the line the slowdown follows is gone"
    text = text.replace(anchor, f"{anchor}        torch.linalg.eigvalsh(torch.eye({size}) + 0.01)\n")
    if needs:
        text = text.replace(needs[0], needs[0] + needs[1], 1)
    path.write_text(text)
    who = ["-c", "user.name=remax-bench benchmark", "-c", "user.email=benchmark@remax-bench.invalid"]
    subprocess.run(["git", "-C", str(b), *who, "commit", "-qam", f"eigvalsh of {size}x{size} per forward"], check=True)
    return {"A": a, "B": b}


def run(pairs: int, size: int, together: bool, out: Path, framework: str, configs: list[Path]) -> None:
    raw: dict = {}
    for path in configs:  # in order, each over the last, as Snakemake's --configfile
        raw = arms.merge(raw, yaml.safe_load(path.read_text()))
    raw = arms.merge({**raw, "frameworks": [framework]}, get_adapter(framework).ab_profile)
    named = [str(p.resolve().relative_to(REPO)) for p in configs]
    record: dict = {"size": size, "framework": framework, "config": named,
                    "commit": subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                                             text=True).stdout.strip(), "AB": [], "AA": []}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        trees = _arms(root, size, framework)
        env = {**os.environ, "PYTHONPATH": str(trees["A"])}
        frozen = root / "config.json"
        for dest in (frozen, root / "config-B.json"):  # B's own, where separate_ports moves its ports
            subprocess.run([sys.executable, "-P", "-m", "harness.cli", "freeze-config", "--json", json.dumps(raw),
                            "--out", str(dest)], env=env, check=True)
        for what in ("dataset", "policy", "reward"):
            subprocess.run([sys.executable, "-P", "-m", "harness.cli", "inputs", what, "--config", str(frozen),
                            "--inputs", str(root / "inputs")], env=env, check=True, stdout=subprocess.DEVNULL)
        config = json.loads(frozen.read_text())
        in_env = environment(get_adapter(framework), config)
        lent = envs.ENV_ROOT if in_env else None  # the planted line is in the arm's checkout, not in its environment
        # in A against A, "B" is the second arm, running A's checkout too
        pair = {kind: (arms.Arm("A", "A", tree=trees["A"], config=frozen, commit=kind, env_root=lent),
                       arms.Arm("B", "B", tree=trees["A" if kind == "AA" else "B"], config=root / "config-B.json",
                                commit=kind, env_root=lent))
                for kind in ("AB", "AA")}
        (root / "logs").mkdir()
        cores = ab.side_by_side(pair["AB"], in_env, framework) if together else None
        if cores and in_env:
            arms.separate_ports(pair["AB"], raw, framework, root / "logs" / "ports.log")
        record["side_by_side"] = cores
        for k in range(pairs):
            for kind in ("AB", "AA"):
                started = time.monotonic()
                done = ab.run_pair(pair[kind], framework, config, 1 + k % 3, k, root / "inputs", root / kind,
                                   root / "logs", cores)
                record[kind].append({**{f: v for f, v in done.items() if f != "steps"},
                                     "seconds": time.monotonic() - started})
                shown = ", ".join(f"{ab.FIGURES[f]} {math.exp(ab.log_ratios([done], f)[0]):.3f}"
                                  for f in ab.FIGURES if done[f"A_{f}"] and done[f"B_{f}"])
                print(f"{kind} pair {k + 1}: B/A {shown}", flush=True)
                tmp_out = out.with_suffix(".tmp")
                tmp_out.write_text(json.dumps(record, indent=1))
                tmp_out.rename(out)


def _swapped(pair: dict) -> dict:
    return {**pair, **{f"{arm}_{f}": pair.get(f"{other}_{f}") for arm, other in ("AB", "BA") for f in ab.FIGURES}}


def _sequence(pool: list[dict], rng: np.random.Generator, max_pairs: int, min_pairs: int, max_minutes: float,
              alpha: float, resolution: float, exchangeable: bool) -> dict:
    """One A/B as `ab` decides it, on the pairs of `pool` in a random order, up to its pairs or its minutes (the
    pool's pairs' own wall times). Where the arms are exchangeable (A against A), each pair's arms are also swapped
    at random: the pool's own mean difference is noise there, not a truth the sequences should inherit."""
    draws = [pool[i] for i in rng.permutation(len(pool))[:max_pairs]]  # each real pair once: no run counted twice
    if exchangeable:
        draws = [_swapped(p) if flip else p for p, flip in zip(draws, rng.integers(0, 2, len(draws)))]
    level = look_alpha(alpha, min_pairs, max_pairs)
    seconds = np.cumsum([p["seconds"] for p in draws])
    for n in range(1, len(draws) + 1):
        final = n == len(draws) or seconds[n - 1] / 60 >= max_minutes
        if n >= min_pairs or final:
            basis = ab.decision_basis(draws[:n], True, level)
            verdict = decide(ab.log_ratios(draws[:n], basis), level=level, resolution=resolution, final=final)
            if verdict["verdict"] != "continue":
                return {**verdict, "basis": basis, "seconds": seconds[n - 1]}
    raise AssertionError("the last look decides")


def _moved(pool: list[dict], slowdown: float) -> list[dict]:
    """The pool with B's tokens/s (as measured, and at equal machine speed where timed) scaled in every pair so that
    the mean log ratio is that of `slowdown`: the planted fault's real spread at another size, an extrapolation."""
    moved = [dict(p) for p in pool]
    for figure in ("throughput_tok_s", ab.EQUAL_SPEED):
        if all(p.get(f"A_{figure}") and p.get(f"B_{figure}") for p in pool):
            by = math.log1p(-slowdown) - float(np.mean(ab.log_ratios(pool, figure)))
            for p in moved:
                p[f"B_{figure}"] *= math.exp(by)
    return moved


def results(out: Path, max_pairs: int, min_pairs: int, max_minutes: float, alpha: float, resolution: float,
            aa_also: list[Path], slowdown: float | None = None) -> None:
    record = json.loads(out.read_text())
    if slowdown is not None:
        record["AB"] = _moved(record["AB"], slowdown)
        print(f"(an extrapolation: the A/B pool's pairs moved to a mean slowdown of {100 * slowdown:g}%, their spread "
              "kept)")
    for other in aa_also:  # both arms of A against A are one checkout in every record: its pairs pool
        record["AA"] = record["AA"] + json.loads(other.read_text())["AA"]
    pool = min(len(record["AB"]), len(record["AA"]))
    how = f"side by side on cores {record['side_by_side']}" if record.get("side_by_side") else "one after the other"
    print(f"{out}: eigvalsh of {record['size']}x{record['size']} in {record.get('framework', 'reference')}'s path, "
          f"at {record['commit'][:12]}; "
          f"{len(record['AB'])} pairs A/B, {len(record['AA'])} A/A, {how}")
    if max_pairs > pool:  # each sequence uses each real pair at most once; the time cap may stop it sooner
        print(f"  (a sequence still undecided after the {pool} pairs recorded ends there as inconclusive, where `ab` "
              f"would go on to --max-pairs {max_pairs} or the time cap; the boundary is {max_pairs} looks')")
    for kind in ("AB", "AA"):
        pool = record[kind]
        for figure in ab.FIGURES:
            if not all(p.get(f"A_{figure}") and p.get(f"B_{figure}") for p in pool):
                continue
            x = np.array(ab.log_ratios(pool, figure))
            print(f"  {kind} {ab.FIGURES[figure]:<32} B/A {100 * math.expm1(x.mean()):+6.2f}% (per pair sd of the log "
                  f"ratio {x.std(ddof=1):.3f})")
    level = look_alpha(alpha, min_pairs, max_pairs)
    minutes_a_pair = float(np.mean([p["seconds"] for p in record["AA"]])) / 60
    budget_pairs = min(max_pairs, math.floor(max_minutes / minutes_a_pair))
    basis = ab.decision_basis(record["AA"], True, level)
    seen = detectable_change(ab.log_ratios(record["AA"], basis), level, budget_pairs)
    print(f"what {max_minutes:g} min sees ({minutes_a_pair:.1f} min a pair, {budget_pairs} pairs, A against A's spread "
          f"on {ab.FIGURES[basis]}): " + (f"a {100 * seen:.1f}% slowdown 4 times in 5" if seen else "n/a"))
    rng = np.random.default_rng(20261204)
    print(f"ab's decision (alpha {alpha}, level {look_alpha(alpha, min_pairs, max_pairs):.2g} at each look of pairs "
          f"{min_pairs}..{max_pairs}, at most {max_minutes:g} min, resolution {resolution:g}), 4000 sequences drawn "
          "from the pairs:")
    for kind in ("AB", "AA"):
        seqs = [_sequence(record[kind], rng, max_pairs, min_pairs, max_minutes, alpha, resolution, kind == "AA")
                for _ in range(4000)]
        counts = {v: sum(s["verdict"] == v for s in seqs) / len(seqs) for v in ("slower", "faster", "same",
                                                                                 "inconclusive")}
        pairs = np.array([s["pairs"] for s in seqs])
        minutes = np.array([s["seconds"] for s in seqs]) / 60
        on_probe = sum(s["basis"] == ab.EQUAL_SPEED for s in seqs) / len(seqs)
        print(f"  {kind}: " + ", ".join(f"{v} {100 * c:.1f}%" for v, c in counts.items())
              + f"; pairs median {np.median(pairs):.0f} (95th pct {np.percentile(pairs, 95):.0f}); minutes median "
              f"{np.median(minutes):.1f} (95th pct {np.percentile(minutes, 95):.1f}, max {minutes.max():.1f}); "
              f"decided at equal machine speed {100 * on_probe:.0f}%")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("run", "results"))
    ap.add_argument("--pairs", type=int, default=60)
    ap.add_argument("--size", type=int, default=56)
    ap.add_argument("--framework", choices=sorted(FAULTS), default="reference")
    ap.add_argument("--config", type=Path, nargs="+", default=CONFIG,
                    help="config files, each over the last (default: benchmarks/regression_short.yaml)")
    ap.add_argument("--one-at-a-time", action="store_true", help="as `ab --one-at-a-time`")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "data" / "ab_power.json")
    ap.add_argument("--max-pairs", type=int, default=100)  # ab's defaults
    ap.add_argument("--min-pairs", type=int, default=3)
    ap.add_argument("--max-minutes", type=float, default=15.0)
    ap.add_argument("--alpha", type=float, default=0.01)
    ap.add_argument("--resolution", type=float, default=0.02)
    ap.add_argument("--aa-also", type=Path, nargs="*", default=[],
                    help="other records whose A against A pairs join this one's (results)")
    ap.add_argument("--as-slowdown", type=float, metavar="FRACTION",
                    help="results: replay the A/B pool moved to this mean slowdown, its spread kept (an extrapolation)")
    args = ap.parse_args()
    if args.what == "run":
        run(args.pairs, args.size, not args.one_at_a_time, args.out, args.framework, args.config)
    results(args.out, args.max_pairs, args.min_pairs, args.max_minutes, args.alpha, args.resolution, args.aa_also,
            args.as_slowdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
