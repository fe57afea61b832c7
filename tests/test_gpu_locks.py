"""The GPU environments' full locks (harness/runtime/locks.py, #52): each made from its description as it is now, still
resolvable against PyPI for Linux x86_64 and Python 3.11 (metadata only: every pin consistent, nothing missing, every
locked file still on the index), each framework's CPU and GPU environments agreeing on the packages that decide its
numerics or its CPU plan saying where not; the install from a lock with hashes required, and its refusal of a file
whose hash differs; `remax-bench env lock` without uv; scripts/first_hour.sh's commands."""

import hashlib
import os
import subprocess
import time
import urllib.request
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from harness import HarnessError
from harness.config import validate_config
from harness.runtime import envs, locks

REPO = Path(__file__).resolve().parents[1]
FRAMEWORKS = REPO / "harness" / "frameworks"
GPU_ENVS = {"verl": "verl", "openrlhf": "openrlhf", "dschat": "dschat", "trl": "trl"}  # framework: GPU environment


def spec(env: str) -> Path:
    return FRAMEWORKS / env / "envs" / f"{env}.txt"


@pytest.mark.parametrize("env", GPU_ENVS.values())
def test_each_gpu_lock_is_made_from_its_description_as_it_is_now(env):
    lock = locks.lock_of(spec(env))
    assert lock is not None, f"no {env}.lock: run `remax-bench env lock {env}`"
    assert locks.description_sha(lock) == hashlib.sha256(spec(env).read_bytes()).hexdigest(), \
        f"{env}.txt changed after its lock was made: run `remax-bench env lock {env}`"
    locked = locks.parse_lock(lock.read_text())
    for name, (version, _) in locks.parse_lock(spec(env).read_text()).items():
        assert locked[name][0] == version, f"{env}.txt pins {name}=={version}, its lock {locked[name][0]}"
    assert all(hashes for _, hashes in locked.values())


def pypi_reachable() -> bool:
    try:
        urllib.request.urlopen("https://pypi.org/simple/uv/", timeout=10).close()
        return True
    except OSError:
        return False


def test_every_gpu_lock_still_resolves_against_pypi_for_linux_x86_64():
    """The lock itself resolved again (with dependencies): its exact pins must satisfy one another for the platform,
    need nothing more, and each sha256 it holds must still be a file the index serves (uv takes hashes from PyPI,
    not from its input). Metadata only: no wheel is downloaded where PyPI serves its metadata."""
    if locks.uv_binary() is None:
        pytest.skip(f"uv is not installed (pip install uv=={locks.UV_VERSION}; CI installs it with the test extras)")
    if not pypi_reachable():
        pytest.skip("PyPI (https://pypi.org) is unreachable from this machine: the locks cannot be resolved here")

    def again(env: str) -> dict:
        lock = locks.lock_path(spec(env))
        out = subprocess.run([locks.uv_binary(), "pip", "compile", *locks.RESOLVE_FLAGS, "--no-header", "--quiet",
                              lock.name], cwd=lock.parent, capture_output=True, text=True, timeout=170)
        assert out.returncode == 0, f"{lock} does not resolve today:\n{out.stderr[-3000:]}"
        return locks.parse_lock(out.stdout)

    start = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        resolved = dict(zip(GPU_ENVS.values(), pool.map(again, GPU_ENVS.values())))
    print(f"the {len(resolved)} GPU locks resolved in {time.monotonic() - start:.1f} s")
    for env, now in resolved.items():
        locked = locks.parse_lock(locks.lock_path(spec(env)).read_text())
        assert {k: v for k, (v, _) in now.items()} == {k: v for k, (v, _) in locked.items()}, env
        gone = {k: set(h) - set(now[k][1]) for k, (_, h) in locked.items() if set(h) - set(now[k][1])}
        assert not gone, f"{env}.lock: files no longer on PyPI: {gone}"


@pytest.mark.parametrize("framework", GPU_ENVS)
def test_cpu_and_gpu_environments_agree_on_the_numerics_or_the_cpu_plan_says_where_not(framework):
    folder = FRAMEWORKS / framework / "envs"
    differences = locks.package_differences(framework, folder)
    assert framework not in {p for p, _, _ in differences}, f"{framework}'s own version differs: {differences}"
    if differences:
        assert "package_deviations" in (FRAMEWORKS / framework / "plan.py").read_text(), \
            f"{framework}: CPU and GPU pin {differences} differently, and its CPU plan does not say so"
        row = locks.package_deviations(framework, folder)[0]
        assert all(f"{p} {g}" in row["shared"] and f"{p} {c}" in row["effective"] for p, g, c in differences)
    if framework == "trl":
        assert not differences


