"""The page of an A/B (`remax-bench ab`, harness.comparison.ab): the verdict, per-phase differences with their
intervals, the arms' package differences, behaviour per seed, every pair, and a figure of the phases and the reward
curves side by side."""

from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from harness.comparison.ab import package_changes, packages_text
from harness.io import write_text

PAGE = "index.md"
PAGE_ROLE = "A/B page"  # what PAGE is (harness.io.WRITTEN)
FIGURE = "ab.png"


def write_page(record: dict, out: Path) -> None:
    """The page and its figure, into the A/B's directory."""
    write_text(out / PAGE, page(record), role=PAGE_ROLE)
    _figure(record, out)


def _pct(x: float | None) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{100 * (x - 1):+.1f}%"


# With fewer pairs than this a row's t quantile at the looks' level runs to the thousands ("-100.0% to
# +1478349399804444409856.0%" with two): the row says so instead of an interval.
FEWEST_PAIRS_SHOWN = 3
# An interval wider than this factor (high / low) bounds nothing an A/B is for (a change of a few percent).
WIDEST_SHOWN = 4.0


def _interval(row: dict) -> str:
    low, high = row["low"], row["high"]
    if row["pairs"] < FEWEST_PAIRS_SHOWN:
        return f"too few pairs to bound ({row['pairs']})"
    if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)) or low <= 0 \
            or high / low > WIDEST_SHOWN:
        return f"too wide to bound with {row['pairs']} pairs"
    return f"{_pct(low)} to {_pct(high)}"


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{1000 * seconds:.3f}"


def _how(record: dict) -> str:
    cores = record["side_by_side"]
    if not cores:
        return "one run after the other in ABBA order"
    return (f"each pair's runs side by side, on cores {','.join(map(str, cores[0]))} and "
            f"{','.join(map(str, cores[1]))} in turn")


def page(record: dict) -> str:
    v = record["verdict"]
    arms = [f"- {label}: `{arm['spec']}` = {arm['commit'][:12]}" + (f", override `{json.dumps(arm['override'])}`"
                                                                     if arm["override"] else "")
            for label, arm in record["arms"].items()]
    arms += [f"- {label}'s ports, moved apart to run side by side: `{json.dumps(arm['ports'])}`"
             for label, arm in record["arms"].items() if arm.get("ports")]
    arms += [f"- {label}'s environment {name}: `{e['description']}` ({e['digest'][:12]})"
             for label, arm in record["arms"].items() for name, e in arm.get("envs", {}).items()]
    changed = package_changes(record)
    arms += ["", "Packages that differ between the arms' environments (A -> B): "
             + packages_text(changed)] if changed else []
    decided = record.get("decided_on", "tokens/s")
    basis = (f"Decided on {decided}: each step's tokens/s times the machine-speed probe timed right after it, so "
             "that the shared machine's drift, which slows the probe with the step, cancels; a slower line in the "
             "run's own code leaves the probe as it was." if decided != "tokens/s" else
             "Decided on tokens/s as measured (no machine-speed probe comparable between the arms).")
    profile = ([f"Each run took {record['framework']}'s A/B profile, `{json.dumps(record['profile'])}`, under the "
                "arms' overrides (`--as-configured`: the config's own steps).", ""] if record.get("profile") else [])
    lines = [f"# A/B of {record.get('framework', 'reference')}: is B slower than A?", "", f"**{v['text']}**", "",
             basis, "", *profile, *arms, "",
             f"{len(record['pairs'])} pairs in {record['minutes']:.1f} min, {_how(record)}, seeds "
             f"{', '.join(map(str, record['seeds']))}; each of the looks from pair {record['min_pairs']} to "
             f"{record['max_pairs']} at level {record['level']:.2g}, so that A against A is called different at most "
             f"{100 * record['alpha']:g}% of the time over all of them; \"no difference\" needs the interval within "
             f"{100 * record['resolution']:g}%.", "",
             "## B against A, per phase (median after warm-up of each run; ratio B/A with its interval)", "",
             "| figure | B/A | interval | pairs |", "|---|---:|---|---:|"]
    lines += [f"| {r['figure']} | {_pct(r['ratio'])} | {_interval(r)} | {r['pairs']} |" for r in record["phases"]]
    lines += ["", f"## {decided} per seed", "", "| seed | B/A | interval | pairs |", "|---:|---:|---|---:|"]
    lines += [f"| {r['seed']} | {_pct(r['ratio'])} | {_interval(r)} | {r['pairs']} |" for r in record["per_seed"]]
    lines += ["", "## Behaviour (B's first run of each seed against A's, step by step)", ""]
    lines += [f"- seed {r['seed']}: {r['text']}" + ("" if r["identical"] else " (a change in behaviour, not only "
                                                                                "in speed)")
              for r in record["behaviour"]]
    lines += ["", "## Pairs", "", "| pair | seed | order | A tokens/s | B tokens/s | A probe (ms) | B probe (ms) |",
              "|---:|---:|---|---:|---:|---:|---:|"]
    lines += [f"| {p['pair']} | {p['seed']} | {p['order']} | {p['A_throughput_tok_s']:.0f} | "
              f"{p['B_throughput_tok_s']:.0f} | {_ms(p.get('A_time_probe_s'))} | {_ms(p.get('B_time_probe_s'))} |"
              for p in record["pairs"]]
    lines += ["", f"![B against A]({FIGURE})", ""]
    return "\n".join(lines)


def _figure(record: dict, out: Path) -> None:
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    phases = pd.DataFrame(record["phases"])
    y = range(len(phases))
    # an interval the table calls too wide to bound is drawn as none: its bar would set the axis to thousands of %
    readable = [not _interval(r).startswith("too wide") for r in record["phases"]]
    low, high = phases["low"].where(readable, phases["ratio"]), phases["high"].where(readable, phases["ratio"])
    left.errorbar(100 * (phases["ratio"] - 1), y, fmt="o",
                  xerr=[100 * (phases["ratio"] - low), 100 * (high - phases["ratio"])])
    left.axvline(0, color="grey", lw=1)
    left.set_yticks(list(y), phases["figure"])
    left.set_xlabel("B against A, % (interval)")
    curves = pd.DataFrame([{"run": run, "step": s, "reward": r} for run, c in record["curves"].items()
                           for s, r in zip(c["step"], c["reward"])])
    sns.lineplot(curves, x="step", y="reward", hue="run", ax=right)
    right.set_title("reward curves (trailing mean)")
    fig.tight_layout()
    tmp = out / f".{FIGURE}.tmp.png"
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.rename(out / FIGURE)
