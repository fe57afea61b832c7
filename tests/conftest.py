import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "workflows" / "config"
BIN = Path(sys.executable).parent

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def a100x8_offline(n_train: int, n_eval: int) -> dict:
    """workflows/config/a100x8.yaml as parsed YAML, its Hub dataset and reward model replaced by what exists here (no
    Hub, no 7B reward model): 5-digit addition of the given size, scored by the rule. Everything else is the
    profile's."""
    raw = yaml.safe_load((REPO / "workflows" / "config" / "a100x8.yaml").read_text())
    raw["task"] = {"kind": "addition", "digits": 5, "n_train": n_train, "n_eval": n_eval, "seed": 1234}
    raw["reward"] = {"kind": "rule"}
    return raw


def merged(*names: str) -> dict:
    """Profiles merged over each other as Snakemake merges --configfile over the Snakefile's configfile."""

    def merge(into, over):
        for k, v in over.items():
            if isinstance(v, dict) and isinstance(into.get(k), dict):
                merge(into[k], v)
            else:
                into[k] = v
        return into

    out = {}
    for name in names:
        merge(out, yaml.safe_load((CONFIGS / name).read_text()))
    return out


def tiny_cpu_config(**policy) -> dict:
    """The cpu-frameworks profile, shrunk to 2 ReMax steps of 4 prompts x 2 samples on a 1-layer policy."""
    raw = merged("cpu.yaml", "cpu-frameworks.yaml")
    raw["task"].update(n_train=64, n_eval=16)
    raw["policy"].update({"hidden_size": 64, "intermediate_size": 64, "num_layers": 1, "num_heads": 2, **policy})
    raw["policy"]["sft"].update(steps=5, batch_size=16)
    raw["remax"].update(steps=2, warmup_steps=1, train_batch_size=4, rollout_n=2)
    raw["verl"]["micro_batch_size_per_gpu"] = 8  # the step's 4 x 2 rows in one pass
    return raw


def parity_config(checkout: str | None) -> dict:
    """The cpu-frameworks profile shrunk for the parity check: 8 prompts a step, one sample each (ReMax's own shape,
    which DeepSpeed-Chat requires), one micro-batch; DeepSpeed-Chat where its checkout is given."""
    raw = tiny_cpu_config()
    # An SFT long enough that no sampled response holds the pad token (5 steps left it in 1 of 8: a framework that
    # masks pad tokens then trains on fewer tokens than the reference, a difference of the batch, not of the update)
    raw["task"]["n_train"] = 1024
    raw["policy"]["sft"].update(steps=150, batch_size=32)
    raw["remax"].update(train_batch_size=8, rollout_n=1)
    raw["verl"]["micro_batch_size_per_gpu"] = 8
    raw["openrlhf"].update(train_micro_batch_size=8, rollout_micro_batch_size=8)
    raw["dschat"]["per_device_training_batch_size"] = 8
    raw["frameworks"] = ["reference", "verl", "openrlhf", "trl"] + (["dschat"] if checkout else [])
    if checkout:
        raw["dschat"]["checkout"] = checkout
    return raw


def make_inputs(root, raw: dict):
    """The config written to root/config.yaml, and the shared inputs built from it in root/inputs."""
    from harness.config import load_config
    from harness.inputs import build_dataset, build_policy, build_reward

    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    config = load_config(path)
    for build in (build_dataset, build_policy, build_reward):
        build(config, root / "inputs")
    return path, config


def run_cli(*args, cwd=None):
    """The real console script, in a subprocess, as users and Snakemake rules call it."""
    return subprocess.run([str(BIN / "remax-bench"), *map(str, args)], cwd=cwd, capture_output=True, text=True)


def clone_with_commit(clone, path: str, line: tuple[str, str], message: str):
    """A clone of this repository's HEAD at `clone` with one commit on top that replaces `line[0]` (found once) in
    `path` by `line[1]`: a planted real change, for the tests that must tell it apart (A/B, reproduce)."""
    subprocess.run(["git", "clone", "-q", "--no-local", str(REPO), str(clone)], check=True)
    target = clone / path
    text = target.read_text()
    assert text.count(line[0]) == 1, f"{path} no longer holds {line[0]!r} once"
    target.write_text(text.replace(*line))
    who = ["-c", "user.name=remax-bench test", "-c", "user.email=test@remax-bench.invalid"]
    subprocess.run(["git", "-C", str(clone), *who, "commit", "-qam", message], check=True)
    return clone


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


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """A finished reference run of 3 steps, with its inputs, metrics and summary, made by the CLI (tests read it, never
    write into it)."""
    root = tmp_path_factory.mktemp("tiny")
    config = root / "config.yaml"
    config.write_text(yaml.safe_dump({
        "profile": "tiny", "seeds": [1], "task": {"n_train": 64, "n_eval": 8},
        "policy": {"hidden_size": 16, "intermediate_size": 32, "num_layers": 1, "num_heads": 2,
                   "sft": {"steps": 1, "batch_size": 8}},
        "remax": {"steps": 3, "warmup_steps": 1, "train_batch_size": 4, "rollout_n": 2},
        "reference": {"eval_batch_size": 8}}))
    proc = run_cli("freeze-config", "--json", json.dumps(yaml.safe_load(config.read_text())),
                   "--out", root / "results" / "config.json")
    assert proc.returncode == 0, proc.stderr
    inputs = root / "results" / "inputs"
    for what in ("dataset", "policy", "reward"):
        assert run_cli("inputs", what, "--config", config, "--inputs", inputs).returncode == 0
    run = root / "results" / "runs" / "reference" / "seed1"
    proc = run_cli("run", "reference", "--config", config, "--seed", 1, "--out", run, "--inputs", inputs)
    assert proc.returncode == 0, proc.stderr
    metrics = root / "results" / "metrics" / "reference" / "seed1.parquet"
    assert run_cli("ingest", "reference", run, "--out", metrics).returncode == 0
    proc = run_cli("summarize", "--config", config, "--metrics", metrics, "--runs", run,
                   "--out", root / "results" / "summary.csv")
    assert proc.returncode == 0, proc.stderr
    return {"root": root, "config": config, "inputs": inputs, "run": run, "metrics": metrics}


# Under pytest-xdist (pyproject's addopts: two workers) a file is one unit of work, so a module's fixtures (a real
# framework run several tests read) are made once. The files that start Ray clusters or bind fixed ports (OpenRLHF's
# reward server, torch.distributed's master port) share one unit, and so does the preflight's, which looks for a
# stray Ray cluster and for those ports taken on this machine: two of them at once would see each other's. That unit,
# the longest, is handed out first, so the other worker takes the rest of the suite beside it (TRL's and verl's
# planning and conformance files among it: one process each, no port of their own). The parity drivers start
# torch.distributed process groups (DeepSpeed's master port), so their file is in that unit too.
FRAMEWORK_RUNS = {"test_verl_cpu.py", "test_openrlhf_cpu.py", "test_openrlhf.py", "test_dschat.py",
                  "test_preflight.py", "test_parity_frameworks.py"}


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: Path(item.fspath).name not in FRAMEWORK_RUNS)  # stable: file order kept


def pytest_xdist_make_scheduler(config, log):
    # Not xdist's own loadgroup: with pytest 9 it no longer sees a group in a test's id (xdist 3.8 writes the id
    # where pytest 9 does not read it), so every test would be a unit of its own.
    from xdist.scheduler import LoadScopeScheduling

    class OneUnitPerFile(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            file = nodeid.split("::", 1)[0]
            return "framework runs" if Path(file).name in FRAMEWORK_RUNS else file

    return OneUnitPerFile(config, log)
