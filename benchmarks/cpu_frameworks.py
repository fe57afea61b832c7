"""Benchmark: the cpu-frameworks profile's results against its targets, and what verl's, OpenRLHF's and
DeepSpeed-Chat's runs cost around their steps.

    time snakemake --cores all --configfile workflows/config/cpu-frameworks.yaml   # from a clean checkout
    python benchmarks/cpu_frameworks.py [RESULTS_DIR]                               # default: results

Prints, per completed run, the reward gain (mean of the last 10% of steps minus the first 10%) and the eval greedy
accuracy before and after, and per run of verl, OpenRLHF and DeepSpeed-Chat where its wall time went, from its steps
as the adapter's ingest gave them (the common schema, results/metrics/) and the launch's record of its wall time
(launch.json): the framework's step timer (time_step_s, summed) and everything outside it. "Between steps" is the
time outside the step timer from the end of the first step to the end of the last, per step: the span of
time_step_end_s (each step's end as the framework's log states it, in whole seconds: verl's progress bar, OpenRLHF's
step lines; DeepSpeed-Chat's log states none) less the step times of the same steps. The harness runs nothing there
(the shared reward is called inside the step); it is the framework's own loop (metrics, loggers, OpenRLHF's weight
read-back).
Exits 1 when a learning target is missed: every framework's every seed gains >= 0.2 and its eval accuracy rises.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pandas as pd

from harness.frameworks.launch import LAUNCH_RECORD
from harness.results import layout
from harness.results.metrics import read_metrics

TARGET_GAIN = 0.2
# The frameworks whose costs are printed, and what their time outside the step timer holds besides the loop.
OUTSIDE = {
    "verl": "start-up, the validation passes before training and at the last step, shutdown",
    "openrlhf": "Ray, DeepSpeed and vLLM start-up, saving the actor, shutdown, the greedy evaluation",
    "dschat": "the deepspeed launcher, DeepSpeed's and the models' start-up, DeepSpeed-Chat's data build and "
              "evaluations, the launcher's greedy evaluation, saving the actor",
}
# verl validates at its last step (its plan's test_freq is the run's steps), outside its step timer: its time between
# steps stops at the step before, and the last step's time outside the timer is that validation pass.
VALIDATES_AT_LAST_STEP = {"verl"}


def between_steps(steps: pd.DataFrame, last: int) -> float:
    """Seconds per step outside the step timer from the end of the first step to the end of step `last`; nan where
    the log states no step's end."""
    span = steps[steps["step"] <= last].sort_values("step")
    if len(span) < 2:
        return math.nan
    ends = span["time_step_end_s"]
    return float((ends.iloc[-1] - ends.iloc[0] - span["time_step_s"].iloc[1:].sum()) / (len(span) - 1))


def costs(steps: pd.DataFrame, launch: dict, validates_at_last_step: bool) -> dict:
    """Where a run's wall time went: the step timer and what is outside it, and the time between steps."""
    last = int(steps["step"].max())
    wall, step_sum = launch["end"] - launch["start"], float(steps["time_step_s"].sum())
    ends, timer = steps.set_index("step")["time_step_end_s"], steps.set_index("step")["time_step_s"]
    return {"steps": len(steps), "wall_s": wall, "step_timer_s": step_sum, "outside_s": wall - step_sum,
            "step_median_s": float(timer.median()), "first_step_s": float(timer[timer.index.min()]),
            "gen_median_s": float(steps["time_gen_s"].median()),
            "train_median_s": float(steps["time_train_s"].median()),
            "between_steps_per_step_s": between_steps(steps, last - 1 if validates_at_last_step else last),
            "last_step_outside_s": float(ends[last] - ends.get(last - 1, math.nan) - timer[last])}


def cost_line(framework: str, seed: int, c: dict, validates_at_last_step: bool) -> str:
    between = c["between_steps_per_step_s"]
    validation = (f"; the last step {c['last_step_outside_s']:.1f} s outside its step timer (the validation pass)"
                  if validates_at_last_step else "")
    return (f"{framework} seed{seed}: {c['steps']} steps in {c['wall_s']:.0f} s wall: its step timer "
            f"{c['step_timer_s']:.0f} s (median step {c['step_median_s']:.2f} s: generation {c['gen_median_s']:.2f} s,"
            f" training {c['train_median_s']:.2f} s; first step {c['first_step_s']:.1f} s), outside it "
            f"{c['outside_s']:.0f} s ({OUTSIDE[framework]}); between steps "
            + ("not stated by its log" if math.isnan(between) else f"{between:.3f} s per step") + validation)


def main() -> int:
    results = Path(sys.argv[1] if len(sys.argv) > 1 else "results")
    summary = pd.read_csv(layout.path(results, layout.SUMMARY))
    missed = []
    print("framework seed  reward first10 -> last10 (gain)   eval greedy accuracy   tokens/s")
    for r in summary.itertuples():
        gain_ok = r.reward_gain >= TARGET_GAIN
        eval_ok = r.eval_accuracy_after > r.eval_accuracy_before
        if not (gain_ok and eval_ok):
            missed.append(f"{r.framework} seed {r.seed}")
        print(f"{r.framework:9} {r.seed:4}  {r.reward_first10:.3f} -> {r.reward_last10:.3f} ({r.reward_gain:+.3f})"
              f"{'' if gain_ok else ' MISSED'}   {r.eval_accuracy_before:.3f} -> {r.eval_accuracy_after:.3f}"
              f"{'' if eval_ok else ' MISSED'}   {r.throughput_tok_s:,.0f}")
    for r in summary[summary["framework"].isin(list(OUTSIDE))].itertuples():
        steps = read_metrics(layout.path(results, layout.METRICS, framework=r.framework, seed=r.seed))
        run = layout.path(results, layout.RUN, framework=r.framework, seed=r.seed)
        validates = r.framework in VALIDATES_AT_LAST_STEP
        c = costs(steps, json.loads((run / LAUNCH_RECORD).read_text()), validates)
        print(cost_line(r.framework, r.seed, c, validates))
    if missed:
        print(f"learning target missed (gain >= {TARGET_GAIN} and eval accuracy rising): {', '.join(missed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
