import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def a100x8_offline(n_train: int, n_eval: int) -> dict:
    """workflows/config/a100x8.yaml as parsed YAML, its Hub dataset and reward model replaced by what exists here (no
    Hub, no 7B reward model): 5-digit addition of the given size, scored by the rule. Everything else is the
    profile's."""
    import yaml

    raw = yaml.safe_load((REPO / "workflows" / "config" / "a100x8.yaml").read_text())
    raw["task"] = {"kind": "addition", "digits": 5, "n_train": n_train, "n_eval": n_eval, "seed": 1234}
    raw["reward"] = {"kind": "rule"}
    return raw


def run_cli(*args, cwd=None):
    """The real console script, in a subprocess, as users and Snakemake rules call it."""
    return subprocess.run([str(BIN / "remax-bench"), *map(str, args)], cwd=cwd, capture_output=True, text=True)


def snakemake(workdir, *args):
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(
        [str(BIN / "snakemake"), "-s", str(REPO / "Snakefile"), "--directory", str(workdir), *map(str, args)],
        cwd=workdir, capture_output=True, text=True, env=env,
    )


@pytest.fixture(scope="session")
def micro_pipeline(tmp_path_factory):
    """One real `snakemake` run of the micro profile; several tests read its results."""
    workdir = tmp_path_factory.mktemp("pipeline")
    proc = snakemake(workdir, "--cores", "2", "--configfile", REPO / "workflows" / "config" / "micro.yaml")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return workdir


@pytest.fixture(scope="module")
def a100x8(tmp_path_factory):
    """workflows/config/a100x8.yaml with a stand-in checkpoint directory and a dataset of the size it uses."""
    import yaml

    from harness.config import load_config
    from harness.inputs import build_dataset, build_policy, build_reward

    root = tmp_path_factory.mktemp("a100x8")
    (root / "ckpt").mkdir()
    (root / "ckpt" / "config.json").write_text("{}")  # plan never loads the model
    raw = a100x8_offline(0, 20)
    raw["policy"]["path"] = str(root / "ckpt")
    raw["task"]["n_train"] = raw["remax"]["steps"] * raw["remax"]["train_batch_size"] + 40
    config_path = root / "config.yaml"
    config_path.write_text(yaml.safe_dump(raw))
    config = load_config(config_path)
    build_dataset(config, root / "inputs")
    build_policy(config, root / "inputs")
    build_reward(config, root / "inputs")
    return {"root": root, "config_path": config_path, "config": config, "inputs": root / "inputs"}
