"""The common per-step schema (docs/design.md): one row per optimizer step of one run, whatever produced it.

Throughput is derived here, never taken from a framework: (prompt + sampled-response tokens) / step time,
aggregate over the run's accelerators (the HybridFlow definition), and per accelerator beside it.
"""

from __future__ import annotations

import numbers
from pathlib import Path

import pandas as pd

from harness import HarnessError
from harness.io import atomic_path

IDENTITY = {"framework": "string", "framework_version": "string", "run_id": "string", "seed": "int64"}
MEASURED = {
    "step": "int64",
    "n_gpus": "int64",
    "time_step_s": "float64",
    "time_gen_s": "float64",
    "time_transition_s": "float64",
    "time_train_s": "float64",
    "tokens_prompt": "float64",
    "tokens_response": "float64",
    "tokens_baseline": "float64",
    "reward_mean": "float64",
    "reward_baseline_mean": "float64",
    "kl_mean": "float64",
    "response_length_mean": "float64",
}
# Measured where the producer can, empty elsewhere.
# time_step_cpu_s: CPU time of the training process over the step (the CPU backend). Unlike wall time it does not
# count time spent waiting for a core that another job holds, so on a shared CPU runner it is the throughput
# figure that regression checks can trust; empty where a framework runs on accelerators.
# time_machine_busy_s: CPU-seconds all processes on the machine were busy during the step (CPU backend, Linux):
# beyond the run's own CPU time it is other jobs' load on the shared cores (their cache and memory traffic slow
# the run even when it keeps its own core).
# time_probe_s: seconds a fixed reference workload took right after the step (CPU backend): the machine's speed
# at that moment, a covariate the regression check uses to take the drift of a shared CPU's speed out of
# throughput while leaving what the run's own code changed.
# task_accuracy_mean: exact-match accuracy of the sampled responses on the verifiable task, whatever the reward:
# with a reward model it shows whether the reward that rises is still the task being solved.
# time_step_end_s: when the step ended, in seconds after the run's first step ended (0 on that step), by the
# framework's own clock as its log states it (verl's progress bar, OpenRLHF's step lines: whole seconds). Its
# differences less time_step_s are the time the framework's loop spends between its step timers.
# rollout_logprob_abs_diff_mean, rollout_token_mult_prob_error, rollout_logprob_diff_mean: the rollout/trainer
# mismatch (#51). For each sampled response token of the step (greedy baseline tokens are not counted),
# delta = log p_rollout - log p_trainer: the log-prob the generation engine reported for the token it sampled,
# less the trainer's log-prob of the same token with the same weights before the step's update (verl's
# old_log_probs, OpenRLHF's action_log_probs). Token means over the step: |delta| (rollout_logprob_abs_diff_mean),
# exp(|delta|) (rollout_token_mult_prob_error: NeMo-RL's token_mult_prob_error, ClippedPGLossFn; always >= 1, and
# log of it >= the mean |delta|; NeMo-RL investigates above 1.05) and delta itself (rollout_logprob_diff_mean: the
# signed k1, verl's rollout_corr/kl, OpenRLHF's vllm_kl). 0 / 1 / 0 means the engine and the trainer agree exactly.
# Empty (NaN) where the framework's generation path reports no log-probs: DeepSpeed-Chat and TRL generate with the
# trained model itself (HF or DeepSpeed generate, no separate engine), so there is no engine log-prob to compare;
# their mismatch is not zero by construction (KV-cache decoding against one full forward, DeepSpeed's inference
# kernels on a GPU, DeepSpeed-Chat's hard-coded top_p 0.9), it is only not measured. The reference backend's
# generate samples from the rollout copy of the same decoder and records no log-probs either.
OPTIONAL = {"time_step_cpu_s": "float64", "time_machine_busy_s": "float64", "time_probe_s": "float64",
            "task_accuracy_mean": "float64", "time_step_end_s": "float64",
            "rollout_logprob_abs_diff_mean": "float64", "rollout_token_mult_prob_error": "float64",
            "rollout_logprob_diff_mean": "float64"}
