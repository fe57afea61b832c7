"""The comparison report on SYNTHETIC results directories (tests/synthetic.py: formula data, `synthetic-*` names)."""

import base64
import html
import json
import os
import re
import shutil
import subprocess
import sys
import time

import pandas as pd
import pytest
import synthetic
from conftest import REPO, run_cli, snakemake

from harness import HarnessError
from harness.config import CONFIG_ROLE, validate_config
from harness.frameworks.registry import _REGISTRY, PLAN_ROLE
from harness.io import write_json
from harness.report import CLAIMS_PATH, render
from harness.report.claims import load_claims
from harness.results.metrics import to_frame, write_metrics
from harness.results.summarize import EVAL_ROLE

sys.path.insert(0, str(REPO / "scripts"))
import browser_check

FAST, SLOW, FLAT, GPU = "synthetic-fast", "synthetic-slow", "synthetic-flat", "synthetic-gpu"


@pytest.fixture
def frameworks(monkeypatch):
    """Synthetic adapters in the registry for one test (removed afterwards)."""
    for name in (FAST, SLOW, FLAT):
        monkeypatch.setitem(_REGISTRY, name, synthetic.adapter(name))
    monkeypatch.setitem(_REGISTRY, GPU, synthetic.adapter(GPU))


def three_frameworks(results, seeds=(1, 2, 3), steps=60):
    config = synthetic.write_config(results, [FAST, SLOW, FLAT, GPU], list(seeds), steps=steps, warmup=5)
    for s in seeds:
        synthetic.write_run(results, FAST, s, steps=steps, step_s=0.5, final_reward=0.8)
        synthetic.write_run(results, SLOW, s, steps=steps, step_s=1.5, final_reward=0.8, transition_s=None)
        synthetic.write_run(results, FLAT, s, steps=steps, step_s=0.4, final_reward=0.05)
    return config


def html_images(page: str) -> list[bytes]:
    return [base64.b64decode(b) for b in re.findall(r'src="data:image/png;base64,([^"]+)"', page)]


def test_report_is_one_self_contained_page_with_the_shared_table(tmp_path, frameworks):
    results = tmp_path / "results"
    three_frameworks(results)
    synthetic.report(results)
    out = results / "report"

    page = (out / "index.html").read_text()
    images = html_images(page)
    assert len(images) == 3 and all(i[:8] == b"\x89PNG\r\n\x1a\n" for i in images)
    assert page.count("<img") == 3 and "http://" not in page and "https://" not in page
    for name in ("throughput.png", "step_time.png", "reward_curve.png"):
        assert (out / name).read_bytes() in images  # the embedded figure is the file written beside it

    # relative speed recomputed here from the parquet files: median over measured steps, then over seeds
    measured = {}
    for fw in (FAST, SLOW, FLAT):
        per_seed = [pd.read_parquet(p).query("step > 5")["throughput_tok_s"].median()
                    for p in (results / "metrics" / fw).glob("*.parquet")]
        measured[fw] = pd.Series(per_seed).median()
    table = pd.read_csv(out / "throughput.csv").set_index("framework")
    assert table.loc[SLOW, "relative"] == pytest.approx(1.0)
    assert table.loc[FLAT, "relative"] == pytest.approx(measured[FLAT] / measured[SLOW])
    assert table.loc[FAST, "tokens_per_s"] == pytest.approx(measured[FAST])
    # the phases are faster than the whole step, since each is only part of it
    assert (table["gen_tokens_per_s"] > table["tokens_per_s"]).all()
    assert (table["train_tokens_per_s"] > table["tokens_per_s"]).all()
    md = (out / "throughput.md").read_text()
    assert f"| {SLOW} |" in md and "1.00x" in md

    # transition: not exposed by one framework, timed by the others
    assert re.search(rf"<td>{SLOW}</td><td>not exposed</td>", page)
    assert pd.isna(table.loc[SLOW, "transition_s_median"]) and table.loc[FAST, "transition_s_p90"] > 0

    # a fast framework that does not learn is named as such
    assert f"{FLAT} did not reach 90% of the best final reward in any seed" in page
    assert f"Fastest: {FLAT}" in page


