"""Per-run summaries from common-schema metrics: medians over measured steps (after warm-up).

One row per run; the per-framework view (median over seeds, spread) is built from these rows by the report.
"""

from __future__ import annotations

import csv
import io
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from harness import HarnessError
from harness.io import read_capped, read_json_object
from harness.results.efficiency import ModelShape, model_shape, run_peak, step_flops
from harness.results.metrics import read_metrics

TIMES = ("time_step_s", "time_gen_s", "time_transition_s", "time_train_s")
# The mismatch columns a run's summary carries, by the per-step columns' names (as throughput_tok_s).
SUMMARY_MISMATCH = ("rollout_logprob_abs_diff_mean", "rollout_token_mult_prob_error")


# The share of a run's steps that stands for its start and its end: the first and final reward (summary, report,
# the learning targets of the benchmarks), and the trailing mean that smooths a reward curve (report, history).
EDGE_FRACTION = 0.1
# What summary.csv and a run's eval.json are (harness.io.WRITTEN): `summarize` writes the one, a run the other.
SUMMARY_ROLE = "summary"
EVAL_ROLE = "eval record"


def edge_window(n_steps: int) -> int:
    """How many steps EDGE_FRACTION of `n_steps` is (at least one)."""
    return max(1, round(n_steps * EDGE_FRACTION))


def edge_means(series: pd.Series) -> tuple[float, float]:
    """Mean of the first and of the last EDGE_FRACTION of a curve (at least one point each)."""
    k = edge_window(len(series))
    return float(series.iloc[:k].mean()), float(series.iloc[-k:].mean())


def reward_curve(steps: pd.DataFrame) -> pd.DataFrame:
    """A run's reward as time-to-reward reads it, per step: the trailing mean of the sampled reward over the last
    edge_window steps (NaN until a full window exists, so a lucky first step cannot reach a target), and the
    training time so far (summed step times, warm-up included)."""
    df = steps.sort_values("step")
    k = edge_window(len(df))
    return pd.DataFrame({"step": df["step"].to_numpy(), "elapsed_s": df["time_step_s"].cumsum().to_numpy(),
                         "reward": df["reward_mean"].rolling(k, min_periods=k).mean().to_numpy()})


def time_to_reward(curve: Mapping[str, Sequence], target: float) -> tuple[float, int] | None:
    """Training time and step at which `curve` (reward_curve's columns, whole or sampled) first reaches `target`;
    None if it never does. Points without a reward (None or NaN) are skipped."""
    for elapsed, step, reward in zip(curve["elapsed_s"], curve["step"], curve["reward"]):
        if reward is not None and not math.isnan(reward) and reward >= target:
            return float(elapsed), int(step)
    return None


def model_flops_utilisation(measured: pd.DataFrame, shape: ModelShape, prompts: int, samples_per_prompt: int,
                            peak_flops: float) -> dict[str, float]:
    """MFU per phase (harness.results.efficiency), median over the measured steps: each step's model FLOPs over its
    time."""
    flops = pd.DataFrame([step_flops(shape, tokens_prompt=r.tokens_prompt, tokens_response=r.tokens_response,
                                     tokens_baseline=0.0 if pd.isna(r.tokens_baseline) else r.tokens_baseline,
                                     prompts=prompts, samples_per_prompt=samples_per_prompt)
                          for r in measured.itertuples()], index=measured.index)
    return {f"mfu_{phase}": float((flops[phase] / measured[time] / peak_flops).median())
            for phase, time in (("gen", "time_gen_s"), ("train", "time_train_s"), ("step", "time_step_s"))}


