"""Comparison report from a results directory: one self-contained HTML page, plus tables and figures for papers.

Every planned run (config frameworks x seeds) is listed as ok, failed or not run; a failed or missing run never
stops the report. Per-run figures come from the common-schema metrics (after warm-up, harness.results.summarize); the
per-framework view is the median over seeds with the min-max spread.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
import yaml

from harness import HarnessError
from harness.config import validate_config
from harness.io import atomic_path, read_json_object, write_text
from harness.results.metrics import FRAMEWORK_THROUGHPUT, read_metrics
from harness.results.summarize import by_framework, edge_means, edge_window, efficiency_of, read_eval, summarize_run

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from harness.frameworks import Adapter

CLAIMS_PATH = Path(__file__).resolve().parents[1] / "workflows" / "report" / "claims.yaml"
LOG_TAIL_LINES = 30
PARTS = (("time_gen_s", "generation"), ("time_transition_s", "transition"), ("time_train_s", "training"))


@dataclass
class Run:
    """One planned (framework, seed) run and what the results directory holds for it."""

    framework: str
    seed: int
    status: str = "not run"  # ok | failed | not run
    reason: str = ""
    log_tail: str = ""
    metrics: pd.DataFrame | None = None
    summary: dict = field(default_factory=dict)
    manifest: dict | None = None
    plan: dict | None = None

    @property
    def steps(self) -> pd.DataFrame:
        """The per-step metrics, which every completed run has."""
        if self.metrics is None:
            raise HarnessError(f"{self.framework} seed {self.seed}: no metrics (status {self.status})")
        return self.metrics


def _fmt(x: float | None, digits: int = 0) -> str:
    return "n/a" if x is None or pd.isna(x) else f"{x:,.{digits}f}"


def _read_json(path: Path, problems: list[str]) -> dict | None:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        problems.append(f"{path}: unreadable ({e})")
        return None


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _logs_tail(results: Path, run: Run) -> str:
    parts = []
    for stage in ("run", "ingest"):
        log = results / "logs" / stage / f"{run.framework}_seed{run.seed}.log"
        tail = _tail(log)
        if tail:
            parts.append(f"==> {log} <==\n{tail}")
    return "\n\n".join(parts)


def _adapter(name: str) -> Adapter | None:
    from harness.frameworks import get_adapter

    try:
        return get_adapter(name)
    except HarnessError:
        return None


def results_config(results: Path) -> dict:
    path = results / "config.json"
    config = read_json_object(path, "effective config", " (run the pipeline's freeze_config step first)")
    for key in ("frameworks", "seeds", "remax", "launch"):
        if key not in config:
            raise HarnessError(f"{path}: lacks key {key!r} (freeze the config again with this version)")
    # A config frozen before the report block or launch.device existed: the schema's defaults.
    defaults = validate_config({}, source="schema defaults")
    config.setdefault("report", defaults["report"])
    config["launch"].setdefault("device", defaults["launch"]["device"])
    return config


def _without_metrics(results: Path, run: Run, adapter: Adapter | None, config: dict) -> tuple[str, str]:
    """Status and reason of a planned run that left no metrics file."""
    fw, seed = run.framework, run.seed
    metrics_path = results / "metrics" / fw / f"seed{seed}.parquet"
    run_log = results / "logs" / "run" / f"{fw}_seed{seed}.log"
    if _logs_tail(results, run):
        return "failed", f"no metrics ({metrics_path} missing); see the log"
    if (results / "runs" / fw / f"seed{seed}").is_dir():
        return "not run", f"the run finished but was not ingested ({metrics_path} missing; the pipeline stopped early)"
    if run_log.exists():  # the job started (its shell made the log) and died without a word
        return "failed", f"no metrics ({metrics_path} missing); {run_log} is empty (killed?)"
    from harness.frameworks import not_runnable

    blocked = not_runnable(adapter, config) if adapter is not None else None
    if blocked:
        return "not run", blocked
    if adapter is None:
        return "not run", f"framework {fw!r} has no registered adapter in this harness version"
    upstream = _upstream_failure(results, run, config)
    if upstream:
        return "not run", upstream
    return "not run", f"no metrics yet ({metrics_path} missing)"


def _upstream_failure(results: Path, run: Run, config: dict) -> str | None:
    """Why a run never started, from the jobs it waits for (the pipeline keeps going past them): its plan refused,
    its environment not built, its pinned source checkout not made (e.g. no network). The stage's last log line."""
    from harness.frameworks import environment, get_adapter

    env = environment(get_adapter(run.framework), config)
    stages = [("its plan was refused", results / "logs" / "plan" / f"{run.framework}_seed{run.seed}.log",
               results / "plans" / run.framework / f"seed{run.seed}")]
    if env:
        stages.append(("its environment could not be built", results / "logs" / "env" / f"{env}.log",
                       results / "envs" / f"{env}.txt"))
    checkout = (config.get(run.framework) or {}).get("checkout")
    if checkout:
        stages.append(("its pinned source checkout could not be made",
                       results / "logs" / "setup" / f"{run.framework}_checkout.log", Path(checkout)))
    for what, log, output in stages:
        lines = _tail(log).strip().splitlines()
        if lines and not output.exists():
            return f"{what}: {lines[-1].strip()} ({log})"
    return None


def collect_runs(results: Path, config: dict, problems: list[str]) -> list[Run]:
    """Every planned run with its status; metrics that cannot be read or summarized mark the run failed."""
    runs = []
    warmup = config["remax"]["warmup_steps"]
    # MFU as the summarize stage computes it: the policy's shape, each run's peak from its manifest.
    efficiency = efficiency_of(config, results / "inputs" / "policy",
                               [results / "runs" / fw / f"seed{seed}" for fw in config["frameworks"]
                                for seed in config["seeds"]])
    for fw in config["frameworks"]:
        adapter = _adapter(fw)
        for seed in config["seeds"]:
            run = Run(fw, int(seed))
            run.plan = _read_json(results / "plans" / fw / f"seed{seed}" / "plan.json", problems)
            run.manifest = _read_json(results / "runs" / fw / f"seed{seed}" / "manifest.json", problems)
            metrics_path = results / "metrics" / fw / f"seed{seed}.parquet"
            if metrics_path.exists():
                try:
                    df = read_metrics(metrics_path)
                    if set(df["framework"]) != {fw} or set(df["seed"]) != {seed}:
                        raise HarnessError(f"{metrics_path}: holds framework {sorted(set(df['framework']))} seed "
                                           f"{sorted(set(df['seed']))}, not {fw} seed {seed}")
                    run.summary = summarize_run(df, warmup, efficiency(df))
                    run.metrics, run.status = df, "ok"
                except HarnessError as e:
                    run.status, run.reason = "failed", str(e)
            else:
                run.status, run.reason = _without_metrics(results, run, adapter, config)
            if run.status == "failed":
                run.log_tail = _logs_tail(results, run)
            eval_path = results / "runs" / fw / f"seed{seed}" / "eval.json"
            if run.status == "ok" and eval_path.is_file():
                try:
                    run.summary.update({k: v for k, v in read_eval(eval_path).items() if k != "run_id"})
                except HarnessError as e:
                    problems.append(str(e))
            runs.append(run)
    return runs