# The mismatch columns, in the order above (harness.results.summarize, the report's mismatch table).
MISMATCH = ("rollout_logprob_abs_diff_mean", "rollout_token_mult_prob_error", "rollout_logprob_diff_mean")
DERIVED = {"throughput_tok_s": "float64", "throughput_tok_s_per_gpu": "float64", "throughput_tok_cpu_s": "float64"}
SCHEMA = {**IDENTITY, **MEASURED, **OPTIONAL, **DERIVED}
# Every producer measures these on every step; the other measured columns may be empty where one cannot.
REQUIRED_FINITE = ["time_step_s", "tokens_prompt", "tokens_response", "reward_mean"]
# Kept beside the derived figure for a cross-check where a framework reports its own (optional).
FRAMEWORK_THROUGHPUT = "framework_throughput_tok_s"


MAX_COUNT = 1 << 53  # steps, seeds, GPUs: above it a float64 (pandas, JSON readers) no longer holds each integer


def step_number(digits: str, where: str) -> int:
    """The step number a log line writes in decimal digits; HarnessError naming `where` from MAX_COUNT on. The
    length is checked first: Python refuses int() of more than 4,300 digits (a ValueError naming nothing)."""
    value = int(digits) if len(digits) <= len(str(MAX_COUNT)) else MAX_COUNT
    if value >= MAX_COUNT:
        shown = digits if len(digits) <= 40 else f"{digits[:20]}... ({len(digits)} digits)"
        raise HarnessError(f"{where}: step {shown} is not a whole number from 0 to 2**53")
    return value


def to_frame(rows: list[dict], source: str) -> pd.DataFrame:
    """Per-step records -> the common schema, with derived throughput; raise naming `source` if anything is off."""
    if not rows:
        raise HarnessError(f"{source}: no step records found")
    return checked_steps(pd.DataFrame(rows), source)


def _shown(value: object) -> str:
    return repr(value.item() if hasattr(value, "item") else value)  # 0.5, not np.float64(0.5)


