"""The verl ingest: verl's per-step metrics, from its file logger's JSONL or its console lines, in the common schema;
and the eval greedy accuracy from its validation passes before the first step and after the last.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pandas as pd

from harness import HarnessError
from harness.frameworks.launch import CONSOLE_LOG
from harness.frameworks.registry import LoggedRun, run_plan
from harness.frameworks.verl.plan import METRICS_LOG, NAME, VALIDATION_GENERATIONS
from harness.io import read_jsonl, text_lines
from harness.results import metrics

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_RAY_PREFIX = re.compile(r"^\((?:[\w.:-]+ )?pid=\w+(?:, ip=[\w.:-]+)?\) ")
_CONSOLE_STEP = re.compile(r"^step:(\d+)(?: - (.*))?$")
_NUMPY_SCALAR = re.compile(r"^np\.\w+\((.*)\)$")
REQUIRED = ("timing_s/step", "timing_s/gen", "timing_s/update_actor", "perf/total_num_tokens",
            "prompt_length/mean", "response_length/mean", "critic/score/mean")
OPTIONAL = ("timing_s/update_weights", "critic/rewards/mean", "actor/reward_kl_penalty_coeff", "perf/throughput")
# The rollout/trainer mismatch (#51; harness.results.metrics): the harness's hook in verl's trainer
# (inside/remax_bench_verl_mismatch.py) and verl's own signed mean, rollout_corr/kl = masked mean of
# rollout_log_probs - old_log_probs (trainer/ppo/rollout_corr_helper.py, compute_offpolicy_metrics). A run without
# them (planned before the hook, or with the rollout's log-probs off) leaves the columns empty.
MISMATCH = {"rollout_logprob_abs_diff_mean": "remax_bench/rollout_logprob_abs_diff_mean",
            "rollout_token_mult_prob_error": "remax_bench/rollout_token_mult_prob_error",
            "rollout_logprob_diff_mean": "rollout_corr/kl"}
TRAINING_STEP = "training/global_step"
# ray_trainer._validate's sections: a record with nothing else is a validation pass (val_before_train logs one at
# step 0), not a training step.
VALIDATION = ("val-core/", "val-aux/")
# verl's progress bar (ray_trainer.fit: tqdm with desc "Training Progress", updated once a step's metrics are logged),
# as tqdm prints it: "Training Progress:  33%|███▎      | 1/3 [01:21<02:43, 81.64s/it]", elapsed in whole seconds
# ([H:]MM:SS). tqdm redraws with carriage returns, so one line may hold several prints.
PROGRESS = "Training Progress:"
_PROGRESS = re.compile(r"Training Progress:\s*\d+%\|[^|]*\|\s*(\d+)/\d+ \[(?:(\d{1,9}):)?(\d{1,9}):(\d{1,9})<")


def _console_value(text: str, where: str) -> float:
    m = _NUMPY_SCALAR.match(text)
    literal = m.group(1) if m else text
    if literal in ("True", "False"):
        return float(literal == "True")
    try:
        return float(literal)
    except ValueError:
        raise HarnessError(f"{where}: garbled verl console metric value {text!r}") from None


def _parse_console_line(line: str, where: str) -> tuple[int, dict] | None:
    line = _RAY_PREFIX.sub("", _ANSI.sub("", line.rstrip("\n")), count=1)
    m = _CONSOLE_STEP.match(line)
    if not m:
        return None
    data = {}
    for part in m.group(2).split(" - ") if m.group(2) is not None else ():
        key, sep, value = part.rpartition(":")
        if not sep or not key:
            raise HarnessError(f"{where}: garbled verl console metric {part!r} (expected key:value)")
        data[key] = _console_value(value, where)
    return metrics.step_number(m.group(1), where), data


def _parse_jsonl_line(line: str, where: str) -> tuple[int, dict] | None:
    if not line.strip():
        return None
    try:
        record = json.loads(line)
    except (ValueError, RecursionError) as e:  # orjson's NaN is null, json's is NaN: both pass
        raise HarnessError(f"{where}: not a verl file-logger record ({getattr(e, 'msg', e)})") from None
    if not (isinstance(record, dict) and isinstance(record.get("step"), int) and isinstance(record.get("data"), dict)):
        raise HarnessError(f"{where}: expected a verl file-logger record {{\"step\": N, \"data\": {{...}}}}")
    # orjson writes NaN as null.
    return record["step"], {k: (math.nan if v is None else v) for k, v in record["data"].items()}


def _identity(run: LoggedRun) -> tuple[dict, int]:
    """The run's identity, and the devices verl divided perf/throughput by (the GPUs the caller states, else the
    plan's framework_devices: on a CPU, the one pretend GPU of a run with no GPUs)."""
    plan = run.planned
    if run.n_gpus is not None:
        return {**plan.identity(), "n_gpus": run.n_gpus}, run.n_gpus
    return plan.identity(), plan.framework_devices


