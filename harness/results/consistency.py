"""Whether a rerun of a comparison, on another machine, agrees with the original: a verdict per figure
(docs/reproducibility.md, "On another machine").

Off the original machine a run does not repeat bit for bit (another CPU, BLAS or thread count rounds differently), so
each seed's figures are draws, and the question is whether the rerun's seeds come from what the original's seeds
spread. Per framework and figure, the original's and the rerun's seeds are compared by a two-sample Student t test
(pooled spread: under "the same experiment" both sides spread alike); the figures of one comparison are held
together by Holm's step-down procedure, so that a rerun of the same experiment is called "not consistent" anywhere
with probability at most FAMILY_FALSE_ALARM, whatever the figures' correlation. Each verdict states its margin: the
difference the test calls "not consistent" with probability POWER, which with 3 seeds a side is several seed
spreads wide, and how many seeds a side would bring it to one seed spread.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from harness.results.student_t import t_quantile, two_sided_p
from harness.results.summarize import edge_means, reward_curve, time_to_reward

FAMILY_FALSE_ALARM = 0.05  # a rerun of the same experiment is called not consistent anywhere at most this often
POWER = 0.8  # the margin: a difference this large is called not consistent at least this often
MAX_SEEDS = 200  # the seeds a side the margin's advice looks up to

FIGURES = {"reward_gain": "reward gain", "final_reward": "final reward", "eval_accuracy": "eval greedy accuracy",
           "time_to_reward_step": "time-to-reward step", "step0_agreement": "step-0 agreement with the reference",
           "throughput_share": "tokens/s against the frameworks' geometric mean (log)"}


def run_figures(steps: pd.DataFrame, eval_accuracy: float, target: float, step0_agreement: float) -> dict:
    """A run's figures. The time-to-reward step is the first step whose trailing mean reward reaches `target` (one
    target for both sides: the original's); a run that never reaches it counts as its last step + 1."""
    first, last = edge_means(steps.sort_values("step")["reward_mean"])
    reached = time_to_reward(reward_curve(steps), target) if math.isfinite(target) else None
    step = float(reached[1]) if reached else (float(steps["step"].max()) + 1 if math.isfinite(target) else math.nan)
    return {"reward_gain": last - first, "final_reward": last, "eval_accuracy": eval_accuracy,
            "time_to_reward_step": step, "step0_agreement": step0_agreement}


def throughput_shares(tokens: pd.DataFrame) -> pd.DataFrame:
    """Tidy rows (side, framework, seed, figure, value) of each framework's log tokens/s less the mean of every
    framework's in the same side and seed: the comparison a reader takes away, with the machine's speed divided out.
    `tokens`: (side, framework, seed, tokens_per_s); a seed where a framework has no figure is left out of its side."""
    ok = tokens[np.isfinite(tokens["tokens_per_s"]) & (tokens["tokens_per_s"] > 0)]
    frameworks = ok["framework"].nunique()
    if frameworks < 2:
        return pd.DataFrame(columns=["side", "framework", "seed", "figure", "value"])
    logs = ok.assign(value=np.log(ok["tokens_per_s"]))
    complete = logs.groupby(["side", "seed"])["framework"].transform("nunique") == frameworks
    logs = logs[complete]
    logs = logs.assign(value=logs["value"] - logs.groupby(["side", "seed"])["value"].transform("mean"))
    return logs.assign(figure="throughput_share")[["side", "framework", "seed", "figure", "value"]]


def _margin_multiple(alpha: float, dof: int, n_original: int, n_rerun: int) -> float:
    """The margin over the pooled seed spread: (t at the test's level + t at POWER) x the standard error's factor."""
    return (t_quantile(alpha, dof) + t_quantile(2 * (1 - POWER), dof)) * math.sqrt(1 / n_original + 1 / n_rerun)


def seeds_for_one_spread(alpha: float) -> int | None:
    """The seeds a side at which the margin is one seed spread at the level `alpha`; None past MAX_SEEDS."""
    return next((n for n in range(2, MAX_SEEDS + 1) if _margin_multiple(alpha, 2 * n - 2, n, n) <= 1), None)


def _test(original: np.ndarray, rerun: np.ndarray) -> dict:
    """The two-sample t test of one figure: means, pooled spread, p (exact when neither side spreads)."""
    n_o, n_r = len(original), len(rerun)
    row = {"n_original": n_o, "n_rerun": n_r, "original": float(original.mean()) if n_o else math.nan,
           "rerun": float(rerun.mean()) if n_r else math.nan}
    row["difference"] = row["rerun"] - row["original"]
    dof = n_o + n_r - 2
    if n_o < 1 or n_r < 1 or dof < 1:
        return {**row, "dof": max(dof, 0), "sd": math.nan, "p": math.nan}
    ss = float(((original - original.mean()) ** 2).sum() + ((rerun - rerun.mean()) ** 2).sum())
    sd = math.sqrt(ss / dof)
    if sd == 0:  # the seeds do not spread (a figure the seed does not touch): only equality is consistent
        return {**row, "dof": dof, "sd": 0.0, "p": 1.0 if row["difference"] == 0 else 0.0}
    t = row["difference"] / (sd * math.sqrt(1 / n_o + 1 / n_r))
    return {**row, "dof": dof, "sd": sd, "p": two_sided_p(t, dof)}


def verdicts(figures: pd.DataFrame) -> pd.DataFrame:
    """One row per (framework, figure) from tidy rows (side: original | rerun, framework, seed, figure, value):
    both sides' means, their difference, the pooled seed spread, p, the verdict (consistent | not consistent |
    untested: too few seeds), its margin (in the figure's units and in seed spreads) and the seeds a side for a
    margin of one spread. Holm over every tested row: FAMILY_FALSE_ALARM for the whole comparison."""
    finite = figures[np.isfinite(figures["value"].astype(float))]
    values = {key: group.to_numpy(float) for key, group in finite.groupby(["framework", "figure", "side"])["value"]}
    none = np.array([])
    rows = [{"framework": framework, "figure": figure, "label": FIGURES.get(figure, figure),
             **_test(values.get((framework, figure, "original"), none), values.get((framework, figure, "rerun"), none))}
            for framework, figure in dict.fromkeys((f, g) for f, g, _ in values)]
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    tested = table["p"].notna()
    m = int(tested.sum())
    table["verdict"] = np.where(tested, "consistent", "untested")
    # Holm: the k-th smallest p is held to alpha / (m - k + 1), and once one holds, every larger p holds too
    for k, index in enumerate(table.loc[tested, "p"].sort_values(kind="stable").index):
        if table.at[index, "p"] > FAMILY_FALSE_ALARM / (m - k):
            break
        table.at[index, "verdict"] = "not consistent"
    # The margin at the strictest level Holm holds a figure to (Bonferroni's): what it resolves at the least
    level = FAMILY_FALSE_ALARM / max(m, 1)
    table["margin_spreads"] = [_margin_multiple(level, int(r.dof), int(r.n_original), int(r.n_rerun))
                               if r.dof >= 1 else math.nan for r in table.itertuples()]
    table["margin"] = table["margin_spreads"] * table["sd"]
    table["seeds_for_one_spread"] = seeds_for_one_spread(level)
    table["family_false_alarm"], table["power"] = FAMILY_FALSE_ALARM, POWER
    return table
