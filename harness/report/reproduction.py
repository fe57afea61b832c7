"""The page of a comparison run again (`remax-bench reproduce RESULTS_OR_BUNDLE`, harness.runs.reproduce_comparison):
the verdict per figure with its margin, what differs between the two worlds, tokens/s on each machine, and the reward
curves of both sides overlaid."""

from __future__ import annotations

import base64
import io
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from harness import HarnessError
from harness.io import write_text
from harness.report.page import environment
from harness.report.tables import fmt
from harness.results import layout
from harness.results.consistency import FAMILY_FALSE_ALARM, POWER
from harness.results.metrics import read_metrics
from harness.results.summarize import reward_curve
from harness.runs.train import METRICS

PAGE = "index.html"
PAGE_ROLE = "reproduction page"  # what PAGE is (harness.io.WRITTEN)


def _value(figure: str, value: float | None) -> str:
    """A figure's mean as read: a throughput share (a log) as the ratio it stands for."""
    if value is None:
        return "n/a"
    return f"{math.exp(value):.3f}x" if figure == "throughput_share" else fmt(value, 4)


def figure_rows(record: dict) -> list[dict]:
    rows = []
    for f in record["figures"]:
        share = f["figure"] == "throughput_share"
        margin = "n/a" if f["margin"] is None else (
            f"±{f['margin']:.3g} ({f['margin_spreads']:.1f})" if not share
            else f"×/÷{math.exp(f['margin']):.3f} ({f['margin_spreads']:.1f})")
        rows.append({"framework": f["framework"], "label": f["label"], "original": _value(f["figure"], f["original"]),
                     "rerun": _value(f["figure"], f["rerun"]),
                     "difference": "n/a" if f["difference"] is None else (
                         f"{math.exp(f['difference']) - 1:+.1%}" if share else f"{f['difference']:+.4g}"),
                     "margin": margin, "p": "n/a" if f["p"] is None else f"{f['p']:.3g}",
                     "seeds": f"{f['n_original']} / {f['n_rerun']}", "verdict": f["verdict"],
                     "cls": {"not consistent": "failed", "untested": "muted"}.get(f["verdict"], "")})
    return rows


def method_text(record: dict) -> str:
    figures = record["figures"]
    tested = [f for f in figures if f["verdict"] != "untested"]
    seeds = figures[0]["seeds_for_one_spread"] if figures else None
    more = (f"{seeds} seeds a side would bring the margin to one seed spread" if seeds
            else "no seed count up to 200 brings it to one seed spread")
    return (f"Each figure: the original's seeds against the rerun's by a two-sample Student t test (pooled spread); "
            f"the {len(tested)} tested figures held together by Holm's procedure, so that a rerun of the same "
            f"experiment is called not consistent anywhere at most {FAMILY_FALSE_ALARM:.0%} of the time. Margin: the "
            f"difference called not consistent {POWER:.0%} of the time, in the figure's units and (in brackets) in "
            f"seed spreads (the pooled standard deviation over seeds); {more} (more seeds in the original's profile, "
            "and `reproduce --seeds` for the rerun). A figure the seed does not move (no spread on either side) is "
            "consistent only when equal. Time-to-reward step: the first step whose trailing mean reward reaches the "
            f"original's target ({fmt(record.get('target'), 3)}); a run that never does counts as its last step + 1.")


def _original_dir(record: dict, out: Path) -> Path:
    original = Path(record["original"])
    return original if original.is_absolute() else out / original


def curves_png(record: dict, out: Path) -> bytes | None:
    """The reward curves (trailing mean) of every run on both sides, one panel per framework."""
    original = _original_dir(record, out)
    frameworks = sorted({r["framework"] for r in record["runs"] if not r["error"]})
    if not frameworks:
        return None
    fig, axes = plt.subplots(1, len(frameworks), figsize=(4 * len(frameworks), 3.2), squeeze=False)
    for ax, framework in zip(axes[0], frameworks):
        for r in (r for r in record["runs"] if r["framework"] == framework and not r["error"]):
            for side, path, style in (
                    ("original", layout.path(original, layout.METRICS, framework=framework, seed=r["seed"]), "-"),
                    ("rerun", layout.path(out, layout.RUN, framework=framework, seed=r["seed"]) / METRICS, "--")):
                try:
                    curve = reward_curve(read_metrics(path))
                except HarnessError:
                    continue
                ax.plot(curve["step"], curve["reward"], style, label=f"{side} seed {r['seed']}")
        ax.set_title(framework)
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("reward (trailing mean)")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return buf.getvalue()


def token_rows(record: dict) -> list[dict]:
    tokens = pd.DataFrame(record.get("tokens_per_s", []), columns=["side", "framework", "tokens_per_s"])
    wide = tokens.pivot_table(index="framework", columns="side", values="tokens_per_s")
    return [{"framework": framework, "original": fmt(row.get("original", math.nan)),
             "rerun": fmt(row.get("rerun", math.nan)),
             "ratio": fmt(row.get("rerun", math.nan) / row.get("original", math.nan), 3)}
            for framework, row in wide.iterrows()]


def probe_text(probe: dict) -> str:
    """Both machines' speed on the fixed torch workload the reference backend times beside every step."""
    if probe.get("original") is None and probe.get("rerun") is None:
        return "No run timed the machine probe (the reference backend does), so the machines' speeds are not shown."
    ms = {side: "n/a" if probe.get(side) is None else f"{probe[side] * 1e3:.3f} ms" for side in ("original", "rerun")}
    return (f"Machine probe (a fixed small torch workload timed after every step, median): {ms['original']} on the "
            f"original's machine, {ms['rerun']} here.")


def findings(record: dict) -> list[str]:
    if record["verdict"] == "identical":
        return ["Every logged figure of every run is equal to the original's, step by step."]
    out = [f"{f['framework']}: {f['label']} not consistent ({_value(f['figure'], f['original'])} originally, "
           f"{_value(f['figure'], f['rerun'])} here)" for f in record["figures"] if f["verdict"] == "not consistent"]
    return out or ["Every tested figure is consistent with what the original's seeds spread."]


def write_page(record: dict, out: Path) -> None:
    png = curves_png(record, out)
    page = environment().get_template("reproduction.html.j2").render(
        verdict=record["verdict"], verdict_cls="failed" if record["verdict"] == "not consistent" else "",
        source=record["source"], out=str(out), n_runs=len(record["runs"]), findings=findings(record),
        figures=figure_rows(record), method=method_text(record),
        identical_text="Identical: every logged figure of every run equal to the original's.",
        failed=[f"{r['framework']} seed {r['seed']}: {r['error']}" for r in record["runs"] if r["error"]],
        world=record["world"], tokens=token_rows(record), probe=probe_text(record.get("probe_s", {})),
        curves=base64.b64encode(png).decode() if png else "")
    write_text(out / PAGE, page, role=PAGE_ROLE)