def test_every_planned_run_is_listed_and_a_corrupt_metrics_file_fails_only_its_run(tmp_path, frameworks):
    results = tmp_path / "results"
    three_frameworks(results)
    bad = results / "metrics" / FAST / "seed2.parquet"
    bad.write_bytes(b"PAR1 truncated by a full disk")
    log = results / "logs" / "run" / f"{FAST}_seed2.log"
    log.parent.mkdir(parents=True)
    log.write_text("".join(f"line {i}\n" for i in range(100)) + "RuntimeError: synthetic failure at the end\n")
    synthetic.report(results)

    runs = pd.read_csv(results / "report" / "runs.csv")
    assert len(runs) == 4 * 3
    status = runs.set_index(["framework", "seed"])["status"]
    assert status[(FAST, 2)] == "failed" and status[(FAST, 1)] == "ok" and status[(SLOW, 3)] == "ok"
    assert f"{bad}: not a readable parquet file" in runs.set_index(["framework", "seed"]).loc[(FAST, 2), "reason"]
    assert (runs[runs["framework"] == GPU]["status"] == "not run").all()
    assert runs[runs["framework"] == GPU]["reason"].str.startswith("needs GPUs").all()

    page = (results / "report" / "index.html").read_text()
    assert "RuntimeError: synthetic failure at the end" in page and "line 99" in page
    assert "line 60" not in page  # a tail, not the whole log
    table = pd.read_csv(results / "report" / "throughput.csv").set_index("framework")
    assert table.loc[FAST, "seeds"] == 2 and table.loc[SLOW, "seeds"] == 3


