"""Benchmark: the cpu-frameworks profile's results against its targets, and what verl's, OpenRLHF's and
DeepSpeed-Chat's runs cost around their steps.

    time snakemake --cores all --configfile workflows/config/cpu-frameworks.yaml   # from a clean checkout
    python benchmarks/cpu_frameworks.py [RESULTS_DIR]                               # default: results

Prints, per completed run, the reward gain (mean of the last 10% of steps minus the first 10%) and the eval greedy
accuracy before and after, and per verl run where its wall time went: verl's own step timer (timing_s/step, summed),
its validation passes (timing_s/testing and the pass before training), and everything else. "Between steps" is the
time outside verl's step timer from the end of step 1 to the end of the last step, per step: tqdm's elapsed time at
each step (whole seconds, printed by verl's trainer) less the step times verl logged for the same steps. The harness
runs nothing there (the shared reward is called inside verl's step); it is verl's own loop (metrics, loggers).
Exits 1 when a learning target is missed: every framework's every seed gains >= 0.2 and its eval accuracy rises.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pandas as pd

from harness.results import layout

TARGET_GAIN = 0.2
_TQDM = re.compile(r"Training Progress:.*\|\s*(\d+)/(\d+) \[(?:(\d+):)?(\d+):(\d+)<")


def tqdm_elapsed(console: Path) -> dict[int, int]:
    """Seconds elapsed at each finished step, as verl's progress bar prints them (last print per step wins)."""
    out = {}
    for line in console.read_text(errors="replace").splitlines():
        for m in _TQDM.finditer(line):
            h, mm, ss = int(m.group(3) or 0), int(m.group(4)), int(m.group(5))
            out[int(m.group(1))] = 3600 * h + 60 * mm + ss
    return out


def verl_costs(run: Path) -> dict:
    records = [json.loads(x) for x in (run / "verl_metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = {r["step"]: r["data"] for r in records if "timing_s/step" in r["data"]}
    launch = json.loads((run / "launch.json").read_text())
    elapsed = tqdm_elapsed(run / "console.log")
    last = max(steps)
    step_sum = sum(d["timing_s/step"] for d in steps.values())
    testing = sum(d.get("timing_s/testing", 0.0) for d in steps.values())
    between = ((elapsed[last] - elapsed[1]) - sum(steps[s]["timing_s/step"] + steps[s].get("timing_s/testing", 0.0)
                                                   for s in range(2, last + 1))) / (last - 1)
    return {"steps": last, "wall_s": launch["end"] - launch["start"], "step_timer_s": step_sum,
            "step_median_s": float(pd.Series([d["timing_s/step"] for d in steps.values()]).median()),
            "first_step_s": steps[1]["timing_s/step"], "testing_s": testing,
            "outside_steps_s": launch["end"] - launch["start"] - step_sum,
            "between_steps_per_step_s": between}


def dschat_costs(run: Path) -> dict:
    """DeepSpeed-Chat's wall time against the launcher's step lines (rollout start to optimizer step)."""
    steps = [json.loads(x) for x in (run / "dschat_steps.log").read_text().splitlines() if x.strip()]
    launch = json.loads((run / "launch.json").read_text())
    step_sum = sum(s["time_step_s"] for s in steps)
    return {"steps": len(steps), "wall_s": launch["end"] - launch["start"], "step_sum_s": step_sum,
            "step_median_s": float(pd.Series([s["time_step_s"] for s in steps]).median()),
            "gen_median_s": float(pd.Series([s["time_gen_s"] for s in steps]).median()),
            "train_median_s": float(pd.Series([s["time_train_s"] for s in steps]).median())}


# OpenRLHF's step line (harness.frameworks.openrlhf.ingest: trainer/ppo_trainer.py through utils/logging_utils.py, whose
# datefmt prints month-day and whole seconds).
_OPENRLHF_STEP = re.compile(r"(\d\d-\d\d \d\d:\d\d:\d\d) ppo_trainer\.py:\d+\] ✨ Global step (\d+): (\{.*\})")


def openrlhf_costs(run: Path) -> dict:
    """OpenRLHF's wall time against its own step timer (timing/step_total). "Between steps": the time from step 1's
    line to the last step's line (whole-second timestamps) less the step times logged for steps 2..last, per step:
    what OpenRLHF's loop does outside its timer (the weight read-back, loggers)."""
    import ast
    from datetime import datetime

    from harness.frameworks.openrlhf.ingest import ANSI

    at, timer = {}, {}
    for line in (run / "openrlhf.log").read_text(errors="replace").splitlines():
        m = _OPENRLHF_STEP.search(ANSI.sub("", line))
        if m:
            step = int(m.group(2))
            at[step] = datetime.strptime(m.group(1), "%m-%d %H:%M:%S")
            timer[step] = ast.literal_eval(m.group(3))["timing/step_total"]
    launch = json.loads((run / "launch.json").read_text())
    last = max(timer)
    between = ((at[last] - at[1]).total_seconds() - sum(timer[s] for s in range(2, last + 1))) / (last - 1)
    return {"steps": last, "wall_s": launch["end"] - launch["start"], "step_timer_s": sum(timer.values()),
            "step_median_s": float(pd.Series(list(timer.values())).median()), "first_step_s": timer[1],
            "between_steps_per_step_s": between}


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
    for run in sorted(results.glob(layout.RUN.format(framework="verl", seed="*"))):
        c = verl_costs(run)
        print(f"verl {run.name}: {c['steps']} steps in {c['wall_s']:.0f} s wall: verl's step timer "
              f"{c['step_timer_s']:.0f} s"
              f" (median step {c['step_median_s']:.2f} s, first step {c['first_step_s']:.1f} s), validation "
              f"{c['testing_s']:.1f} s at the end, outside the step timer {c['outside_steps_s']:.0f} s (start-up, the "
              f"validation before training, shutdown); between steps {c['between_steps_per_step_s']:.3f} s per step")
    for run in sorted(results.glob(layout.RUN.format(framework="openrlhf", seed="*"))):
        c = openrlhf_costs(run)
        print(f"openrlhf {run.name}: {c['steps']} steps in {c['wall_s']:.0f} s wall: OpenRLHF's step timer "
              f"{c['step_timer_s']:.0f} s (median step {c['step_median_s']:.2f} s, first step {c['first_step_s']:.1f} "
              f"s), outside it {c['wall_s'] - c['step_timer_s']:.0f} s (Ray, DeepSpeed and vLLM start-up, saving the "
              f"actor, shutdown, the greedy evaluation); between steps {c['between_steps_per_step_s']:.3f} s per step")
    for run in sorted(results.glob(layout.RUN.format(framework="dschat", seed="*"))):
        c = dschat_costs(run)
        print(f"dschat {run.name}: {c['steps']} steps in {c['wall_s']:.0f} s wall: the steps {c['step_sum_s']:.0f} s "
              f"(median step {c['step_median_s']:.2f} s: generation {c['gen_median_s']:.2f} s, training "
              f"{c['train_median_s']:.2f} s), outside them {c['wall_s'] - c['step_sum_s']:.0f} s (the deepspeed "
              "launcher, DeepSpeed's and the models' start-up, DeepSpeed-Chat's data build and evaluations, the "
              "launcher's greedy evaluation, saving the actor)")
    if missed:
        print(f"learning target missed (gain >= {TARGET_GAIN} and eval accuracy rising): {', '.join(missed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
