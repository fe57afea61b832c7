import re

import pytest
import yaml
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
    from harness.config import CONFIG_ROLE
    from harness.io import write_json

    path = tmp_path / "config.json"
    write_json(path, validate_config({"remax": {"lr": 1e-6, "steps": 20}}), role=CONFIG_ROLE)
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


def _numbers(node: dict, path: tuple[str, ...] = (), defs: dict | None = None):
    """(path, schema, inside a list) of every integer or number of the config schema, through $defs and lists."""
    defs = node.get("$defs", {}) if defs is None else defs
    if "$ref" in node:
        node = {**defs[node["$ref"].rsplit("/", 1)[1]], **{k: v for k, v in node.items() if k != "$ref"}}
    types = node.get("type") if isinstance(node.get("type"), list) else [node.get("type")]
    if {"integer", "number"} & set(types):
        yield path, node, False
    if isinstance(node.get("items"), dict):
        yield from ((p, n, True) for p, n, _ in _numbers(node["items"], path, defs))
    for key, sub in node.get("properties", {}).items():
        yield from _numbers(sub, (*path, key), defs)


def _schema_numbers():
    from harness.config import schema

    return list(_numbers(schema()))


def _with_value(path: tuple[str, ...], value: object, in_list: bool) -> dict:
    raw = yaml.safe_load((REPO / "workflows" / "config" / "cpu.yaml").read_text())
    node = raw
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = [value] if in_list else value
    return raw


def test_every_number_of_the_schema_has_a_lower_and_an_upper_bound():
    """A number without a ceiling took lr 1e308 or steps 2**63 - 1 and planned a run that could never be."""
    numbers = _schema_numbers()
    assert len(numbers) > 40  # the walk sees the framework blocks and the lists too
    unbounded = [".".join(path) for path, node, _ in numbers
                 if not ({"minimum", "exclusiveMinimum"} & set(node) and {"maximum", "exclusiveMaximum"} & set(node))]
    assert unbounded == []


def _past(node: dict, side: str) -> float:
    """The first value past the bound on `side` (the exclusive bound itself, or one past an inclusive one)."""
    exclusive = "exclusiveMaximum" if side == "maximum" else "exclusiveMinimum"
    if exclusive in node:
        return node[exclusive]
    return node[side] + 1 if side == "maximum" else node[side] - 1


@pytest.mark.parametrize("path, node, in_list", [pytest.param(*n, id=".".join(n[0])) for n in _schema_numbers()])
def test_a_number_past_either_bound_is_refused_naming_the_key_and_each_inclusive_bound_is_accepted(path, node,
                                                                                                  in_list):
    where = ".".join(path) + (".0" if in_list else "")
    for side in ("minimum", "maximum"):
        assert side in node or "exclusive" + side.title() in node, f"{where}: no {side}"
        with pytest.raises(HarnessError, match=rf"invalid config\n(.*\n)*  at {re.escape(where)}: "):
            validate_config(_with_value(path, _past(node, side), in_list), source="my.yaml")
        if side in node:  # the bound itself passes the schema (a rule across keys may still refuse it)
            try:
                validate_config(_with_value(path, node[side], in_list), source="my.yaml")
            except HarnessError as e:
                assert "invalid config" not in str(e), str(e)


@pytest.mark.parametrize("path", sorted({*(REPO / "workflows" / "config").glob("*.yaml"),
                                         *(REPO / "benchmarks").glob("*.yaml")}), ids=lambda p: p.name)
def test_every_shipped_profile_validates(path):
    load_config(path)


@pytest.mark.parametrize("url, said", [
    ("http://127.0.0.1:99999/", "the port must be a number from 1 to 65535"),
    ("http://127.0.0.1:0/", "the port must be a number from 1 to 65535"),
    ("http://[:::::]:5000", "not a URL"),
    ("http://-reward:5000", "not a hostname"),
    ("http://reward..lan:5000", "not a hostname"),
    ("http://999.1.1.1:5000", "not a hostname"),
    ("http://user:secret@127.0.0.1:5000", "user info"),
    ("ftp://127.0.0.1:5000", "the scheme must be http or https"),
    ("127.0.0.1:5000", "the scheme must be http or https"),
    ("http://:5000/", "no host"),
    ("http://127.0.0.1:5000/score?x=1", "a query or a fragment"),
    ("http://127.0.0.1:5000/a b", "a space or a control character"),
    ("http://127.0.0.1:5000/\n", "a space or a control character"),
    ("http://127.0.0.1:5000/%2e", "path"),
])
def test_a_reward_url_is_parsed_and_a_bad_one_is_refused_saying_what_is_wrong(url, said):
    with pytest.raises(HarnessError, match=r"at dschat\.reward_url: .*" + re.escape(said)):
        validate_config({"dschat": {"reward_url": url}}, source="my.yaml")


