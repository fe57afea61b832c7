"""Comparison report from a results directory: throughput table (Markdown + CSV) and reward curves (PNG)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from harness import HarnessError  # noqa: E402
from harness.io import atomic_path, write_text  # noqa: E402
from harness.metrics import read_metrics  # noqa: E402
from harness.summarize import by_framework  # noqa: E402

SUMMARY = "summary.csv"


def _fmt(x: float, digits: int = 0) -> str:
    return "n/a" if pd.isna(x) else f"{x:,.{digits}f}"


def throughput_markdown(table: pd.DataFrame) -> str:
    """The shared comparison table's form (framework, tokens/s, relative to the slowest), with spread over seeds."""
    lines = [
        "| framework | version | GPUs | seeds | tokens/s (median) | min-max over seeds | tokens/s per GPU | relative |"
        " transition s (median) | reward gain | eval acc. before -> after |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in table.itertuples():
        lines.append(
            f"| {r.framework} | {r.framework_version} | {r.n_gpus} | {r.seeds} | {_fmt(r.tokens_per_s)} |"
            f" {_fmt(r.tokens_per_s_min)}-{_fmt(r.tokens_per_s_max)} | {_fmt(r.tokens_per_s_per_gpu)} |"
            f" {r.relative:.2f}x | {_fmt(r.transition_s_median, 4)} | {_fmt(r.reward_gain, 3)} |"
            f" {_fmt(r.eval_accuracy_before, 3)} -> {_fmt(r.eval_accuracy_after, 3)} |"
        )
    notes = (
        "\ntokens/s = (prompt + sampled-response tokens of the global batch) / RL iteration time, aggregate over the"
        " run's accelerators, median over measured steps (after warm-up) per run, then median over seeds. Greedy"
        " baseline tokens are generated inside the step but not counted (as verl's own figure). GPUs = 0: CPU run.\n"
    )
    return "\n".join(lines) + "\n" + notes


def reward_curves(metrics: pd.DataFrame, dest: Path) -> None:
    sns.set_theme(style="whitegrid")
    fig, ax = plt.subplots(figsize=(7, 4))
    sns.lineplot(data=metrics, x="step", y="reward_mean", hue="framework", errorbar=("pi", 100), ax=ax)
    ax.set(xlabel="optimizer step", ylabel="mean reward of sampled responses",
           title="ReMax reward (line: mean over seeds; band: min-max over seeds)")
    fig.tight_layout()
    with atomic_path(dest) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)


def render(results_dir: str | Path, out_dir: str | Path) -> None:
    results_dir, out_dir = Path(results_dir), Path(out_dir)
    try:
        summary = pd.read_csv(results_dir / SUMMARY)
    except FileNotFoundError:
        raise HarnessError(f"{results_dir / SUMMARY}: no summary (run the summarize step first)") from None
    files = sorted((results_dir / "metrics").rglob("*.parquet"))
    if not files:
        raise HarnessError(f"{results_dir / 'metrics'}: no metrics files")
    metrics = pd.concat([read_metrics(p) for p in files], ignore_index=True)
    table = by_framework(summary)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_text(out_dir / "throughput.md", throughput_markdown(table))
    with atomic_path(out_dir / "throughput.csv") as tmp:
        table.to_csv(tmp, index=False)
    reward_curves(metrics, out_dir / "reward_curve.png")
