"""The OpenRLHF ingest: the `✨ Global step N: {...}` line the PPOTrainer Ray actor logs per step, in the common
schema; and the eval greedy accuracy, from vLLM's greedy decoding of the initial policy and of the saved actor.
"""

from __future__ import annotations

import ast
import math
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pandas as pd

from harness import HarnessError
from harness.frameworks.openrlhf.plan import LOG, NAME, REMAX_DIR
from harness.frameworks.registry import LoggedRun, greedy_evaluation, run_plan
from harness.io import text_lines
from harness.results import metrics
from harness.runtime import envs

# Format of OpenRLHF 0.11.2's per-step line: trainer/ppo_trainer.py, PPOTrainer.fit,
#     logger.info(f"✨ Global step {global_step}: {log_status}")
# through openrlhf/utils/logging_utils.py (format "%(levelname)s %(asctime)s %(filename)s:%(lineno)d] %(message)s"),
# printed by the PPOTrainer Ray actor and forwarded by Ray to the driver's stdout behind "(PPOTrainer pid=N) ",
# which Ray colours with ANSI codes even when stdout is not a terminal. log_status is a dict of floats (its repr).
STEP_LINE = re.compile(r"✨ Global step (\d+): (\{.*\})\s*$")
# The same line's time (logging_utils' datefmt "%m-%d %H:%M:%S"): when the step ended, in whole seconds of the local
# clock, without a year.
STEP_TIME = re.compile(r"\d\d-\d\d (\d\d):(\d\d):(\d\d) \S+:\d+\] ✨ Global step")
DAY_S = 86400
ANSI = re.compile(r"\x1b\[[0-9;]*m")
# repr() of a float that ast.literal_eval does not read back.
NONFINITE = re.compile(r"(?<![\w.'\"])(-?)(nan|inf)(?![\w'\"])")
# The rollout/trainer mismatch (#51; harness.results.metrics): remax_patch.py's per-sample sums over the response
# tokens (delta = the engine's log-prob of the sampled token less the actor's) and token count. The step line holds
# each as a mean over the step's samples, so sum / count is the token mean of the step. A run without them (patched by
# an earlier revision) leaves the columns empty.
MISMATCH = {"rollout_logprob_abs_diff_mean": "remax_lp_absdiff_sum",
            "rollout_token_mult_prob_error": "remax_mult_prob_sum",
            "rollout_logprob_diff_mean": "remax_lp_diff_sum"}
MISMATCH_TOKENS = "remax_action_tokens"
REQUIRED = ("timing/generation", "timing/ppo_train", "timing/broadcast", "timing/step_total", "rollout/num_samples",
            "rollout/reward_mean", "rollout/response_length_mean", "response_length", "total_length", "remax_baseline")


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        repaired = NONFINITE.sub(lambda m: "None" if m.group(2) == "nan" else m.group(1) + "1e999", text)
        value = ast.literal_eval(repaired)
        return {k: math.nan if v is None else v for k, v in value.items()} if isinstance(value, dict) else value


def _row(status: dict, step: int, n_gpus: int, per_prompt: int, where: str) -> dict:
    missing = [k for k in REQUIRED if k not in status]
    if missing:
        hint = " (not a ReMax run: was --algo.advantage.estimator remax with the ReMax agent used?)" \
            if "remax_baseline" in missing else ""
        raise HarnessError(f"{where}: step {step} lacks {', '.join(missing)}{hint}")
    samples = status["rollout/num_samples"]
    greedy_tokens = status.get("remax_baseline_tokens", math.nan)
    tokens = status.get(MISMATCH_TOKENS, math.nan)
    mismatch = {column: status.get(key, math.nan) / tokens if tokens > 0 else math.nan
                for column, key in MISMATCH.items()}
    return {
        "step": step, "n_gpus": n_gpus,
        "time_step_s": status["timing/step_total"],
        "time_gen_s": status["timing/generation"],
        "time_transition_s": status["timing/broadcast"],
        "time_train_s": status["timing/ppo_train"],
        # Sample-weighted means over the step's samples, times the number of samples.
        "tokens_prompt": samples * (status["total_length"] - status["response_length"]),
        "tokens_response": samples * status["rollout/response_length_mean"],
        "tokens_baseline": greedy_tokens * samples / per_prompt,  # every sample carries its prompt's greedy length
        "reward_mean": status["rollout/reward_mean"],
        "reward_baseline_mean": status["remax_baseline"],
        "kl_mean": status.get("remax_kl_sum", math.nan),
        "response_length_mean": status["rollout/response_length_mean"],
        **mismatch,
    }