# A time of 0 (in metrics another tool wrote) divides to inf or nan, which summarize then refuses naming the run and
# the figure: numpy's own warning about the division would only print a line before that one.
@np.errstate(divide="ignore", invalid="ignore")
def summarize_run(df: pd.DataFrame, warmup_steps: int, efficiency: dict | None = None) -> dict:
    """`efficiency`: {"shape", "prompts", "samples_per_prompt", "peak_flops", "peak_source"} for the MFU columns
    (empty where the run's peak is unknown)."""
    measured = df[df["step"] > warmup_steps]
    if measured.empty:
        raise HarnessError(
            f"run {df['run_id'].iloc[0]}: no step after the {warmup_steps} warm-up steps (it has {len(df)} steps)")
    first, last = edge_means(df["reward_mean"])
    acc_first, acc_last = edge_means(df["task_accuracy_mean"])
    row = {c: df[c].iloc[0] for c in ("framework", "framework_version", "run_id", "seed", "n_gpus")}
    row.update(
        steps=int(df["step"].max()),
        measured_steps=len(measured),
        throughput_tok_s=float(measured["throughput_tok_s"].median()),
        throughput_tok_s_per_gpu=float(measured["throughput_tok_s_per_gpu"].median()),
        throughput_tok_cpu_s=float(measured["throughput_tok_cpu_s"].median()),
        time_probe_s_median=float(measured["time_probe_s"].median()),
        # Wall time over CPU time: about 1 (or 1 / threads) when the run had its cores, more when it waited for them.
        cpu_contention=float((measured["time_step_s"] / measured["time_step_cpu_s"]).median()),
        # Cores other processes kept busy on average while the run's steps ran (sums: /proc/stat counts in ticks).
        cpu_foreign_load=float((measured["time_machine_busy_s"] - measured["time_step_cpu_s"]).sum(min_count=1)
                               / measured["time_step_s"].sum()),
        **{f"{c}_median": float(measured[c].median()) for c in TIMES},
        time_transition_s_p90=float(measured["time_transition_s"].quantile(0.9)),
        wall_time_s=float(df["time_step_s"].sum()),
        reward_first10=first,
        reward_last10=last,
        reward_gain=last - first,
        task_accuracy_first10=acc_first,
        task_accuracy_last10=acc_last,
        # The rollout/trainer mismatch (harness.results.metrics.MISMATCH): the mean over the measured steps of each
        # step's token mean; empty where the framework's generation reports no log-probs.
        **{c: float(measured[c].mean()) for c in SUMMARY_MISMATCH},
    )
    if efficiency is not None:
        peak = efficiency["peak_flops"]
        row.update(model_flops_utilisation(measured, efficiency["shape"], efficiency["prompts"],
                                           efficiency["samples_per_prompt"], peak) if peak else
                   dict.fromkeys(("mfu_gen", "mfu_train", "mfu_step"), np.nan),
                   peak_flops=peak or np.nan, peak_source=efficiency["peak_source"])
    return row


def efficiency_of(config: dict, policy: Path, run_dirs: list[Path]) -> Callable[[pd.DataFrame], dict]:
    """summarize_run's efficiency record per run's metrics, from the policy's config.json and each run's manifest
    (its peak); an unreadable policy or peak leaves MFU empty and says why, and the rest of the summary stands."""
    try:
        shape, unknown = model_shape(policy / "config.json"), None
    except HarnessError as e:
        shape, unknown = None, f"no MFU: {e}"
    by_id = {}
    for d in run_dirs:
        try:
            run_id = read_json_object(d / "manifest.json", "manifest").get("run_id")
        except HarnessError:
            continue  # an unreadable manifest names no run: that run's MFU stays empty, saying so below
        if isinstance(run_id, str):
            by_id[run_id] = d

    def efficiency(metrics: pd.DataFrame) -> dict:
        run_id, n_gpus = metrics["run_id"].iloc[0], int(metrics["n_gpus"].iloc[0] or 0)
        peak, source = (run_peak(by_id[run_id], n_gpus) if run_id in by_id
                        else (None, "no peak: no run directory given holds a readable manifest.json of this run"))
        return {"shape": shape, "prompts": config["remax"]["train_batch_size"],
                "samples_per_prompt": config["remax"]["rollout_n"], "peak_flops": peak if shape else None,
                "peak_source": unknown or source}
    return efficiency


def read_eval(path: Path) -> dict:
    data = read_json_object(path, "eval record")
    sides = [side for when in ("before", "after") if isinstance(side := data.get(when), dict)
             and "greedy_accuracy" in side]
    if "run_id" not in data or len(sides) != 2:
        raise HarnessError(f"{path}: not an eval record (run_id, before.greedy_accuracy and after.greedy_accuracy)")
    if not isinstance(data["run_id"], str):
        raise HarnessError(f"{path}: run_id: expected a string, not {data['run_id']!r:.40}")
    for when, side in zip(("before", "after"), sides):
        value = side["greedy_accuracy"]
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise HarnessError(f"{path}: {when}.greedy_accuracy: expected a number or null, not {value!r:.40}")
    return {"run_id": data["run_id"], "eval_accuracy_before": sides[0]["greedy_accuracy"],
            "eval_accuracy_after": sides[1]["greedy_accuracy"]}