def _step_row(step: int, data: dict, where: str, ident: dict, devices: int) -> dict:
    missing = [k for k in (TRAINING_STEP, *REQUIRED) if k not in data]
    if missing:
        raise HarnessError(f"{where}: verl step {step} lacks {', '.join(missing)} (truncated log?)")
    used = (TRAINING_STEP, *REQUIRED, *(k for k in (*OPTIONAL, *MISMATCH.values()) if k in data))
    bad = [k for k in used if isinstance(data[k], bool) or not isinstance(data[k], (int, float))]
    if bad:
        raise HarnessError(f"{where}: verl step {step}: {bad[0]} is {data[bad[0]]!r}, not a number")
    if data[TRAINING_STEP] != step:
        raise HarnessError(f"{where}: record for step {step} has {TRAINING_STEP} {data[TRAINING_STEP]}")
    total, prompt_mean, response_mean = (data[k] for k in
                                         ("perf/total_num_tokens", "prompt_length/mean", "response_length/mean"))
    if not prompt_mean + response_mean > 0:
        raise HarnessError(f"{where}: verl step {step}: prompt_length/mean + response_length/mean is not positive")
    # The means are over the same rows whose attention masks make up the total, so total / (sum of means) is
    # the number of rows and each mean times it is that part's token count.
    rows = total / (prompt_mean + response_mean)
    coef = data.get("actor/reward_kl_penalty_coeff", math.nan)
    # score - reward = coef * mean over samples of the summed per-token KL (ray_trainer.apply_kl_penalty).
    kl_mean = ((data["critic/score/mean"] - data["critic/rewards/mean"]) / coef
               if coef and not math.isnan(coef) and "critic/rewards/mean" in data else math.nan)
    return {
        **ident,
        "step": step,
        "time_step_s": data["timing_s/step"],
        "time_gen_s": data["timing_s/gen"],
        "time_transition_s": data.get("timing_s/update_weights", math.nan),
        "time_train_s": data["timing_s/update_actor"],
        "tokens_prompt": prompt_mean * rows,
        "tokens_response": response_mean * rows,
        "tokens_baseline": math.nan,  # verl does not count the greedy baseline's tokens
        "reward_mean": data["critic/score/mean"],
        "reward_baseline_mean": math.nan,  # not logged by verl
        "kl_mean": kl_mean,
        "response_length_mean": response_mean,
        **{column: data.get(key, math.nan) for column, key in MISMATCH.items()},
        # verl's own figure is per GPU (total / (step time * n_gpus)): times its devices for the cross-check.
        metrics.FRAMEWORK_THROUGHPUT: data.get("perf/throughput", math.nan) * devices,
    }


