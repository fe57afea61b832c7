"""The check's verdict where CI shows it (harness/regression/ci.py): a job summary in GitHub-flavoured Markdown, JUnit
XML that validates against the schema CI systems read, and the documented nightly workflow (docs/ci-nightly.yml),
whose steps must run commands that exist."""

import json
import os
import re
import shlex
import subprocess
import xml.etree.ElementTree as ET

import numpy as np
import pytest
import yaml
from conftest import BIN, REPO, run_cli
from test_history import make_results
from test_regression import nights, slowed_config

from harness.cli import parser
from harness.config import nightly_from_config
from harness.regression.ci import junit_xml, summary_markdown
from harness.results import layout

# The JUnit schema as Jenkins publishes it (junit-10.xsd, which GitHub's, GitLab's and Azure's readers accept): per
# element its allowed attributes, the required ones, and its allowed children.
SCHEMA = {
    "testsuites": ({"name", "time", "tests", "failures", "disabled", "errors"}, set(), {"testsuite"}),
    "testsuite": ({"name", "tests", "failures", "errors", "group", "time", "disabled", "skipped", "timestamp",
                   "hostname", "id", "package", "file", "log", "url", "version"}, {"name", "tests"},
                  {"properties", "testcase", "testsuite", "system-out", "system-err"}),
    "testcase": ({"name", "assertions", "time", "classname", "status", "class", "file", "line", "log", "group",
                  "url"}, {"name"}, {"skipped", "error", "failure", "system-out", "system-err"}),
    "failure": ({"message", "type"}, set(), set()),
    "error": ({"message", "type"}, set(), set()),
    "skipped": ({"message"}, set(), set()),
    "system-out": (set(), set(), set()),
    "system-err": (set(), set(), set()),
}
INTEGER = {"tests", "failures", "errors", "skipped", "disabled", "assertions"}


def validate_junit(text: str) -> ET.Element:
    """The document, checked against SCHEMA, the attribute types, and its counts against its elements."""
    root = ET.fromstring(text)
    assert root.tag == "testsuites"
    for el in root.iter():
        allowed, required, children = SCHEMA[el.tag]
        assert set(el.attrib) <= allowed, (el.tag, set(el.attrib) - allowed)
        assert required <= set(el.attrib), (el.tag, required - set(el.attrib))
        assert {c.tag for c in el} <= children, (el.tag, {c.tag for c in el} - children)
        for k, v in el.attrib.items():
            if k in INTEGER:
                assert re.fullmatch(r"\d+", v), (el.tag, k, v)
            if k == "time":
                assert re.fullmatch(r"\d+(\.\d+)?", v), (el.tag, k, v)
            if k == "timestamp":
                assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", v), v
        if el.tag == "testcase":
            assert len([c for c in el if c.tag in ("failure", "error", "skipped")]) <= 1
    suites = root.findall("testsuite")
    for s in suites:
        cases = s.findall("testcase")
        assert int(s.get("tests")) == len(cases)
        assert int(s.get("failures")) == sum(c.find("failure") is not None for c in cases)
        assert int(s.get("skipped")) == sum(c.find("skipped") is not None for c in cases)
        assert int(s.get("errors")) == sum(c.find("error") is not None for c in cases)
    for k in ("tests", "failures", "errors"):
        assert int(root.get(k)) == sum(int(s.get(k)) for s in suites)
    return root


@pytest.fixture(scope="module")
def regressed(tmp_path_factory):
    """A real check that finds a 10% slowdown, run as CI runs it, with $GITHUB_STEP_SUMMARY set."""
    tmp = tmp_path_factory.mktemp("ci")
    results = nights(tmp / "results", 10)
    baseline = tmp / "cpu.json"
    assert run_cli("baseline", "update", "--results", results, "--out", baseline).returncode == 0
    make_results(results, throughput=900.0, noise=0.01, rng=np.random.default_rng(12), config=slowed_config(0.1),
                 created="2026-01-12T00:00:00+00:00")
    step_summary = tmp / "step_summary.md"
    step_summary.write_text("earlier step\n")
    proc = subprocess.run([str(BIN / "remax-bench"), "check", "--baseline", str(baseline), "--results", str(results),
                           "--summary-md", str(tmp / "summary.md"), "--junit", str(tmp / "junit.xml")],
                          capture_output=True, text=True, env={**os.environ, "GITHUB_STEP_SUMMARY": str(step_summary)})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    return tmp, json.loads((results / "alerts.json").read_text())


