"""Nothing in a config is ever executed (harness.runtime.launch_script): every string key of the schema, set to a
shell payload, is either refused by validation (naming the key) or reaches the launch scripts and rules quoted.

The plans are real (`plan` of verl, OpenRLHF and DeepSpeed-Chat, with the venv and with the Apptainer runtime) and
their launch.sh runs for real in bash, with the reward server it starts. Only what cannot exist here is replaced, at
the last step: the framework's own program (an environment or apptainer that records the words it was given, so the
test also sees that each payload arrives verbatim) and `git` answering for the pinned ReMax checkout.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO, snakemake

from harness import HarnessError
from harness.config import schema as config_schema
from harness.config import validate_config
from harness.frameworks import get_adapter
from harness.frameworks.dschat.plan import REMAX_COMMIT
from harness.inputs import build_dataset, build_policy, build_reward
from harness.runtime import envs

PLANNED = ("verl", "openrlhf", "dschat")
# Each executes `touch MARKER` if the value is spliced into bash unquoted, in double quotes, or in single quotes.
PAYLOADS = ("$(touch {m})", "`touch {m}`", "x; touch {m}", "x\ntouch {m}", "x' ; touch {m}; echo '",
            'x" ; touch {m}; echo "', "x && touch {m} #", "${{IFS}}$(touch${{IFS}}{m})")


def string_keys(schema: dict) -> list[tuple[tuple[str, ...], bool]]:
    """(path, is a list of strings) of every string-valued key of the config schema, through its $defs."""
    defs = schema.get("$defs", {})
    out = []

    def walk(node: dict, path: tuple[str, ...]) -> None:
        if "$ref" in node:
            node = {**defs[node["$ref"].rsplit("/", 1)[1]], **{k: v for k, v in node.items() if k != "$ref"}}
        types = node.get("type")
        types = types if isinstance(types, list) else [types]
        if "string" in types:
            out.append((path, False))
        if "array" in types and node.get("items", {}).get("type") == "string":
            out.append((path, True))
        for key, sub in node.get("properties", {}).items():
            walk(sub, (*path, key))

    walk(schema, ())
    return out


def with_value(raw: dict, path: tuple[str, ...], value: object) -> dict:
    out = copy.deepcopy(raw)
    node = out
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    return out


STUB = """#!{python}
import json, os, sys
with open(os.environ["STUB_LOG"], "a") as f:
    f.write(json.dumps({{"argv": sys.argv[1:], "env": dict(os.environ)}}) + "\\n")
