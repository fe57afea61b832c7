"""Apptainer images as the framework environments (container.runtime: apptainer), checked without apptainer or a GPU:
the workflow makes images instead of venvs, every adapter's launch command is the one `apptainer exec` line built by
harness.runtime.container.env_command, and the image build itself runs apptainer with the generated definition.
Apptainer is not installable here (no Debian package), so it is replaced by a stand-in script at the one seam where it
is run."""

import json
import os
import re
import shlex
import shutil
import subprocess

import pytest
import yaml
from conftest import REPO, snakemake

from harness import HarnessError
from harness.config import validate_config
from harness.frameworks import get_adapter
from harness.io import sha256_file
from harness.runtime import container, envs

FRAMEWORKS = {"verl": "python", "openrlhf": "python3", "dschat": "deepspeed"}  # adapter -> program it runs


def job_counts(output: str) -> dict[str, int]:
    table = output.split("Job stats:")[1].split("\n\n")[0]
    return {name: int(n) for name, n in (line.split() for line in table.splitlines()[3:] if line.strip())}


def apptainer_config(tmp_path):
    path = tmp_path / "apptainer.yaml"
    path.write_text(yaml.safe_dump({"container": {"runtime": "apptainer"}}))
    return path


@pytest.mark.e2e
@pytest.mark.parametrize("profile", [None, "slurm"])
def test_a100x8_dry_run_under_apptainer_makes_images_instead_of_venvs(tmp_path, profile):
    adapters = [get_adapter(fw) for fw in yaml.safe_load((REPO / "workflows" / "config" / "a100x8.yaml").read_text())
                ["frameworks"]]
    args = ["-n", "--configfile", REPO / "workflows" / "config" / "a100x8.yaml", apptainer_config(tmp_path)]
    args += ["--profile", REPO / "workflows" / "profiles" / "slurm"] if profile else ["--cores", "8"]
    proc = snakemake(tmp_path, *args)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    jobs = job_counts(out)
    # the runs' environments are images; the only venvs are the CPU check environments of the conformance rule
    checked = {a.check_env for a in adapters}
    assert jobs["framework_image"] == len(adapters) and jobs["framework_env"] == len(checked)
    assert jobs["conformance"] == 1 and {"verl-validate", "openrlhf-validate", "dschat-cpu"} <= checked
    venvs = set(re.findall(r"output: results/envs/([\w-]+)\.txt", out))
    assert venvs == checked, venvs
    assert jobs["plan"] == jobs["run_planned"] == 3 * len(adapters)
    built = set()
    for block in out.split("rule framework_image:")[1:]:
        block = block.split("\nrule ")[0]
        built.add(re.search(r"output: results/images/(\w+)\.sif, results/images/\1\.json", block).group(1))
        resources = re.search(r"resources: (.*)", block).group(1)
        assert "mem_mb=32000" in resources and "disk_mb=100000" in resources and "runtime=240" in resources
        assert "gpu=" not in resources and "timed_run" not in resources  # no GPU, and no timing slot held
        # 8 CPUs for pip builds from source: the rule's threads, which the SLURM profile asks for per task
        assert "cpus_per_task=8" in resources if profile else "threads: 8" in block
    assert built == {a.env for a in adapters}
    for block in out.split("rule run_planned:")[1:]:
        fw = re.search(r"wildcards: framework=(\w+)", block).group(1)
        assert f"results/images/{get_adapter(fw).env}.json" in re.search(r"input: (.*)", block).group(1)
    assert not (tmp_path / "results").exists()


@pytest.fixture
def planned_apptainer(a100x8, tmp_path, monkeypatch):
    """The three adapters planned under container.runtime apptainer, from a working directory of the test's own."""
    monkeypatch.chdir(tmp_path)
    config = json.loads(json.dumps(a100x8["config"]))
    config["container"]["runtime"] = "apptainer"
    config["remax"]["train_batch_size"] = 32  # DeepSpeed-Chat needs 20 batches per epoch of the fixture's prompts
    config["verl"]["micro_batch_size_per_gpu"] = 4  # verl's micro-batch must divide the 32 / 8 rows of each GPU
    config["dschat"]["checkout"] = str(tmp_path / "results" / "src" / "ReMax")
    inputs = tmp_path / "inputs"
    shutil.copytree(a100x8["inputs"], inputs, symlinks=True)
    plans = {}
    for fw in FRAMEWORKS:
        get_adapter(fw).plan(config, 1, tmp_path / "plans" / fw, inputs)
        plans[fw] = tmp_path / "plans" / fw
    return config, plans