def _each_readable(paths: list[Path], read: Callable[[Path], dict], partial: bool) -> list[tuple[Path, dict]]:
    """(path, read(path)) for each path; with `partial`, one that raises HarnessError is left out and named on
    stderr."""
    out = []
    for path in paths:
        try:
            out.append((path, read(path)))
        except HarnessError as e:
            if not partial:
                raise
            print(f"summarize: left out: {e}", file=sys.stderr)
    return out


# The per-step time each figure of summarize_run divides by: a figure that comes out infinite is named by the step
# and the column where the damage is, not by the summary's column that shows it.
DIVIDES_BY = {"cpu_contention": "time_step_cpu_s", "mfu_gen": "time_gen_s", "mfu_train": "time_train_s",
              "mfu_step": "time_step_s"}


def _summary_row(path: Path, warmup_steps: int, efficiency: Callable[[pd.DataFrame], dict] | None) -> dict:
    """summarize_run of one metrics file. A figure that came out infinite (a CPU time or phase time of 0 divides by
    it) is refused, naming the run, the figure, and the step and the time of 0: in summary.csv it would pass for a
    measurement and stop the report and the check downstream. NaN stays: it is a figure the run did not measure."""
    df = read_metrics(path)
    row = summarize_run(df, warmup_steps, efficiency(df) if efficiency else None)
    infinite = [k for k, v in row.items() if isinstance(v, float) and math.isinf(v)]
    if infinite:
        figure, cause = infinite[0], DIVIDES_BY.get(infinite[0], "")
        zero = df.loc[(df["step"] > warmup_steps) & (df[cause] == 0), "step"] if cause else df["step"].iloc[:0]
        where = f": {cause} is 0.0 at step {int(zero.iloc[0])}" if not zero.empty else ""
        raise HarnessError(f"{path}: run {row['run_id']}: {figure} is {row[figure]}, not a finite number{where}")
    return row


def summarize(metric_files: list[Path], eval_files: list[Path], warmup_steps: int,
              efficiency: Callable[[pd.DataFrame], dict] | None = None, partial: bool = False) -> pd.DataFrame:
    """`efficiency`: (a run's metrics) -> summarize_run's efficiency record, or None for no MFU columns. `partial`:
    leave out (and say on stderr) a run whose metrics or eval record cannot be read, as the report of a failed
    pipeline run does, which marks that run failed itself; otherwise one such run fails the summary."""
    if not metric_files:
        raise HarnessError("summarize: no metrics files given")
    rows = [row for _, row in _each_readable(
        metric_files, lambda path: _summary_row(path, warmup_steps, efficiency), partial)]
    if not rows:
        raise HarnessError("summarize: no run could be summarized")
    summary = pd.DataFrame(rows)
    if summary["run_id"].duplicated().any():
        twice = summary.loc[summary["run_id"].duplicated(), "run_id"].iloc[0]
        raise HarnessError(f"summarize: run {twice} given twice")
    records = _each_readable(eval_files, read_eval, partial)
    seen: dict[str, Path] = {}
    for path, record in records:
        if record["run_id"] in seen:  # a run directory copied: which accuracy is the run's cannot be told
            raise HarnessError(f"{seen[record['run_id']]}, {path}: two eval records of run {record['run_id']}")
        seen[record["run_id"]] = path
    evals = pd.DataFrame([record for _, record in records],
                         columns=["run_id", "eval_accuracy_before", "eval_accuracy_after"])
    summary = summary.merge(evals, on="run_id", how="left")
    return summary.sort_values(["framework", "seed"], ignore_index=True)


# The columns of summary.csv that are text, and those that count (summarize_run's row); every other one is a figure.
SUMMARY_TEXT = ("framework", "framework_version", "run_id", "peak_source")
SUMMARY_COUNTS = ("seed", "n_gpus", "steps", "measured_steps")
# summary.csv has one row per run (a framework and a seed): tens in a pipeline run, thousands in the largest sweep, a
# row a few hundred bytes. A file past these bounds is not a summary summarize wrote (a table appended to itself,
# another tool's export): refused naming it before it is parsed. A 1,000,000-row one (350 MB) took 24-34 s and 2.3 GB
# of memory in each stage that read it (report, bundle, history append) before any of them said a word about it.
MAX_SUMMARY_ROWS = 10_000
MAX_SUMMARY_BYTES = 16 << 20


