from conftest import REPO, run_cli


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