def expected_prefix(tmp_path, config, env):
    binds = [str(REPO), str((tmp_path / "results").resolve()), str(os.path.realpath(config["policy"]["path"]))]
    return ["apptainer", "exec", "--nv", "--bind", ",".join(binds), str(tmp_path / "results" / "images" / f"{env}.sif")]


def test_every_adapter_launches_inside_apptainer_exec(planned_apptainer, tmp_path):
    config, plans = planned_apptainer
    for fw, program in FRAMEWORKS.items():
        plan = json.loads((plans[fw] / "plan.json").read_text())
        prefix = expected_prefix(tmp_path, config, plan["env"])
        assert plan["argv"][:7] == [*prefix, program], fw
        assert plan["argv"] == [*container.env_command(plan["env"], config, program), *plan["argv"][7:]]
        script = (plans[fw] / "launch.sh").read_text()
        assert subprocess.run(["bash", "-n", plans[fw] / "launch.sh"]).returncode == 0
        assert ".venvs" not in " ".join(plan["argv"]) and "build it with 'remax-bench env" not in script, fw
    # OpenRLHF's patch runs in the image too (there it finds the image build's patch already applied).
    patch = shlex.join([*expected_prefix(tmp_path, config, "openrlhf"), "python3"]) + ' "$PLAN_DIR/remax_patch.py"'
    assert patch in (plans["openrlhf"] / "launch.sh").read_text()


