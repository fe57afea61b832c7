"""The real Snakemake pipeline, end to end, on the micro profile."""

import json

import pandas as pd
import pytest
from conftest import REPO, snakemake

from harness.results.metrics import SCHEMA

pytestmark = pytest.mark.e2e


def test_pipeline_writes_summary_report_and_runs_in_the_common_schema(micro_pipeline):
    results = micro_pipeline / "results"
    summary = pd.read_csv(results / "summary.csv")
    assert sorted(summary["seed"]) == [1, 2] and set(summary["framework"]) == {"reference"}
    assert (summary["throughput_tok_s"] > 0).all() and (summary["measured_steps"] == 4).all()
    assert summary["eval_accuracy_before"].between(0, 1).all()

    for seed in (1, 2):
        run = results / "runs" / "reference" / f"seed{seed}"
        df = pd.read_parquet(results / "metrics" / "reference" / f"seed{seed}.parquet")
        assert list(df.columns)[: len(SCHEMA)] == list(SCHEMA) and df["step"].tolist() == [1, 2, 3, 4, 5, 6]
        # the step is the sum of its parts plus reward/ref work, never less than them
        parts = df[["time_gen_s", "time_transition_s", "time_train_s"]].sum(axis=1)
        assert (parts <= df["time_step_s"]).all() and (df["time_transition_s"] > 0).all()
        # prompts are counted once per sampled response (rollout_n = 2), greedy tokens separately
        assert (df["tokens_baseline"] > 0).all() and (df["tokens_prompt"] % 2 == 0).all()
        assert (df["time_probe_s"] > 0).all()  # the machine-speed probe ran beside every CPU step
        pd.testing.assert_frame_equal(df, pd.read_parquet(run / "metrics.parquet"))

        manifest = json.loads((run / "manifest.json").read_text())
        assert manifest["seed"] == seed and manifest["config"]["profile"] == "micro"
        for name in ("dataset", "policy", "reward"):
            assert len(manifest["inputs"][name]["sha256"]) == 64
        recorded = (results / "inputs" / "dataset.jsonl.sha256").read_text().split()[0]
        assert manifest["inputs"]["dataset"]["sha256"] == recorded
        assert manifest["versions"]["torch"] and manifest["hardware"]["cpu_count"] >= 1

    manifests = [json.loads((results / "runs" / "reference" / f"seed{s}" / "manifest.json").read_text())
                 for s in (1, 2)]
    windows = sorted((m["timed_window"]["start"], m["timed_window"]["end"]) for m in manifests)
    assert windows[0][1] <= windows[1][0], "two timed runs overlapped although the pipeline had 2 cores"

    table = (results / "report" / "throughput.md").read_text()
    assert "| reference |" in table and "1.00x" in table
    assert (results / "report" / "reward_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_same_seed_gives_the_same_reward_curve(micro_pipeline, tmp_path):
    from conftest import run_cli

    out = tmp_path / "again"
    proc = run_cli("run", "reference", "--config", micro_pipeline / "results" / "config.json", "--seed", 1,
                   "--inputs", micro_pipeline / "results" / "inputs", "--out", out)
    assert proc.returncode == 0, proc.stderr
    first = pd.read_parquet(micro_pipeline / "results" / "runs" / "reference" / "seed1" / "metrics.parquet")
    again = pd.read_parquet(out / "metrics.parquet")
    for column in ("reward_mean", "reward_baseline_mean", "kl_mean", "tokens_response", "tokens_baseline"):
        assert again[column].tolist() == first[column].tolist(), column


def test_bad_config_stops_before_any_job_and_names_the_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("remax: {train_batch_size: -4}\ntask: {digitz: 2}\n")
    proc = snakemake(tmp_path, "--cores", "1", "--configfile", bad)
    assert proc.returncode != 0
    assert "remax.train_batch_size: -4 is less than the minimum of 1" in proc.stderr
    assert "task: Additional properties are not allowed ('digitz' was unexpected)" in proc.stderr
    assert not (tmp_path / "results").exists()


def test_lint_is_clean():
    proc = snakemake(REPO, "--lint")
    assert proc.returncode == 0 and "Congratulations" in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def test_a_corrupted_input_stops_the_run_and_leaves_no_run_directory(micro_pipeline, tmp_path):
    import shutil

    from conftest import run_cli

    inputs = tmp_path / "inputs"
    shutil.copytree(micro_pipeline / "results" / "inputs", inputs)
    data = inputs / "dataset.jsonl"
    data.write_text(data.read_text().replace('"answer":"1', '"answer":"7', 1))
    out = tmp_path / "run"
    proc = run_cli("run", "reference", "--config", micro_pipeline / "results" / "config.json", "--seed", 1,
                   "--inputs", inputs, "--out", out)
    assert proc.returncode == 2 and f"{data}: sha256 mismatch" in proc.stderr
    assert not out.exists()
