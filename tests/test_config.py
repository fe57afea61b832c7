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
        # Numbers past every bound of the schema: NaN compares false with the bound, infinity is a float
        ({"remax": {"lr": float("nan")}}, "at remax.lr: nan is not a finite number"),
        ({"remax": {"lr": float("inf")}}, "at remax.lr: inf is not a finite number"),
        ({"openrlhf": {"reward_health_timeout_s": float("inf")}},
         "at openrlhf.reward_health_timeout_s: inf is not a finite number"),
        ({"remax": {"steps": 10**30}}, "at remax.steps: 1000000000000000000000000000000 does not fit in 64 bits"),
        ({"openrlhf": {"reward_port": 70000}}, "at openrlhf.reward_port: 70000 is greater than the maximum of 65535"),
        # Python's $ matches before a final newline; a pattern means the whole string
        ({"profile": "micro\n"}, "at profile: 'micro\\n' does not match"),
        ({"launch": {"gpu_model": "a100\n"}}, "at launch.gpu_model: 'a100\\n' does not match"),
        ({"openrlhf": {"reward_host": "localhost\n"}}, "at openrlhf.reward_host: 'localhost\\n' does not match"),
        ({"dschat": {"reward_url": "http://127.0.0.1:5000/\n"}}, "at dschat.reward_url:"),
        ({"container": {"apptainer": "apptainer\n"}}, "at container.apptainer: 'apptainer\\n' does not match"),
        # every seed within numpy's 0..2**32 - 1, every timeout within 7 days (1e308 minutes never times out)
        ({"policy": {"sft": {"seed": 2**63 - 1}}},
         "at policy.sft.seed: 9223372036854775807 is greater than the maximum of 4294967295"),
        ({"seeds": [1, 2**32]}, "at seeds.1: 4294967296 is greater than the maximum of 4294967295"),
        ({"task": {"seed": 2**32}}, "at task.seed: 4294967296 is greater than the maximum of 4294967295"),
        ({"reward": {"train": {"seed": 2**32}}}, "at reward.train.seed: 4294967296 is greater than the maximum"),
        ({"reproducibility": {"repeat_seeds": [2**32]}}, "at reproducibility.repeat_seeds.0: 4294967296 is greater"),
        ({"launch": {"timeout_min": 10081}}, "at launch.timeout_min: 10081 is greater than the maximum of 10080"),
        ({"openrlhf": {"reward_health_timeout_s": 1e308}}, "at openrlhf.reward_health_timeout_s: 1e+308 is greater"),
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


def test_nan_and_infinity_are_refused_from_yaml_and_from_the_workflows_json(tmp_path):
    from harness.cli import main

    (tmp_path / "c.yaml").write_text("remax: {lr: .inf}\n")
    with pytest.raises(HarnessError, match=r"c\.yaml: at remax\.lr: inf is not a finite number"):
        load_config(tmp_path / "c.yaml")
    assert main(["freeze-config", "--json", '{"remax": {"lr": Infinity}}', "--out", str(tmp_path / "f.json")]) == 2
    assert not (tmp_path / "f.json").exists()


def test_a_brace_in_a_config_value_is_an_ordinary_character_in_the_workflow(tmp_path):
    """Snakemake reads {word} in a rule's params string as a wildcard (WildcardError, naming no key)."""
    import json

    from conftest import snakemake

    (tmp_path / "c.yaml").write_text('task: {prompt_key: "question {word}"}\n')
    proc = snakemake(tmp_path, "-n", "--configfile", REPO / "workflows" / "config" / "micro.yaml", tmp_path / "c.yaml")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    proc = snakemake(tmp_path, "--cores", "1", "results/config.json", "--configfile",
                     REPO / "workflows" / "config" / "micro.yaml", tmp_path / "c.yaml")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert json.loads((tmp_path / "results" / "config.json").read_text())["task"]["prompt_key"] == "question {word}"


def test_the_workflow_refuses_a_config_file_past_the_cap_naming_it(tmp_path):
    from conftest import snakemake

    big = tmp_path / "big.yaml"
    big.write_text("profile: cpu\n" + "# padding\n" * 110_000)  # comments: Snakemake's own parse stays quick
    proc = snakemake(tmp_path, "-n", "--configfile", big)
    assert proc.returncode != 0 and f"{big}: larger than 1048576 bytes; not a config" in proc.stdout + proc.stderr
