"""The check's verdict where CI shows it: GitHub-flavoured Markdown for a job summary or a pull-request comment
(`check --summary-md FILE`, and appended to $GITHUB_STEP_SUMMARY where that is set), and JUnit XML (`check --junit
FILE`), the test report every CI system reads: one test case per framework and metric, a regression that fails the
check a <failure> with its figures, a metric the check could not judge <skipped> with the reason. alerts.md stays the
full verdict (harness/regression/alerts.py); these are its short forms."""

from __future__ import annotations

import os
import socket
import xml.etree.ElementTree as ET
from pathlib import Path

from harness.io import write_text

# What write_ci_outputs writes (harness.io.WRITTEN).
SUMMARY_ROLE, JUNIT_ROLE = "CI summary", "JUnit report"
HEADS = {"regression": ":x: **Regression**: throughput or transition time regressed",
         "ok": ":white_check_mark: **OK**: no regression",
         "contended": ":warning: **Not judged**: the machine was disturbed; rerun on a quiet machine",
         "insufficient history": ":warning: **Not judged**: too little history to know the noise"}
UNDECIDED = ("contended", "insufficient history", "no comparison")


def _change(c: dict) -> str:
    change = c.get("change")
    if change is None:
        return "n/a"
    return f"{change:+.1f}%" if c.get("unit") == "%" else f"{change:+.3f}"


def _z(c: dict) -> str:
    z = (c.get("evidence") or {}).get("z")
    return "n/a" if z is None else f"{z:+.1f}"


def _cell(text: object) -> str:
    """Text for a Markdown table cell: no pipe or line break can break the row."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def summary_markdown(result: dict, alerts_path: str | None = None) -> str:
    """The verdict in a screenful: the status, the judged metrics that fail the check (or all of them, folded), the
    commands that confirm a regression, and where the whole verdict is."""
    checks = result["checks"]
    failing = [c for c in checks if c["class"] == "alert" and c["status"] == "regression"]
    lines = [f"## Nightly regression check: {HEADS[result['status']]}", "",
             f"Pipeline run `{result['pipeline_run']}` ({result['pipeline_time']}), profile `{result['profile']}`, "
             f"baseline `{result['baseline']}`; {len(checks)} check(s), {len(failing)} failing.", ""]
    header = ["| framework | metric | status | change | z | detectable by night 3 |", "|---|---|---|---:|---:|---:|"]

    def row(c: dict) -> str:
        ev = c.get("evidence") or {}
        status = c["status"] + (f": {c['reason']}" if c.get("reason") else "")
        detectable = ev.get("detectable_change")
        return (f"| {_cell(c['framework'])} | {_cell(c.get('label', c['metric']))} | {_cell(status)} | "
                f"{_change(c)} | {_z(c)} | {'' if detectable is None else _change({**c, 'change': detectable})} |")

    if failing:
        lines += ["### Regressions", "", *header, *map(row, failing), ""]
    undecided = [c for c in checks if c["class"] == "alert" and c["status"] in UNDECIDED]
    if undecided:
        lines += ["### Not judged", "", *header, *map(row, undecided), ""]
    lines += ["<details><summary>Every check</summary>", "", *header, *map(row, checks), "", "</details>", ""]
    if result.get("confirm"):
        lines += ["Confirm it with a paired A/B on this machine (and find the commit):", "", "```",
                  *result["confirm"], "```", ""]
    if alerts_path:
        lines += [f"The whole verdict, its evidence and what changed since the baseline: `{alerts_path}`.", ""]
    return "\n".join(lines)


def _testcase(suite: ET.Element, c: dict) -> str:
    """One check as a test case; returns its outcome: failure, skipped or passed."""
    name = c.get("label", c["metric"]) if c["metric"] != "*" else "every metric"
    case = ET.SubElement(suite, "testcase", name=f"{c['metric']}: {name}",
                         classname=f"remax-bench.check.{c['framework']}", time="0")
    ev = c.get("evidence") or {}
    figures = (f"change {_change(c)} (reference {c.get('baseline')}, current {c.get('current')}), z {_z(c)}, noise "
               f"{ev.get('noise')}, history runs {ev.get('n_history_runs')}, seeds {ev.get('seeds')}")
    if c["class"] == "alert" and c["status"] == "regression":
        ET.SubElement(case, "failure", message=f"{c['framework']} {name}: {_change(c)} regressed (z {_z(c)})",
                      type="regression").text = figures + (f"; {c['reason']}" if c.get("reason") else "")
        return "failure"
    if c["status"] in UNDECIDED:
        ET.SubElement(case, "skipped", message=f"{c['status']}: {c.get('reason', '')}".rstrip(": "))
        return "skipped"
    said = f"{c['class']} {c['status']}" + (" (never fails the check)" if c["class"] != "alert" else "")
    ET.SubElement(case, "system-out").text = f"{said}: {figures}"
    return "passed"


def junit_xml(result: dict) -> str:
    """JUnit XML of the verdict: <testsuites> of one <testsuite> per framework, a <testcase> per metric checked."""
    root = ET.Element("testsuites", name="remax-bench check")
    totals = {"tests": 0, "failures": 0, "skipped": 0}
    for fw in sorted({c["framework"] for c in result["checks"]}):
        suite = ET.SubElement(root, "testsuite", name=f"regression check: {fw}", timestamp=result["checked"][:19],
                              hostname=socket.gethostname() or "localhost")
        outcomes = [_testcase(suite, c) for c in result["checks"] if c["framework"] == fw]
        counts = {"tests": len(outcomes), "failures": outcomes.count("failure"), "skipped": outcomes.count("skipped")}
        suite.attrib.update({k: str(v) for k, v in counts.items()}, errors="0", time="0")
        for k, v in counts.items():
            totals[k] += v
    root.attrib.update(tests=str(totals["tests"]), failures=str(totals["failures"]), errors="0", time="0")
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def write_ci_outputs(result: dict, summary_md: str | Path | None, junit: str | Path | None,
                     alerts_path: str | None = None) -> None:
    """The files asked for, and the summary appended to $GITHUB_STEP_SUMMARY where the job runs on GitHub."""
    markdown = summary_markdown(result, alerts_path)
    if summary_md:
        write_text(summary_md, markdown, role=SUMMARY_ROLE)
    if junit:
        write_text(junit, junit_xml(result), role=JUNIT_ROLE)
    append_step_summary(markdown)


def append_step_summary(markdown: str) -> None:
    """`markdown` appended to the job's summary where the job runs on GitHub ($GITHUB_STEP_SUMMARY, a file the
    runner shows on the run's page)."""
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary:
        with open(step_summary, "a", encoding="utf-8") as f:
            f.write(markdown + "\n")
