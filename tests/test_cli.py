import pytest
from conftest import REPO, run_cli

from harness.cli import main


def test_run_with_a_broken_config_exits_2_naming_the_key_and_writes_nothing(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("remax: {steps: 0}\n")
    out = tmp_path / "run"
    proc = run_cli("run", "reference", "--config", config, "--seed", 1, "--out", out, "--inputs", tmp_path)
    assert proc.returncode == 2
    assert f"{config}: invalid config" in proc.stderr
    assert "at remax.steps: 0 is less than the minimum of 1" in proc.stderr
    assert not out.exists()


def test_run_without_built_inputs_names_the_missing_input(tmp_path):
    out = tmp_path / "run"
    proc = run_cli("run", "reference", "--config", REPO / "workflows/config/cpu.yaml", "--seed", 1, "--out", out,
                   "--inputs", tmp_path)
    assert proc.returncode == 2 and f"{tmp_path}/dataset.jsonl: input is missing" in proc.stderr
    assert not out.exists()


def test_unknown_framework_exits_2(tmp_path):
    proc = run_cli("run", "deepspeed-magic", "--config", REPO / "workflows/config/cpu.yaml", "--seed", 1,
                   "--out", tmp_path / "x")
    assert proc.returncode == 2 and "unknown framework 'deepspeed-magic'" in proc.stderr


@pytest.mark.parametrize("argv, flag, said", [
    (["plan", "verl", "--config", "c.yaml", "--seed", "-5", "--out", "p"], "--seed", "at least 0, not -5"),
    (["run", "reference", "--config", "c.yaml", "--seed", "x", "--out", "r"], "--seed", "an integer, not 'x'"),
    (["ingest", "reference", "r", "--out", "m.parquet", "--n-gpus", "-3"], "--n-gpus", "at least 0, not -3"),
    (["launch", "p", "--out", "r", "--config", "c.yaml", "--timeout-min", "inf"], "--timeout-min",
     "a finite number, not 'inf'"),
    (["reproduce", "r", "--out", "o", "--timeout-min", "0"], "--timeout-min", "a finite number above 0, not '0'"),
    (["serve-reward", "--port", "70000"], "--port", "a TCP port (0-65535; 0 = any free one), not 70000"),
    (["serve-reward", "--health-check", "http://127.0.0.1:1/health", "--timeout", "-1"], "--timeout",
     "a number of seconds from 0 to 604800 (7 days), not '-1'"),
    (["serve-reward", "--health-check", "http://127.0.0.1:1/health", "--timeout", "nan"], "--timeout",
     "a finite number, not 'nan'"),
    (["launch", "p", "--out", "r", "--config", "c.yaml", "--timeout-min", "nan"], "--timeout-min",
     "a finite number, not 'nan'"),
    (["baseline", "update", "--out", "b.json", "--last", "0"], "--last", "at least 1, not 0"),
    (["ab", "--a", "A", "--b", "B", "--config", "c.yaml", "--out", "o", "--alpha", "1.5"], "--alpha",
     "a number between 0 and 1, not '1.5'"),
    (["ab", "--a", "A", "--b", "B", "--config", "c.yaml", "--out", "o", "--seeds", "1,-2"], "--seeds",
     "seeds: comma-separated integers from 0 to 4294967295, not '1,-2'"),
])
def test_a_number_out_of_range_on_the_command_line_is_exit_2_naming_the_flag(argv, flag, said, capsys):
    """NaN and infinity too: `launch --timeout-min nan` never timed out, its wait loop spinning at 100% CPU."""
    with pytest.raises(SystemExit) as refused:
        main(argv)
    err = capsys.readouterr().err
    assert refused.value.code == 2 and f"argument {flag}: {said}" in err and "Traceback" not in err, err
