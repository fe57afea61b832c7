"""A framework adapter shipped as a package of its own (tests/fixtures/plugin_adapter), installed with pip beside the
harness: found through the entry point group remax_bench.frameworks, its config block merged, then planned, launched
and ingested by the CLI, and run through the real Snakemake pipeline to its report, its environment built from the
package's own envs/, with no change to the harness."""

import os
import shutil
import subprocess
import sys

import pandas as pd
import pytest
import yaml

from harness.results.metrics import read_metrics
from tests.conftest import BIN, REPO, merged, snakemake


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    d = tmp_path_factory.mktemp("plugin")
    shutil.copytree(REPO / "tests" / "fixtures" / "plugin_adapter", d / "src")  # the build writes beside its source
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                           "--target", d / "site", d / "src"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return d / "site"


def cli(site, *args):
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run([BIN / "remax-bench", *map(str, args)], capture_output=True, text=True, env=env,
                          timeout=600)


def test_an_installed_adapter_is_found_planned_launched_and_ingested(site, tmp_path):
    raw = merged("cpu.yaml")
    raw["frameworks"] = ["toy"]
    raw["toy"] = {"steps_logged": 4}  # the plug-in's own config block, merged into the schema by the registry
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    for argv in (("plan", "toy", "--config", cfg, "--seed", 7, "--out", tmp_path / "plan"),
                 ("launch", tmp_path / "plan", "--out", tmp_path / "run", "--timeout-min", 1, "--config", cfg),
                 ("ingest", "toy", tmp_path / "run", "--out", tmp_path / "metrics.parquet")):
        proc = cli(site, *argv)
        assert proc.returncode == 0, f"{argv[0]}: {proc.stderr[-3000:]}"
    df = read_metrics(tmp_path / "metrics.parquet")
    assert list(df["step"]) == [1, 2, 3, 4] and set(df["run_id"]) == {"toy-cpu-s7"}
    assert df["throughput_tok_s"].tolist() == [60.0] * 4  # (10 + 20) tokens / 0.5 s


def test_the_plugins_config_block_is_validated_and_absent_without_it(site, tmp_path):
    raw = merged("cpu.yaml")
    raw["toy"] = {"steps_logged": 0}
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    proc = cli(site, "plan", "toy", "--config", cfg, "--seed", 1, "--out", tmp_path / "plan")
    assert proc.returncode == 2 and "toy.steps_logged" in proc.stderr, proc.stderr
    proc = cli(tmp_path / "no-plugin", "plan", "toy", "--config", cfg, "--seed", 1, "--out", tmp_path / "plan")
    assert proc.returncode == 2 and "unknown framework 'toy'" not in proc.stdout
    assert "toy" in proc.stderr  # the key `toy` is unknown to a harness without the plug-in


@pytest.mark.e2e
def test_an_installed_framework_runs_through_the_pipeline_and_one_without_a_path_is_named(site, tmp_path,
                                                                                         monkeypatch):
    """The minimum of docs/frameworks.md: the toy package (one module, one environment description, a config block)
    runs through `snakemake` as an in-tree folder does; toy-gpu, listed too on a CPU profile, is named with its
    reason by the dry run before anything runs, and is "not run" in the report."""
    monkeypatch.setenv("PYTHONPATH", str(site))
    monkeypatch.setenv("REMAX_BENCH_ENVS", str(tmp_path / "venvs"))  # the toy environment, not in the checkout's
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({
        "profile": "toy", "seeds": [1], "frameworks": ["toy", "toy-gpu"], "launch": {"device": "cpu"},
        "task": {"n_train": 64, "n_eval": 8}, "toy": {"steps_logged": 3},
        "policy": {"hidden_size": 16, "intermediate_size": 32, "num_layers": 1, "num_heads": 2,
                   "sft": {"steps": 1, "batch_size": 8}},
        "remax": {"steps": 3, "warmup_steps": 1, "train_batch_size": 4, "rollout_n": 2}}))
    why = "remax-bench: framework toy-gpu will not run in this profile: cannot run on a CPU: TOY: its kernels are CUDA"
    dry = snakemake(tmp_path, "-n", "--cores", "1", "--configfile", cfg)
    assert dry.returncode == 0 and why in dry.stderr, dry.stdout[-3000:] + dry.stderr[-3000:]
    assert "framework toy will not run" not in dry.stderr and "framework_env" in dry.stdout
    proc = snakemake(tmp_path, "--cores", "2", "--configfile", cfg)  # the environment builds beside the policy
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = tmp_path / "results"
    assert (results / "envs" / "toy.txt").read_text().strip() == str(tmp_path / "venvs" / "toy" / "bin" / "python")
    assert list(read_metrics(results / "metrics" / "toy" / "seed1.parquet")["step"]) == [1, 2, 3]
    runs = pd.read_csv(results / "report" / "runs.csv").set_index("framework")
    assert runs.loc["toy", "status"] == "ok"
    assert runs.loc["toy-gpu", "status"] == "not run" and "its kernels are CUDA only" in runs.loc["toy-gpu", "reason"]
    summary = pd.read_csv(results / "summary.csv").set_index("framework")
    assert summary.loc["toy", "run_id"] == "toy-toy-s1" and summary.loc["toy", "throughput_tok_s"] == 60.0


def test_the_required_core_is_plan_or_run_and_a_profile_without_its_environment_gets_a_reason():
    from harness.frameworks import Adapter, not_runnable, register_framework

    core = {"description": "d", "ingest": lambda run: None, "log_glob": "x.log"}
    for extra in ({}, {"plan": print, "run": print}):
        with pytest.raises(ValueError, match=r"one of plan .* or run"):
            register_framework(Adapter(name="incomplete", **core, **extra))
    gpus = {"launch": {"device": "gpu", "nnodes": 1, "gpus_per_node": 8}}
    cpu = {"launch": {"device": "cpu", "nnodes": 1, "gpus_per_node": 0}}
    cpu_only = Adapter(name="m", **core, plan=print, cpu_env="m")
    assert not_runnable(cpu_only, cpu) is None
    assert not_runnable(cpu_only, gpus) == ("has no GPU environment: its adapter names no env (it runs on a CPU "
                                           "with launch.device cpu)")
    bare = Adapter(name="m", **core, plan=print)
    assert not_runnable(bare, cpu) == "cannot run on a CPU: its adapter names no cpu_env"
