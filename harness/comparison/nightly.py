"""`remax-bench nightly`: tonight's commit against the accepted baseline's, confirmed by a paired A/B on this machine
before anyone is alerted (docs/regression.md, "The nightly job").

A series of nights compares each night with others recorded on other days, so the machine's drift between days sits
in every comparison: measured on the default profile, it catches a lasting 5% drop by the third night in a third of
series. This job runs tonight's commit (B: the checkout's HEAD) against the commit the accepted baseline was made
with (A: `baseline update` records it) as `ab` does, interleaved and paired in one sitting, within `budget` minutes.
Only a slowdown the A/B confirms alerts. Where the commits differ, `bisect` then takes that A/B as its round 0 and
names the first slow commit, each of its rounds within its share of `bisect_budget`. The history check (`check`)
stays as the record and as the trigger for what no pairing sees, a baseline that aged over weeks: its verdict is
carried as context here, and never alerts on its own.

The record (nightly.json), a page for a CI job summary (summary.md) and a JUnit report (junit.xml) go to `out`, and
the record is appended to the history (history/nightly/). Exit 0: no confirmed slowdown (no difference, faster, not
slower, inconclusive within the budget, or no commit since the baseline's); 1: confirmed slower; 2: bad input.
"""

from __future__ import annotations

import datetime as dt
import math
import socket
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

from harness import HarnessError
from harness.comparison.ab import Arm, compare, package_changes, packages_text
from harness.comparison.bisect import ab_argv, bisect
from harness.config import MAX_CONFIG_BYTES
from harness.io import atomic_path, read_document, read_json_object, write_json, write_text
from harness.regression.baseline import load_baseline
from harness.results import layout
from harness.runtime.git import commit_id, git

RECORD, SUMMARY, JUNIT = "nightly.json", "summary.md", "junit.xml"
OWNER = {"kind": "nightly"}  # harness.io.OWNER: a later night's folder may replace it, nothing else may
RECORD_ROLE = "nightly record"  # what a night's record is in the history (harness.io.WRITTEN)
EXIT = {"slower": 1}  # every other outcome is 0: only a confirmed slowdown alerts


def baseline_commit(baseline: dict, framework: str, where: Path) -> str:
    """The commit the baseline's runs of `framework` were made with: A of tonight's A/B."""
    entry = baseline["frameworks"].get(framework)
    if entry is None:
        raise HarnessError(f"{where}: no baseline for framework {framework!r} (it has "
                           f"{', '.join(sorted(baseline['frameworks'])) or 'none'}): write one with `remax-bench "
                           "baseline update`")
    commit = entry["provenance"].get("git", {}).get("commit")
    if commit is None:
        raise HarnessError(f"{where}: the baseline of {framework} records no harness commit (its runs were made "
                           "outside a git checkout): nothing to run tonight's commit against")
    if entry["provenance"].get("git", {}).get("dirty"):
        raise HarnessError(f"{where}: the baseline of {framework} was made from a checkout with uncommitted "
                           f"changes to {commit[:12]}: its commit is not the code it measured; write the baseline "
                           "again from a clean checkout")
    return commit_id(commit, f"{where}: frameworks.{framework}.provenance.git.commit")


def _framework(config: Path, framework: str | None) -> str:
    if framework:
        return framework
    raw = read_document(config, "config file", max_bytes=MAX_CONFIG_BYTES)
    frameworks = raw.get("frameworks", ["reference"]) if isinstance(raw, dict) else None
    if isinstance(frameworks, list) and len(frameworks) > 1 and "reference" in frameworks:
        return "reference"  # the harness's own code, which every shipped profile lists and runs on any machine
    if not isinstance(frameworks, list) or len(frameworks) != 1 or not isinstance(frameworks[0], str):
        raise HarnessError(f"nightly: --config {config}: frameworks {frameworks!r}; the nightly A/B runs one "
                           "framework (--framework NAME; the reference backend by default, where the config lists it)")
    return frameworks[0]


def bisect_rounds(repo: Path, good: str, bad: str) -> int:
    """How many A/B rounds `git bisect` needs at most between GOOD and BAD: log2 of the commits after GOOD."""
    commits = int(git(repo, "rev-list", "--count", f"{good}..{bad}") or 1)
    return max(1, math.ceil(math.log2(commits))) if commits > 1 else 0


