"""The preflight of a GPU profile: one table, every failing check at once, a fix per row.

nvidia-smi's outputs are replayed from tests/fixtures/nvidia-smi (this machine has no NVIDIA driver) and free disk is
a stand-in number; the checkpoints, the environment probe, the port and the stray Ray process are real."""

import socket
import subprocess
import sys
import time

import pytest
from conftest import REPO, a100x8_offline, run_cli

from harness.config import validate_config
from harness.frameworks.preflight import preflight, render
from harness.inputs.policy import build_policy, train_tokenizer

SMI = REPO / "tests" / "fixtures" / "nvidia-smi"
GiB = 1024 ** 3


def recorded_smi(node: str, gpus: str | None = None):
    """`gpus`: the node whose compute capabilities the strict-mode row reads (default: `node`)."""
    def smi(*args):
        if "--query-gpu=name,compute_cap" in args:
            return (SMI / f"{gpus or node}-capability.csv").read_text()
        return (SMI / (f"{node}-query.csv" if args else f"{node}-header.txt")).read_text()
    return smi


def checkpoint(path, hidden: int, heads: int):
    tokenizer = train_tokenizer(["12+34=46", "5+7=12"], 32)
    build_policy(tokenizer, {"hidden_size": hidden, "intermediate_size": 2 * hidden, "num_layers": 1,
                             "num_heads": heads}, 32).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def a100x8(tmp_path, policy, **openrlhf):
    config = validate_config(a100x8_offline(2000, 100))
    config["policy"]["path"] = str(policy)
    config["openrlhf"].update(openrlhf)
    return config


def environment(venvs, name):
    """An environment directory whose python is the tests' own (with its packages: torch, harness)."""
    python = venvs / name / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)


def by_check(rows):
    return {r["check"]: r for r in rows}


def test_a_node_that_fits_the_profile_passes(tmp_path):
    config = a100x8(tmp_path, checkpoint(tmp_path / "policy", hidden=128, heads=4))  # head_dim 32
    rows = preflight(config, tmp_path / "results", smi=recorded_smi("a100x8"), free=lambda path: 500 * GiB,
                     commands=lambda: ["/usr/bin/python3 train.py"], env_root=tmp_path / "venvs")
    text = render(rows)
    assert text.startswith("preflight passed"), text
    checks = by_check(rows)
    assert checks["GPUs"]["found"].startswith("8 x NVIDIA A100-SXM4-80GB")
    assert checks["environment verl"]["status"] == "skip"  # not built yet: checked once it is
    assert "head_dim 32" in checks["policy checkpoint"]["found"]
    assert "3 seeds x openrlhf, dschat" in checks["disk"]["found"]


def test_every_failing_check_is_reported_at_once_with_its_fix(tmp_path):
    policy = checkpoint(tmp_path / "policy", hidden=80, heads=4)  # head_dim 20: vLLM serves multiples of 8
    (policy / "tokenizer.json").unlink()
    # Environments that cannot import their framework.
    venvs = tmp_path / "venvs"
    for env in ("verl", "openrlhf"):
        environment(venvs, env)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        config = a100x8(tmp_path, policy, reward_port=taken.getsockname()[1])
        # A Ray node left behind: a real process whose name is raylet.
        ray = subprocess.Popen(["bash", "-c", "exec -a raylet sleep 60"])
        try:
            time.sleep(0.2)
            rows = preflight(config, tmp_path / "results", smi=recorded_smi("h100x4"), free=lambda path: 1000,
                             env_root=venvs)
        finally:
            ray.kill()
    checks = by_check(rows)
    failed = [r["check"] for r in rows if r["status"] == "fail"]
    assert failed == ["GPUs", "GPU model", "environment verl", "environment openrlhf", "policy checkpoint", "disk",
                      "port openrlhf.reward_port", "no stray Ray cluster"]
    assert render(rows).startswith("preflight failed: GPUs, GPU model, environment verl")
    assert checks["GPUs"]["found"] == "4 x NVIDIA H100 80GB HBM3 (launch.gpus_per_node: 8)"
    assert "import verl fails: ModuleNotFoundError" in checks["environment verl"]["found"]
    assert "rebuild it" in checks["environment verl"]["fix"]
    policy_row = checks["policy checkpoint"]["found"]
    assert "tokenizer missing" in policy_row and "verl's generation engine does not serve head_dim 20" in policy_row
    assert "in use" in checks["port openrlhf.reward_port"]["found"]
    assert "raylet" in checks["no stray Ray cluster"]["found"] and "ray stop" in checks["no stray Ray cluster"]["fix"]
    assert all(r["fix"] for r in rows if r["status"] == "fail")