def _run_extras(df: pd.DataFrame, warmup: int) -> dict:
    """Phase-only throughputs and the mean step-time breakdown over the measured steps of one run."""
    m = df[df["step"] > warmup]
    tokens = m["tokens_prompt"] + m["tokens_response"]
    parts = {name: m[col].fillna(0.0).mean() for col, name in PARTS}
    # A phase a framework does not time (NaN) or rounds to 0 has no throughput of its own.
    phase = {k: (tokens / m[col].where(m[col] > 0)).median() for k, col in (("gen", "time_gen_s"),
                                                                            ("train", "time_train_s"))}
    return {
        "gen_tok_s": float(phase["gen"]),
        "train_tok_s": float(phase["train"]),
        "transition_exposed": bool(m["time_transition_s"].notna().any()),
        **{f"mean_{name}_s": float(v) for name, v in parts.items()},
        "mean_other_s": float(max(0.0, m["time_step_s"].mean() - sum(parts.values()))),
        "mean_step_s": float(m["time_step_s"].mean()),
    }


def run_table(runs: list[Run], warmup: int) -> pd.DataFrame:
    rows = [{**r.summary, **_run_extras(r.metrics, warmup)} for r in runs if r.status == "ok"]
    return pd.DataFrame(rows)


def throughput_table(per_run: pd.DataFrame) -> pd.DataFrame:
    """by_framework's shared-table form, plus generation-only and training-only throughput, transition p90 and MFU."""
    if per_run.empty:
        return pd.DataFrame()
    for col in ("eval_accuracy_before", "eval_accuracy_after", "mfu_step", "mfu_gen", "mfu_train"):
        if col not in per_run:
            per_run = per_run.assign(**{col: np.nan})
    table = by_framework(per_run)
    extra = per_run.groupby("framework").agg(
        gen_tokens_per_s=("gen_tok_s", "median"), gen_tokens_per_s_min=("gen_tok_s", "min"),
        gen_tokens_per_s_max=("gen_tok_s", "max"),
        train_tokens_per_s=("train_tok_s", "median"), train_tokens_per_s_min=("train_tok_s", "min"),
        train_tokens_per_s_max=("train_tok_s", "max"),
        transition_s_p90=("time_transition_s_p90", "median"),
        **{c: (c, "median") for c in ("mfu_step", "mfu_gen", "mfu_train")},
    ).reset_index()
    return table.merge(extra, on="framework", how="left")


def _mfu(r: Any) -> str:  # a row of DataFrame.itertuples(): a namedtuple of the table's columns
    if pd.isna(r.mfu_step):
        return "-"
    return f"{r.mfu_step:.1%} ({r.mfu_gen:.1%} / {r.mfu_train:.1%})"


