import pytest
from conftest import REPO

from harness import HarnessError
from harness.config import load_config, validate_config
from harness.io import config_hash


def test_default_profile_is_valid_and_defaults_are_filled():
    config = load_config(REPO / "workflows" / "config" / "cpu.yaml")
    assert config["frameworks"][0] == "reference" and config["remax"]["grad_clip"] == 1.0
    assert validate_config({})["policy"]["sft"]["steps"] == 300  # nested defaults from the schema


@pytest.mark.parametrize(
    "config, message",
    [
        ({"remax": {"rollout_nn": 4}}, "at remax: Additional properties are not allowed ('rollout_nn' was unexpected)"),
        ({"remax": {"lr": "fast"}}, "at remax.lr: 'fast' is not of type 'number'"),
        ({"task": {"n_train": -5}}, "at task.n_train: -5 is less than the minimum of 1"),
        ({"seeds": []}, "at seeds: [] should be non-empty"),
        ({"frameworks": ["reference", "vllm-magic"]}, "at frameworks: unknown framework 'vllm-magic'"),
        ({"remax": {"steps": 5, "warmup_steps": 5}}, "at remax.warmup_steps: 5 leaves no measured step"),
    ],
)
def test_bad_config_names_the_key(config, message):
    with pytest.raises(HarnessError) as err:
        validate_config(config, source="my.yaml")
    assert str(err.value).startswith("my.yaml") and message in str(err.value)


def test_broken_yaml_names_the_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("remax: {steps: [1\n")
    with pytest.raises(HarnessError, match=f"{path}: not valid YAML"):
        load_config(path)


def test_config_hash_changes_with_the_experiment_not_with_key_order():
    a = validate_config({"remax": {"lr": 0.001, "steps": 20}})
    b = validate_config({"remax": {"steps": 20, "lr": 0.001}})
    assert config_hash(a) == config_hash(b) != config_hash(validate_config({"remax": {"lr": 0.002, "steps": 20}}))


def test_a_frozen_json_config_keeps_small_floats_as_numbers(tmp_path):
    from harness.io import write_json

    path = tmp_path / "config.json"
    write_json(path, validate_config({"remax": {"lr": 1e-6, "steps": 20}}))
    assert "1e-06" in path.read_text() and load_config(path)["remax"]["lr"] == 1e-6