def stand_in_apptainer(bin_dir, record):
    """An `apptainer` that records its argv and the environment it was given, as the real one would receive them."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "apptainer"
    script.write_text("#!/usr/bin/env bash\n"
                      f"printf '%s\\0' \"$@\" > {shlex.quote(str(record))}\n"
                      f"env > {shlex.quote(str(record))}.env\n")
    script.chmod(0o755)
    return script


def test_verl_launch_sh_runs_exactly_the_apptainer_exec_line(planned_apptainer, tmp_path):
    _config, plans = planned_apptainer
    record = tmp_path / "argv"
    bin_dir = tmp_path / "bin"
    stand_in_apptainer(bin_dir, record)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    run_dir = tmp_path / "run"
    launch = plans["verl"] / "launch.sh"

    proc = subprocess.run(["bash", launch, run_dir], capture_output=True, text=True, env=env)
    assert proc.returncode == 2 and "no image at" in proc.stderr and "results/images/verl.json" in proc.stderr

    image = tmp_path / "results" / "images" / "verl.sif"
    image.parent.mkdir(parents=True)
    image.write_bytes(b"stand-in image")
    proc = subprocess.run(["bash", launch, run_dir], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    argv = record.read_bytes().decode().split("\0")[:-1]
    # the plan holds the $RUN_DIR placeholder; launch.sh expands it to the run directory it was given
    planned_argv = json.loads((plans["verl"] / "plan.json").read_text())["argv"]
    assert ["apptainer", *argv] == [a.replace("$RUN_DIR", str(run_dir.resolve())) for a in planned_argv]
    assert any(str(run_dir.resolve()) in a for a in argv)
    # launch.sh's exports reach apptainer, which passes the host environment into the container
    assert f"VERL_FILE_LOGGER_PATH={run_dir.resolve()}/verl_metrics.jsonl" in (tmp_path / "argv.env").read_text()

    env["PATH"] = "/usr/bin:/bin"  # no apptainer on this node
    proc = subprocess.run(["bash", launch, run_dir], capture_output=True, text=True, env=env)
    assert proc.returncode == 2 and "apptainer not found" in proc.stderr


def test_venv_runtime_keeps_the_venv_programs(a100x8):
    config = a100x8["config"]
    assert config["container"]["runtime"] == "venv"
    assert container.env_command("dschat", config, "deepspeed") == [str(envs.ENV_ROOT / "dschat" / "bin" / "deepspeed")]


def test_binds_refuse_paths_apptainer_cannot_take(tmp_path):
    config = validate_config({"container": {"runtime": "apptainer", "binds": [str(tmp_path / "a,b")]}})
    with pytest.raises(HarnessError, match="cannot take a path with ','"):
        container.exec_prefix("verl", config)


def test_definition_installs_the_pinned_description_over_the_published_image():
    config = validate_config({})
    text = container.definition("openrlhf", config["container"]["images"]["openrlhf"])
    lines = [line.strip() for line in text.splitlines()]
    assert lines[:2] == ["Bootstrap: docker", "From: nvcr.io/nvidia/pytorch:26.03-py3"]
    spec = envs.spec_path("openrlhf")
    assert f"{spec} /opt/remax-bench/openrlhf.txt" in lines
    post = lines[lines.index("%post") + 1:lines.index("%labels")]
    # the description's own install variables and pins, in the venv's order; the uninstall before, the patch after
    assert "export DS_BUILD_OPS=0" in post
    pip = [line for line in post if line.startswith("python3 -m pip")]
    assert pip[0].startswith("python3 -m pip uninstall -y xgboost transformer_engine")
    assert pip[1].endswith("-r /opt/remax-bench/openrlhf.txt")
    assert [line for line in post if line][-1] == "python3 /opt/remax-bench/remax_patch.py"
    assert f"remax-bench.description-sha256 {sha256_file(spec)}" in lines


def test_definition_writes_plain_paths_as_before_and_quotes_a_path_with_a_space(tmp_path):
    spaced = tmp_path / "setup scripts" / "fix up.py"
    spaced.parent.mkdir()
    spaced.write_text("")
    settings = validate_config({})["container"]["images"]["openrlhf"]
    settings["setup"] = [*settings["setup"], str(spaced)]
    lines = container.definition("openrlhf", settings).splitlines()
    files = lines[lines.index("%files") + 1:lines.index("%post") - 1]
    assert files == [f"    {envs.spec_path('openrlhf')} /opt/remax-bench/openrlhf.txt",
                     f"    {REPO}/harness/frameworks/openrlhf/inside/remax/remax_patch.py "
                     "/opt/remax-bench/remax_patch.py",
                     f'    "{spaced}" "/opt/remax-bench/fix up.py"']
    assert "    python3 '/opt/remax-bench/fix up.py'" in lines


@pytest.mark.parametrize("name", ["x.py\n%post\n    touch pwned\n%files\n", "x.py\rok", "$(touch pwned).py",
                                  "`touch pwned`.py", 'a".py', "{{ pwned }}.py", "*.py", "100%s.py"])
def test_image_refuses_a_setup_file_apptainer_would_misread(tmp_path, monkeypatch, capsys, name):
    """`remax-bench image` with a setup file whose name would add a section to the definition, run in the shell that
    expands %files sources, or be replaced by a build argument: exit 2, one line naming the file and the key, and
    apptainer is never run, so no definition is written."""
    from harness.cli import main

    monkeypatch.chdir(tmp_path)
    script = tmp_path / name
    script.write_text("")
    calls = tmp_path / "calls"
    fake = tmp_path / "apptainer"
    fake.write_text("#!/usr/bin/env bash\n"
                    f"echo \"$*\" >> {shlex.quote(str(calls))}\n"
                    f"[ \"$1\" = build ] && cp \"$3\" {shlex.quote(str(tmp_path / 'used.def'))} && "
                    "printf sif > \"$2\"\nexit 0\n")
    fake.chmod(0o755)
    cfg = {"container": {"apptainer": str(fake), "images": {"verl": {
        "from": "docker://verlai/verl:vllm024.dev2", "setup": [str(script)]}}}}
    assert main(["image", "verl", "--json", json.dumps(cfg)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "container.images.verl.setup" in err and repr(str(script)) in err, err
    assert not calls.exists()
    assert not list(tmp_path.rglob("*.def")) and not (tmp_path / "results" / "images" / "verl.sif").exists()


@pytest.mark.parametrize("install", [True, False])
def test_image_build_runs_apptainer_once_and_records_the_sif(tmp_path, monkeypatch, install):
    """`remax-bench image` with a stand-in apptainer that writes the .sif as apptainer would: the build or pull
    command, and a record with the reference and the .sif's sha256, which the manifest copies."""
    monkeypatch.chdir(tmp_path)
    log = tmp_path / "calls"
    fake = tmp_path / "bin" / "apptainer"
    fake.parent.mkdir()
    fake.write_text("#!/usr/bin/env bash\n"
                    f"echo \"$*\" >> {log}\n"
                    "case \"$1\" in\n"
                    "  --version) echo 'apptainer version 1.4.1' ;;\n"
                    "  build) cp \"$3\" \"$2.def-used\"; printf 'sif of %s' \"$3\" > \"$2\" ;;\n"
                    "  pull) printf 'sif of %s' \"$3\" > \"$2\" ;;\n"
                    "esac\n")
    fake.chmod(0o755)
    config = validate_config({"container": {"apptainer": str(fake), "images": {"verl": {
        "from": "docker://verlai/verl:vllm024.dev2", "install": install}}}})
    record = container.build_image("verl", config)
    sif = tmp_path / "results" / "images" / "verl.sif"
    calls = log.read_text().splitlines()
    assert calls[0] == "--version" and len(calls) == 2
    assert calls[1].split()[0] == ("build" if install else "pull")
    assert record == json.loads((tmp_path / "results" / "images" / "verl.json").read_text())
    assert record["sif_sha256"] == sha256_file(sif) and record["from"] == "docker://verlai/verl:vllm024.dev2"
    assert record["apptainer"] == "apptainer version 1.4.1"
    assert container.image_record("verl") == record
    assert (record["definition"] is not None) == install
    assert not list(sif.parent.glob(".verl.sif.*"))  # no temporary left behind