def throughput_markdown(table: pd.DataFrame) -> str:
    """The shared comparison table's form (framework, tokens/s, relative to the slowest), with spread over seeds."""
    lines = [
        "| framework | version | GPUs | seeds | tokens/s (median) | min-max over seeds | tokens/s per GPU | relative |"
        " generation-only tokens/s | training-only tokens/s | transition s (median / p90) | reward gain |"
        " eval acc. before -> after | MFU step (gen / train) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in table.itertuples():
        lines.append(
            f"| {r.framework} | {r.framework_version} | {r.n_gpus} | {r.seeds} | {_fmt(r.tokens_per_s)} |"
            f" {_fmt(r.tokens_per_s_min)}-{_fmt(r.tokens_per_s_max)} | {_fmt(r.tokens_per_s_per_gpu)} |"
            f" {r.relative:.2f}x | {_fmt(r.gen_tokens_per_s)} | {_fmt(r.train_tokens_per_s)} |"
            f" {_fmt(r.transition_s_median, 4)} / {_fmt(r.transition_s_p90, 4)} | {_fmt(r.reward_gain, 3)} |"
            f" {_fmt(r.eval_accuracy_before, 3)} -> {_fmt(r.eval_accuracy_after, 3)} | {_mfu(r)} |"
        )
    notes = (
        "\ntokens/s = (prompt + sampled-response tokens of the global batch) / RL iteration time, aggregate over the"
        " run's accelerators, median over measured steps (after warm-up) per run, then median over seeds. Greedy"
        " baseline tokens are generated inside the step but not counted (as verl's own figure). Generation-only and"
        " training-only: the same tokens over the generation (sampled + greedy) or actor-update time alone."
        " GPUs = 0: CPU run. MFU: the model FLOPs of the step's tokens (PaLM's count; harness/results/efficiency.py)"
        " per"
        " second over the run's peak (GPUs: data-sheet bf16 peak; the reference on a CPU: its measured fp32 matmul"
        " rate), median over measured steps, then over seeds; empty where the peak is unknown.\n"
    )
    return "\n".join(lines) + "\n" + notes


def _trailing(series: pd.Series, k: int, min_periods: int) -> pd.Series:
    return series.rolling(k, min_periods=min_periods).mean()



def time_to_reward_table(runs: list[Run], fraction: float) -> tuple[pd.DataFrame, float]:
    """Wall time until a run's trailing mean reward reaches `fraction` of the best framework's final reward.

    Final reward: mean of the last 10% of a run's steps, median over seeds; the trailing mean uses the same
    window, so a run 'reaches' the target in the same sense the best one ended there.
    """
    ok = [r for r in runs if r.status == "ok"]
    if not ok:
        return pd.DataFrame(), math.nan
    finals = pd.DataFrame([(r.framework, r.summary["reward_last10"]) for r in ok], columns=["framework", "final"])
    best = finals.groupby("framework")["final"].median().max()
    target = fraction * best if best > 0 else math.nan
    rows = []
    for r in ok:
        df = r.steps
        smooth = _trailing(df["reward_mean"], edge_window(len(df)), edge_window(len(df)))
        hit = np.flatnonzero((smooth >= target).to_numpy()) if not math.isnan(target) else np.array([], dtype=int)
        wall = df["time_step_s"].cumsum().to_numpy()
        rows.append({"framework": r.framework, "seed": r.seed, "final": r.summary["reward_last10"],
                     "time_s": float(wall[hit[0]]) if len(hit) else math.nan,
                     "step": int(df["step"].iloc[hit[0]]) if len(hit) else math.nan})
    per_run = pd.DataFrame(rows)
    table = per_run.groupby("framework", sort=False).agg(
        final_reward=("final", "median"), final_min=("final", "min"), final_max=("final", "max"),
        seeds=("seed", "nunique"), reached=("time_s", "count"),
        time_s=("time_s", "median"), time_min=("time_s", "min"), time_max=("time_s", "max"),
        step=("step", "median"),
    ).reset_index()
    return table, target


OWN_AGREE = 0.01  # relative difference under which a framework's own throughput figure agrees with the harness's


def own_throughput_table(runs: list[Run], warmup: int) -> pd.DataFrame:
    """Per framework that logs a throughput figure of its own: that figure against the harness's tokens/s on the
    same measured steps of the same logs (medians over steps, then seeds), their ratio, and what the framework's
    figure counts (its adapter's own_throughput)."""
    rows = []
    for fw in dict.fromkeys(r.framework for r in runs):
        ok = [r for r in runs if r.framework == fw and r.status == "ok"
              and FRAMEWORK_THROUGHPUT in r.steps and r.steps[FRAMEWORK_THROUGHPUT].notna().any()]
        if not ok:
            continue
        measured = [r.steps[r.steps["step"] > warmup] for r in ok]
        ratio = pd.concat([m[FRAMEWORK_THROUGHPUT] / m["throughput_tok_s"] for m in measured])
        adapter = _adapter(fw)
        rows.append({"framework": fw, "seeds": len(ok),
                     "own_tok_s": float(np.median([m[FRAMEWORK_THROUGHPUT].median() for m in measured])),
                     "harness_tok_s": float(np.median([m["throughput_tok_s"].median() for m in measured])),
                     "ratio_median": float(ratio.median()), "ratio_min": float(ratio.min()),
                     "ratio_max": float(ratio.max()),
                     "agree": bool((ratio - 1).abs().max() <= OWN_AGREE),
                     "definition": adapter.own_throughput if adapter is not None else ""})
    return pd.DataFrame(rows, columns=["framework", "seeds", "own_tok_s", "harness_tok_s", "ratio_median",
                                       "ratio_min", "ratio_max", "agree", "definition"])


def own_throughput_html(own: pd.DataFrame) -> str:
    if own.empty:
        return ""
    rows = [[_e(r.framework), _num(r.seeds), _num(r.own_tok_s), _num(r.harness_tok_s),
             f'<td class="num">{r.ratio_median:.4f} <span class="muted">({r.ratio_min:.4f}&ndash;{r.ratio_max:.4f})'
             "</span></td>",
             "<b>agree</b>" if r.agree else
             f"<b>differ</b> by up to {max(abs(r.ratio_min - 1), abs(r.ratio_max - 1)):.1%}",
             _e(r.definition)] for r in own.itertuples()]
    return ("<h3>The frameworks' own throughput figures against the harness's</h3>"
            + _table(["framework", "seeds", "own figure, tokens/s (median)", "harness tokens/s (median)",
                      "own / harness per step (min&ndash;max)", f"within {OWN_AGREE:.0%}?",
                      "what the own figure counts"],
                     rows, ["" if r.agree else "mismatch" for r in own.itertuples()])
            + "<p class='muted'>Both figures from the same real log, on the measured steps of every completed run. "
              "The comparison table above uses the harness's figure for every framework.</p>")


# ---- figures -----------------------------------------------------------------------------------------------

def _png(fig: Figure, dest: Path) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    data = buf.getvalue()
    with atomic_path(dest) as tmp:
        tmp.write_bytes(data)
    return data


def _empty(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=12, color="0.4")
    ax.set_xticks([])
    ax.set_yticks([])


def _palette(frameworks: list[str]) -> dict[str, tuple]:
    return dict(zip(frameworks, sns.color_palette("colorblind", max(1, len(frameworks)))))


def throughput_figure(table: pd.DataFrame, colors: dict, dest: Path) -> bytes:
    panels = (("tokens_per_s", "end to end (the table's figure)"), ("gen_tokens_per_s", "generation only"),
              ("train_tokens_per_s", "training only"))
    n = max(1, len(table))
    fig, axes = plt.subplots(1, 3, figsize=(13, 1.2 + 0.55 * n), sharey=True)
    for ax, (col, title) in zip(axes, panels):
        if table.empty or table[col].isna().all():
            _empty(ax, f"{title}: not timed" if not table.empty else "no completed run")
            continue
        y = np.arange(len(table))
        med = table[col].to_numpy()
        err = np.vstack([med - table[f"{col}_min"].to_numpy(), table[f"{col}_max"].to_numpy() - med])
        ax.barh(y, med, xerr=err, color=[colors[f] for f in table["framework"]], capsize=4, height=0.6)
        for yi, v in zip(y, med):
            if np.isnan(v):
                ax.text(0, yi, " not timed", va="center", ha="left", fontsize=9, color="0.4")
            else:
                ax.text(v, yi, f" {_fmt(v)}", va="bottom", ha="left", fontsize=9)
        ax.set_yticks(y, table["framework"])
        ax.set_xlim(0, np.nanmax(table[f"{col}_max"].to_numpy()) * 1.25)
        ax.set(title=title, xlabel="tokens/s (median; bar: min-max over seeds)")
    fig.tight_layout()
    return _png(fig, dest)


def step_time_figure(per_run: pd.DataFrame, order: list[str], colors: dict, dest: Path) -> bytes:
    fig, ax = plt.subplots(figsize=(10, 1.4 + 0.55 * max(1, len(order))))
    if per_run.empty:
        _empty(ax, "no completed run")
        return _png(fig, dest)
    parts = ["generation", "transition", "training", "other"]
    means = per_run.groupby("framework")[[f"mean_{p}_s" for p in parts]].mean().reindex(order)
    left = np.zeros(len(means))
    part_colors = sns.color_palette("Set2", len(parts))
    for p, c in zip(parts, part_colors):
        v = means[f"mean_{p}_s"].to_numpy()
        ax.barh(means.index, v, left=left, color=c, label=p, height=0.6)
        left += v
    for i, total in enumerate(left):
        ax.text(total, i, f" {total:.3g} s", va="center", fontsize=9)
    ax.set_xlim(0, left.max() * 1.15)
    ax.set(xlabel="seconds per RL iteration (mean over measured steps and seeds)",
           title="Step-time breakdown (other = step time not in generation, transition or training)")
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    fig.tight_layout()
    return _png(fig, dest)


def reward_figure(runs: list[Run], order: list[str], colors: dict, target: float, ttr: pd.DataFrame,
                  dest: Path) -> bytes:
    fig, (ax_step, ax_wall) = plt.subplots(1, 2, figsize=(13, 4.6))
    ok = [r for r in runs if r.status == "ok"]
    if not ok:
        for ax in (ax_step, ax_wall):
            _empty(ax, "no completed run")
        return _png(fig, dest)
    for fw in order:
        fw_runs = [r for r in ok if r.framework == fw]
        if not fw_runs:
            continue
        color = colors[fw]
        curves = pd.concat({r.seed: _trailing(r.steps.set_index("step")["reward_mean"],
                                              edge_window(len(r.steps)), 1) for r in fw_runs}, axis=1)
        ax_step.plot(curves.index, curves.mean(axis=1), color=color, label=f"{fw} ({len(fw_runs)} seeds)")
        ax_step.fill_between(curves.index, curves.min(axis=1), curves.max(axis=1), color=color, alpha=0.2, lw=0)
        # up to the shortest seed's run time: past it the mean would be over fewer seeds and jump
        end = min(r.steps["time_step_s"].sum() for r in fw_runs)
        grid = np.linspace(0, end, 300)
        on_grid = np.vstack([
            np.interp(grid, r.steps["time_step_s"].cumsum().to_numpy(),
                      _trailing(r.steps["reward_mean"], edge_window(len(r.steps)), 1).to_numpy(),
                      left=np.nan, right=np.nan) for r in fw_runs])
        with warnings.catch_warnings():  # a time no seed has reached yet: drawn as a gap on purpose
            warnings.simplefilter("ignore", RuntimeWarning)
            ax_wall.plot(grid, np.nanmean(on_grid, 0), color=color, label=fw)
            ax_wall.fill_between(grid, np.nanmin(on_grid, 0), np.nanmax(on_grid, 0), color=color, alpha=0.2, lw=0)
        row = ttr[ttr["framework"] == fw]
        if not row.empty and not pd.isna(row["time_s"].iloc[0]):
            ax_wall.plot(row["time_s"].iloc[0], target, "o", color=color, ms=8, mec="black")
    if not math.isnan(target):
        for ax in (ax_step, ax_wall):
            ax.axhline(target, ls="--", color="0.3", lw=1, label="time-to-reward target")
    ax_step.set(xlabel="optimizer step", ylabel="reward of sampled responses", title="Reward vs step")
    ax_wall.set(xlabel="wall-clock time of the run's steps (s), up to the shortest seed's end",
                title="Reward vs wall-clock (dot: median time-to-reward)")
    ax_step.legend(fontsize=9, loc="best")
    fig.suptitle("line: mean over seeds of a trailing mean over 10% of steps; band: min-max over seeds", fontsize=10)
    fig.tight_layout()
    return _png(fig, dest)


def truth_table(runs: list[Run]) -> pd.DataFrame:
    """Per run with the task's exact-match accuracy logged: shared reward and accuracy, first and last 10% of
    steps, and how the two move together (Pearson over steps). Empty when no run logged the accuracy."""
    rows = []
    for r in runs:
        if r.status != "ok" or r.steps["task_accuracy_mean"].isna().all():
            continue
        reward_first, reward_last = edge_means(r.steps["reward_mean"])
        acc_first, acc_last = edge_means(r.steps["task_accuracy_mean"])
        rows.append({"framework": r.framework, "seed": r.seed, "reward_first10": reward_first,
                     "reward_last10": reward_last, "accuracy_first10": acc_first, "accuracy_last10": acc_last,
                     "correlation": r.steps["reward_mean"].corr(r.steps["task_accuracy_mean"])})
    return pd.DataFrame(rows)


def truth_figure(runs: list[Run], colors: dict, dest: Path) -> bytes:
    """Shared reward and the task's exact-match accuracy per step, one panel each, per run (trailing means)."""
    fig, (ax_reward, ax_acc) = plt.subplots(1, 2, figsize=(13, 4.2))
    for r in runs:
        if r.status != "ok" or r.steps["task_accuracy_mean"].isna().all():
            continue
        m, k = r.steps.set_index("step"), edge_window(len(r.steps))
        for ax, column in ((ax_reward, "reward_mean"), (ax_acc, "task_accuracy_mean")):
            ax.plot(m.index, _trailing(m[column], k, 1), color=colors[r.framework], alpha=0.8,
                    label=f"{r.framework} seed {r.seed}")
    ax_reward.set(xlabel="optimizer step", ylabel="shared reward of the samples",
                  title="Reward the policy is trained on")
    ax_acc.set(xlabel="optimizer step", ylabel="exact-match accuracy of the samples", ylim=(-0.02, 1.02),
               title="The task's truth")
    ax_reward.legend(fontsize=8, loc="best")
    fig.suptitle("trailing mean over 10% of steps, one line per run", fontsize=10)
    fig.tight_layout()
    return _png(fig, dest)


def truth_html(truth: pd.DataFrame, figure: bytes, reward_record: dict | None) -> str:
    made = ""
    if reward_record and reward_record.get("pair_accuracy_eval") is not None:
        by = ", ".join(f"{k} {v:.3f}" for k, v in reward_record.get("pair_accuracy_eval_by_mistake", {}).items())
        made = (f"<p>The reward model ranks the right answer above a wrong one in "
                f"<b>{reward_record['pair_accuracy_eval']:.1%}</b> of {reward_record.get('eval_pairs')} held-out "
                f"pairs (by kind of mistake: {_e(by)}).</p>")
    rows = [[_e(r.framework), _e(r.seed), f"{_fmt(r.reward_first10, 3)} &rarr; {_fmt(r.reward_last10, 3)}",
             f"{_fmt(r.accuracy_first10, 3)} &rarr; {_fmt(r.accuracy_last10, 3)}", _fmt(r.correlation, 2)]
            for r in truth.itertuples()]
    return ("<h3>Reward vs the task's truth</h3>" + made + _img(figure, "reward and task accuracy vs step")
            + _table(["framework", "seed", "reward, first &rarr; last 10% of steps",
                      "exact-match accuracy, first &rarr; last 10%", "correlation over steps"], rows)
            + "<p class='muted'>A reward that rises while the accuracy does not is the reward model being "
              "exploited (over-optimisation), not the task being learnt.</p>")


# ---- fairness, conformance, claims -------------------------------------------------------------------------

def _get(config: dict, dotted: str) -> Any:
    node = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _same(a: object, b: object) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)
    return a == b