def evaluation(run_dir: Path) -> dict | None:
    """Eval greedy accuracy before and after training from verl's own validation passes (the file logger's
    records with val-core/ keys: the one before step 1 and the one at the last step); None without both."""
    log = Path(run_dir) / METRICS_LOG
    if not log.is_file():
        return None
    records = []
    for lineno, line in text_lines(log, errors="replace"):
        parsed = _parse_jsonl_line(line, f"{log}:{lineno}")
        if parsed and any(k.startswith(VALIDATION) for k in parsed[1]):
            records.append(parsed)
    if len(records) < 2:
        return None

    def point(step: int, data: dict) -> dict:
        acc = [v for k, v in data.items() if k.startswith("val-core/") and k.endswith("/acc/mean@1")]
        reward = [v for k, v in data.items() if k.startswith("val-aux/") and k.endswith("/score/mean@1")]
        if len(acc) != 1:
            raise HarnessError(f"{log}: verl validation at step {step} has {len(acc)} val-core/.../acc/mean@1 "
                               "values, expected one (is the reward function "
                               "harness/frameworks/verl/inside/reward_function.py?)")
        return {"greedy_accuracy": float(acc[0]), "reward_mean": float(reward[0]) if reward else math.nan,
                "step": step}

    (first_step, first), (last_step, last) = records[0], records[-1]
    before = point(first_step, first)
    generations = Path(run_dir) / VALIDATION_GENERATIONS / f"{first_step}.jsonl"
    if generations.is_file():
        # The prompt verl decoded (skip_special_tokens) is the shared prompt: RAW_PROMPT_TEMPLATE adds only BOS.
        before["responses"] = []
        for n, r in read_jsonl(generations, "not a line of verl's validation generations"):
            if not (isinstance(r, dict) and isinstance(r.get("input"), str) and isinstance(r.get("output"), str)):
                raise HarnessError(f"{generations}:{n}: not a line of verl's validation generations "
                                   "(ray_trainer._write_generations: input and output strings)")
            before["responses"].append({"prompt": r["input"], "response": r["output"]})
    return {"run_id": run_plan(log, NAME)["run_id"], "split": "eval", "source": "verl validation (val-core)",
            "before": before, "after": point(last_step, last)}


def progress_elapsed(console: Path) -> dict[int, int]:
    """Seconds verl's progress bar had run when each step ended, from its console output; {} without one."""
    elapsed: dict[int, int] = {}
    if not console.is_file():
        return elapsed
    for lineno, line in text_lines(console, errors="replace"):
        if PROGRESS not in line:
            continue
        for m in _PROGRESS.finditer(line):
            # The first print of a count is the update after that step; tqdm prints the last one again on closing.
            seconds = 3600 * int(m.group(2) or 0) + 60 * int(m.group(3)) + int(m.group(4))
            elapsed.setdefault(metrics.step_number(m.group(1), f"{console}:{lineno}"), seconds)
    return elapsed


def ingest(run: LoggedRun) -> pd.DataFrame:
    """verl's file-logger JSONL (*.jsonl) or its console output (anything else) -> the common schema; the steps' ends
    from the progress bar in the console output (the log itself, or the run's console beside the JSONL)."""
    rows = []
    ident, devices = _identity(run)
    for log in run.logs:
        parse = _parse_jsonl_line if log.suffix == ".jsonl" else _parse_console_line
        elapsed = progress_elapsed(log.parent / CONSOLE_LOG if log.suffix == ".jsonl" else log)
        found = 0
        for lineno, line in text_lines(log, errors="replace"):
            where = f"{log}:{lineno}"
            parsed = parse(line, where)
            if parsed is None:
                continue
            step, data = parsed
            if data and all(k.startswith(VALIDATION) for k in data):
                continue
            rows.append(_step_row(step, data, where, ident, devices))
            found += 1
        if not found:
            raise HarnessError(f"{log}: no verl training-step metrics found (expected "
                               + ("file-logger records" if log.suffix == ".jsonl" else "'step:N - ...' lines")
                               + f" with {TRAINING_STEP})")
        first = min(row["step"] for row in rows[-found:])
        for row in rows[-found:]:
            known = first in elapsed and row["step"] in elapsed
            row["time_step_end_s"] = elapsed[row["step"]] - elapsed[first] if known else math.nan
    return metrics.to_frame(rows, ", ".join(map(str, run.logs)))