def test_the_junit_xml_validates_and_a_regression_is_a_failure_with_its_figures(regressed):
    tmp, result = regressed
    root = validate_junit((tmp / "junit.xml").read_text())
    cases = root.findall("testsuite/testcase")
    assert len(cases) == len(result["checks"])  # one per framework and metric
    failures = [c for c in cases if c.find("failure") is not None]
    assert [c.get("name") for c in failures] == [f"{a['metric']}: {a['label']}" for a in result["alerts"]]
    [failure] = [c.find("failure") for c in failures]
    assert failure.get("type") == "regression" and re.search(r"-\d+\.\d%", failure.get("message"))
    assert "z +" in failure.text and "reference" in failure.text and "seeds [1, 2, 3]" in failure.text
    # Advisories and context figures never fail the check, in XML either.
    assert all(c.find("failure") is None for c in cases if "advisory" in (c.findtext("system-out") or ""))
    # Metrics the check could not judge are skipped, with why.
    undecided = {**result, "checks": [{**c, "status": "insufficient history", "reason": "3 past runs"}
                                      for c in result["checks"]]}
    root = validate_junit(junit_xml(undecided))
    assert int(root.find("testsuite").get("skipped")) == len(result["checks"]) and root.get("failures") == "0"


def test_the_summary_is_github_markdown_and_reaches_the_job_summary(regressed):
    tmp, result = regressed
    md = (tmp / "summary.md").read_text()
    assert md.startswith("## Nightly regression check: :x: **Regression**")
    table = md.split("### Regressions\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert table[1] == "|---|---|---|---:|---:|---:|" and len(table) == 2 + len(result["alerts"])
    assert all(line.count("|") == 7 for line in table)  # no cell broke its row
    assert "<details><summary>Every check</summary>" in md and "remax-bench ab --framework reference" in md
    assert (tmp / "step_summary.md").read_text() == "earlier step\n" + md + "\n"  # appended, not replaced
    ok = summary_markdown({**result, "status": "ok", "confirm": [], "checks": [
        {**c, "status": "ok"} for c in result["checks"]]})
    assert ":white_check_mark: **OK**" in ok and "### Regressions" not in ok


def _rules() -> set[str]:
    files = [REPO / "Snakefile", *(REPO / "workflows" / "rules").glob("*.smk")]
    return {m for f in files for m in re.findall(r"^rule (\w+):", f.read_text(), re.M)}


def _check_snakemake(words: list[str], env: dict) -> list[str]:
    """Every option, rule and config value of one snakemake command line exists; its targets. `--forcerun` takes
    every word up to the next option (Snakemake's nargs="*"): words after it are rules to force, not targets."""
    rules = _rules()
    targets, i = [], 1
    while i < len(words):
        w = words[i]
        if w == "--config":  # the nightly's framework and budget, as workflows/rules/common.smk reads them
            key, _, value = words[i + 1].partition("=")
            assert key == "nightly" and nightly_from_config(yaml.safe_load(value), "--config"), words[i + 1]
            i += 2
        elif w == "--forcerun":
            i += 1
            while i < len(words) and not words[i].startswith("-"):
                assert words[i] in rules, words[i]
                i += 1
        elif w in ("--cores", "--configfile"):
            if w == "--configfile":
                assert (REPO / words[i + 1]).is_file(), words[i + 1]
            i += 2
        else:
            assert not w.startswith("-") or w in ("-n", "--dry-run"), w
            if not w.startswith("-"):
                assert w in rules, f"snakemake target {w!r} is not a rule"
                targets.append(w)
            i += 1
    return targets


def test_the_documented_nightly_workflow_runs_commands_that_exist():
    workflow = yaml.safe_load((REPO / "docs" / "ci-nightly.yml").read_text())
    [job] = workflow["jobs"].values()
    runners = job["strategy"]["matrix"]["include"]
    assert {r["runner"] for r in runners} == {"gpu", "cpu"}
    assert job["runs-on"][:2] == ["self-hosted", "linux"]
    known = {"python3.11", ".venv/bin/pip", "echo", "mkdir", "ln", "gh"}
    seen = set()
    for runner in runners:
        assert (REPO / runner["profile"]).is_file()
        env = {"PROFILE": runner["profile"], "NIGHTLY": runner["nightly"]}
        for step in job["steps"]:
            if "uses" in step:
                assert re.fullmatch(r"[\w.-]+/[\w.-]+@v\d+", step["uses"]), step["uses"]
                continue
            for line in step["run"].strip().splitlines():
                words = shlex.split(line.replace('"$PROFILE"', env["PROFILE"]).replace('"$NIGHTLY"',
                                                                                        shlex.quote(env["NIGHTLY"])))
                seen.add(words[0])
                if words[0] == "remax-bench":
                    args = parser().parse_args(words[1:])  # a subcommand or option that does not exist: SystemExit
                    assert callable(args.func)
                elif words[0] == "snakemake":
                    assert "nightly" in _check_snakemake(words, env), line  # the job's point: the A/B runs
                else:
                    assert words[0] in known, words[0]
    assert {"remax-bench", "snakemake"} <= seen
    checkout = next(step for step in job["steps"] if step.get("uses", "").startswith("actions/checkout"))
    assert checkout["with"]["fetch-depth"] == 0  # the baseline's commit must be in the clone: it is arm A
    paths = [p for step in job["steps"] for p in str(step.get("with", {}).get("report_paths", "")).split()]
    # the files the nightly and the check rules write (workflows/rules/nightly.smk, check.smk)
    assert paths == [f"results/{layout.NIGHTLY}/junit.xml", f"results/{layout.ALERTS_JUNIT}"]