def _history_check(path: Path | None) -> dict | None:
    """The history check's verdict tonight (alerts.json), as context: status and the alerts it raised."""
    if path is None or not path.is_file():
        return None
    result = read_json_object(path, "the history check's verdict (alerts.json)")
    alerts = result["alerts"] if isinstance(result.get("alerts"), list) else []
    return {"status": result.get("status"), "alerts": [
        {k: a.get(k) for k in ("framework", "metric", "change")} for a in alerts if isinstance(a, dict)]}


def nightly(repo: Path, baseline_path: Path, config: Path, out: Path, *, framework: str | None = None,
            budget: float = 15.0, bisect_budget: float = 45.0, history_check: Path | None = None,
            results: Path | None = None, ab_options: dict | None = None,
            say: Callable[[str], None] = print, render: Callable[[dict, Path], None] | None = None) -> dict:
    """Tonight's A/B against the baseline's commit into `out` (appears when complete); its record. `ab_options`:
    compare's other limits (seeds, pairs, alpha, ...). `results`: the results folder whose history gets the record.
    `render`: the A/B's page (harness.report.ab), as `ab` writes it."""
    repo, out = repo.resolve(), out.resolve()
    framework = _framework(config, framework)
    good = baseline_commit(load_baseline(baseline_path), framework, baseline_path)
    bad = git(repo, "rev-parse", "HEAD")
    record: dict = {"framework": framework, "baseline": str(baseline_path), "a": good, "b": bad,
                    "budget_min": budget, "bisect_budget_min": bisect_budget, "host": socket.gethostname(),
                    "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                    "history_check": _history_check(history_check), "ab": None, "bisect": None}
    with atomic_path(out, owner=OWNER) as tmp:
        tmp.mkdir()
        if good == bad:
            record["outcome"] = "unchanged"
            record["text"] = f"tonight's commit is the baseline's ({good[:12]}): no code to confirm a change of"
        else:
            _confirm(repo, config, framework, good, bad, tmp, record, budget, bisect_budget, ab_options or {}, say,
                     render)
        write_json(tmp / RECORD, record, role=RECORD_ROLE)
        write_text(tmp / SUMMARY, summary_markdown(record), role=SUMMARY_ROLE)
        write_text(tmp / JUNIT, junit_xml(record), role=JUNIT_ROLE)
    if results is not None:
        name = f"{record['started'].replace(':', '').replace('-', '').replace('+0000', 'Z')}-{bad[:12]}"
        write_json(layout.path(results, layout.NIGHTLY_RECORD, name=name), record, role=RECORD_ROLE)
    return record


def _confirm(repo: Path, config: Path, framework: str, good: str, bad: str, tmp: Path, record: dict, budget: float,
             bisect_budget: float, ab_options: dict, say: Callable[[str], None],
             render: Callable[[dict, Path], None] | None) -> None:
    """The A/B of GOOD against BAD within `budget`; where it calls BAD slower, the bisection naming the first slow
    commit. Fills `record` (outcome, text, ab, bisect)."""
    say(f"remax-bench nightly: {framework}, baseline's {good[:12]} (A) against tonight's {bad[:12]} (B), "
        f"at most {budget:g} min")
    ab = compare(repo, config, Arm("A", good), Arm("B", bad), tmp / "ab", framework=framework, max_minutes=budget,
                 say=say, render=render, **ab_options)
    verdict = ab["verdict"]
    record["ab"] = {k: verdict.get(k) for k in ("verdict", "text", "change", "low", "high", "more_pairs", "basis")}
    record["ab"].update(pairs=len(ab["pairs"]), minutes=ab["minutes"], level=ab["level"], alpha=ab["alpha"],
                        detectable=verdict["detectable"], profile=ab["profile"], packages={
                            name: list(versions) for name, versions in package_changes(ab).items()})
    record["outcome"] = verdict["verdict"]
    record["text"] = f"B against A: {verdict['text']}"
    if verdict["verdict"] != "slower":
        return
    rounds = bisect_rounds(repo, good, bad)
    if rounds == 0:  # BAD is GOOD's child: it is the first slow commit
        record["bisect"] = {"first_slow": bad, "subject": git(repo, "log", "-1", "--format=%s", bad), "rounds": 0}
    else:
        per_round = bisect_budget / rounds
        options = ab_argv({**ab_options, "framework": framework, "max_minutes": f"{per_round:.6g}"})
        found = bisect(repo, good, bad, config, tmp / "bisect", options, say=say, confirmed_by=tmp / "ab",
                       framework=framework)
        record["bisect"] = {k: found[k] for k in ("first_slow", "subject", "verdict")}
        record["bisect"].update(rounds=len(found["rounds"]) - 1, minutes_per_round=per_round)
    record["text"] += (f"; first slow commit {record['bisect']['first_slow'][:12]} "
                       f"({record['bisect']['subject']})")


SUMMARY_ROLE, JUNIT_ROLE = "nightly summary", "nightly JUnit report"
HEADS = {"slower": ":x: **Confirmed slower**", "unchanged": ":white_check_mark: **No commit since the baseline's**",
         "inconclusive": ":warning: **Inconclusive within the budget** (no alert)"}


def _interval(ab: dict) -> str:
    """B's slowdown against A (negative: faster) with its interval at the A/B's level."""
    if ab.get("change") is None:
        return "n/a"
    ci = "" if ab.get("low") is None else f" (CI {100 * ab['low']:+.1f}% to {100 * ab['high']:+.1f}%)"
    return f"{100 * ab['change']:+.1f}%{ci}"


def summary_markdown(record: dict) -> str:
    """The night in a screenful, for a CI job summary: the outcome, the A/B's change with its interval, pairs and
    minutes within the budget, the first slow commit, and the history check's own verdict as context."""
    head = HEADS.get(record["outcome"], ":white_check_mark: **No confirmed slowdown**")
    lines = [f"## Nightly A/B, {record['framework']}: {head}", "",
             f"Baseline `{record['baseline']}` (A, `{record['a'][:12]}`) against tonight's `{record['b'][:12]}` (B) "
             f"on `{record['host']}`, budget {record['budget_min']:g} min.", "", record["text"], ""]
    ab = record.get("ab")
    if ab:
        lines += ["| B slower than A by | decided on | pairs | minutes | level per look |", "|---|---|---:|---:|---:|",
                  f"| {_interval(ab)} | {ab.get('basis')} | {ab['pairs']} | {ab['minutes']:.1f} | "
                  f"{ab['level']:.2g} |", "", f"What the budget can see: {ab['detectable']['text']}.", ""]
        if ab["packages"]:
            lines += ["Packages that differ between the arms' environments (A -> B): " + packages_text(ab["packages"]),
                      ""]
    found = record.get("bisect")
    if found:
        lines += [f"First slow commit: `{found['first_slow']}` ({found['subject']}), after {found['rounds']} "
                  "bisection round(s).", ""]
    check = record.get("history_check")
    if check:
        alerts = ", ".join(f"{a['framework']} {a['metric']}" for a in check["alerts"]) or "none"
        lines += [f"The history check (context, never an alert here): {check['status']}; its alerts: {alerts}.", ""]
    return "\n".join(lines)


def junit_xml(record: dict) -> str:
    """One test case: a <failure> for a confirmed slowdown (with its interval and the first slow commit), <skipped>
    where nothing was decided (unchanged, inconclusive)."""
    root = ET.Element("testsuites", name="remax-bench nightly")
    suite = ET.SubElement(root, "testsuite", name=f"nightly A/B: {record['framework']}", tests="1",
                          timestamp=record["started"][:19], hostname=record["host"] or "localhost")
    case = ET.SubElement(suite, "testcase", name=f"{record['framework']}: tonight against the baseline",
                         classname="remax-bench.nightly", time="0")
    failures = skipped = 0
    if record["outcome"] == "slower":
        failures = 1
        ab = record["ab"]
        changed = "; packages A -> B: " + packages_text(ab["packages"])
        ET.SubElement(case, "failure", message=record["text"], type="confirmed slowdown").text = (
            f"B slower than A by {_interval(ab)}, {ab['pairs']} pairs in {ab['minutes']:.1f} min; "
            f"{ab['detectable']['text']}" + (changed if ab["packages"] else ""))
    elif record["outcome"] in ("unchanged", "inconclusive"):
        skipped = 1
        ET.SubElement(case, "skipped", message=record["text"])
    else:
        ET.SubElement(case, "system-out").text = record["text"]
    suite.attrib.update(failures=str(failures), skipped=str(skipped), errors="0", time="0")
    root.attrib.update(tests="1", failures=str(failures), errors="0", time="0")
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