def checked_steps(df: pd.DataFrame, source: str) -> pd.DataFrame:
    """`df` (one row per step) in the common schema, with derived throughput; HarnessError naming `source`, the step
    and the column of the first value the schema refuses. The schema's one rule: a framework's log at ingest
    (to_frame) and a metrics file at every stage after it (read_metrics) pass the same checks, so a parquet edited by
    hand or written by another tool is refused where ingest would have refused its log."""
    df = df.reset_index(drop=True)
    missing = [c for c in {**IDENTITY, **MEASURED} if c not in df.columns]
    if missing:
        raise HarnessError(f"{source}: step records lack {', '.join(missing)}")
    for c in (c for c, kind in SCHEMA.items() if kind == "int64"):
        fits = df[c].map(lambda v: isinstance(v, numbers.Real) and not isinstance(v, bool)
                         and float(v).is_integer() and 0 <= float(v) < MAX_COUNT)
        if not fits.all():
            row = int((~fits).to_numpy().argmax())
            raise HarnessError(f"{source}: record {row + 1} (step {_shown(df.at[row, 'step'])}): {c} is "
                               f"{_shown(df.at[row, c])}, not a whole number from 0 to 2**53")
        df[c] = df[c].astype("int64")
    # Every later stage names a run by these (the summary's rows, the report's runs, the history's series).
    for c in (c for c, kind in IDENTITY.items() if kind == "string"):
        named = df[c].map(lambda v: isinstance(v, str))
        if not named.all():
            row = int((~named).to_numpy().argmax())
            value = df.at[row, c]
            shown = "null" if pd.api.types.is_scalar(value) and pd.isna(value) else _shown(value)
            raise HarnessError(f"{source}: step {df.at[row, 'step']}: {c} is {shown}, not text")
    step_time = pd.to_numeric(df["time_step_s"], errors="coerce").astype("float64")
    if not (step_time > 0).all():  # NaN compares false: refused with the rest
        row = int((~(step_time > 0)).to_numpy().argmax())
        raise HarnessError(f"{source}: step {df.at[row, 'step']}: time_step_s is {_shown(df.at[row, 'time_step_s'])}, "
                           "not a positive number")
    for c in OPTIONAL:
        df[c] = df[c] if c in df.columns else float("nan")
    # A framework's log may say NaN or Infinity (a diverged loss, a broken timer): bad input, not a figure to average.
    # Text where a number belongs is refused too: the column's type would otherwise fail later, naming nothing.
    numeric = [c for c in (*MEASURED, *OPTIONAL) if c != "step"]
    values = df[numeric].apply(pd.to_numeric, errors="coerce").astype("float64")
    bad = (values.isin([float("inf"), float("-inf")]) | (df[numeric].notna() & values.isna())
           | values[REQUIRED_FINITE].isna().reindex(columns=numeric, fill_value=False))
    if bad.any().any():
        row, col = next((r, c) for r in bad.index for c in numeric if bad.at[r, c])
        raise HarnessError(f"{source}: step {df.at[row, 'step']}: {col} is {_shown(df.at[row, col])}, not a finite "
                           "number")
    df[numeric] = values
    tokens = df["tokens_prompt"] + df["tokens_response"]
    df["throughput_tok_s"] = tokens / step_time
    df["throughput_tok_cpu_s"] = tokens / df["time_step_cpu_s"].where(df["time_step_cpu_s"] > 0)
    # A CPU run (0 accelerators) has no per-GPU figure.
    df["throughput_tok_s_per_gpu"] = df["throughput_tok_s"] / df["n_gpus"].where(df["n_gpus"] > 0)
    df = df[list(SCHEMA) + [c for c in (FRAMEWORK_THROUGHPUT,) if c in df.columns]].astype(SCHEMA)
    if df["step"].duplicated().any():
        raise HarnessError(f"{source}: step {int(df.loc[df['step'].duplicated(), 'step'].iloc[0])} appears twice")
    return df.sort_values("step", ignore_index=True)


METRICS_ROLE = "metrics file"  # what write_metrics writes (harness.io.WRITTEN)


def write_metrics(df: pd.DataFrame, dest: str | Path) -> None:
    with atomic_path(dest, role=METRICS_ROLE) as tmp:
        df.to_parquet(tmp, index=False)


def read_metrics(path: str | Path) -> pd.DataFrame:
    try:
        df = pd.read_parquet(path)
    except FileNotFoundError:
        raise HarnessError(f"{path}: metrics file not found") from None
    except Exception as e:  # pyarrow raises several types for a damaged file
        raise HarnessError(f"{path}: not a readable parquet file ({e})") from None
    missing = [c for c in {**IDENTITY, **MEASURED} if c not in df.columns]
    if missing:
        raise HarnessError(f"{path}: not in the common schema (missing {', '.join(missing)})")
    if df.empty:  # every stage after ingest computes on a run's steps
        raise HarnessError(f"{path}: no steps (an empty metrics file)")
    # A file written before the optional columns existed lacks them (they were not measured); one that has them all
    # holds each in the type ingest writes.
    wrong = [c for c, kind in SCHEMA.items() if kind in ("int64", "float64") and str(df[c].dtype) != kind] \
        if all(c in df.columns for c in SCHEMA) else []
    if wrong:
        raise HarnessError(f"{path}: column {wrong[0]} holds {df[wrong[0]].dtype} values, not {SCHEMA[wrong[0]]} "
                           "(not a metrics file written by `remax-bench ingest`)")
    # Through ingest's own checks: a parquet edited by hand or written by another tool (a negative or NaN step time,
    # an infinite reward) would otherwise reach every figure of the summary, the report and the regression check.
    return checked_steps(df, str(path))