def _step_ends(times: dict[int, int]) -> dict[int, float]:
    """Seconds from the end of the log's first step to the end of each step, from the second of the day each step's
    line was logged at. Without a year in the lines the time between two steps is read from the time of day alone:
    a step of a benchmark's run ends well within a day of the one before."""
    ends: dict[int, float] = {}
    total, previous = 0, None
    for step, t in sorted(times.items()):
        total += 0 if previous is None else (t - previous) % DAY_S
        ends[step], previous = float(total), t
    return ends


def ingest(run: LoggedRun) -> pd.DataFrame:
    """OpenRLHF's step lines; the baseline's tokens by the samples per prompt of the run's plan record."""
    rows: list[dict] = []
    plan_ = run.planned
    identity = {k: v for k, v in plan_.identity().items() if k != "n_gpus"}
    gpus = plan_.n_gpus if run.n_gpus is None else run.n_gpus
    for path in run.logs:
        times: dict[int, int] = {}
        found = len(rows)
        for lineno, line in text_lines(path, errors="replace"):
            if "✨ Global step" not in line:
                continue
            where = f"{path}:{lineno}"
            line = ANSI.sub("", line)
            match = STEP_LINE.search(line)
            if not match:
                raise HarnessError(f"{where}: garbled OpenRLHF step line (expected '✨ Global step N: {{...}}')")
            step = metrics.step_number(match.group(1), where)
            if stamp := STEP_TIME.search(line):
                h, m, sec = map(int, stamp.groups())
                times[step] = 3600 * h + 60 * m + sec
            try:
                status = _literal(match.group(2))
            except (ValueError, SyntaxError, RecursionError, MemoryError) as e:
                raise HarnessError(f"{where}: the step's metrics are not a Python dict literal ({e})") from None
            if not isinstance(status, dict):
                raise HarnessError(f"{where}: the step's metrics are not a dict")
            rows.append({**identity, **_row(status, step, gpus, plan_.samples_per_prompt, where)})
        first = min((row["step"] for row in rows[found:]), default=None)
        ends = _step_ends(times) if first in times else {}  # from the log's first step, or none
        for row in rows[found:]:
            row["time_step_end_s"] = ends.get(row["step"], math.nan)
    return metrics.to_frame(rows, ", ".join(map(str, run.logs)))


# ----------------------------------------------------------------------------------------------------- evaluation

GREEDY_EVAL = REMAX_DIR / "greedy_eval.py"
EVAL_LOG = "openrlhf_eval.json"  # greedy_eval.py's record, beside OpenRLHF's log
CHECKPOINT = "ckpt"  # the final actor, where --ckpt.output_dir's default (./ckpt) puts it: the run directory


def evaluation(run_dir: Path) -> dict | None:
    """Eval greedy accuracy before and after training: vLLM's greedy decoding of the initial policy and of the actor
    OpenRLHF saved (remax/greedy_eval.py, in the run's environment, after the run; OpenRLHF's own evaluation samples
    and runs only after training steps)."""
    run_dir = Path(run_dir).resolve()
    plan_ = run_plan(run_dir / LOG, NAME)
    if not (run_dir / CHECKPOINT).is_dir():
        return None
    argv, out = plan_["argv"], run_dir / EVAL_LOG
    env = {**os.environ, **{k: v.replace("$RUN_DIR", str(run_dir)) for k, v in plan_["env_vars"].items()},
           "PYTHONPATH": str(envs.REPO)}
    # from the caller's working directory, against which the plan's input paths are written
    proc = subprocess.run([*argv[:argv.index("-m")], str(GREEDY_EVAL), str(run_dir), str(out)], capture_output=True,
                          text=True, env=env)
    if proc.returncode:
        raise HarnessError(f"{GREEDY_EVAL.name} failed on {run_dir} (exit {proc.returncode}):\n"
                           + (proc.stdout + proc.stderr)[-3000:])
    return greedy_evaluation(out, NAME, GREEDY_EVAL.name, "greedy decoding by vLLM of the initial policy and of "
                             "OpenRLHF's saved actor (greedy_eval.py)")
