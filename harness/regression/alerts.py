"""The check's verdict for people: alerts.md (Markdown) and alerts.json in the results directory."""

from __future__ import annotations

from pathlib import Path

from harness.io import write_json, write_text
from harness.regression.statistics import (
    DETECT_BY,
    DETECT_MARGIN,
    METRICS,
    MIN_HISTORY,
    NEIGHBOURS,
    PERSISTENCE,
    REFERENCE_BEFORE,
    Z_CRIT,
    Z_EARLIER,
    Z_PERSIST,
    Z_SEGMENT,
    Z_SUPPORT,
    noise_widening,
)
from harness.results import layout

# What write_alerts writes (harness.io.WRITTEN): alerts.json, alerts.md, and the night's record beside the history.
ALERTS_ROLE, ALERTS_PAGE_ROLE, CHECK_RECORD_ROLE = "alerts record", "alerts page", "check record"


def _fmt(value: float | None, unit: str | None = None) -> str:
    if value is None:
        return "n/a"
    if unit == "%":
        return f"{value:+.1f}%"
    return f"{value:+.3f}" if unit == "absolute" else f"{value:.4g}"


def _changes_md(changes: dict) -> list[str]:
    lines = []
    for fw, groups in changes.items():
        items = [f"- {group}: `{d['key']}` {d['baseline']!r} -> {d['current']!r}"
                 for group, diffs in groups.items() for d in diffs]
        lines += [f"### {fw}", *(items or ["- nothing: same framework version, config, harness commit, packages, "
                                          "inputs"]), ""]
    return lines


