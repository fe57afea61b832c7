import json

import numpy as np
import pandas as pd
import pytest
from conftest import run_cli

from harness import HarnessError
from harness.frameworks import get_adapter, known_frameworks, read_run
from harness.results.metrics import SCHEMA, to_frame


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
        ([step(1), step(2, time_step_s=0.0)], "log: step 2: time_step_s must be a positive number"),
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