def test_the_report_reads_the_summarize_stages_table_and_refuses_one_older_than_the_metrics(tmp_path, frameworks):
    results = tmp_path / "results"
    three_frameworks(results)
    synthetic.summarize(results)
    summary = pd.read_csv(results / "summary.csv")
    summary.loc[summary["framework"] == FAST, "throughput_tok_s"] *= 2  # the report's figure is the summary's
    summary[summary["run_id"] != f"{SLOW}-s3"].to_csv(results / "summary.csv", index=False)
    render(results, results / "report")
    table = pd.read_csv(results / "report" / "throughput.csv").set_index("framework")
    assert table.loc[FAST, "tokens_per_s"] == summary.loc[summary["framework"] == FAST, "throughput_tok_s"].median()
    reason = pd.read_csv(results / "report" / "runs.csv").set_index(["framework", "seed"]).loc[(SLOW, 3), "reason"]
    assert reason.startswith(f"{results / 'summary.csv'}: has no row for run {SLOW}-s3")

    rerun = results / "metrics" / FLAT / "seed1.parquet"  # a run ingested again after the summary was written
    os.utime(rerun, (time.time() + 5, time.time() + 5))
    render(results, results / "report")
    reason = pd.read_csv(results / "report" / "runs.csv").set_index(["framework", "seed"]).loc[(FLAT, 1), "reason"]
    assert reason == f"{results / 'summary.csv'}: older than {rerun} (summarize again)"

    text = (results / "summary.csv").read_text()
    (results / "summary.csv").write_text(text[:text.index("\n", len(text) // 2) + 40])  # cut inside a row
    proc = run_cli("report", results, "--out", tmp_path / "again")
    assert proc.returncode == 2 and "fields as the header (a truncated file?)" in proc.stderr, proc.stderr
    assert not (tmp_path / "again").exists()

    (results / "summary.csv").write_text("run_id,framework\n")
    proc = run_cli("report", results, "--out", tmp_path / "again")
    assert proc.returncode == 2 and proc.stderr.strip().endswith(
        "summary.csv: lacks column(s) seed, reward_last10, throughput_tok_s (summarize again with this version)")
    assert not (tmp_path / "again").exists()


def test_a_run_that_never_started_says_which_stage_kept_it_back(tmp_path, frameworks):
    """The pipeline keeps going past a failed job; the runs waiting for it are "not run", with that job's last line:
    DeepSpeed-Chat's checkout where GitHub cannot be reached, a plan the adapter refused."""
    results = tmp_path / "results"
    config = validate_config({"frameworks": [FAST, "verl", "dschat"], "seeds": [1], "profile": "synthetic",
                              "remax": {"steps": 20, "warmup_steps": 2}, "launch": {"device": "cpu"},
                              "dschat": {"checkout": str(tmp_path / "src" / "ReMax")}})
    write_json(results / "config.json", config, role=CONFIG_ROLE)
    synthetic.write_run(results, FAST, 1, steps=20, step_s=0.5, final_reward=0.5)
    logs = results / "logs"
    (logs / "setup").mkdir(parents=True)
    (logs / "setup" / "dschat_checkout.log").write_text(
        "fatal: unable to access 'https://github.com/liziniu/ReMax.git/': Could not resolve host: github.com\n")
    (logs / "plan").mkdir()
    (logs / "plan" / "verl_seed1.log").write_text(
        "remax-bench plan: error: config: at verl.micro_batch_size_per_gpu: 3 does not divide the 128 rows\n")
    synthetic.report(results)
    runs = pd.read_csv(results / "report" / "runs.csv").set_index("framework")
    assert runs.loc[FAST, "status"] == "ok"
    assert runs.loc["dschat", "status"] == "not run"
    assert runs.loc["dschat", "reason"].startswith("its pinned source checkout could not be made: fatal: unable to "
                                                   "access 'https://github.com/liziniu/ReMax.git/'")
    assert runs.loc["verl", "status"] == "not run"
    assert runs.loc["verl", "reason"].startswith("its plan was refused: remax-bench plan: error: config: at "
                                                 "verl.micro_batch_size_per_gpu")


def test_runs_without_metrics_get_the_status_their_traces_show(tmp_path, frameworks):
    results = tmp_path / "results"
    three_frameworks(results, seeds=(1,))
    (results / "metrics" / SLOW / "seed1.parquet").unlink()
    log = results / "logs" / "ingest" / f"{SLOW}_seed1.log"
    log.parent.mkdir(parents=True)
    log.write_text("remax-bench ingest: error: synthetic log has no step lines\n")
    (results / "metrics" / FAST / "seed1.parquet").unlink()  # its run directory is still there
    (results / "metrics" / FLAT / "seed1.parquet").unlink()
    shutil.rmtree(results / "runs" / FLAT)
    (results / "logs" / "run").mkdir(parents=True)
    (results / "logs" / "run" / f"{FLAT}_seed1.log").touch()  # started, then killed before writing a word
    config = json.loads((results / "config.json").read_text())
    config["frameworks"].append("synthetic-gone")  # registered when the config was frozen, not now
    write_json(results / "config.json", config, role=CONFIG_ROLE)
    synthetic.report(results)
    runs = pd.read_csv(results / "report" / "runs.csv").set_index("framework")
    assert runs.loc[SLOW, "status"] == "failed" and "see the log" in runs.loc[SLOW, "reason"]
    assert runs.loc[FAST, "status"] == "not run" and "finished but was not ingested" in runs.loc[FAST, "reason"]
    assert runs.loc[FLAT, "status"] == "failed" and "is empty (killed?)" in runs.loc[FLAT, "reason"]
    assert runs.loc["synthetic-gone", "status"] == "not run"
    assert "no registered adapter" in runs.loc["synthetic-gone", "reason"]
    assert "synthetic log has no step lines" in (results / "report" / "index.html").read_text()


def step_run(results, framework, seed, rewards, step_s=1.0, gen_s=None):
    rows = [dict(framework=framework, framework_version="0", run_id=f"{framework}-{seed}", seed=seed, step=i + 1,
                 n_gpus=0, time_step_s=step_s, time_gen_s=step_s / 2 if gen_s is None else gen_s,
                 time_transition_s=0.0, time_train_s=step_s / 4,
                 tokens_prompt=10.0, tokens_response=10.0, tokens_baseline=5.0, reward_mean=r,
                 reward_baseline_mean=0.0, kl_mean=0.0, response_length_mean=1.0) for i, r in enumerate(rewards)]
    write_metrics(to_frame(rows, "synthetic step rewards"), results / "metrics" / framework / f"seed{seed}.parquet")


@pytest.mark.parametrize("fraction, step", [(0.9, 59), (0.5, 55)])
def test_time_to_reward_is_the_wall_time_until_the_trailing_mean_reaches_the_target(tmp_path, frameworks, fraction,
                                                                                    step):
    results = tmp_path / "results"
    config = validate_config({"frameworks": [FAST, FLAT], "seeds": [1], "remax": {"steps": 100, "warmup_steps": 5},
                              "report": {"time_to_reward_fraction": fraction}})
    write_json(results / "config.json", config, role=CONFIG_ROLE)
    # reward 0 for 50 steps, then 1: the trailing mean over 10 steps is 0.1 * (step - 50) from step 51 on
    step_run(results, FAST, 1, [0.0] * 50 + [1.0] * 50, step_s=2.0)
    step_run(results, FLAT, 1, [0.0] * 100, gen_s=float("nan"))  # a framework that does not time generation
    synthetic.report(results)
    page = (results / "report" / "index.html").read_text()
    assert f"{FAST} reached {fraction:.0%} of the best final reward in {2.0 * step:.1f} s" in page
    assert f"{FLAT} did not reach" in page
    table = pd.read_csv(results / "report" / "throughput.csv").set_index("framework")
    assert pd.isna(table.loc[FLAT, "gen_tokens_per_s"]) and table.loc[FAST, "gen_tokens_per_s"] == pytest.approx(20)


def test_fairness_table_shows_effective_values_and_the_cause_of_each_mismatch(tmp_path, frameworks):
    results = tmp_path / "results"
    config = three_frameworks(results, seeds=(1, 2))
    for seed in (1, 2):
        write_json(results / "plans" / FAST / f"seed{seed}" / "plan.json", {
            "hyperparameters": [
                {"key": "remax.lr", "shared": config["remax"]["lr"], "framework_key": "actor.optim.lr",
                 "effective": config["remax"]["lr"]},
                {"key": "remax.top_p", "shared": 1.0, "framework_key": "rollout.top_p", "effective": 0.9},
                {"key": "remax.train_batch_size", "shared": 16, "framework_key": "data.train_batch_size",
                 "effective": 16 if seed == 1 else 32},
                {"key": "seeds", "shared": seed, "framework_key": "seed", "effective": seed},
                {"key": "remax.kl_coef", "shared": 0.5 if seed == 2 else config["remax"]["kl_coef"],
                 "framework_key": "kl", "effective": 0.5 if seed == 2 else config["remax"]["kl_coef"]},
            ],
            "deviations": [{"key": "remax.top_p", "shared": 1.0, "effective": 0.9,
                            "cause": "synthetic cause: top_p hard-coded"},
                           {"key": "reward.clip", "shared": None, "effective": 5.0,
                            "cause": "synthetic cause: reward clipped to +-5"}]}, role=PLAN_ROLE)
    synthetic.report(results)
    page = (results / "report" / "index.html").read_text()
    section = page[page.index("4. Fairness"):page.index("5. Published")]
    assert re.search(r'class="mismatch"><b>0.9</b>.*?synthetic cause: top_p hard-coded', section)
    assert re.search(r'class="mismatch"><b>5.0</b>.*?synthetic cause: reward clipped to \+-5', section)
    # seeds planned differently: both values shown, flagged although the adapter gave no cause
    assert re.search(r'class="mismatch"><b>\[16, 32\]</b>.*?the adapter gives no cause', section)
    # a plan made from another config is caught although it follows its own shared value
    assert re.search(r'class="mismatch"><b>\[0.001, 0.5\]</b>.*?made from another config \(shared value there: 0.5\)',
                     section)
    # a per-run key (one seed of `seeds` per plan) is a match
    seeds_row = re.search(r"<tr><td><code>seeds</code></td>.*?</tr>", section, re.S).group(0)
    assert "mismatch" not in seeds_row and "[1, 2]" in seeds_row
    assert "4 setting(s) differ" in section
    # an integer key stays an integer; a key the adapter does not map is said so, never shown as a match
    assert "<td><code>remax.rollout_n</code></td><td>4</td>" in section
    assert "the adapter does not map this key" in section
    # frameworks without a plan get one line, not a column of "no plan.json"
    assert f"Not in the table: {SLOW}, {FLAT}, {GPU} (no plan in this profile" in section
    assert f"<th>{FAST}</th>" in section and f"<th>{GPU}</th>" not in section


def test_the_frameworks_own_throughput_is_set_beside_the_harness_figure(tmp_path, frameworks):
    results = tmp_path / "results"
    synthetic.write_config(results, [FAST, SLOW, FLAT], [1, 2], steps=20, warmup=2)
    for s in (1, 2):
        synthetic.write_run(results, FAST, s, steps=20, step_s=0.5, final_reward=0.8, own_throughput_ratio=1.0)
        # e.g. a figure from configured maximum lengths: 5% above the tokens really processed
        synthetic.write_run(results, SLOW, s, steps=20, step_s=1.5, final_reward=0.8, own_throughput_ratio=1.05)
        synthetic.write_run(results, FLAT, s, steps=20, step_s=1.0, final_reward=0.1)  # logs no figure of its own
    synthetic.report(results)
    page = (results / "report" / "index.html").read_text()
    section = page.split("The frameworks' own throughput figures against the harness's")[1].split("</table>")[0]
    rows = {fw: row for row in section.split("<tr")[2:] for fw in (FAST, SLOW, FLAT) if f"<td>{fw}</td>" in row}
    assert set(rows) == {FAST, SLOW}  # FLAT has nothing to cross-check
    assert "<b>agree</b>" in rows[FAST] and "1.0000" in rows[FAST]
    assert "<b>differ</b> by up to 5.0%" in rows[SLOW] and 'class="mismatch"' in rows[SLOW]


def test_conformance_table_and_a_malformed_one(tmp_path, frameworks):
    results = tmp_path / "results"
    three_frameworks(results, seeds=(1,))
    pd.DataFrame([{"framework": FAST, "case": "outcome", "max_abs_diff": 0.0, "verdict": "match", "note": ""},
                  {"framework": FAST, "case": "dense", "max_abs_diff": 0.25, "verdict": "differs",
                   "note": "synthetic: outcome-only estimator"}]).to_csv(results / "conformance.csv", index=False)
    synthetic.report(results)
    page = (results / "report" / "index.html").read_text()
    assert re.search(r'<tr class="mismatch"><td>synthetic-fast</td><td>dense</td>.*?differs', page)

    (results / "conformance.csv").write_text("framework,case\nx,y\n")
    synthetic.report(results)
    page = (results / "report" / "index.html").read_text()
    assert f"{results / 'conformance.csv'}: lacks columns max_abs_diff, verdict, note" in page
    assert "1. Throughput" in page


def test_claims_compared_only_on_matching_hardware(tmp_path, frameworks):
    results = tmp_path / "results"
    synthetic.write_config(results, [FAST, SLOW], [1], steps=20, warmup=2)
    synthetic.write_run(results, FAST, 1, steps=20, step_s=0.5, final_reward=0.5, n_gpus=8, gpus=synthetic.A100X8)
    synthetic.write_run(results, SLOW, 1, steps=20, step_s=1.0, final_reward=0.5)
    response_length = json.loads((results / "config.json").read_text())["remax"]["max_response_length"]
    claims = tmp_path / "claims.yaml"
    claims.write_text(f"""
throughput:
  - {{framework: {FAST}, tokens_per_s: 1000, model: m, hardware: {{gpus: 8, gpu: A100}}, source: synthetic claim,
     setting: {{remax.max_response_length: {response_length}, note: same length}}}}
  - {{framework: {FAST}, tokens_per_s: 1000, model: m, hardware: {{gpus: 8, gpu: H100}}, source: synthetic claim,
     setting: {{}}}}
  - {{framework: {FAST}, tokens_per_s: 900, model: m, hardware: {{gpus: 8, gpu: A100}}, source: synthetic claim,
     setting: {{remax.max_response_length: 1024, remax.generation_length: fixed}}}}
  - {{framework: {SLOW}, tokens_per_s: 500, model: m, hardware: {{gpus: 8, gpu: A100}}, source: synthetic claim,
     setting: {{}}}}
  - {{framework: synthetic-absent, tokens_per_s: 500, model: m, hardware: {{gpus: 8, gpu: A100}}, source: s,
     setting: {{}}}}
ratios:
  - {{faster: {FAST}, slower: {SLOW}, ratio: 2.0, hardware: {{gpus: null, gpu: A100}}, source: synthetic claim,
     setting: {{}}}}
""")
    synthetic.report(results, claims_path=claims)
    page = (results / "report" / "index.html").read_text()
    fast = pd.read_csv(results / "report" / "throughput.csv").set_index("framework").loc[FAST, "tokens_per_s"]
    assert f"<b>{fast:,.0f} tokens/s ({fast / 1000:.2f}x the claim)</b>" in page
    assert f"not comparable: different hardware (this run: {FAST} on 8x NVIDIA A100-SXM4-80GB)" in page
    assert f"not comparable: different hardware (this run: {SLOW} on 0 GPUs (synthetic CPU))" in page
    assert "not measured: no completed synthetic-absent run" in page
    # The published setting is shown, and a claim made in another one is not set beside this run.
    assert f"<td>max_response_length {response_length}; same length</td>" in page
    assert (f"not comparable: a different setting (remax.max_response_length 1024 there, {response_length} here; "
            "remax.generation_length fixed there, natural here)") in page
    assert page.count("not comparable") == 4  # the ratio too: one side ran on a CPU


def test_project_claims_file_has_a_source_for_every_claim():
    claims = load_claims(CLAIMS_PATH)
    assert {c["framework"] for c in claims["throughput"]} == {"dschat", "openrlhf", "verl"}
    assert all(c["source"] for c in claims["throughput"] + claims["ratios"])


def test_bad_claims_file_names_the_entry(tmp_path):
    bad = tmp_path / "claims.yaml"
    bad.write_text("throughput:\n  - {framework: x, tokens_per_s: 1}\n")
    with pytest.raises(HarnessError, match=r"at throughput\[0\]: missing hardware, setting, source"):
        load_claims(bad)
    bad.write_text("throughput:\n  - {framework: x, tokens_per_s: 1, hardware: {gpus: 8}, source: s,\n"
                   "     setting: {remax.response_len: 1024}}\n")
    with pytest.raises(HarnessError, match=r"at throughput\[0\].setting: remax.response_len is not a config key"):
        load_claims(bad)


def test_time_to_reward_fraction_is_in_the_schema():
    assert validate_config({})["report"] == {"time_to_reward_fraction": 0.9}
    with pytest.raises(HarnessError, match=r"report\.time_to_reward_fraction"):
        validate_config({"report": {"time_to_reward_fraction": 1.5}})


def test_cli_without_a_frozen_config_exits_2_naming_the_file(tmp_path):
    proc = run_cli("report", tmp_path, "--out", tmp_path / "report")
    assert proc.returncode == 2 and f"{tmp_path / 'config.json'}: effective config not found" in proc.stderr
    assert not (tmp_path / "report").exists()


def test_no_completed_run_still_renders_the_status(tmp_path, frameworks):
    results = tmp_path / "results"
    synthetic.write_config(results, [FAST, GPU], [1], steps=10, warmup=2)
    synthetic.report(results)
    page = (results / "report" / "index.html").read_text()
    assert "No run completed: nothing to compare." in page and "needs GPUs" in page
    assert len(html_images(page)) == 3


needs_chromium = pytest.mark.skipif(browser_check.chromium_path() is None,
                                    reason="chromium not installed (Debian: apt-get install -y chromium; .ci/run does)")


@needs_chromium
def test_report_loads_in_headless_chromium_without_errors(tmp_path, frameworks):
    results = tmp_path / "results"
    three_frameworks(results)
    synthetic.report(results)
    shot = results / "report" / "screenshot.png"
    assert browser_check.check_page(results / "report" / "index.html", shot) == []
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@needs_chromium
def test_the_browser_check_sees_what_a_reader_would(tmp_path):
    """A missing image, a console error, a missing section and a table wider than the window, each named; the same
    wide table inside a box that scrolls is fine."""
    wide = "<table><tr>" + "<td>a_long_cell_value</td>" * 120 + "</tr></table>"
    page = tmp_path / "bad.html"
    page.write_text('<!DOCTYPE html><html><body><h2>1. Throughput</h2><img alt="gone" src="missing.png">'
                    f'<script>console.error("synthetic error")</script>{wide}</body></html>')
    problems = browser_check.check_page(page, sections=["1. Throughput", "2. Transition and step time"])
    assert "image did not load: gone" in problems
    assert "console error: synthetic error" in problems
    assert any(p.startswith("load failed: file://") for p in problems)
    assert "section missing: 2. Transition and step time" in problems
    assert "section missing: 1. Throughput" not in problems
    too_wide = [p for p in problems if p.startswith("the page is ")]
    assert len(too_wide) == 1 and "px wide in a 1280 px window: <table>" in too_wide[0], problems

    page.write_text('<!DOCTYPE html><html><body><img alt="pixel" src="data:image/png;base64,'
                    'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGP4z8DwHwAFAAH/iZk9HQAAAABJRU5ErkJggg==">'
                    f'<div style="overflow-x:auto">{wide}</div></body></html>')
    assert browser_check.check_page(page, sections=[]) == []


@needs_chromium
@pytest.mark.e2e
def test_the_micro_pipelines_report_is_clean_in_a_real_browser(micro_pipeline, tmp_path):
    """Every section present, no console error, every image loaded, nothing wider than a 1280 px window."""
    shot = tmp_path / "screenshot.png"
    assert browser_check.check_page(micro_pipeline / "results" / "report" / "index.html", shot) == []
    assert len(browser_check.report_sections()) == 7 and shot.stat().st_size > 0


@pytest.mark.e2e
def test_snakemake_report_includes_the_html_report(micro_pipeline, tmp_path):
    index = micro_pipeline / "results" / "report" / "index.html"
    assert "| reference |" in (micro_pipeline / "results" / "report" / "throughput.md").read_text()
    assert "<h1>ReMax framework comparison</h1>" in index.read_text()
    proc = snakemake(micro_pipeline, "--report", tmp_path / "snakemake_report.zip",
                     "--configfile", REPO / "workflows" / "config" / "micro.yaml")
    assert proc.returncode == 0, proc.stderr[-3000:]
    listing = subprocess.run([sys.executable, "-m", "zipfile", "-l", str(tmp_path / "snakemake_report.zip")],
                             capture_output=True, text=True).stdout
    assert "index.html" in listing and "reward_curve.png" in listing


# ---- the output folder, and bad values in what the report reads (issue 54) ----------------------------------------

def _report_cli(results, out, capsys):
    """`remax-bench report` in this process (the synthetic frameworks are registered only here): exit code and
    stderr."""
    from harness.cli import main

    capsys.readouterr()
    code = main(["report", str(results), "--out", str(out)])
    return code, capsys.readouterr().err


def _one_line(err, *names):
    lines = [line for line in err.splitlines() if line.startswith("remax-bench ")]
    assert "Traceback" not in err and len(lines) == 1 and all(str(n) in lines[0] for n in names), err


def _files(folder):
    return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_the_report_folder_is_written_whole_and_replaces_only_a_report(tmp_path, frameworks, capsys, monkeypatch):
    from harness.io import OWNER

    results = tmp_path / "results"
    three_frameworks(results, seeds=(1,), steps=20)
    synthetic.summarize(results)
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "index.html").write_text("my own page")
    (foreign / "reward_curve.png").write_bytes(b"my own figure")
    # someone's folder, the results directory itself, a run directory: refused before anything is written
    for out in (foreign, results, results / "runs" / FAST / "seed1"):
        before, around = _files(results) | _files(foreign), sorted(out.parent.iterdir())
        code, err = _report_cli(results, out, capsys)
        assert code == 2
        _one_line(err, out, "refusing to replace it (nothing was deleted)")
        assert _files(results) | _files(foreign) == before and sorted(out.parent.iterdir()) == around

    out = tmp_path / "report"
    for _ in range(2):  # a rerun replaces its own report
        code, err = _report_cli(results, out, capsys)
        assert code == 0, err
    mark = json.loads((out / OWNER).read_text())
    assert mark == {"kind": "report", "files": sorted(p.name for p in out.iterdir() if p.name != OWNER)}
    assert {p.name for p in out.iterdir()} == {OWNER, "index.html", "throughput.md", "throughput.csv", "runs.csv",
                                               "throughput.png", "step_time.png", "reward_curve.png"}

    # a failure after the figures and tables: the previous report stays as it was, a new one does not appear
    def fail(*args, **kwargs):
        raise HarnessError("synthetic failure while rendering the page")

    monkeypatch.setattr("harness.report.page.html", fail)
    before = _files(out)
    for target in (out, tmp_path / "new-report"):
        code, err = _report_cli(results, target, capsys)
        assert code == 2
        _one_line(err, "synthetic failure while rendering the page")
    assert _files(out) == before and not (tmp_path / "new-report").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine", "report", "results"]  # no temporary left


def test_a_non_finite_or_unconfigured_summary_value_is_exit_2_naming_the_file_and_field(tmp_path, frameworks,
                                                                                         capsys):
    results = tmp_path / "results"
    three_frameworks(results, seeds=(1, 2), steps=20)
    synthetic.summarize(results)
    path = results / "summary.csv"
    good = pd.read_csv(path)
    row = int(good.index[good["run_id"] == f"{FAST}-s2"][0])
    for column, value in (("throughput_tok_s", "inf"), ("throughput_tok_s", "-Infinity"),
                          ("time_step_s_median", "fast"), ("framework", "synthetic-elsewhere"),
                          ("framework", "../../elsewhere"), ("seed", "2.5"),
                          ("reward_gain", "nan")):
        bad = good.astype(object)
        bad.loc[row, column] = value
        bad.to_csv(path, index=False)
        code, err = _report_cli(results, tmp_path / "report", capsys)
        if value == "nan":  # an empty figure: a metric the run did not measure
            assert code == 0, err
            continue
        assert code == 2, (column, value, err)
        _one_line(err, f"{path}:{row + 2}", column)
        assert not (tmp_path / "report").exists()


def test_a_manifest_or_plan_field_of_the_wrong_type_is_named_and_the_report_still_written(tmp_path, frameworks,
                                                                                          capsys):
    """One damaged record never stops the report of the others: it is named, file and field, among the problems."""
    results = tmp_path / "results"
    three_frameworks(results, seeds=(1,), steps=20)
    synthetic.summarize(results)
    path = results / "runs" / FAST / "seed1" / "manifest.json"
    good = json.loads(path.read_text())
    plan = results / "plans" / FAST / "seed1" / "plan.json"
    damaged = [(path, {**good, field: value}, field) for field, value in (
        ("hardware", "8x A100"), ("created", 20260101), ("inputs", ["dataset"]), ("inputs", {"dataset": "d.jsonl"}),
        ("hardware", {"gpus": "A100"}))]
    damaged += [(path, [good], "should be a JSON object, not a list")]
    damaged += [(plan, {"run_id": f"{FAST}-s1", field: value}, field) for field, value in (
        ("hyperparameters", "lr 1e-6"), ("deviations", [{"key": ["remax.lr"], "cause": "x"}]))]
    for where, record, named in damaged:
        where.parent.mkdir(parents=True, exist_ok=True)
        where.write_text(json.dumps(record))
        code, err = _report_cli(results, tmp_path / "report", capsys)
        assert code == 0 and "Traceback" not in err, (named, err)
        page = html.unescape((tmp_path / "report" / "index.html").read_text())
        assert f"{where}:" in page and named in page, named
        if where == path:
            where.write_text(json.dumps(good))
        else:
            where.unlink()


def test_the_step0_table_has_rows_only_for_runs_that_ran(tmp_path):
    """Issue 53: the default report listed the framework runs of its profile that never ran (no GPU) as "its
    evaluation keeps no greedy responses". Only finished runs have a row; the run table says why the others did not
    run."""
    from harness.report.repeats import step0_view
    from harness.report.runs import Run
    from harness.results import layout

    results = tmp_path / "results"
    reference = layout.path(results, layout.RUN, framework="reference", seed=1)
    reference.mkdir(parents=True)
    write_json(reference / "eval.json", {"run_id": "r", "before": {"greedy_accuracy": 0.1, "responses": [
        {"prompt": "12", "response": "21"}]}, "after": {"greedy_accuracy": 0.2}}, role=EVAL_ROLE)
    finished = layout.path(results, layout.RUN, framework="trl", seed=1)
    finished.mkdir(parents=True)
    write_json(finished / "eval.json", {"run_id": "t", "before": {"greedy_accuracy": 0.1},
                                        "after": {"greedy_accuracy": 0.2}}, role=EVAL_ROLE)
    runs = [Run("reference", 1, status="ok"), Run("verl", 1), Run("openrlhf", 1, status="failed"),
            Run("trl", 1, status="ok")]
    rows = {r["framework"]: r["text"] for r in step0_view(results, runs, [])}
    assert rows == {"trl": "its evaluation keeps no greedy responses"}


def test_the_mismatch_table_gives_each_frameworks_figures_or_why_it_has_none(tmp_path, frameworks):
    """The rollout/trainer mismatch (#51): per framework, over its runs' measured steps, mean |delta log p| and
    token_mult_prob_error (mean over steps per run, median over seeds; max over every step), highlighted above
    NeMo-RL's 1.05; a framework whose runs logged none says why. The summary carries each run's means."""
    results = tmp_path / "results"
    config = validate_config({"frameworks": [FAST, FLAT], "seeds": [1, 2], "remax": {"steps": 10, "warmup_steps": 5}})
    write_json(results / "config.json", config, role=CONFIG_ROLE)
    for seed, (abs_diff, mult) in ((1, (0.01, 1.01)), (2, (0.03, 1.03))):
        rows = [dict(framework=FAST, framework_version="0", run_id=f"{FAST}-{seed}", seed=seed, step=i,
                     n_gpus=0, time_step_s=1.0, time_gen_s=0.5, time_transition_s=0.0, time_train_s=0.25,
                     tokens_prompt=10.0, tokens_response=10.0, tokens_baseline=5.0, reward_mean=0.5,
                     reward_baseline_mean=0.0, kl_mean=0.0, response_length_mean=1.0,
                     # a warm-up step far off is left out; seed 1's step 8 is NeMo-RL's case to investigate
                     rollout_logprob_abs_diff_mean=abs_diff if i > 5 else 3.0,
                     rollout_token_mult_prob_error=(1.2 if (seed, i) == (1, 8) else mult) if i > 5 else 9.0,
                     rollout_logprob_diff_mean=-abs_diff) for i in range(1, 11)]
        write_metrics(to_frame(rows, "synthetic mismatch"), results / "metrics" / FAST / f"seed{seed}.parquet")
        step_run(results, FLAT, seed, [0.5] * 10)
    synthetic.report(results)
    summary = pd.read_csv(results / "summary.csv").set_index("run_id")
    assert summary.loc[f"{FAST}-1", "rollout_logprob_abs_diff_mean"] == pytest.approx(0.01)
    assert summary.loc[f"{FAST}-1", "rollout_token_mult_prob_error"] == pytest.approx((4 * 1.01 + 1.2) / 5)
    assert pd.isna(summary.loc[f"{FLAT}-1", "rollout_token_mult_prob_error"])
    page = (results / "report" / "index.html").read_text()
    section = page.split("<h3>Rollout/trainer mismatch</h3>")[1].split("</table>")[0]
    rows = {fw: row for row in section.split("<tr")[2:] for fw in (FAST, FLAT) if f"<td>{fw}</td>" in row}
    cells = re.findall(r'<td class="num">(?:<b>)?([^<]*)', rows[FAST])
    assert cells == ["2", "10", "0.02", f"{((4 * 1.01 + 1.2) / 5 + 1.03) / 2:.4g}", "1.2"]
    assert rows[FAST].startswith(' class="mismatch"')
    assert "its runs logged no rollout log-probs" in rows[FLAT] and "mismatch" not in rows[FLAT]
    assert "NeMo-RL investigates a token_mult_prob_error above 1.05" in page