def fairness_table(config: dict, runs: list[Run]) -> pd.DataFrame:
    """One row per (shared key, framework): the effective value against the shared spec, and why it differs.

    The reference backend reads the shared config itself; a real framework's values come from its plans'
    `hyperparameters` and `deviations` (all seeds; differing values across seeds are all shown). Each plan entry
    is judged against its own `shared` value (the spec as the adapter applied it to that run, e.g. one seed of
    `seeds`); a scalar that differs from the config's means the plan was made from another config.
    """
    entries = [e for r in runs if r.plan for e in r.plan.get("hyperparameters", []) + r.plan.get("deviations", [])]
    keys = list(dict.fromkeys([f"remax.{k}" for k in config["remax"]] + [e["key"] for e in entries if e.get("key")]))
    spec = {k: _get(config, k) if _get(config, k) is not None else
            next((e.get("shared") for e in entries if e.get("key") == k), None) for k in keys}
    rows = []
    for fw in config["frameworks"]:
        adapter = _adapter(fw)
        plans = [r.plan for r in runs if r.framework == fw and r.plan]
        for key in keys:
            row = dict(framework=fw, key=key, shared=spec[key], effective=None, framework_key="")
            if adapter is not None and adapter.run is not None and adapter.plan is None:
                rows.append({**row, "effective": spec[key], "framework_key": key, "state": "match",
                             "cause": "embedded backend: reads the shared config"})
                continue
            if not plans:
                rows.append({**row, "state": "unknown", "cause": "no plan.json under results/plans"})
                continue
            mapped = [h for p in plans for h in p.get("hyperparameters", []) if h.get("key") == key]
            devs = [d for p in plans for d in p.get("deviations", []) if d.get("key") == key]
            if not mapped and not devs:
                rows.append({**row, "state": "not mapped", "cause": "the adapter does not map this key"})
                continue
            causes = [d["cause"] for d in devs if d.get("cause")]
            if any(not _same(e.get("effective"), e.get("shared")) for e in mapped) and not causes:
                causes.append("differs from the shared spec; the adapter gives no cause")
            configured = _get(config, key)
            stale = [e.get("shared") for e in mapped + devs if configured is not None and e.get("shared") is not None
                     and not isinstance(configured, (list, dict)) and not _same(e["shared"], configured)]
            if stale:
                causes.append(f"plan.json was made from another config (shared value there: {stale[0]})")
            effective = [json.loads(v) for v in dict.fromkeys(json.dumps(e.get("effective")) for e in mapped + devs)]
            rows.append({**row, "effective": effective[0] if len(effective) == 1 else effective,
                         "framework_key": ", ".join(dict.fromkeys(h.get("framework_key", "") for h in mapped)),
                         "state": "mismatch" if causes or devs else "match", "cause": "; ".join(dict.fromkeys(causes))})
    # object dtype: an integer setting stays an integer next to float ones
    return pd.DataFrame(rows, columns=["framework", "key", "shared", "effective", "framework_key", "state", "cause"],
                        dtype=object)