@pytest.mark.parametrize("url", ["http://127.0.0.1:18643", "https://reward.example.org/get_reward",
                                 "http://[::1]:8000/score", "http://localhost:1/", "http://LOCALHOST:65535", None])
def test_a_good_reward_url_passes(url):
    assert validate_config({"dschat": {"reward_url": url}})["dschat"]["reward_url"] == url


@pytest.mark.parametrize("key, value, said", [
    (("openrlhf", "reward_host"), "reward..lan", "not a hostname"),
    (("openrlhf", "reward_host"), "300.0.0.1", "not a hostname"),
    (("dschat", "repository"), "https://github.com:99999/liziniu/ReMax.git", "the port must be a number"),
    (("dschat", "repository"), "https://user:token@github.com/liziniu/ReMax.git", "user info"),
    (("dschat", "repository"), "https://-github.com/liziniu/ReMax.git", "not a hostname"),
    (("dschat", "repository"), "gopher://github.com/liziniu/ReMax.git", "the scheme must be one of"),
])
def test_every_other_address_in_the_config_is_parsed_too(key, value, said):
    with pytest.raises(HarnessError, match=rf"at {re.escape('.'.join(key))}: .*{re.escape(said)}"):
        validate_config({key[0]: {key[1]: value}}, source="my.yaml")


@pytest.mark.parametrize("key, value", [
    (("openrlhf", "reward_host"), "localhost"), (("openrlhf", "reward_host"), "10.0.0.7"),
    (("dschat", "repository"), "https://github.com/liziniu/ReMax.git"),
    (("dschat", "repository"), "ssh://git@github.com:22/liziniu/ReMax.git"),
    (("dschat", "repository"), "git@github.com:liziniu/ReMax.git"), (("dschat", "repository"), "/srv/git/ReMax.git"),
    (("dschat", "repository"), "file:///srv/git/ReMax.git"),
])
def test_good_addresses_pass(key, value):
    assert validate_config({key[0]: {key[1]: value}})[key[0]][key[1]] == value


def _strings(node: dict, path: tuple[str, ...] = (), defs: dict | None = None):
    defs = node.get("$defs", {}) if defs is None else defs
    if "$ref" in node:
        node = {**defs[node["$ref"].rsplit("/", 1)[1]], **{k: v for k, v in node.items() if k != "$ref"}}
    types = node.get("type") if isinstance(node.get("type"), list) else [node.get("type")]
    if "string" in types:
        yield path, False
    if "array" in types and node.get("items", {}).get("type") == "string":
        yield path, True
    for key, sub in node.get("properties", {}).items():
        yield from _strings(sub, (*path, key), defs)


def test_an_empty_string_is_refused_naming_the_key_wherever_a_value_is_needed():
    """'' as a dataset, a checkpoint or a checkout path is the working directory; as a key, no key at all."""
    from harness.config import schema

    meaning_empty = {"launch.gpu_model"}  # empty = any GPU model, as documented
    accepted = []
    for path, in_list in _strings(schema()):
        where = ".".join(path)
        try:
            validate_config(_with_value(path, "", in_list), source="my.yaml")
        except HarnessError as e:
            assert f"at {where}" in str(e), str(e)
            continue
        accepted.append(where)
    assert sorted(accepted) == sorted(meaning_empty)


@pytest.mark.parametrize("arms", [{"a": "-x", "b": "HEAD"}, {"a": "HEAD", "b": "--upload-pack=touch"},
                                  {"a": "HEAD", "b": ""}, {"a": "HEAD", "b": "HEAD", "framework": "-x"}])
def test_an_arm_of_the_workflows_ab_that_looks_like_an_option_or_is_empty_is_refused(arms):
    from harness.config import arms_from_config

    with pytest.raises(HarnessError, match="ab must name both arms"):
        arms_from_config(arms, "snakemake config")


def test_a_format_the_harness_does_not_check_is_refused_rather_than_ignored(monkeypatch):
    """JSON Schema's formats are annotations by default: `format: uri` would read as a check and check nothing."""
    import harness.config

    monkeypatch.setattr(harness.config, "schema", lambda: {"type": "object", "properties": {
        "frameworks": {"type": "array", "default": ["reference"]}, "url": {"type": "string", "format": "uri"}}})
    with pytest.raises(HarnessError, match=r"format 'uri' is not one harness\.config checks"):
        validate_config({"url": "x"})