def test_failed_image_build_leaves_no_image(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fake = tmp_path / "apptainer"
    fake.write_text("#!/usr/bin/env bash\n[ \"$1\" = --version ] && exit 0\n"
                    "echo 'FATAL: no such image' >&2\nexit 255\n")
    fake.chmod(0o755)
    config = validate_config({"container": {"apptainer": str(fake)}})
    with pytest.raises(HarnessError, match="build of environment 'dschat' failed"):
        container.build_image("dschat", config)
    assert not (tmp_path / "results" / "images" / "dschat.sif").exists()
    assert not (tmp_path / "results" / "images" / "dschat.json").exists()


@pytest.mark.skipif(shutil.which("apptainer") is None,
                    reason="apptainer is not installed (Debian has no apptainer or singularity-container package)")
def test_real_apptainer_exec_of_a_local_image(tmp_path):
    """A real `apptainer exec` with the prefix's options, of a local sandbox image whose programs are the host's own
    (bound in; no registry): a bound path is writable and the host environment reaches the program."""
    rootfs = tmp_path / "rootfs"
    binds = [str(tmp_path / "work")]
    (tmp_path / "work").mkdir()
    for d in ("bin", "sbin", "lib", "lib64", "usr"):
        host = f"/{d}"
        if os.path.islink(host):  # merged /usr: the same link in the image
            rootfs.mkdir(exist_ok=True)
            (rootfs / d).symlink_to(os.readlink(host))
        elif os.path.isdir(host):
            (rootfs / d).mkdir(parents=True)
            binds.append(host)
    out = tmp_path / "work" / "probe"
    proc = subprocess.run(["apptainer", "exec", "--bind", ",".join(binds), rootfs, "sh", "-c",
                           'echo "$REMAX_PROBE" > "$0"', out], capture_output=True, text=True,
                          env={**os.environ, "REMAX_PROBE": "passed through"})
    assert proc.returncode == 0, proc.stderr
    assert out.read_text() == "passed through\n"


def test_manifest_records_the_image_and_the_versions_inside_it(tmp_path, monkeypatch):
    """harness.frameworks.launch under apptainer: the manifest names the runtime, the image's reference and .sif
    sha256, and `pip freeze` as run inside the image (through the stand-in apptainer, which answers like the image's
    pip)."""
    from harness.frameworks.launch import launch

    monkeypatch.chdir(tmp_path)
    fake = tmp_path / "bin" / "apptainer"
    fake.parent.mkdir()
    fake.write_text("#!/usr/bin/env bash\n"
                    "case \"$1\" in\n"
                    "  --version) echo 'apptainer version 1.4.1' ;;\n"
                    "  pull) printf 'image' > \"$2\" ;;\n"
                    "  exec) [ \"${*: -4}\" = 'python3 -m pip freeze' ] && echo 'verl==0.9.1' ;;\n"
                    "esac\n")
    fake.chmod(0o755)
    config = validate_config({"container": {"runtime": "apptainer", "apptainer": str(fake),
                                            "images": {"verl": {"from": "docker://verlai/verl:x", "install": False}}}})
    record = container.build_image("verl", config)
    plan_dir = tmp_path / "plan"
    plan_dir.mkdir()
    (plan_dir / "plan.json").write_text(json.dumps({"framework": "verl", "framework_version": "0.9.1", "seed": 1,
                                                    "run_id": "verl-s1", "n_gpus": 8, "env": "verl", "inputs": {}}))
    (plan_dir / "launch.sh").write_text("exit 0\n")
    launch(plan_dir, tmp_path / "run", timeout_min=1, config=config)
    environment = json.loads((tmp_path / "run" / "manifest.json").read_text())["environment"]
    assert environment["name"] == "verl" and environment["runtime"] == "apptainer"
    assert environment["packages"] == ["verl==0.9.1"]
    assert environment["image"]["from"] == "docker://verlai/verl:x"
    assert environment["image"]["sif_sha256"] == record["sif_sha256"] == sha256_file(container.image_path("verl"))
