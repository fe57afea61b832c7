"""A framework adapter shipped as a package of its own (tests/fixtures/plugin_adapter), installed with pip beside the
harness: found through the entry point group remax_bench.frameworks, its config block merged, then planned, launched
and ingested by the CLI, with no change to the harness."""

import os
import shutil
import subprocess
import sys

import pytest
import yaml

from harness.results.metrics import read_metrics
from tests.conftest import BIN, REPO, merged


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
