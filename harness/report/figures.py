"""The report's figures: PNG files beside the page, whose bytes the page embeds (harness/report/page.py)."""

from __future__ import annotations

import io
import math
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.ticker import FuncFormatter, MaxNLocator

from harness.report.runs import Run
from harness.report.tables import fmt
from harness.results.summarize import edge_window

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


def trailing_mean(series: pd.Series, k: int) -> pd.Series:
    """The curves as drawn: a trailing mean over k steps from the first step on (time-to-reward, by contrast,
    waits for a full window: harness.results.summarize.reward_curve)."""
    return series.rolling(k, min_periods=1).mean()


def _png(fig: Figure, dest: Path) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    data = buf.getvalue()
    dest.write_bytes(data)  # into the report's own temporary folder, which is renamed into place whole
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
                ax.text(v, yi, f" {fmt(v)}", va="bottom", ha="left", fontsize=9)
        ax.set_yticks(y, table["framework"])
        ax.set_xlim(0, np.nanmax(table[f"{col}_max"].to_numpy()) * 1.25)
        # At most 4 ticks with thousands separated: a panel a third of the figure wide fits them at any magnitude.
        ax.xaxis.set_major_locator(MaxNLocator(nbins=4))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: fmt(v)))
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
        curves = pd.concat({r.seed: trailing_mean(r.steps.set_index("step")["reward_mean"],
                                                  edge_window(len(r.steps))) for r in fw_runs}, axis=1)
        ax_step.plot(curves.index, curves.mean(axis=1), color=color, label=f"{fw} ({len(fw_runs)} seeds)")
        ax_step.fill_between(curves.index, curves.min(axis=1), curves.max(axis=1), color=color, alpha=0.2, lw=0)
        # up to the shortest seed's run time: past it the mean would be over fewer seeds and jump
        end = min(r.steps["time_step_s"].sum() for r in fw_runs)
        grid = np.linspace(0, end, 300)
        on_grid = np.vstack([
            np.interp(grid, r.steps["time_step_s"].cumsum().to_numpy(),
                      trailing_mean(r.steps["reward_mean"], edge_window(len(r.steps))).to_numpy(),
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


def truth_figure(runs: list[Run], colors: dict, dest: Path) -> bytes:
    """Shared reward and the task's exact-match accuracy per step, one panel each, per run (trailing means)."""
    fig, (ax_reward, ax_acc) = plt.subplots(1, 2, figsize=(13, 4.2))
    for r in runs:
        if r.status != "ok" or r.steps["task_accuracy_mean"].isna().all():
            continue
        m, k = r.steps.set_index("step"), edge_window(len(r.steps))
        for ax, column in ((ax_reward, "reward_mean"), (ax_acc, "task_accuracy_mean")):
            ax.plot(m.index, trailing_mean(m[column], k), color=colors[r.framework], alpha=0.8,
                    label=f"{r.framework} seed {r.seed}")
    ax_reward.set(xlabel="optimizer step", ylabel="shared reward of the samples",
                  title="Reward the policy is trained on")
    ax_acc.set(xlabel="optimizer step", ylabel="exact-match accuracy of the samples", ylim=(-0.02, 1.02),
               title="The task's truth")
    ax_reward.legend(fontsize=8, loc="best")
    fig.suptitle("trailing mean over 10% of steps, one line per run", fontsize=10)
    fig.tight_layout()
    return _png(fig, dest)


def draw(out: Path, frameworks: list[str], runs: list[Run], per_run: pd.DataFrame, table: pd.DataFrame,
         ttr: pd.DataFrame, target: float, truth: bool) -> dict[str, bytes]:
    """Every figure as a PNG in `out`, by the name the page shows it under; `truth`: draw reward vs the task's
    accuracy (some run logged the accuracy)."""
    colors = _palette(frameworks)  # by the config's order, so a framework keeps its color in every figure
    sns.set_theme(style="whitegrid", context="notebook")
    figures = {
        "throughput": throughput_figure(table, colors, out / "throughput.png"),
        "step_time": step_time_figure(per_run, list(table["framework"]) if not table.empty else [], colors,
                                      out / "step_time.png"),
        "reward_curve": reward_figure(runs, frameworks, colors, target, ttr, out / "reward_curve.png"),
    }
    if truth:
        figures["truth"] = truth_figure(runs, colors, out / "reward_vs_accuracy.png")
    return figures