def test_the_lock_is_installed_with_hashes_required_and_a_source_package_after_it_without_isolation(tmp_path):
    steps = envs.pip_steps(spec("openrlhf"), ["pip", "install"], locked_in=tmp_path)
    assert steps[0] == ["pip", "install", "--require-hashes", "--no-deps", "-r", str(tmp_path / "openrlhf.locked.txt")]
    assert steps[1] == ["pip", "install", "--require-hashes", "--no-deps", "--no-build-isolation", "-r",
                        str(tmp_path / "openrlhf.built-here.txt")]
    assert not [s for s in steps[2:] if "flash-attn==2.8.3" in s]  # not installed a second time, unhashed
    built = locks.parse_lock((tmp_path / "openrlhf.built-here.txt").read_text())
    assert list(built) == ["flash-attn"] and built["flash-attn"][1]
    assert "flash-attn" not in locks.parse_lock((tmp_path / "openrlhf.locked.txt").read_text())
    assert "torch" in locks.parse_lock((tmp_path / "openrlhf.locked.txt").read_text())
    # the CPU environments, and an image's build (no locked_in), install the description as before
    assert envs.pip_steps(spec("trl"), ["pip"])[0] == ["pip", "-r", str(spec("trl"))]
    cpu = FRAMEWORKS / "trl" / "envs" / "trl-cpu.txt"
    assert envs.pip_steps(cpu, ["pip"], locked_in=tmp_path) == [["pip", "-r", str(cpu)]]


def tiny_wheel(folder: Path) -> Path:
    folder.mkdir()
    wheel = folder / "tinylocked-1.0-py3-none-any.whl"
    info = "tinylocked-1.0.dist-info"
    files = {"tinylocked.py": "VALUE = 1\n", f"{info}/METADATA": "Metadata-Version: 2.1\nName: tinylocked\n"
             "Version: 1.0\n", f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
             "Tag: py3-none-any\n"}
    with zipfile.ZipFile(wheel, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
        z.writestr(f"{info}/RECORD", "".join(f"{n},,\n" for n in files) + f"{info}/RECORD,,\n")
    return wheel


def test_a_locked_environment_installs_from_its_lock_and_a_wrong_hash_stops_it_naming_the_package(tmp_path):
    wheel = tiny_wheel(tmp_path / "wheels")
    folder = tmp_path / "frameworks" / "tiny" / "envs"
    folder.mkdir(parents=True)
    description = folder / "tiny.txt"
    description.write_text(f"#!env PIP_NO_INDEX=1\n#!env PIP_FIND_LINKS={wheel.parent}\ntinylocked==1.0\n")
    lock = locks.lock_path(description)
    good = hashlib.sha256(wheel.read_bytes()).hexdigest()
    lock.write_text(f"tinylocked==1.0 \\\n    --hash=sha256:{'0' * 64}\n")
    before = envs.env_digest(description)
    root = tmp_path / "venvs"
    with pytest.raises(HarnessError, match=r"tiny\.lock: tinylocked==1\.0 .*does not match the lock's sha256"):
        envs.ensure_env("tiny", root=root, spec=description, repo=tmp_path)
    assert not (root / "tiny" / envs.STAMP).exists()  # half built: never used

    lock.write_text(f"tinylocked==1.0 \\\n    --hash=sha256:{good}\n")
    assert envs.env_digest(description) != before  # a changed lock rebuilds
    python = envs.ensure_env("tiny", root=root, spec=description, repo=tmp_path)
    assert subprocess.run([python, "-c", "import tinylocked"]).returncode == 0
    assert (root / "tiny" / envs.STAMP).read_text().strip() == envs.env_digest(description)
    record = locks.lock_record(description, tmp_path)
    assert record == {"file": "frameworks/tiny/envs/tiny.lock", "sha256": hashlib.sha256(lock.read_bytes()).hexdigest()}


def test_env_lock_without_uv_stops_with_one_line(monkeypatch, capsys):
    from harness.cli import main

    monkeypatch.setattr(locks, "uv_binary", lambda: None)
    assert main(["env", "lock", "trl"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"uv=={locks.UV_VERSION}" in err
    assert main(["env", "lock"]) == 2


def test_changes_name_each_package_added_removed_or_moved():
    old = locks.parse_lock("a==1 \\\n    --hash=sha256:" + "1" * 64 + "\nb==2\nc==3 --hash=sha256:" + "2" * 64 + "\n")
    new = locks.parse_lock("a==1.1\nc==3 --hash=sha256:" + "3" * 64 + "\nd_e==4\n")
    assert locks.changes(old, new) == ["changed  a 1 -> 1.1", "removed  b 2",
                                       "hashes   c 3 (files added or removed on the index)", "added    d-e 4"]


def test_first_hour_script_runs_the_checklist_in_order(tmp_path):
    script = REPO / "scripts" / "first_hour.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    out = subprocess.run([str(script), "--dry-run"], capture_output=True, text=True, check=True,
                         env={**os.environ, "OUT": str(tmp_path)}).stdout
    commands = [line.split(": ", 1)[1] for line in out.splitlines() if line.startswith("== ")]
    assert commands[0].startswith("remax-bench preflight --config workflows/config/gpu1.yaml")
    assert commands[1:5] == [f"remax-bench env {e}" for e in GPU_ENVS.values()]
    assert commands[5] == f"snakemake --cores all --configfile workflows/config/gpu1.yaml {tmp_path}/one-step.yaml"
    # the override is a config the schema takes over the profile: one step per framework, seed 1
    raw = yaml.safe_load((REPO / "workflows" / "config" / "gpu1.yaml").read_text())
    override = yaml.safe_load((tmp_path / "one-step.yaml").read_text())
    raw["remax"].update(override["remax"])
    config = validate_config({**raw, "seeds": override["seeds"]})
    assert config["remax"]["steps"] == 1 and config["seeds"] == [1]