REWARD_COLUMNS = ["framework", "kind", "sha256", "checkpoint", "scored_by", "seeds"]


def reward_table(runs: list[Run]) -> pd.DataFrame:
    """Which shared reward scored each framework, and how: one row per (framework, reward, path) over its seeds.

    A real framework's plan.json says it ("reward": kind, checkpoint, sha256, scored_by); the embedded backend's
    manifest.json records the reward input it scored with in its own process (inputs.reward).
    """
    rows: dict[tuple, dict] = {}
    for r in runs:
        if r.plan and isinstance(r.plan.get("reward"), dict):
            rec = r.plan["reward"]
            kind, sha, ckpt, by = rec.get("kind"), rec.get("sha256"), rec.get("checkpoint"), rec.get("scored_by")
        elif r.manifest and isinstance((r.manifest.get("inputs") or {}).get("reward"), dict):
            rec = r.manifest["inputs"]["reward"]
            kind, sha, by = rec.get("kind"), rec.get("sha256"), "in-process"
            ckpt = rec.get("path") if kind == "model" else None
        else:
            continue
        row = rows.setdefault((r.framework, kind, sha, by), {"framework": r.framework, "kind": kind, "sha256": sha,
                                                              "checkpoint": ckpt, "scored_by": by, "seeds": []})
        row["seeds"].append(r.seed)
    return pd.DataFrame(list(rows.values()), columns=REWARD_COLUMNS, dtype=object)


def reward_html(table: pd.DataFrame) -> str:
    if table.empty:
        return "<p>No run records which reward scored it (no plan.json or manifest.json).</p>"
    counts = table["sha256"].value_counts(dropna=False)
    shas, common = set(counts.index), counts.index[0]
    note = (f'<p><b class="failed">The frameworks were scored by {len(shas)} different rewards (sha256; rows '
            "with a reward other than the most common one are highlighted): their rewards are not comparable.</b></p>"
            if len(shas) > 1 else "<p>Every framework was scored by the same reward (one sha256).</p>")
    return "<h3>Reward: which checkpoint scored each framework, and how</h3>" + note + _table(
        ["framework", "kind", "sha256", "checkpoint", "scored by", "seeds"],
        [[_e(r.framework), _e(r.kind), _short(r.sha256), _e(r.checkpoint or "n/a"), f"<b>{_e(r.scored_by)}</b>",
          _e(", ".join(map(str, r.seeds)))] for r in table.itertuples()],
        ["mismatch" if sha != common else "" for sha in table["sha256"]])


CONFORMANCE_COLUMNS = ["framework", "case", "max_abs_diff", "verdict", "note"]


def read_conformance(results: Path, problems: list[str]) -> pd.DataFrame | None:
    path = results / "conformance.csv"
    if not path.is_file():
        return None
    try:
        df = pd.read_csv(path)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        problems.append(f"{path}: unreadable ({e})")
        return None
    missing = [c for c in CONFORMANCE_COLUMNS if c not in df.columns]
    if missing:
        problems.append(f"{path}: lacks columns {', '.join(missing)}")
        return None
    return df[CONFORMANCE_COLUMNS]


def load_claims(path: Path) -> dict:
    try:
        claims = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise HarnessError(f"{path}: unreadable claims file ({e})") from None
    defaults = validate_config({})
    for section, required in (("throughput", ("framework", "tokens_per_s", "hardware", "setting", "source")),
                              ("ratios", ("faster", "slower", "ratio", "hardware", "setting", "source"))):
        for i, c in enumerate(claims.get(section, [])):
            missing = [k for k in required if k not in c]
            if missing:
                raise HarnessError(f"{path}: at {section}[{i}]: missing {', '.join(missing)}")
            unknown = [k for k in c["setting"] if k != "note" and _get(defaults, k) is None]
            if unknown:
                raise HarnessError(f"{path}: at {section}[{i}].setting: {', '.join(unknown)} is not a config key "
                                   "(a setting is config keys, e.g. remax.max_response_length, and a note)")
    return claims


def run_hardware(runs: list[Run], fw: str) -> list[str] | None:
    """GPU names of the framework's completed runs (from manifest.json), or None when not recorded."""
    seen = [r.manifest["hardware"].get("gpus", []) for r in runs
            if r.framework == fw and r.status == "ok" and r.manifest and "hardware" in r.manifest]
    return seen[0] if seen else None


def _hardware_words(runs: list[Run], fw: str) -> str:
    gpus = run_hardware(runs, fw)
    if gpus is None:
        return "hardware not recorded"
    if not gpus:
        cpu = next(r.manifest["hardware"].get("cpu", "CPU") for r in runs
                   if r.framework == fw and r.manifest and "hardware" in r.manifest)
        return f"0 GPUs ({cpu})"
    names = sorted(set(gpus))
    return f"{len(gpus)}x {' / '.join(names)}"


def _matches(hw: dict, gpus: list[str] | None) -> bool:
    if not gpus:
        return False
    count_ok = hw.get("gpus") is None or len(gpus) == hw["gpus"]
    return count_ok and all(str(hw.get("gpu", "")).lower() in g.lower() for g in gpus)


# What decides whether a published throughput can be set beside this run's, besides the hardware.
RUN_SETTING = ("remax.max_prompt_length", "remax.max_response_length", "remax.generation_length",
               "remax.train_batch_size", "remax.rollout_n")


def setting_words(setting: dict) -> str:
    """A claim's published setting in words: its config keys and values, then its note."""
    keys = "; ".join(f"{k.split('.')[-1]} {_fmt(v) if isinstance(v, (int, float)) else v}"
                     for k, v in setting.items() if k != "note")
    return "; ".join(part for part in (keys, setting.get("note", "")) if part) or "not stated"