"""
GIT = f"""#!/bin/sh
case "$*" in *rev-parse*) echo {REMAX_COMMIT} ;; esac
exit 0
"""


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    """A small config every planned framework accepts (one GPU each, as a GPU node's plan), its built inputs, and
    stand-ins for what cannot exist here: the frameworks' environments, apptainer and the ReMax checkout's git."""
    root = tmp_path_factory.mktemp("injection")
    raw = yaml.safe_load((REPO / "workflows" / "config" / "cpu.yaml").read_text())
    raw.update(frameworks=["reference", *PLANNED], seeds=[1])
    raw["task"] = {"n_train": 64, "n_eval": 16}
    raw["policy"] = {"hidden_size": 64, "intermediate_size": 64, "num_layers": 1, "num_heads": 2,
                     "sft": {"steps": 1, "batch_size": 16}}
    raw["remax"] = {**raw.get("remax", {}), "steps": 2, "warmup_steps": 1, "train_batch_size": 4, "rollout_n": 1}
    raw["launch"] = {"device": "gpu", "gpus_per_node": 1}
    raw["verl"] = {"micro_batch_size_per_gpu": 4}
    raw["dschat"] = {"per_device_training_batch_size": 4}
    raw["openrlhf"] = {"reward_port": 18000 + os.getpid() % 1000}
    config = validate_config(raw)
    for build in (build_dataset, build_policy, build_reward):
        build(config, root / "inputs")
    bin_dir = root / "bin"
    bin_dir.mkdir()
    stub = STUB.format(python=sys.executable)
    for name, text in (("python", stub), ("python3", stub), ("apptainer", stub), ("deepspeed", stub), ("git", GIT)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    venvs = root / "venvs"
    for env in ("verl", "openrlhf", "dschat"):
        (venvs / env).mkdir(parents=True)
        (venvs / env / "bin").symlink_to(bin_dir)
    return {"root": root, "raw": raw, "inputs": root / "inputs", "bin": bin_dir, "venvs": venvs}


def launch(setting: dict, plan_dir: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{setting['bin']}{os.pathsep}{os.environ['PATH']}",
           "STUB_LOG": str(plan_dir / "stub.jsonl")}
    return subprocess.run(["bash", str(plan_dir / "launch.sh"), str(plan_dir / "run")], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=180)


def plan_all(setting: dict, raw: dict, out: Path, monkeypatch) -> dict[str, str]:
    """Plan every framework with `raw` under `out`; {framework: its launch.sh, with `out` written OUT} of those whose
    plan was not refused (a refusal at plan time runs nothing)."""
    config = validate_config(raw)
    monkeypatch.setattr(envs, "ENV_ROOT", setting["venvs"])
    monkeypatch.chdir(out)
    if config["container"]["runtime"] == "apptainer":
        (out / "results" / "images").mkdir(parents=True, exist_ok=True)
        for env in PLANNED:
            (out / "results" / "images" / f"{env}.sif").write_text("image")
    scripts = {}
    for fw in PLANNED:
        try:
            get_adapter(fw).plan(config, 1, out / fw, setting["inputs"])
        except HarnessError:
            continue
        scripts[fw] = (out / fw / "launch.sh").read_text().replace(str(out), "OUT")
    return scripts


def launch_and_check(setting: dict, plan_dir: Path, cwd: Path, marker_dir: Path) -> None:
    """Run launch.sh; no payload may have run, and each planned word carrying one arrives verbatim."""
    proc = launch(setting, plan_dir, cwd)
    assert not any(marker_dir.iterdir()), f"{plan_dir.name}: a payload ran:\n{(plan_dir / 'launch.sh').read_text()}"
    assert proc.returncode == 0, f"{plan_dir.name}: launch.sh failed: {proc.stderr[-2000:]}"
    calls = [json.loads(line) for line in (plan_dir / "stub.jsonl").read_text().splitlines()]
    plan = json.loads((plan_dir / "plan.json").read_text())
    words = {w for call in calls for w in call["argv"]}
    carried = [a for a in plan["argv"][1:] if str(marker_dir) in a and "$" + "RUN_DIR" not in a]
    assert all(a in words for a in carried), f"{plan_dir.name}: a value did not arrive verbatim: {carried}"
    for key, value in plan["env_vars"].items():
        if str(marker_dir) in value:
            assert calls[-1]["env"][key] == value


def test_every_string_key_is_refused_or_carried_verbatim_and_never_executed(setting, tmp_path, monkeypatch):
    schema = config_schema()
    keys = string_keys(schema)
    assert len(keys) > 20 and (("openrlhf", "reward_host"), False) in keys  # the walk sees the whole schema
    markers = tmp_path / "markers"
    markers.mkdir()
    runtimes = {"venv": setting["raw"],
                "apptainer": with_value(with_value(setting["raw"], ("container", "runtime"), "apptainer"),
                                        ("container", "apptainer"), str(setting["bin"] / "apptainer"))}
    baseline = {}
    for runtime, raw in runtimes.items():
        (tmp_path / runtime).mkdir()
        baseline[runtime] = plan_all(setting, raw, tmp_path / runtime, monkeypatch)
        assert sorted(baseline[runtime]) == sorted(PLANNED)
    refused, launched = set(), set()
    for i, (path, is_list) in enumerate(keys):
        dotted = ".".join(path)
        for runtime, base_raw in runtimes.items():
            for j, payload in enumerate(PAYLOADS):
                value = payload.format(m=markers / f"k{i}p{j}")
                raw = with_value(base_raw, path, [value] if is_list else value)
                try:
                    validate_config(raw)
                except HarnessError as e:
                    # The key is named (a key inside a list or $defs by its parent's path at least).
                    assert re.search(rf"at {re.escape('.'.join(path[:2]))}", str(e)), (dotted, str(e))
                    refused.add(dotted)
                    continue
                out = tmp_path / f"k{i}p{j}{runtime}"
                out.mkdir()
                scripts = plan_all(setting, raw, out, monkeypatch)
                reached = [fw for fw, text in scripts.items() if text != baseline[runtime][fw]]
                if not reached:
                    break  # the value reaches no launch.sh, whatever it holds
                for fw in reached:
                    launch_and_check(setting, out / fw, out, markers)
                    launched.add(dotted)
                assert not any(markers.iterdir()), f"{dotted} = {value!r} ran a command"
    # Both ways were taken, and the keys the probe found reached a script (quoted) or were refused.
    assert {"openrlhf.reward_host", "container.apptainer"} <= refused
    assert {"dschat.checkout", "container.binds", "policy.path"} <= launched
    print(f"refused: {sorted(refused)}\nlaunched: {sorted(launched)}")


def test_the_reward_host_payload_of_the_probe_is_refused_naming_the_key(setting):
    raw = with_value(setting["raw"], ("openrlhf", "reward_host"), "127.0.0.1$(touch marker)")
    with pytest.raises(HarnessError, match=r"at openrlhf\.reward_host: '127\.0\.0\.1\$\(touch marker\)' does not"):
        validate_config(raw)


def test_every_value_in_a_rules_shell_command_is_quoted():
    """Snakemake's `:q` quotes with shlex, as launch.sh's shell_word does; a placeholder without it could run a
    config value (the DeepSpeed-Chat checkout path was one)."""
    unquoted = []
    for path in sorted((REPO / "workflows" / "rules").glob("*.smk")) + [REPO / "Snakefile"]:
        text = path.read_text()
        for shell in re.finditer(r"shell\((.*?)\)\n|shell:\n((?:\s+[\"'].*\n)+)", text):
            body = shell.group(1) or shell.group(2)
            unquoted += [f"{path.name}: {{{m}}}" for m in re.findall(r"(?<!\{)\{([A-Za-z_][\w.]*)\}", body)]
    assert unquoted == []


def test_a_payload_in_the_checkout_path_does_not_run_in_the_checkout_rule(tmp_path):
    """The real rule, run by Snakemake, with a payload in dschat.checkout and a repository that has no such commit:
    git fails, the rule fails, and the payload never runs."""
    marker = tmp_path / "marker"
    bare = tmp_path / "mirror.git"
    subprocess.run(["git", "init", "-q", "--bare", str(bare)], check=True)
    checkout = f"results/src/ReMax$(touch {marker})"
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"frameworks": ["reference", "dschat"], "launch": {"device": "cpu"},
                                      "dschat": {"checkout": checkout, "repository": str(bare)}}))
    proc = snakemake(tmp_path, checkout, "--cores", "1", "--configfile", config)  # --configfile takes several
    assert not marker.exists(), proc.stdout + proc.stderr
    assert proc.returncode != 0
    log = tmp_path / "results" / "logs" / "setup" / "dschat_checkout.log"
    assert REMAX_COMMIT in log.read_text() or "fatal" in log.read_text()
