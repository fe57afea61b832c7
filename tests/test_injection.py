"""Nothing in a config is ever executed (harness.runtime.launch_script): every string key of the schema, set to a
shell payload, is either refused by validation (naming the key) or reaches the launch scripts and rules quoted.

The plans are real (`plan` of verl, OpenRLHF and DeepSpeed-Chat, with the venv and with the Apptainer runtime) and
their launch.sh runs for real in bash, with the reward server it starts. Only what cannot exist here is replaced, at
the last step: the framework's own program (an environment or apptainer that records the words it was given, so the
test also sees that each payload arrives verbatim) and `git` answering for the pinned ReMax checkout.
"""

from __future__ import annotations

import ast
import copy
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml
from conftest import REPO, run_cli, snakemake

from harness import HarnessError
from harness.config import schema as config_schema
from harness.config import validate_config
from harness.frameworks import get_adapter
from harness.frameworks.dschat.plan import REMAX_COMMIT
from harness.inputs import build_dataset, build_policy, build_reward
from harness.runs.unbundle import RECORD, TOP
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


# --- values read from files and arguments never reach git or a shell as options or code (issue #61) ---


def _package_shell_calls() -> list[str]:
    """Every call in harness/ that hands a shell a command line: shell=True, os.system/os.popen, or an argv list of
    `sh`/`bash` `-c` followed by a string; each with whether its every part is a constant."""
    found = []
    shells = {"sh", "bash", "/bin/sh", "/bin/bash"}
    for path in sorted((REPO / "harness").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            where = f"{path.relative_to(REPO)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Call):
                shell = any(k.arg == "shell" and not (isinstance(k.value, ast.Constant) and not k.value.value)
                            for k in node.keywords)
                system = ast.unparse(node.func) in ("os.system", "os.popen", "subprocess.getoutput",
                                                    "subprocess.getstatusoutput")
                if (shell or system) and not all(isinstance(a, ast.Constant) for a in node.args):
                    found.append(f"{where}: {ast.unparse(node)[:120]}")
            if isinstance(node, (ast.List, ast.Tuple)):
                items = node.elts
                for i, item in enumerate(items[:-2]):
                    if (isinstance(item, ast.Constant) and item.value in shells
                            and isinstance(items[i + 1], ast.Constant) and items[i + 1].value == "-c"
                            and not isinstance(items[i + 2], ast.Constant)):
                        found.append(f"{where}: {ast.unparse(node)[:120]}")
    return found


def test_no_shell_command_line_of_the_package_is_built_from_a_value():
    """A shell reads whatever a value holds as code (`bisect` once put `git rev-parse`'s echo of a folder name in
    `sh -c`): the package starts programs from argv lists; a shell line, if ever needed, is all constants."""
    assert _package_shell_calls() == []


def test_the_scan_sees_a_shell_line_built_from_a_value(tmp_path, monkeypatch):
    """The scan above can fail: the shapes it looks for, in a module of its own, are all found."""
    fake = tmp_path / "harness" / "m.py"
    fake.parent.mkdir()
    fake.write_text("import os, subprocess\nx = 'a'\nsubprocess.run(f'echo {x}', shell=True)\nos.system('ls ' + x)\n"
                    "subprocess.run(['sh', '-c', f'echo {x}'])\nsubprocess.run(['sh', '-c', 'true'])\n"
                    "subprocess.run('true', shell=True)\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    assert [line.split(":")[1] for line in _package_shell_calls()] == ["3", "4", "5"]


def _hostile_commit_results(tiny: dict, root: Path, commit: str) -> Path:
    """A copy of the tiny comparison whose run manifest records `commit` as the harness commit that made it."""
    results = root / "results"
    shutil.copytree(tiny["root"] / "results", results)
    manifest = results / "runs" / "reference" / "seed1" / "manifest.json"
    record = json.loads(manifest.read_text())
    record["git"]["commit"] = commit
    manifest.write_text(json.dumps(record))
    return results


def _rebundled(bundle_path: Path, out: Path, change: dict[str, bytes]) -> Path:
    """The bundle at `bundle_path` with the entries in `change` (paths under its top folder) replaced, and its
    bundle.json's sha256 listing made to match: what a hostile publisher can always do."""
    with tarfile.open(bundle_path, "r:gz") as tar:
        entries = {m.name.removeprefix(f"{TOP}/"): tar.extractfile(m).read() for m in tar if m.isfile()}
    entries.update(change)
    record = json.loads(entries.pop(RECORD))
    record["files"] = {name: hashlib.sha256(data).hexdigest() for name, data in entries.items()}
    entries[RECORD] = json.dumps(record).encode()
    with tarfile.open(out, "w:gz") as tar:
        for name, data in entries.items():
            info = tarfile.TarInfo(f"{TOP}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out


@pytest.mark.parametrize("source", ["results", "bundle"])
def test_a_recorded_commit_that_is_a_git_option_is_refused_before_git_sees_it(tiny, tmp_path, source):
    """A manifest whose git.commit is `--output=FILE` once made reproduce's `git diff` create FILE, from a results
    folder and from a bundle alike; now the manifest is refused, naming the field, before anything runs."""
    victim = tmp_path / "victim.txt"
    results = _hostile_commit_results(tiny, tmp_path, f"--output={victim}")
    if source == "bundle":
        clean = tmp_path / "clean.tar.gz"
        assert run_cli("bundle", tiny["root"] / "results", "--out", clean).returncode == 0
        manifest = (results / "runs" / "reference" / "seed1" / "manifest.json").read_bytes()
        target = _rebundled(clean, tmp_path / "hostile.tar.gz", {"runs/reference/seed1/manifest.json": manifest})
    else:
        target = results
    proc = run_cli("reproduce", target, "--out", tmp_path / "out")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "git.commit: expected a full hex commit id" in proc.stderr
    assert not victim.exists() and not (tmp_path / "out").exists()


def test_reproduce_with_nothing_to_run_again_is_refused_naming_the_choice(tiny, tmp_path):
    """Each choice is a framework and a seed the comparison has, but no run has both (a failed seed left out): once
    "identical" with no run at all, exit 0; now exit 2."""
    results = tmp_path / "results"
    shutil.copytree(tiny["root"] / "results", results)
    summary = (results / "summary.csv").read_text().splitlines()
    header, row = summary[0].split(","), summary[1].split(",")
    other = dict(zip(header, row), framework="verl", seed="2", run_id="verl-tiny-s2")  # another framework, seed 2
    (results / "summary.csv").write_text("\n".join([*summary, ",".join(other[h] for h in header)]) + "\n")
    proc = run_cli("reproduce", results, "--out", tmp_path / "out", "--frameworks", "reference", "--seeds", "2")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no run of framework reference with seed 2: nothing to run again" in proc.stderr
    assert "reference seed 1, verl seed 2" in proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.fixture
def hostile_checkout(tmp_path):
    """A git checkout holding DeepSpeed-Chat's main.py, whose own .git/config runs a program (core.fsmonitor) that
    leaves a marker, with one tracked file changed (so `git status` has work to do)."""
    checkout, marker = tmp_path / "ReMax", tmp_path / "fsmonitor-ran"
    (checkout / "step3_rlhf_finetuning").mkdir(parents=True)
    (checkout / "step3_rlhf_finetuning" / "main.py").write_text("print('main')\n")
    who = ["-c", "user.name=t", "-c", "user.email=t@t.invalid"]
    subprocess.run(["git", "init", "-q", str(checkout)], check=True)
    subprocess.run(["git", "-C", str(checkout), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(checkout), *who, "commit", "-qm", "x"], check=True)
    subprocess.run(["git", "-C", str(checkout), "config", "core.fsmonitor", f"touch {marker}; echo"], check=True)
    head = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    return checkout, marker, head


def test_a_checkouts_own_git_config_does_not_run_when_it_is_checked(hostile_checkout, monkeypatch):
    """launch.sh's check of the ReMax checkout (in bash, as launched) and require_checkout (parity, conformance)
    run `git status` there: the checkout's core.fsmonitor stays off. The check runs to its end: the checkout is
    taken as the pinned commit, and it is clean."""
    from harness.frameworks.dschat import plan as dschat_plan

    checkout, marker, head = hostile_checkout
    monkeypatch.setattr(dschat_plan, "REMAX_COMMIT", head)
    assert dschat_plan.require_checkout(checkout) == checkout
    proc = subprocess.run(["bash", "-c", dschat_plan._checkout_check(checkout) + "\necho checked"],
                          capture_output=True, text=True)
    assert proc.stdout.strip() == "checked", proc.stderr
    assert not marker.exists()
    # the same status, without the harness's settings, does run it: the checkout is hostile indeed
    subprocess.run(["git", "-C", str(checkout), "status", "--porcelain"], capture_output=True)
    assert marker.exists()


def test_bisect_never_hands_a_folder_name_to_a_shell(tmp_path):
    """GOOD given as a clean checkout's path: `git rev-parse` once echoed the path, which went unquoted into `sh -c`
    (a folder named `p;cd;touch X;#` ran `touch` in $HOME). Now GOOD is its resolved commit and no shell runs: the
    A/B of round 0 is refused for the config it is given (an unknown key), before any training."""
    home = tmp_path / "home"
    home.mkdir()
    checkout = tmp_path / "p;cd;touch X;#"
    subprocess.run(["git", "clone", "-q", "--no-local", str(REPO), str(checkout)], check=True)
    config = tmp_path / "config.yaml"
    config.write_text("not_a_key: 1\n")
    proc = subprocess.run([str(Path(sys.executable).parent / "remax-bench"), "bisect", str(checkout), "HEAD",
                           "--config", str(config), "--out", str(tmp_path / "bisect")],
                          cwd=checkout, env={**os.environ, "HOME": str(home)}, capture_output=True, text=True,
                          timeout=300)
    assert not (home / "X").exists(), proc.stdout + proc.stderr
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "is not shown slower than GOOD" in proc.stderr and "not_a_key" in proc.stderr
