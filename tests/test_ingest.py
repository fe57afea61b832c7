import json

import numpy as np
import pandas as pd
import pytest
from conftest import run_cli

from harness import HarnessError
from harness.frameworks import get_adapter, known_frameworks, read_run
from harness.results.efficiency import ModelShape
from harness.results.metrics import SCHEMA, read_metrics, to_frame, write_metrics
from harness.results.summarize import summarize


def step(n, **kw):
    row = dict(framework="reference", framework_version="0.1.0", run_id="r", seed=1, step=n, n_gpus=0,
               time_step_s=2.0, time_gen_s=1.0, time_transition_s=0.1, time_train_s=0.5, tokens_prompt=300,
               tokens_response=100, tokens_baseline=40, reward_mean=0.5, reward_baseline_mean=0.4, kl_mean=0.0,
               response_length_mean=3.0)
    return {**row, **kw}


def write_log(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_throughput_is_derived_from_tokens_and_step_time():
    df = to_frame([step(2, n_gpus=8), step(1, n_gpus=8, time_step_s=4.0)], "log")
    assert df["step"].tolist() == [1, 2]
    assert df["throughput_tok_s"].tolist() == [100.0, 200.0]  # (300 + 100) / step time; greedy tokens not counted
    assert df["throughput_tok_s_per_gpu"].tolist() == [12.5, 25.0]
    assert np.isnan(to_frame([step(1)], "log")["throughput_tok_s_per_gpu"]).all()  # CPU: no per-GPU figure
    assert list(df.columns) == list(SCHEMA)


@pytest.mark.parametrize(
    "rows, message",
    [
        ([], "log: no step records found"),
        ([{k: v for k, v in step(1).items() if k != "time_gen_s"}], "log: step records lack time_gen_s"),
        ([step(1), step(1)], "log: step 1 appears twice"),
        ([step(1), step(2, time_step_s=0.0)], "log: step 2: time_step_s is 0.0, not a positive number"),
    ],
)
def test_bad_step_records_are_named(rows, message):
    with pytest.raises(HarnessError, match=message):
        to_frame(rows, "log")


def test_reference_ingest_names_file_and_line_of_a_garbled_record(tmp_path):
    log = write_log(tmp_path / "steps.jsonl", [step(1), step(2)])
    log.write_text(log.read_text() + '{"step": 3, "time_st\n')
    with pytest.raises(HarnessError, match=rf"{log}:3: not a JSON step record"):
        get_adapter("reference").ingest(read_run("reference", [log]))


def test_ingest_cli_writes_parquet_and_rejects_bad_input(tmp_path):
    log = write_log(tmp_path / "steps.jsonl", [step(1), step(2)])
    out = tmp_path / "m.parquet"
    proc = run_cli("ingest", "reference", tmp_path, "--out", out, "--n-gpus", "2")
    assert proc.returncode == 0, proc.stderr
    assert pd.read_parquet(out)["n_gpus"].tolist() == [2, 2]

    log.write_text("")
    proc = run_cli("ingest", "reference", log, "--out", tmp_path / "empty.parquet")
    assert proc.returncode == 2 and f"{log}: no step records found" in proc.stderr
    assert not (tmp_path / "empty.parquet").exists()

    proc = run_cli("ingest", "nosuch", log, "--out", tmp_path / "x.parquet")
    assert proc.returncode == 2
    assert f"unknown framework 'nosuch' (known: {', '.join(known_frameworks())})" in proc.stderr


# --- a metrics file is held to ingest's rules wherever it is read (#61) ---

def hand_edited(tmp_path, column, value, row=1):
    """A metrics parquet of three steps as ingest writes it, then one cell changed by another tool (pandas and
    pyarrow, past every check of the harness's own writer)."""
    path = tmp_path / f"{column}-{row}.parquet"
    write_metrics(to_frame([step(n, time_step_cpu_s=2.0) for n in (1, 2, 3)], "log"), path)
    df = pd.read_parquet(path)
    if df[column].dtype.kind not in "f":
        df[column] = df[column].astype(object)
    df.loc[row, column] = value
    df.to_parquet(path, index=False)
    return path


def test_summarize_refuses_a_negative_step_time_as_ingest_does(tmp_path):
    """summarize read a hand-edited parquet without ingest's checks: a step time of -400 s became a wall time of
    -400 s in summary.csv."""
    path = hand_edited(tmp_path, "time_step_s", -400.0)
    config, out = tmp_path / "config.yaml", tmp_path / "summary.csv"
    config.write_text("remax: {warmup_steps: 1}\n")  # step 2 measured
    proc = run_cli("summarize", "--config", config, "--metrics", path, "--out", out)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"{path}: step 2: time_step_s is -400.0, not a positive number" in proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()


# (column, value, what summarize says): each used to be summarized (or blamed on another column, or a traceback)
DAMAGE = [
    ("time_step_s", -400.0, "step 2: time_step_s is -400.0, not a positive number"),
    ("time_step_s", float("nan"), "step 2: time_step_s is nan, not a positive number"),
    # was "run r: wall_time_s is inf": the summary's figure named, not the step's time
    ("time_step_s", float("inf"), "step 2: time_step_s is inf, not a finite number"),
    ("reward_mean", float("nan"), "step 2: reward_mean is nan, not a finite number"),
    ("tokens_response", float("-inf"), "step 2: tokens_response is -inf, not a finite number"),
    ("kl_mean", float("inf"), "step 2: kl_mean is inf, not a finite number"),
    ("step", -3, r"record 2 \(step -3\): step is -3, not a whole number"),
    ("framework", None, "step 2: framework is null, not text"),  # was a traceback in the report
    ("run_id", None, "step 2: run_id is null, not text"),
]


@pytest.mark.parametrize("column, value, message", DAMAGE, ids=[f"{c}={v}" for c, v, _ in DAMAGE])
def test_a_metrics_file_is_refused_where_its_log_would_be(tmp_path, column, value, message):
    """One rule: read_metrics refuses what to_frame refuses at ingest, with the same words, naming the file, the step
    and the column; summarize reads through it."""
    path = hand_edited(tmp_path, column, value)
    with pytest.raises(HarnessError, match=rf"^{path}: {message}"):
        summarize([path], [], warmup_steps=1)
    rows = [step(1), step(2, **{column: value}), step(3)]
    with pytest.raises(HarnessError) as at_ingest:
        to_frame([{**r, "time_step_cpu_s": 2.0} for r in rows], "log")
    with pytest.raises(HarnessError) as at_read:
        read_metrics(path)
    assert str(at_read.value) == str(at_ingest.value).replace("log: ", f"{path}: ", 1)


def test_the_figure_a_time_of_zero_makes_infinite_names_that_step_and_time(tmp_path):
    """A time of 0 divides a summary figure to infinity: the message names the step and the time of 0 beside the
    figure (it said only "run r: cpu_contention is inf")."""
    path = hand_edited(tmp_path, "time_step_cpu_s", 0.0)
    with pytest.raises(HarnessError, match=rf"^{path}: run r: cpu_contention is inf, not a finite number: "
                                           r"time_step_cpu_s is 0.0 at step 2$"):
        summarize([path], [], warmup_steps=1)
    path = hand_edited(tmp_path, "time_gen_s", 0.0, row=2)
    shape = {"shape": ModelShape(1000, 1, 16), "prompts": 4, "samples_per_prompt": 2, "peak_flops": 1e12,
             "peak_source": "test"}
    with pytest.raises(HarnessError, match=rf"^{path}: run r: mfu_gen is inf, not a finite number: time_gen_s is 0.0 "
                                           r"at step 3$"):
        summarize([path], [], warmup_steps=1, efficiency=lambda df: shape)


def test_a_hand_edited_throughput_is_derived_again(tmp_path):
    """Throughput is derived, never taken from a file: a parquet whose throughput was edited reads as its tokens and
    step times say."""
    path = hand_edited(tmp_path, "throughput_tok_s", 1e9)
    assert read_metrics(path)["throughput_tok_s"].tolist() == [200.0, 200.0, 200.0]
