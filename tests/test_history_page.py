"""The history page (harness/report/history.py, `remax-bench history page`): every night a point, the check's alerts
and accepted baselines marked, A/B verdicts linked, clean in a real browser."""

import json
import re
import sys

import numpy as np
import pytest
from conftest import REPO, run_cli
from synthetic_history import commit_of, write_history
from test_history import make_results
from test_regression import nights, slowed_config

from harness.comparison.ab import RECORD_ROLE as AB_RECORD_ROLE
from harness.io import write_json
from harness.regression.baseline import BASELINE_ROLE, build_baseline
from harness.regression.history import append
from harness.report.history import CHARTS, write_history_page

sys.path.insert(0, str(REPO / "scripts"))
import browser_check

FRAMEWORKS = ["reference", "verl"]


def charts(html: str) -> dict[tuple[str, str], str]:
    """(framework, metric) -> that chart's SVG, by the framework <h2> it follows."""
    out = {}
    for section in re.split(r"<h2>", html)[1:]:
        name = section.split("</h2>", 1)[0]
        for m in re.finditer(r'<svg class="night-chart" data-metric="([^"]+)"(.*?)</svg>', section, re.S):
            out[(name, m.group(1))] = m.group(2)
    return out


def test_every_night_is_a_point_and_the_checks_alerts_and_new_baselines_are_marked(tmp_path):
    results = tmp_path / "results"
    n = 40
    runs = write_history(results, n, FRAMEWORKS, slow_from=30, alerts={30, 31, 32}, accepted=35)
    baseline = tmp_path / "baseline.json"
    write_json(baseline, build_baseline(results / "history", profile="cpu", runs=runs[5:10]), role=BASELINE_ROLE)
    # An A/B that ran on night 31's commit, its page beside its record.
    ab = results / "ab"
    write_json(ab / "ab.json", {"framework": "reference", "arms": {"A": {"commit": commit_of(29)},
                                                                   "B": {"commit": commit_of(31)}},
                                "verdict": {"text": "B is 10.2% slower (CI 8.0% to 12.4%, 5 pairs)"}},
               role=AB_RECORD_ROLE)
    (ab / "index.md").write_text("# A/B\n")
    page = write_history_page(results, tmp_path / "page", baseline)
    html = page.read_text()
    found = charts(html)
    assert set(found) == {(fw, name) for fw in FRAMEWORKS for _, name, _, _ in CHARTS}
    for (fw, metric), svg in found.items():
        assert len(re.findall(r'<circle class="night', svg)) == n, (fw, metric)  # every night's point
        assert 'class="band"' in svg  # the baseline's band
        assert len(re.findall(r'class="accepted"', svg)) == 1  # the night the new baseline was first used
    tokens = found[("reference", "throughput_tok_s")]
    assert len(re.findall(r'<circle class="night alert"', tokens)) == 3
    assert len(re.findall(r'<circle class="night alert"', found[("verl", "throughput_tok_s")])) == 0
    assert len(re.findall(r'<circle class="night alert"', found[("reference", "time_gen_s_median")])) == 0
    # The hover text of night 31: its time, run, commit and environment digest, and the alert.
    title = re.findall(r"<title>([^<]*)</title>", tokens)
    night31 = next(t for t in title if f"pipeline run {runs[31]}" in t)
    assert "2026-02-01T03:00:00+00:00" in night31 and f"commit {commit_of(31)[:12]}" in night31
    assert re.search(r"environment [0-9a-f]{12}", night31) and "alert throughput: -10.0%" in night31
    # The A/B is linked on the reference's charts at night 31, and listed.
    assert tokens.count('<a href="../results/ab/index.md">') == 1 and "B is 10.2% slower" in tokens
    assert 'href="../results/ab/index.md"' not in found[("verl", "throughput_tok_s")]
    assert "<td>A/B</td><td>reference</td>" in html
    assert "Nights the check found a regression (3)" in html


@pytest.mark.skipif(browser_check.chromium_path() is None,
                    reason="chromium not installed (apt-get install -y chromium)")
def test_the_history_page_is_clean_in_headless_chromium(tmp_path):
    results = tmp_path / "results"
    write_history(results, 60, FRAMEWORKS, slow_from=50, alerts={50, 51}, accepted=55)
    page = write_history_page(results, tmp_path / "page")
    shot = tmp_path / "history.png"
    assert browser_check.check_page(page, shot, sections=[*FRAMEWORKS, "A/B and bisect verdicts"], images=False) == []
    assert shot.stat().st_size > 0


def test_a_real_check_marks_its_night_and_the_cli_and_the_report_show_the_history(tmp_path):
    """Nights of the reference backend, a baseline, then a 10% slower night appended and checked, as the nightly
    job does: the check keeps its verdict beside the history and the page marks that night."""
    results = nights(tmp_path / "results", 10)
    baseline = tmp_path / "cpu.json"
    assert run_cli("baseline", "update", "--results", results, "--out", baseline).returncode == 0
    make_results(results, throughput=900.0, noise=0.01, rng=np.random.default_rng(12), config=slowed_config(0.1),
                 created="2026-01-12T00:00:00+00:00")
    append(results)
    assert run_cli("check", "--baseline", baseline, "--results", results).returncode == 1
    record = json.loads(next((results / "history" / "checks").glob("[!.]*.json")).read_text())
    assert record["status"] == "regression" and len(record["baseline_runs"]) == 5
    proc = run_cli("history", "page", results, "--out", tmp_path / "page")
    assert proc.returncode == 0, proc.stderr
    found = charts((tmp_path / "page" / "history.html").read_text())
    tokens = found[("reference", "throughput_tok_s")]
    assert len(re.findall(r'<circle class="night', tokens)) == 11 and 'class="band"' in tokens  # the check's baseline
    assert len(re.findall(r'<circle class="night alert"', tokens)) == 1
    proc = run_cli("report", results, "--out", results / "report")
    assert proc.returncode == 0, proc.stderr
    assert '<a href="history.html">the nightly history</a>' in (results / "report" / "index.html").read_text()
    assert (results / "report" / "history.html").is_file()