def render_markdown(result: dict) -> str:
    head = {"regression": "REGRESSION: a throughput or transition-time regression was found",
            "ok": "OK: no regression",
            "contended": "NOT JUDGED: the machine was disturbed (another job held the cores, or its speed was far "
                         "outside the history's; see below); rerun it on a quiet machine; no alert raised",
            "insufficient history":
            "NOT JUDGED: too little history to know the noise (see below); no alert raised"}[result["status"]]
    lines = [f"# Regression check: {head}", "",
             f"- run: `{result['pipeline_run']}` ({result['pipeline_time']}), profile `{result['profile']}`",
             f"- hardware: {result['hardware']}", f"- baseline: `{result['baseline']}`", ""]
    header = ["| framework | metric | status | reference | current | change | noise (1 sigma) | z | history runs |"
              " reference runs | seeds |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def row(c: dict) -> str:
        if c.get("metric") == "*":
            return f"| {c['framework']} | * | {c['status']}: {c['reason']} | | | | | | | | |"
        ev = c["evidence"]
        unit = c["unit"]
        status = c["status"] + (f" ({c['reason']})" if c.get("reason") else "")
        z = "n/a" if ev["z"] is None else f"{ev['z']:+.1f}"
        before = ev["n_reference_before"]
        since = ev["n_reference_runs"] - ev["n_baseline_runs"] - before
        joined = "".join(f" + {n} {when}" for n, when in ((before, "before"), (since, "since")) if n)
        return (f"| {c['framework']} | {c['label']} | {status} | {_fmt(c['baseline'])} | {_fmt(c['current'])} |"
                f" {_fmt(c['change'], unit)} | {_fmt(ev['noise'], unit).lstrip('+')} | {z} | {ev['n_history_runs']} |"
                f" {ev['n_baseline_runs']}{joined} | {len(ev['seeds'])} |")

    for title, kind in (("Alerts (throughput, transition time)", "alert"),
                        ("Context (raw throughput: the figure adjusted for the machine's speed decides; never fails "
                         "the check)", "context"),
                        ("Advisory (reward curve, machine speed; never fails the check)", "advisory")):
        rows = [row(c) for c in result["checks"] if c["class"] == kind]
        if rows or kind != "context":
            lines += [f"## {title}", "", *header, *rows, ""]
        if kind == "alert":
            lines += [f"Machine-speed adjustment ({c['framework']}): throughput brought to the baseline's probe time "
                      f"{ms['probe_reference_s']:.4g} s with theta {ms['theta']:.2f} (throughput falls theta % per % "
                      f"the probe slows; Theil-Sen fit over {ms['points']} quiet history points, correlation "
                      f"{_fmt(ms['correlation'])})." for c in result["checks"]
                      if (ms := c.get("evidence", {}).get("machine_sensitivity")) and ms["correlation"] is not None]
            lines += [f"Detectable ({c['framework']}, {c['label']}): a lasting change of "
                      f"{_fmt(ev['detectable_change'], c['unit'])} or worse is caught by night {ev['detect_by']} "
                      f"95% of the time on this series' noise ({ev['n_history_runs']} history runs, "
                      f"{ev['n_reference_runs']} reference runs); a smaller one may go unseen longer."
                      for c in result["checks"] if c["class"] == "alert" and (ev := c.get("evidence"))
                      and ev.get("detectable_change") is not None]
            lines += [""] if lines[-1] else []
    if result.get("confirm"):
        lines += ["## Confirm it", "", "A series of nights cannot tell a slower commit from a slower host; a paired "
                  "A/B on this machine, in one sitting, can (the baseline's commit against this run's), and bisect "
                  "finds the commit between them:", "", "```", *result["confirm"], "```", ""]
    lines += ["## What changed since the baseline", "", *_changes_md(result["changes"])]
    lines += ["## Method", "",
              "Reference = the baseline's runs and the history's runs at its level (within "
              f"{Z_SUPPORT} noise levels; not the last {PERSISTENCE - 1}, which persistence judges with this run): "
              f"the nights after them, and the last {REFERENCE_BEFORE} runs before them when their median is within "
              f"{Z_SEGMENT} noise level (of the difference of two medians) of the baseline's: one level, not the one "
              "a `baseline update` accepted a change from. "
              "Change = median over seeds of each seed's change against the same seed in the reference (paired; log "
              "ratio for times and rates). Noise = one run's robust standard deviation (Qn) of the same statistic "
              f"over the history, each past run against the rolling median of its {2 * NEIGHBOURS} neighbours (less "
              "that median's own noise), widened for how few runs estimate it (a z over an estimated noise is a "
              f"Student t: x{noise_widening(12):.2f} at 12 runs, x{noise_widening(20):.2f} at 20), with the "
              "reference's share added (the more reference runs, the smaller). A "
              "metric alerts when it is worse by at least its minimum effect and by more than any past run deviated, "
              f"and by at least {Z_CRIT} noise levels in this run alone, or by at least {Z_PERSIST} noise levels of "
              f"their mean on average over this and up to {PERSISTENCE - 1} previous runs (this one worse by at least "
              f"{Z_SUPPORT} noise levels on its own, each earlier one by {Z_EARLIER}, and none clearly worse than "
              f"this one); with fewer than {MIN_HISTORY} past runs it is not judged. Detectable = the mean of "
              f"{DETECT_BY} nights' threshold plus {DETECT_MARGIN} noise levels of that mean: a lasting change that "
              f"large is caught by night {DETECT_BY} 95% of the time (the margin calibrated on measured hosts). "
              "A change under a metric's floor "
              "in its own unit is never judged (" + "; ".join(f"{m.label}: {m.min_abs:g}" for m in METRICS if m.min_abs)
              + "). See docs/regression.md.", ""]
    return "\n".join(lines)


def check_record(result: dict) -> dict:
    """What the history keeps of a night's verdict (layout.CHECK_RECORD): enough for the history page to mark the
    night's regressions and the baseline it was judged against; alerts.json has the evidence."""
    keep = ("framework", "metric", "label", "class", "status", "change", "unit", "reason")
    return {"pipeline_run": result["pipeline_run"], "pipeline_time": result["pipeline_time"],
            "status": result["status"], "checked": result.get("checked"), "baseline": result["baseline"],
            "baseline_runs": result.get("baseline_runs", []),
            "checks": [{k: c[k] for k in keep if k in c} for c in result["checks"]]}


def write_alerts(result: dict, results_dir: str | Path) -> None:
    """alerts.json and alerts.md in the results directory, and the night's verdict beside the history (a check of
    the same night again replaces its record)."""
    results_dir = Path(results_dir)
    write_json(layout.path(results_dir, layout.ALERTS_JSON), result, role=ALERTS_ROLE)
    write_text(layout.path(results_dir, layout.ALERTS), render_markdown(result), role=ALERTS_PAGE_ROLE)
    write_json(layout.path(results_dir, layout.CHECK_RECORD, pipeline_run=result["pipeline_run"]),
               check_record(result), role=CHECK_RECORD_ROLE)