def claims_table(claims: dict, runs: list[Run], table: pd.DataFrame, config: dict) -> pd.DataFrame:
    measured = dict(zip(table["framework"], table["tokens_per_s"])) if not table.empty else {}
    rows = []

    def verdict(fws: list[str], hw: dict, setting: dict) -> str | None:
        for fw in fws:
            if fw not in measured:
                return f"not measured: no completed {fw} run"
        for fw in fws:
            if run_hardware(runs, fw) is None:
                return f"not comparable: the hardware of the {fw} runs is not recorded (no manifest.json)"
            if not _matches(hw, run_hardware(runs, fw)):
                return f"not comparable: different hardware (this run: {fw} on {_hardware_words(runs, fw)})"
        if len(fws) > 1 and len({tuple(sorted(run_hardware(runs, fw) or [])) for fw in fws}) > 1:
            return "not comparable: the frameworks ran on different hardware"
        differ = [f"{k} {v} there, {_get(config, k)} here" for k, v in setting.items()
                  if k != "note" and not _same(v, _get(config, k))]
        if differ:
            return f"not comparable: a different setting ({'; '.join(differ)})"
        return None

    def claim_hw(hw: dict) -> str:
        return f"{hw['gpus']}x {hw.get('gpu', '?')}" if hw.get("gpus") else f"{hw.get('gpu', '?')} (count not stated)"

    for c in claims.get("throughput", []):
        fw, why = c["framework"], verdict([c["framework"]], c["hardware"], c["setting"])
        rows.append(dict(claim=f"{fw} {c.get('version') or ''} {_fmt(c['tokens_per_s'])} tokens/s".replace("  ", " "),
                         model=c.get("model", ""), hardware=claim_hw(c["hardware"]),
                         setting=setting_words(c["setting"]), source=c["source"],
                         measured=why or f"{_fmt(measured[fw])} tokens/s "
                                         f"({measured[fw] / c['tokens_per_s']:.2f}x the claim)",
                         comparable=why is None))
    for c in claims.get("ratios", []):
        fws = [c["faster"], c["slower"]]
        why = verdict(fws, c["hardware"], c["setting"])
        rows.append(dict(claim=f"{c['faster']} / {c['slower']} = {c['ratio']:.2f}x tokens/s", model=c.get("model", ""),
                         hardware=claim_hw(c["hardware"]), setting=setting_words(c["setting"]), source=c["source"],
                         measured=why or f"{measured[fws[0]] / measured[fws[1]]:.2f}x", comparable=why is None))
    return pd.DataFrame(rows, columns=["claim", "model", "hardware", "setting", "source", "measured", "comparable"])


