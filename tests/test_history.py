"""The append-only history: one atomically written file per pipeline run, read back with damage named by line."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import REPO, run_cli

from harness import HarnessError
from harness.config import CONFIG_ROLE, load_config, validate_config
from harness.io import write_json
from harness.regression.history import append, pipeline_rows, read_history
from harness.results.layout import HISTORY
from harness.results.metrics import to_frame, write_metrics
from harness.results.summarize import summarize
from harness.runtime.manifest import MANIFEST_ROLE, build_manifest


def make_results(results: Path, *, throughput: float | dict = 1000.0, transition_s: float = 0.001,
                 seeds=(1, 2, 3), created: str = "2026-01-01T00:00:00+00:00", config: dict | None = None,
                 noise: float = 0.0, rng=None, steps: int = 20, learning_rate: float = 0.05,
                 contention: float | None = None, foreign_load: float = 0.0, probe_s: float | None = None) -> Path:
    """A results directory as the pipeline leaves it (summary.csv, runs/*/manifest.json, metrics/*.parquet),
    written by the harness's own code from per-step records with the given speed; only the numbers are chosen.
    With `contention` (wall / CPU time) the steps also carry CPU time and the machine's busy time, as the CPU
    backend records them, with `foreign_load` cores of other work beside the run; with `probe_s` the steps carry
    the machine-speed probe's time, as the CPU backend records it after each step."""
    rng = rng or np.random.default_rng(0)
    config = config or load_config(REPO / "workflows" / "config" / "cpu.yaml")
    config = validate_config({**config, "remax": {**config["remax"], "steps": steps, "warmup_steps": 2}})
    files = []
    for seed in seeds:
        tps = throughput[seed] if isinstance(throughput, dict) else throughput
        level = 1 + noise * rng.standard_normal()
        run_id = f"reference-{config['profile']}-s{seed}"
        rows = [{"framework": "reference", "framework_version": "0.1.0", "run_id": run_id, "seed": seed, "step": step,
                 "n_gpus": 0, "time_step_s": 200 / (tps * level), "time_gen_s": 0.5 * 200 / (tps * level),
                 "time_transition_s": transition_s / level,
                 "time_train_s": 0.3 * 200 / (tps * level), "tokens_prompt": 120.0, "tokens_response": 80.0,
                 "tokens_baseline": 20.0, "reward_mean": min(1.0, 0.2 + learning_rate * step),
                 "reward_baseline_mean": 0.2, "kl_mean": 0.0, "response_length_mean": 5.0}
                for step in range(1, steps + 1)]
        if contention is not None:
            for r in rows:
                r["time_step_cpu_s"] = r["time_step_s"] / contention
                r["time_machine_busy_s"] = r["time_step_cpu_s"] + foreign_load * r["time_step_s"]
        if probe_s is not None:
            for r in rows:
                r["time_probe_s"] = probe_s
        path = results / "metrics" / "reference" / f"seed{seed}.parquet"
        write_metrics(to_frame(rows, "synthetic"), path)
        files.append(path)
        manifest = build_manifest(framework="reference", framework_version="0.1.0", run_id=run_id,
                                  seed=seed, config=config, inputs={"dataset": {"path": "d", "sha256": "0" * 64}})
        write_json(results / "runs" / "reference" / f"seed{seed}" / "manifest.json", {**manifest, "created": created},
                   role=MANIFEST_ROLE)
    write_json(results / "config.json", config, role=CONFIG_ROLE)
    summarize(files, [], config["remax"]["warmup_steps"]).to_csv(results / "summary.csv", index=False)
    return results


def test_append_writes_one_row_per_run_once_and_never_touches_earlier_files(tmp_path):
    results = make_results(tmp_path / "results")
    path, rows, new = append(results)
    assert new and path.parent == results / HISTORY and len(rows) == 3
    first_bytes = path.read_bytes()
    again_path, _, again = append(results)  # a rule rerun or a manual call: same pipeline run
    listed = [p for p in path.parent.iterdir() if not p.name.startswith(".")]  # the hidden record of files written
    assert not again and again_path == path and listed == [path]

    make_results(results, throughput=900.0, created="2026-01-02T00:00:00+00:00")  # the next night
    second, _, new = append(results)
    assert new and second != path and path.read_bytes() == first_bytes
    history = read_history(results / HISTORY)
    days = [r["pipeline_time"][:10] for r in history]
    assert days == ["2026-01-01"] * 3 + ["2026-01-02"] * 3
    row = history[0]
    assert (row["profile"], row["framework"], row["seed"]) == ("cpu", "reference", 1)
    assert row["metrics"]["throughput_tok_s"] == pytest.approx(1000.0)
    assert row["provenance"]["config"]["profile"] == "cpu" and row["curve"]["reward"][-1] == pytest.approx(1.0)
    assert history[-1]["metrics"]["throughput_tok_s"] == pytest.approx(900.0)


def test_concurrent_writers_leave_every_row_intact(tmp_path):
    """Eight processes append at once: four different pipeline runs, each twice."""
    dirs = []
    for i in range(4):
        dirs.append(make_results(tmp_path / f"r{i}" / "results", throughput=1000.0 + i,
                                 created=f"2026-01-0{i + 1}T00:00:00+00:00"))
    shared = tmp_path / "history"
    code = "import sys; from harness.regression.history import append; append(sys.argv[1], sys.argv[2])"
    procs = [subprocess.Popen([sys.executable, "-c", code, str(d), str(shared)]) for d in dirs + dirs]
    assert [p.wait() for p in procs] == [0] * 8
    rows = read_history(shared)
    assert len(list(shared.glob("*.jsonl"))) == 4 and len(rows) == 12
    assert sorted({round(r["metrics"]["throughput_tok_s"]) for r in rows}) == [1000, 1001, 1002, 1003]


def test_an_interrupted_writer_leaves_nothing_that_reads_as_history(tmp_path):
    results = make_results(tmp_path / "results")
    history = results / HISTORY
    append(results)
    # What a writer killed before its rename leaves: a hidden temporary directory with a partial file.
    torn = history / ".20260102T000000Z-abc.jsonl.x1y2" / "20260102T000000Z-abc.jsonl"
    torn.parent.mkdir()
    torn.write_text('{"schema": 1, "pipeline_run": "ab')
    assert len(read_history(history)) == 3


def test_a_corrupt_row_is_named_by_file_and_line(tmp_path):
    results = make_results(tmp_path / "results")
    path, _, _ = append(results)
    lines = path.read_text().splitlines(keepends=True)
    path.write_text(lines[0] + '{"schema": 1, "pipeline_run": \n' + lines[2])
    with pytest.raises(HarnessError, match=rf"{path}:2: corrupt row, not valid JSON"):
        read_history(results / HISTORY)
    path.write_text(lines[0] + lines[1] + lines[2].rstrip("\n"))
    with pytest.raises(HarnessError, match=rf"{path}:3: incomplete row"):
        read_history(results / HISTORY)
    row = json.loads(lines[0])
    del row["config_hash"]
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(HarnessError, match=rf"{path}:1: row lacks 'config_hash'"):
        read_history(results / HISTORY)


def test_pipeline_run_id_follows_the_content(tmp_path):
    a = pipeline_rows(make_results(tmp_path / "a" / "results"))
    b = pipeline_rows(make_results(tmp_path / "b" / "results"))
    c = pipeline_rows(make_results(tmp_path / "c" / "results", created="2026-01-05T00:00:00+00:00"))
    assert a[0]["pipeline_run"] == b[0]["pipeline_run"] != c[0]["pipeline_run"]
    assert len({r["pipeline_run"] for r in a}) == 1


def test_cli_append_and_bad_inputs(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = run_cli("history", "append", "--results", empty)
    assert proc.returncode == 2 and f"{empty}/summary.csv: missing" in proc.stderr

    results = make_results(tmp_path / "results")
    os.remove(results / "runs" / "reference" / "seed2" / "manifest.json")
    proc = run_cli("history", "append", "--results", results)
    assert proc.returncode == 2
    assert (f"{results}/runs/reference/seed2/manifest.json: manifest not found (the run directory has no manifest)"
            in proc.stderr)
    assert not (results / HISTORY).exists()

    results = make_results(tmp_path / "ok" / "results")
    receipt = tmp_path / "receipt.json"
    proc = run_cli("history", "append", "--results", results, "--receipt", receipt)
    assert proc.returncode == 0 and "appended 3 run(s)" in proc.stdout
    assert json.loads(receipt.read_text())["newly_appended"] is True
    proc = run_cli("history", "append", "--results", results)
    assert proc.returncode == 0 and "already in the history, nothing written" in proc.stdout


def test_the_report_and_the_check_read_time_to_reward_from_one_curve():
    """The report times a run on its full curve, the check on the history's sampled copy of the same curve: both
    are harness.results.summarize.time_to_reward, the sampled one later by at most one spacing of its points."""
    from harness.regression.history import CURVE_POINTS, sampled_reward_curve
    from harness.results.summarize import reward_curve, time_to_reward

    rng = np.random.default_rng(3)
    n = 400
    steps = pd.DataFrame({"step": np.arange(1, n + 1), "time_step_s": 0.05 + 0.01 * rng.random(n),
                          "reward_mean": np.linspace(0.2, 0.8, n) + 0.05 * rng.standard_normal(n)})
    steps.loc[0, "reward_mean"] = 5.0  # a lucky first step: no full trailing window yet, so it reaches nothing
    full = reward_curve(steps)
    assert full["reward"].iloc[:39].isna().all() and full["reward"].iloc[39:].notna().all()
    target = 0.6
    time_s, step = time_to_reward(full, target)
    assert 200 < step < 400 and time_s == pytest.approx(steps["time_step_s"].iloc[:step].sum())
    sampled = sampled_reward_curve(steps)
    assert sampled["reward"][0] is None  # stored as JSON null, as the history writes it
    late_s, late_step = time_to_reward(sampled, target)
    assert step <= late_step <= step + (n - 1) / (CURVE_POINTS - 1) + 1 and late_s >= time_s - 1e-4  # 4 decimals kept
    assert time_to_reward(full, 0.95) is None and time_to_reward(sampled, 0.95) is None


def test_append_checks_its_receipt_before_the_history_grows(tmp_path):
    results = make_results(tmp_path / "results")
    receipt = tmp_path / "receipt"
    receipt.mkdir()  # a folder where the receipt file should go
    proc = run_cli("history", "append", "--results", results, "--receipt", receipt)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"{receipt}: an existing folder; refusing to replace it with a file" in proc.stderr
    assert not (results / HISTORY).exists()