def _text(path: Path) -> str:
    data = read_capped(path, "summary table", "", MAX_SUMMARY_BYTES)
    try:
        return data.decode()
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise HarnessError(f"{path}:{line}: not UTF-8 text ({e.reason})") from None


def _checked_columns(summary: pd.DataFrame, path: Path) -> pd.DataFrame:
    """The table with every run named, every figure a number (empty: not measured) and never infinite, and every
    count a whole number; HarnessError naming the line and the column of the first cell that is not."""
    def refuse(bad: pd.Series, column: str, expected: str) -> None:
        if bad.any():
            i = int(bad.to_numpy().argmax())
            value = summary[column].iloc[i]
            shown = repr(value) if isinstance(value, str) else value
            raise HarnessError(f"{path}:{i + 2}: {column} is {shown}, not {expected}")

    # framework_version too: the report groups runs by it, and a run without one would vanish from its tables
    for column in (c for c in ("run_id", "framework", "framework_version") if c in summary):
        refuse(summary[column].isna(), column, "a name")
    for column in (c for c in summary.columns if c not in SUMMARY_TEXT):
        raw = summary[column]
        values = pd.to_numeric(raw, errors="coerce")
        refuse((raw.notna() & values.isna()) | np.isinf(values), column, "a finite number")
        if column in SUMMARY_COUNTS:
            refuse(values.isna() | (values % 1 != 0) | (values.abs() >= 2**63), column, "a whole number")
            values = values.astype("int64")
        summary[column] = values
    return summary


def read_summary(path: Path) -> pd.DataFrame:
    """The summarize stage's table, indexed by run_id, for the stages after it (the report, the history), which do
    not summarize again."""
    try:
        text = _text(path)
        widths = [len(row) for row in csv.reader(io.StringIO(text, newline=""))]
        if len(widths) > MAX_SUMMARY_ROWS + 1:
            raise HarnessError(f"{path}: {len(widths) - 1} rows, more than the {MAX_SUMMARY_ROWS} runs a summary "
                               "holds; not a summary table summarize wrote")
        summary = pd.read_csv(io.StringIO(text), dtype=dict.fromkeys(SUMMARY_TEXT, str))
    except (OSError, ValueError, csv.Error) as e:  # pandas' ParserError and EmptyDataError are ValueErrors
        raise HarnessError(f"{path}: not a summary table ({e})") from None
    # pandas fills a row cut short (a truncated file) with NaN: count fields
    short = next((i for i, width in enumerate(widths, 1) if width != len(summary.columns)), None)
    if short is not None:
        raise HarnessError(f"{path}:{short}: not {len(summary.columns)} fields as the header (a truncated file?)")
    missing = [c for c in ("run_id", "framework", "seed", "reward_last10", "throughput_tok_s") if c not in summary]
    if missing:
        raise HarnessError(f"{path}: lacks column(s) {', '.join(missing)} (summarize again with this version)")
    summary = _checked_columns(summary, path)
    # the stages after it build paths from the framework (runs/<framework>/seed<S>): a name, never "../x"
    named = summary["framework"].astype(str).str.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
    if not named.all():
        row = int((~named).to_numpy().argmax())
        raise HarnessError(f"{path}:{row + 2}: framework {summary['framework'].iloc[row]!r} is not a framework's name")
    if summary["run_id"].duplicated().any():
        raise HarnessError(f"{path}: run {summary.loc[summary['run_id'].duplicated(), 'run_id'].iloc[0]} twice")
    return summary.set_index("run_id", drop=False)


def by_framework(summary: pd.DataFrame) -> pd.DataFrame:
    """Median over seeds with min-max spread; speed relative to the slowest framework (the shared-table form)."""
    g = summary.groupby(["framework", "framework_version", "n_gpus"], sort=False)
    table = g.agg(
        seeds=("seed", "nunique"),
        tokens_per_s=("throughput_tok_s", "median"),
        tokens_per_s_min=("throughput_tok_s", "min"),
        tokens_per_s_max=("throughput_tok_s", "max"),
        tokens_per_s_per_gpu=("throughput_tok_s_per_gpu", "median"),
        transition_s_median=("time_transition_s_median", "median"),
        reward_gain=("reward_gain", "median"),
        eval_accuracy_before=("eval_accuracy_before", "median"),
        eval_accuracy_after=("eval_accuracy_after", "median"),
    ).reset_index()
    table["relative"] = table["tokens_per_s"] / table["tokens_per_s"].min()
    return table.sort_values("tokens_per_s", ignore_index=True).replace({np.inf: np.nan})