# ---- HTML --------------------------------------------------------------------------------------------------

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;max-width:1200px;color:#222;
padding:0 1em;line-height:1.4}
h1{margin-bottom:.2em}h2{border-bottom:2px solid #ddd;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;margin:.6em 0;font-size:.9em}th,td{border:1px solid #ccc;padding:.25em .55em;
vertical-align:top}th{background:#f3f3f3;text-align:left}td.num{text-align:right;font-variant-numeric:tabular-nums}
.ok{background:#e3f5e1}.failed{background:#fbe0e0}.notrun{background:#eee;color:#555}
.mismatch{background:#fde8c8}.unmapped{background:#eee;color:#666}.match{}
.claim{font-style:italic}.muted{color:#666;font-size:.9em}.findings{background:#f6f8fa;border:1px solid #ddd;
padding:.6em 1.2em;border-radius:6px}img{max-width:100%;border:1px solid #eee}
.nw{white-space:nowrap}.scroll{overflow-x:auto}.small table{font-size:.78em}
pre{background:#f6f6f6;padding:.5em;overflow-x:auto;font-size:.8em;max-height:30em}code{font-size:.9em}
"""


def _e(x: object) -> str:
    if isinstance(x, float) and math.isnan(x):
        return "n/a"
    return html.escape(str(x))


def _img(data: bytes, alt: str) -> str:
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{base64.b64encode(data).decode()}">'


def _table(header: list[str], rows: list[list[str]], classes: list[str] | None = None) -> str:
    """Cells are already HTML; a cell string starting with '<td' is taken as is (for a class)."""
    out = ["<table><tr>" + "".join(f"<th>{h}</th>" for h in header) + "</tr>"]
    for i, row in enumerate(rows):
        cls = f' class="{classes[i]}"' if classes and classes[i] else ""
        out.append(f"<tr{cls}>" + "".join(c if c.startswith("<td") else f"<td>{c}</td>" for c in row) + "</tr>")
    return "\n".join(out) + "</table>"


def _num(x: float | None, digits: int = 0) -> str:
    return f'<td class="num">{_fmt(x, digits)}</td>'


def _spread(med: float | None, lo: float | None, hi: float | None, digits: int = 0) -> str:
    spread = f'<span class="muted">({_fmt(lo, digits)}&ndash;{_fmt(hi, digits)})</span>'
    return f'<td class="num">{_fmt(med, digits)} {spread}</td>'


def findings(table: pd.DataFrame, ttr: pd.DataFrame, runs: list[Run], fraction: float) -> list[str]:
    """The page's answers in words, each computed from the tables below."""
    out = []
    counts = pd.Series([r.status for r in runs]).value_counts()
    statuses = ("ok", "failed", "not run")
    out.append(f"{len(runs)} planned runs: " + ", ".join(f"{counts.get(s, 0)} {s}" for s in statuses))
    if table.empty:
        out.append("No run completed: nothing to compare.")
        return out
    fast, slow = table.iloc[-1], table.iloc[0]
    if len(table) == 1:
        out.append(f"Only {fast.framework} completed ({_fmt(fast.tokens_per_s)} tokens/s): "
                   "no framework to compare with.")
    else:
        second = table.iloc[-2]
        real = ("its slowest seed is faster than the fastest seed of " + second.framework
                if fast.tokens_per_s_min > second.tokens_per_s_max else
                f"but its seed range overlaps that of {second.framework}: the difference may not be real")
        out.append(f"Fastest: {fast.framework}, {_fmt(fast.tokens_per_s)} tokens/s, {fast.relative:.2f}x the slowest "
                   f"({slow.framework}); {real}.")
    for row in ttr.itertuples():
        if row.reached == 0:
            out.append(f"{row.framework} did not reach {fraction:.0%} of the best final reward in any seed "
                       f"(final reward {_fmt(row.final_reward, 3)}).")
        else:
            out.append(f"{row.framework} reached {fraction:.0%} of the best final reward in {_fmt(row.time_s, 1)} s "
                       f"(median over the {row.reached} of {row.seeds} seeds that reached it).")
    return out


def _value(v: object) -> str:
    return "n/a" if v is None else _e(json.dumps(v) if isinstance(v, (list, dict, bool)) else v)


def fairness_html(fair: pd.DataFrame, frameworks: list[str]) -> str:
    if fair.empty:
        return "<p>No shared keys.</p>"
    header = ["shared key", "shared spec"] + [_e(f) for f in frameworks]
    rows = []
    for key, group in fair.groupby("key", sort=False):
        cells = [f"<code>{_e(key)}</code>", _value(group["shared"].iloc[0])]
        by_fw = group.set_index("framework")
        for fw in frameworks:
            if fw not in by_fw.index:
                cells.append("")
                continue
            r = by_fw.loc[fw]
            named = r.framework_key and r.framework_key != key
            fk = f' <span class="muted">({_e(r.framework_key)})</span>' if named else ""
            if r.state == "mismatch":
                cells.append(f'<td class="mismatch"><b>{_value(r.effective)}</b>{fk}<br>'
                             f'<span class="muted">{_e(r.cause)}</span></td>')
            elif r.state in ("not mapped", "unknown"):
                cells.append(f'<td class="unmapped">{_e(r.cause)}</td>')
            else:
                cells.append(f"{_value(r.effective)}{fk}")
        rows.append(cells)
    return _table(header, rows)


def _short(sha: str | None) -> str:
    return f'<code title="{_e(sha)}">{_e(sha[:12])}</code>' if sha else "n/a"


def manifest_html(runs: list[Run]) -> str:
    header = ["framework", "seed", "status", "run id", "version", "git commit", "hardware", "packages", "config hash",
              "dataset sha256", "policy sha256", "reward sha256", "created"]
    rows: list[list[str]] = []
    hashes: dict[str, set[str]] = {}
    for r in runs:
        m = r.manifest or {}
        inputs = m.get("inputs") or (r.plan or {}).get("inputs") or {}
        if not m and not r.plan:
            continue
        for name in ("dataset", "policy", "reward"):
            if inputs.get(name, {}).get("sha256"):
                hashes.setdefault(name, set()).add(inputs[name]["sha256"])
        git = m.get("git") or {}
        hw = m.get("hardware") or {}
        gpus = hw.get("gpus")
        hw_words = "n/a" if not hw else (f"{len(gpus)}x {', '.join(sorted(set(gpus)))}" if gpus else
                                         f"CPU: {hw.get('cpu', '?')} ({hw.get('cpu_count', '?')} cores)")
        versions = m.get("versions") or {}
        pkgs = ", ".join(f"{k} {v}" for k, v in versions.items() if v and k in ("python", "torch", "transformers"))
        plan = r.plan or {}
        rows.append([_e(r.framework), _e(r.seed), _e(r.status), _e(m.get("run_id") or plan.get("run_id", "n/a")),
                     _e(m.get("framework_version") or plan.get("framework_version", "n/a")),
                     (_short(git.get("commit")) + (" (dirty)" if git.get("dirty") else "")) if git else "n/a",
                     _e(hw_words), _e(pkgs or "n/a"), _e(m.get("config_hash", "n/a")),
                     *[_short(inputs.get(n, {}).get("sha256")) for n in ("dataset", "policy", "reward")],
                     _e(m.get("created", "n/a"))])
    if not rows:
        return "<p>No manifest or plan recorded for any run.</p>"
    same = [n for n, s in hashes.items() if len(s) == 1]
    diff = [n for n, s in hashes.items() if len(s) > 1]
    note = (f"<p>Same inputs in every run: {', '.join(same) or 'none recorded'}."
            + (f' <b class="failed">Inputs differ between runs: {", ".join(diff)}.</b>' if diff else "") + "</p>")
    return note + "<div class='scroll small'>" + _table(header, rows) + "</div>"


def render_html(*, config: dict, results: Path, runs: list[Run], table: pd.DataFrame, per_run: pd.DataFrame,
                ttr: pd.DataFrame, target: float, fair: pd.DataFrame, conformance: pd.DataFrame | None,
                claims: pd.DataFrame, figures: dict[str, bytes], problems: list[str]) -> str:
    fraction = config["report"]["time_to_reward_fraction"]
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>remax-bench report: "
             f"{_e(config.get('profile', ''))}</title><style>{CSS}</style></head><body>",
             f"<h1>ReMax framework comparison</h1><p class='muted'>profile <b>{_e(config.get('profile'))}</b>; "
             f"frameworks {_e(', '.join(config['frameworks']))}; seeds {_e(', '.join(map(str, config['seeds'])))}; "
             f"{config['remax']['steps']} steps per run, first {config['remax']['warmup_steps']} left out as warm-up; "
             f"results from <code>{_e(results)}</code></p>",
             "<div class='findings'><ul>" + "".join(f"<li>{_e(f)}</li>" for f in findings(table, ttr, runs, fraction))
             + "</ul></div>"]
    if problems:
        parts.append("<p class='failed'>Problems reading the results: " + "; ".join(map(_e, problems)) + "</p>")

    parts.append("<h2>1. Throughput</h2>")
    if table.empty:
        parts.append("<p>No completed run.</p>")
    else:
        rows = [[_e(r.framework), _e(r.framework_version), _num(r.n_gpus), _num(r.seeds),
                 _spread(r.tokens_per_s, r.tokens_per_s_min, r.tokens_per_s_max), _num(r.tokens_per_s_per_gpu),
                 f'<td class="num"><b>{r.relative:.2f}x</b></td>',
                 _spread(r.gen_tokens_per_s, r.gen_tokens_per_s_min, r.gen_tokens_per_s_max),
                 _spread(r.train_tokens_per_s, r.train_tokens_per_s_min, r.train_tokens_per_s_max),
                 f'<td class="num">{_e(_mfu(r))}</td>']
                for r in table.itertuples()]
        parts.append(_table(["framework", "version", "GPUs", "seeds", "tokens/s median (min&ndash;max over seeds)",
                             "tokens/s per GPU", "relative (slowest = 1.0x)", "generation-only tokens/s",
                             "training-only tokens/s", "MFU step (generation / training)"], rows))
        parts.append("<p class='muted'>tokens/s = (prompt + sampled-response tokens of the global batch) / RL "
                     "iteration time, aggregate over the run's accelerators (HybridFlow's definition); median over "
                     "measured steps per run, then median over seeds. Generation-only and training-only: the same "
                     "tokens over the generation (sampled + greedy) or actor-update time alone. GPUs = 0: CPU run, "
                     "no per-GPU figure. MFU: the model FLOPs of the step's tokens (PaLM's count, "
                     "harness/results/efficiency.py) per second over the run's peak (GPUs: data-sheet bf16 peak; the "
                     "reference on a CPU: its measured fp32 matmul rate); empty where the peak is unknown.</p>")
    parts.append(_img(figures["throughput"], "throughput per framework"))
    parts.append(own_throughput_html(own_throughput_table(runs, config["remax"]["warmup_steps"])))

    parts.append("<h2>2. Transition and step time</h2>")
    if not per_run.empty:
        rows = []
        for fw, g in per_run.groupby("framework", sort=False):
            exposed = bool(g["transition_exposed"].any())
            rows.append([_e(fw), _num(g["time_transition_s_median"].median(), 4) if exposed else "not exposed",
                         _num(g["time_transition_s_p90"].median(), 4) if exposed else "not exposed",
                         _num(g["time_step_s_median"].median(), 4),
                         _num(100 * g["mean_transition_s"].mean() / g["mean_step_s"].mean(), 1) if exposed else "n/a"])
        parts.append(_table(["framework", "transition s (median)", "transition s (p90)", "step s (median)",
                             "transition share of step %"], rows))
        parts.append("<p class='muted'>Transition: moving the updated actor weights into the generation engine "
                     "(and waking/sleeping it), measured steps; median and p90 over steps per run, median over "
                     "seeds. 'not exposed': the framework does not time it (counted in 'other' below).</p>")
    parts.append(_img(figures["step_time"], "step-time breakdown"))

    parts.append("<h2>3. Learning: reward curves and time-to-reward</h2>")
    parts.append(_img(figures["reward_curve"], "reward vs step and vs wall-clock"))
    if not ttr.empty:
        evals = (per_run.groupby("framework")[["eval_accuracy_before", "eval_accuracy_after"]].median()
                 if "eval_accuracy_before" in per_run else pd.DataFrame())
        rows = []
        for r in ttr.itertuples():
            ev = evals.loc[r.framework] if r.framework in evals.index else None
            rows.append([_e(r.framework), _spread(r.final_reward, r.final_min, r.final_max, 3),
                         _spread(r.time_s, r.time_min, r.time_max, 1) if r.reached else
                         '<td class="failed">not reached</td>',
                         _num(r.step), f"{r.reached} of {r.seeds}",
                         (f"{_fmt(ev.eval_accuracy_before, 3)} &rarr; {_fmt(ev.eval_accuracy_after, 3)}"
                          if ev is not None else "n/a")])
        parts.append(_table(["framework", "final reward (min&ndash;max)", "time-to-reward s (min&ndash;max)",
                             "step reached (median)", "seeds reaching", "eval greedy accuracy before &rarr; after"],
                            rows, ["failed" if r.reached == 0 else "" for r in ttr.itertuples()]))
        parts.append(f"<p class='muted'>Target: {fraction:.0%} of the best framework's final reward "
                     f"(= {_fmt(target, 3)}); final reward: mean of a run's last 10% of steps, median over seeds. "
                     "A run reaches the target when its trailing mean over 10% of its steps first gets there; the "
                     "time is the wall-clock sum of its step times up to that step (warm-up included); time and step "
                     "are the median over the seeds that reached it.</p>")

    if "truth" in figures:
        parts.append(truth_html(truth_table(runs), figures["truth"],
                                _read_json(results / "inputs" / "reward" / "reward.json", problems)))

    parts.append("<h2>4. Fairness: effective hyperparameters and conformance</h2>")
    n_mismatch = int((fair["state"] == "mismatch").sum()) if not fair.empty else 0
    parts.append(f"<p>{n_mismatch} setting(s) differ from the shared spec (highlighted, with the cause). The "
                 "reference backend reads the shared config itself; real frameworks' values come from their "
                 "plans (<code>results/plans/&lt;fw&gt;/seed&lt;S&gt;/plan.json</code>).</p>")
    parts.append(fairness_html(fair, config["frameworks"]))
    parts.append(reward_html(reward_table(runs)))
    parts.append("<h3>Advantage conformance against the reference</h3>")
    if conformance is None:
        parts.append("<p class='muted'>No conformance results (<code>results/conformance.csv</code> absent).</p>")
    else:
        parts.append(_table(CONFORMANCE_COLUMNS, [
            [_e(r.framework), _e(r.case), f'<td class="num">{r.max_abs_diff:.3g}</td>', f"<b>{_e(r.verdict)}</b>",
             _e(r.note if isinstance(r.note, str) else "")] for r in conformance.itertuples()],
            ["mismatch" if r.verdict != "match" else "" for r in conformance.itertuples()]))

    parts.append("<h2>5. Published claims versus this run</h2>")
    parts.append("<p>These are <b>claims</b> from publications, not measurements of this project "
                 "(<code>workflows/report/claims.yaml</code> lists them with sources and the published setting "
                 "each used); they are compared only with runs on matching hardware in that setting. This run: "
                 f"{_e(setting_words({k: _get(config, k) for k in RUN_SETTING}))}.</p>")
    parts.append(_table(["claim", "model", "claim hardware", "published setting", "source", "measured here"],
                        [[f'<span class="claim">{_e(c.claim)}</span>', _e(c.model), _e(c.hardware), _e(c.setting),
                          _e(c.source),
                          f"<b>{_e(c.measured)}</b>" if c.comparable else _e(c.measured)]
                         for c in claims.itertuples()]))

    parts.append("<h2>6. Run status and manifest</h2>")
    status_rows, classes = [], []
    for r in runs:
        tail = f"<details><summary>log tail</summary><pre>{_e(r.log_tail)}</pre></details>" if r.log_tail else ""
        status_rows.append([_e(r.framework), _e(r.seed), f'<td class="nw"><b>{_e(r.status)}</b></td>',
                            _e(r.reason) + tail])
        classes.append({"ok": "ok", "failed": "failed"}.get(r.status, "notrun"))
    parts.append(_table(["framework", "seed", "status", "detail"], status_rows, classes))
    parts.append(manifest_html(runs))
    parts.append("</body></html>")
    return "\n".join(parts)


def status_frame(runs: list[Run]) -> pd.DataFrame:
    return pd.DataFrame([{"framework": r.framework, "seed": r.seed, "status": r.status, "reason": r.reason}
                         for r in runs], columns=["framework", "seed", "status", "reason"])


def render(results_dir: str | Path, out_dir: str | Path, claims_path: str | Path = CLAIMS_PATH) -> None:
    """Write index.html (self-contained), throughput.md/.csv, runs.csv and the figures' PNGs into out_dir."""
    results, out = Path(results_dir), Path(out_dir)
    config = results_config(results)
    claims = load_claims(Path(claims_path))
    problems: list[str] = []
    runs = collect_runs(results, config, problems)
    warmup = config["remax"]["warmup_steps"]
    per_run = run_table(runs, warmup)
    table = throughput_table(per_run)
    ttr, target = time_to_reward_table(runs, config["report"]["time_to_reward_fraction"])
    order = list(table["framework"]) if not table.empty else []
    colors = _palette(list(config["frameworks"]))
    out.mkdir(parents=True, exist_ok=True)
    sns.set_theme(style="whitegrid", context="notebook")
    figures = {
        "throughput": throughput_figure(table, colors, out / "throughput.png"),
        "step_time": step_time_figure(per_run, order, colors, out / "step_time.png"),
        "reward_curve": reward_figure(runs, list(config["frameworks"]), colors, target, ttr,
                                      out / "reward_curve.png"),
    }
    if not truth_table(runs).empty:
        figures["truth"] = truth_figure(runs, colors, out / "reward_vs_accuracy.png")
    write_text(out / "throughput.md", throughput_markdown(table) if not table.empty else "No completed run.\n")
    with atomic_path(out / "throughput.csv") as tmp:
        table.to_csv(tmp, index=False)
    with atomic_path(out / "runs.csv") as tmp:
        status_frame(runs).to_csv(tmp, index=False)
    write_text(out / "index.html", render_html(
        config=config, results=results, runs=runs, table=table, per_run=per_run, ttr=ttr, target=target,
        fair=fairness_table(config, runs), conformance=read_conformance(results, problems),
        claims=claims_table(claims, runs, table, config), figures=figures, problems=problems))
