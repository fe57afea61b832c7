"""The fairness table's summary first (harness/report/fairness.py): per framework the settings that change the step's
work, the CPU stand-ins, the other differences and the unmapped ones; its counts are the full table's cells by class,
and the page fits a 1280 px window at the summary level."""

import json
import re
import sys

import pytest
from conftest import REPO, make_inputs, merged, run_cli

from harness.report.fairness import CLASSES, fairness_class
from harness.report.page import environment, fairness_view
from harness.report.runs import Run
from harness.report.tables import fairness_table

sys.path.insert(0, str(REPO / "scripts"))
import browser_check


@pytest.fixture(scope="module")
def cpu_frameworks_table(tmp_path_factory):
    """The fairness table of the cpu-frameworks profile's real CPU plans (DeepSpeed-Chat's where its checkout is)."""
    tmp = tmp_path_factory.mktemp("fairness")
    config_path, config = make_inputs(tmp, merged("cpu.yaml", "cpu-frameworks.yaml"))
    runs = [Run("reference", 1, status="ok")]
    for fw in ("verl", "openrlhf", "dschat"):
        proc = run_cli("plan", fw, "--config", config_path, "--seed", 1, "--inputs", tmp / "inputs", "--out", tmp / fw)
        if proc.returncode == 0:
            runs.append(Run(fw, 1, plan=json.loads((tmp / fw / "plan.json").read_text())))
        else:  # DeepSpeed-Chat plans only from its checkout (CI has no GitHub)
            assert fw == "dschat" and "checkout" in proc.stderr, proc.stderr
    frameworks = [r.framework for r in runs]
    return tmp, fairness_table({**config, "frameworks": frameworks}, runs), frameworks


def test_each_row_has_one_class_by_its_cause_and_key():
    assert fairness_class("attention", "mismatch", "CPU run: FlashAttention needs CUDA") == "cpu"
    assert fairness_class("remax.max_prompt_length", "mismatch", "data.max_len is also vLLM's max_model_len") == "work"
    assert fairness_class("remax.top_p", "mismatch", "hard-coded (top_p=0.9)") == "work"
    assert fairness_class("remax.kl_coef", "mismatch", "KL placement") == "other"
    assert fairness_class("seed", "not mapped", "the adapter does not map this key") == "unmapped"
    assert fairness_class("policy.path", "unknown", "no plan.json under results/plans") == "unmapped"
    assert fairness_class("remax.lr", "match", "") == "match"


def _page(tmp, view) -> str:
    """The fairness section alone in the report's page shell: its stylesheet, its tables."""
    template = environment().from_string(
        '{% import "tables.html.j2" as t %}<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>f</title>'
        '<style>{% include "report.css" %}</style></head><body><h2>4. Fairness</h2>{{ t.fairness(view) }}'
        '</body></html>')
    return template.render(view=view)


def test_the_summary_counts_are_the_tables_rows_by_class(cpu_frameworks_table):
    tmp, table, frameworks = cpu_frameworks_table
    view = fairness_view(table, frameworks)
    html = _page(tmp, view)
    summary, full = html.split('<details class="fairness-full">', 1)
    assert "<summary>The full table:" in full and "<table" in summary  # the summary first, the table folded
    columns = view["frameworks"]
    rows = re.findall(r"<tr><td><code>.*?</tr>", full, re.S)
    body = [re.findall(r"<td[^>]*>.*?</td>", row, re.S)[2:] for row in rows]
    assert len(body) == len(view["rows"]) and all(len(cells) == len(columns) for cells in body)
    for fw in columns:
        k = columns.index(fw)
        tagged = [re.search(r'data-class="(\w+)"', cells[k]) for cells in body]
        in_table = {c: sum(1 for t in tagged if t and t.group(1) == c) for c in CLASSES}
        row = re.search(rf'<tr data-framework="{fw}">(.*?)</tr>', summary, re.S).group(1)
        shown = {c: int(re.search(rf'data-class="{c}">(?:<b>)?(\d+)', row).group(1)) for c in CLASSES}
        assert shown == in_table, fw
        assert sum(shown.values()) == int((table["framework"] == fw).sum())
    reference = next(s for s in view["summary"] if s["framework"] == "reference")["counts"]
    assert reference["match"] == int((table["framework"] == "reference").sum())  # it reads the shared config
    openrlhf = next(s for s in view["summary"] if s["framework"] == "openrlhf")
    assert openrlhf["counts"]["cpu"] >= 5 and "attention" in openrlhf["names"]["cpu"]
    assert "remax.max_prompt_length" in openrlhf["names"]["work"]


@pytest.mark.skipif(browser_check.chromium_path() is None,
                    reason="chromium not installed (apt-get install -y chromium)")
def test_the_fairness_section_fits_a_1280_px_window(cpu_frameworks_table):
    tmp, table, frameworks = cpu_frameworks_table
    page = tmp / "fairness.html"
    page.write_text(_page(tmp, fairness_view(table, frameworks)))
    assert browser_check.check_page(page, tmp / "fairness.png", sections=["4. Fairness"], images=False) == []