def test_an_environment_with_a_cpu_only_torch_fails_with_the_fix(tmp_path, monkeypatch):
    # The tests' own environment as dschat's, its package stood in by one it has: the probe imports a real torch
    # (this machine's CPU build, no CUDA) and the row says so.
    import dataclasses

    from harness.frameworks import get_adapter, registry

    monkeypatch.setitem(registry._REGISTRY, "dschat", dataclasses.replace(get_adapter("dschat"), module="harness"))
    venvs = tmp_path / "venvs"
    environment(venvs, "dschat")
    config = a100x8(tmp_path, checkpoint(tmp_path / "policy", hidden=128, heads=4))
    config["frameworks"] = ["dschat"]
    rows = preflight(config, tmp_path / "results", smi=recorded_smi("a100x8"), free=lambda path: 500 * GiB,
                     commands=list, env_root=venvs)
    row = by_check(rows)["environment dschat"]
    assert row["status"] == "fail" and "a CPU build" in row["found"] and "CUDA 12.2" in row["found"]
    assert row["fix"] == "a CUDA build of torch in harness/frameworks/dschat/envs/dschat.txt"


def test_the_command_on_a_machine_without_gpus_exits_2_with_the_table(tmp_path):
    proc = run_cli("preflight", "--config", REPO / "workflows" / "config" / "a100x8.yaml", "--results",
                   tmp_path / "results", "--out", tmp_path / "preflight.md")
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout.startswith("preflight failed: GPUs")
    assert "no nvidia-smi on this machine" in proc.stdout
    assert (tmp_path / "preflight.md").read_text() == proc.stdout


@pytest.mark.e2e
def test_gpu_profiles_run_the_preflight_before_anything_else_needs_a_node(tmp_path):
    from conftest import snakemake

    proc = snakemake(tmp_path, "-n", "--cores", "8", "--configfile", REPO / "workflows" / "config" / "a100x8.yaml")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    for rule in ("framework_env", "dschat_checkout", "plan"):
        block = out.split(f"rule {rule}:")[1].split("\n\n")[0]
        assert "results/preflight.md" in block, (rule, block)
    cpu = snakemake(tmp_path, "-n", "--cores", "2", "--configfile", REPO / "workflows" / "config" / "cpu.yaml")
    assert cpu.returncode == 0 and "rule preflight" not in cpu.stdout + cpu.stderr


def test_strict_mode_needs_the_compute_capability_of_the_pinned_vllms_batch_invariance(tmp_path):
    """VLLM_BATCH_INVARIANT=1 (the strict GPU plans of verl and OpenRLHF) has kernels for compute capability 8.0 and
    up in vLLM 0.24.0 and 0.29.0 (their source): a V100 node fails the row of each, an A100 node passes, and under
    `off` there is no such row."""
    config = a100x8(tmp_path, checkpoint(tmp_path / "policy", hidden=128, heads=4))
    config["reproducibility"]["determinism"] = "strict"

    def rows(gpus):
        return by_check(preflight(config, tmp_path / "results", smi=recorded_smi("a100x8", gpus),
                                  free=lambda path: 500 * GiB, commands=list, env_root=tmp_path / "venvs"))

    checks = rows("v100x8")
    assert checks["strict: verl's vLLM 0.24.0 batch invariance"]["status"] == "fail"
    openrlhf = checks["strict: openrlhf's vLLM 0.29.0 batch invariance"]
    assert openrlhf["status"] == "fail" and "Tesla V100-SXM2-32GB (7.0)" in openrlhf["found"]
    assert "compute capability 8.0+" in openrlhf["fix"]
    assert not [c for c in checks if c.startswith(("strict: dschat", "strict: trl"))]  # no vLLM
    assert all(r["status"] == "ok" for c, r in rows("a100x8").items() if c.startswith("strict: "))
    config["reproducibility"]["determinism"] = "off"
    assert not [c for c in rows("v100x8") if c.startswith("strict: ")]
